"""inbox.py show:一张工单从头到尾的经过,给客户问「为什么给我发了这个」时的客服主管看。课文「上线以后盯什么」说后台
Agent 要按事件、按工单组织,可这些记录散在四处:事件表(什么时候、从哪来、试了几次、为什么失败)、llm_usage(每次
模型调用)、checkpoint(第一版草稿、每轮意见和重写)、review_log 和发件箱(怎么决定的、发了什么)。story() 把它们按
时间排成一份,show 打印它,--json 原样交给脚本;网页收件箱的工单页也用它。Agent 提过问的(agent_question.py),
第一版是那个问题,人的回答是 rounds 里的一轮(feedback 里「提问:… 回答:…」那一条),打印时写成提问、回答、起草。"""
import json

import config
import store
from agent import thread_of
from agent_question import is_answer, is_question, split_answer
from inbox_show import indented, visible
from inbox_take import Refused


def show(graph, ticket_id: str, as_json: bool) -> None:
    """打印这张工单的经过;没有这张工单时抛 Refused(和别的命令一样说「不在」,退出码 1)。"""
    if (s := story(graph, ticket_id)) is None:
        raise Refused(f"{ticket_id} 不在收件箱里,事件表和 checkpoint 里也没有它:工单号写错了,或者还没有事件进来")
    print_json(s) if as_json else print_story(s)


def story(graph, ticket_id: str) -> dict | None:
    """这张工单的经过;事件表里没有它、checkpoint 里也没有时是 None。"""
    events = [dict(r) for r in rows(
        "SELECT event_id, source, kind, received_at, attempts, status, last_error FROM events "
        "WHERE ticket_id = ? ORDER BY received_at, event_id", ticket_id)]
    history = list(graph.get_state_history(thread_of(ticket_id)))[::-1]  # 从旧到新
    if not events and not history:
        return None
    backup = config.get("LLM_FALLBACK_MODEL")
    price = config.value("LLM_PRICE_PER_1K_TOKENS")
    calls = [{**dict(r), "cost": (r["input_tokens"] + r["output_tokens"]) / 1000 * price, "fallback": r["model"] == backup}
             for r in rows("SELECT event_id, model, input_tokens, output_tokens, duration_ms, created_at FROM llm_usage "
                           "WHERE ticket_id = ? ORDER BY id", ticket_id)]
    decision = next((dict(r) for r in rows("SELECT action, final, reviewer, created_at FROM review_log WHERE ticket_id = ?",
                                           ticket_id)), None)
    sent = next((dict(r) for r in rows("SELECT body, sent_by, sent_at FROM outbox WHERE ticket_id = ?", ticket_id)), None)
    values = history[-1].values if history else {}
    return {"ticket_id": ticket_id, "ticket_text": values.get("ticket_text"), "events": events, "model_calls": calls,
            **drafts(history), "waiting": bool(history and history[-1].interrupts),
            "decision": decision, "outbox": sent}


def drafts(history: list) -> dict:
    """checkpoint 里每一版给人看的草稿:draft 节点写完、下一步是 review 的那几个 checkpoint(同一轮人的回答被拒、
    review 再问一次的不算新的一版)。第一版,然后每一轮意见和按它重写的那一版。"""
    shown: dict[int, dict] = {}
    for snap in history:
        if snap.next == ("review",) and "draft" in snap.values:
            shown.setdefault(len(snap.values.get("feedback", [])), snap.values["draft"])
    feedback = history[-1].values.get("feedback", []) if history else []
    return {"first_draft": shown.get(0),
            "rounds": [{"feedback": text, "redraft": shown.get(i)} for i, text in enumerate(feedback, 1)]}


def rows(sql: str, ticket_id: str) -> list:
    with store.opened() as conn:
        return conn.execute(sql, (ticket_id,)).fetchall()


def print_story(s: dict) -> None:
    """story() 给人看的样子:几段,每段一个标题,内容缩进。"""
    print(visible(f"{s['ticket_id']}  {s['ticket_text'] or '(还没有读到工单)'}"))
    print("事件")
    for e in s["events"]:
        print(indented("", f"{e['event_id']}  {e['source']} {e['kind']}  收到 {e['received_at']}  "
                           f"尝试 {e['attempts']} 次  {e['status']}"))
        if e["last_error"]:
            print(indented("原因:", e["last_error"]))
    print("模型调用" if s["model_calls"] else "模型调用:没有")
    for c in s["model_calls"]:
        backup = "  备用模型" if c["fallback"] else ""
        took = "" if c["duration_ms"] is None else f"  用时 {c['duration_ms'] / 1000:.2f} 秒"
        print(indented("", f"{c['created_at']}  {c['model']}  输入 {c['input_tokens']} / 输出 {c['output_tokens']} token  "
                           f"约 ¥{c['cost']:.4f}{took}{backup}"))
    if s["first_draft"]:
        print("草稿")
        first = s["first_draft"]
        notice = first.get("action") == "notify_supervisor"  # 练习 5:没有起草,只通知主管
        print(indented("第一版:", f"(通知主管,没有起草)[{first['category']}] {first['summary']}" if notice else
                       f"(提问,没有起草)[{first['category']}] {first['question']}" if is_question(first) else
                       first["reply"]))
    for i, r in enumerate(s["rounds"], 1):
        if is_answer(r["feedback"]):  # 人回答了 Agent 的提问,Agent 照着起草
            question, answer = split_answer(r["feedback"])
            print(indented(f"提问 {i}:", question))
            print(indented(f"回答 {i}:", answer))
        else:
            print(indented(f"意见 {i}:", r["feedback"]))
        print(indented(f"重写 {i}:", redraft_text(r["redraft"])))
    if s["decision"]:
        print("决定")
        who = s["decision"]["reviewer"] or "(没有记下是谁)"
        print(indented("", f"{s['decision']['action']}  {who}  {s['decision']['created_at']}"))
    else:
        print("决定:还在收件箱里等人处理" if s["waiting"] else "决定:没有")
    if s["outbox"]:
        print("发件箱")
        print(indented("", f"{s['outbox']['sent_at']}  {s['outbox']['sent_by']}"))
        print(indented("", s["outbox"]["body"]))


def redraft_text(redraft: dict | None) -> str:
    if redraft is None:
        return "(还没有重写完)"
    return f"(又提了一个问题)【提问】{redraft['question']}" if is_question(redraft) else redraft["reply"]


def print_json(s: dict) -> None:
    print(json.dumps(s, ensure_ascii=False, indent=2, default=str))
