"""agent.py 的 review 节点对人的回答的核对:这条待办允许哪几种处理、edit 和 respond 带的文字在不在、有没有超长
(INBOX_MAX_TEXT_CHARS),一张工单最多按意见重写几次(MAX_REDRAFTS)。课文的 review() 收到什么就照做;可回答不一定来自
这个实验的收件箱(Agent Inbox、自己拼的 Command 都能恢复 thread),不能用的回答要退回去再问,不能发给客户,
所以 inbox.py 先拦一遍,review 再照同样的规则查一遍。"""
import config


def may_respond(state: dict) -> bool:
    """这条待办还允许不允许 respond(让 Agent 按意见再写一版)。"""
    # 用起草时记下的上限,不读现在的设置:review 在人回答后重跑时,算出的必须和人看到的一样
    return len(state.get("feedback", [])) < state.get("redraft_limit", config.value("MAX_REDRAFTS"))


def allowed(item: dict) -> list[str]:
    """这条待办允许的处理(HumanResponse 的 type)。"""
    flags = {"accept": "allow_accept", "edit": "allow_edit", "response": "allow_respond", "ignore": "allow_ignore"}
    return [kind for kind, flag in flags.items() if item["config"].get(flag)]


def edited_reply(answer: dict) -> str | None:
    """edit 回答里改好的回复全文(HumanResponse 的 args.args.reply);没有或是空的就是 None。"""
    args = answer.get("args")
    inner = args.get("args") if isinstance(args, dict) else None
    reply = inner.get("reply") if isinstance(inner, dict) else None
    return reply if isinstance(reply, str) and reply.strip() else None


def answer_problem(answer, item: dict) -> str | None:
    """这个回答哪里不能用;能用就是 None。收件箱事先就这样查过,这里防的是别的客户端(Agent Inbox、自己拼的 Command)。"""
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind not in allowed(item):
        return f"这条待办不接受 {kind!r},允许的是 {allowed(item)}"
    if kind == "edit" and edited_reply(answer) is None:
        return "edit 要带改好的回复全文(args.args.reply,不能为空)"
    if kind == "response" and not (isinstance(answer.get("args"), str) and answer["args"].strip()):
        return "response 要带给 Agent 的意见(args,不能为空)"
    text = edited_reply(answer) if kind == "edit" else answer["args"] if kind == "response" else ""
    if len(text.strip()) > (limit := config.value("INBOX_MAX_TEXT_CHARS")):
        return f"{kind} 的文字有 {len(text.strip())} 个字,最多 {limit} 个(INBOX_MAX_TEXT_CHARS)"
    return None
