"""提问(agent_question.py):客户说「上次那张发票」、名下有几张发票时,Agent 不猜,在收件箱里问人是哪张;人用 respond 回答,
Agent 照回答起草,之后和普通的审核待办一样。只有一张发票、工单写了发票号、业务库没有发票表时照常起草。"""
import json

import pytest
from conftest import cli, drain, rows
from openai_stub import OpenAIStub

import agent_question
import llm_offline
import store
import store_biz
from agent import build_prompt, opened_graph, thread_of

QUESTION = "客户说的「上次那张发票」是哪张?系统里有 3 张候选"
T1042_TEXT = "发票抬头开错了:上次那张发票抬头开错了，麻烦重开一下。"
CHOSEN = "INV-2026-0121"


def queue(*tickets: str) -> None:
    for t in tickets:
        payload = json.dumps({"id": f"evt_{t}_created", "type": "ticket.created", "data": {"ticket_id": t}})
        store.add_event(f"evt_{t}_created", "webhook", "ticket.created", payload)
    drain()


def inbox(env, *args):
    return cli(["inbox.py", *args], env)


def item(ticket_id: str) -> dict:
    with opened_graph() as graph:
        return graph.get_state(thread_of(ticket_id)).interrupts[0].value


def issued(invoice_id: str) -> str:
    return next(i["issued_on"] for i in store_biz.invoices("C011") if i["id"] == invoice_id)


def answered_draft() -> str:
    """离线模型按回答 CHOSEN 写的草稿:说出是哪一张。"""
    return (f"您好,您说的那张是发票 {CHOSEN}({issued(CHOSEN)} 开具)。关于发票的问题,我们已记录您的开票信息,"
            "财务同事核对后会为您重新处理,处理完成后电子发票会发送到您的预留邮箱。感谢您的耐心。")


def everything() -> tuple:
    """事件、发件箱、审核记录和模型调用的全部行:被拒的处理前后要一模一样。"""
    return (rows("SELECT event_id, status, attempts, last_error FROM events ORDER BY event_id"),
            rows("SELECT ticket_id, body FROM outbox"), rows("SELECT ticket_id, action, feedback FROM review_log"),
            rows("SELECT COUNT(*) FROM llm_usage"))


def test_t1042_asks_which_invoice_then_drafts_naming_the_answer_and_sends_it_once(any_lab):
    queue("T1042")
    day = {i: issued(i) for i in ("INV-2026-0121", "INV-2026-0120", "INV-2026-0119")}
    asked = item("T1042")
    assert asked == {
        "action_request": {"action": "ask_human", "args": {
            "ticket_id": "T1042", "question": QUESTION, "ticket_text": T1042_TEXT,
            "candidates": [
                {"id": "INV-2026-0121", "issued_on": day["INV-2026-0121"], "amount": "1200.00", "title": "广州百草堂医药有限公司"},
                {"id": "INV-2026-0120", "issued_on": day["INV-2026-0120"], "amount": "6800.00", "title": "广州百草堂医药连锁有限公司"},
                {"id": "INV-2026-0119", "issued_on": day["INV-2026-0119"], "amount": "6800.00",
                 "title": "广州百草堂医药连锁有限公司"}]}},
        "config": {"allow_accept": False, "allow_edit": False, "allow_respond": True, "allow_ignore": True},
        "description": f"【提问】[invoice] {QUESTION}"}

    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stderr) == (0, "")
    assert listing.stdout.splitlines() == [
        f"T1042  【提问】[invoice] {QUESTION}",
        f"        工单:{T1042_TEXT}",
        f"        候选:INV-2026-0121  {day['INV-2026-0121']} 开具  ¥1200.00  抬头「广州百草堂医药有限公司」",
        f"        候选:INV-2026-0120  {day['INV-2026-0120']} 开具  ¥6800.00  抬头「广州百草堂医药连锁有限公司」",
        f"        候选:INV-2026-0119  {day['INV-2026-0119']} 开具  ¥6800.00  抬头「广州百草堂医药连锁有限公司」",
        '        回答:uv run python inbox.py respond T1042 "<发票号或说明>";不回答就 ignore']

    before = everything()
    assert before[0] == [("evt_T1042_created", "waiting_human", 1, None)]
    for args in (["accept", "T1042"], ["approve", "T1042"], ["edit", "T1042", "您好,已为您重开。"]):
        r = inbox(any_lab, *args)
        command = "accept" if args[0] == "approve" else args[0]
        assert (r.returncode, r.stdout, r.stderr) == (
            1, "", f"T1042 是提问类待办,Agent 在等你回答它的问题,没有草稿可以 {command};只能 respond / ignore"
                   "(respond 带上回答,比如发票号)\n")
        assert everything() == before  # 什么都没动:事件还在收件箱,没发信、没记账、没调模型
    assert item("T1042") == asked

    answer = inbox(any_lab, "respond", "T1042", CHOSEN)
    assert (answer.returncode, answer.stdout) == (0, f"已按回答起草,新草稿: {answered_draft()}\n")
    review = item("T1042")
    assert review == {
        "action_request": {"action": "send_reply", "args": {"ticket_id": "T1042", "reply": answered_draft()}},
        "config": {"allow_accept": True, "allow_edit": True, "allow_respond": True, "allow_ignore": True},
        "description": "[invoice] 客户反映:发票抬头开错了"}
    assert inbox(any_lab, "list").stdout == f"T1042  [invoice] 客户反映:发票抬头开错了\n        草稿:{answered_draft()}\n"

    sent = inbox(any_lab, "accept", "T1042")
    assert (sent.returncode, sent.stdout) == (0, "T1042 → sent\n")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1042_created", "done", 1)]
    assert rows("SELECT ticket_id, body, sent_by FROM outbox") == [("T1042", answered_draft(), "agent+reviewer")]
    # 问答那一轮记在 feedback 里;原稿是回答之后写的那一版(问题不是草稿)
    assert rows("SELECT ticket_id, category, draft, final, action, feedback FROM review_log") == [
        ("T1042", "invoice", answered_draft(), answered_draft(), "accept",
         json.dumps([f"提问:{QUESTION} 回答:{CHOSEN}"], ensure_ascii=False))]
    assert rows("SELECT COUNT(*) FROM llm_usage WHERE ticket_id = 'T1042'") == [(2,)]  # 提问一次,按回答起草一次
    assert inbox(any_lab, "list").stdout == "收件箱是空的\n"


def test_show_tells_the_question_round_and_the_daily_report_counts_it_apart_from_feedback(lab):
    queue("T1042")
    assert inbox(lab, "respond", "T1042", CHOSEN).returncode == 0
    assert inbox(lab, "respond", "T1042", "语气再软一点,先道歉").returncode == 0
    assert inbox(lab, "accept", "T1042").returncode == 0
    shown = inbox(lab, "show", "T1042")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    redraft = rows("SELECT final FROM review_log")[0][0]
    assert lines[lines.index("草稿") + 1:lines.index("决定")] == [
        f"        第一版:(提问,没有起草)[invoice] {QUESTION}",
        f"        提问 1:{QUESTION}",
        f"        回答 1:{CHOSEN}",
        f"        重写 1:{answered_draft()}",
        "        意见 2:语气再软一点,先道歉",
        f"        重写 2:{redraft}"]
    assert CHOSEN in redraft  # 按意见重写时,问过的答案还在提示词里
    report = cli(["cron_jobs.py", "report"], lab)
    assert report.returncode == 0, report.stderr
    assert "  invoice:1 张,accept 1,edit 0,ignore 0,原样批准率 100%,其中 1 张提过意见重写(response 共 1 轮),"\
           "1 张 Agent 提过问(回答 1 轮);" in report.stdout


def test_ignoring_a_question_records_an_ignore_without_a_draft(lab):
    queue("T1042")
    r = inbox(lab, "ignore", "T1042")
    assert (r.returncode, r.stdout) == (0, "T1042 → ignored\n")
    assert rows("SELECT event_id, status FROM events") == [("evt_T1042_created", "ignored")]
    assert rows("SELECT ticket_id, category, final, action, feedback FROM review_log") == [
        ("T1042", "invoice", None, "ignore", "[]")]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


def test_an_answer_counts_as_a_redraft_round(lab, monkeypatch):
    """MAX_REDRAFTS 把回答也算一轮:上限是 1 时,回答之后的草稿不能再 respond;上限是 0 时没人能回答,Agent 不问,照常起草。"""
    monkeypatch.setenv("MAX_REDRAFTS", "1")
    queue("T1042")
    assert inbox({**lab, "MAX_REDRAFTS": "1"}, "respond", "T1042", CHOSEN).returncode == 0
    assert item("T1042")["config"] == {"allow_accept": True, "allow_edit": True, "allow_respond": False,
                                       "allow_ignore": True}
    again = inbox({**lab, "MAX_REDRAFTS": "1"}, "respond", "T1042", "再短一点")
    assert (again.returncode, again.stderr) == (
        1, "T1042 已经按意见重写了 1 次,到上限了,不能再 respond;现在可以:accept / edit / ignore\n")

    monkeypatch.setenv("MAX_REDRAFTS", "0")
    state = {"ticket_id": "T1042", "ticket_text": T1042_TEXT, "invoices": store_biz.invoices("C011"), "feedback": []}
    assert agent_question.ASK_RULE not in build_prompt(state)
    assert "question" not in llm_offline.offline_draft(build_prompt(state))


@pytest.mark.parametrize("ticket, why", [
    ("T1040", "客户名下只有一张发票:「上周申请的那张」就是它"),
    ("T1006", "工单写了发票号 INV-2026-0105"),
    ("T1012", "没说「上次」「那张」"),
])
def test_a_ticket_the_data_settles_gets_a_draft_not_a_question(lab, ticket, why):
    queue(ticket)
    got = item(ticket)
    assert got["action_request"]["action"] == "send_reply", why
    assert got["config"]["allow_accept"] and not got["description"].startswith("【提问】")


def test_a_business_db_without_invoices_gets_a_draft_not_a_question(lab):
    """课文自己的业务库没有发票表:Agent 没有候选可列,照常起草,不报错。"""
    conn = store.connect(store.biz_target())
    conn.execute("DROP TABLE invoices")
    conn.close()
    assert store_biz.invoices("C011") == []
    queue("T1042")
    got = item("T1042")
    assert got["action_request"] == {"action": "send_reply", "args": {
        "ticket_id": "T1042", "reply": "您好,关于发票的问题,我们已记录您的开票信息,财务同事核对后会为您重新处理,"
                                        "处理完成后电子发票会发送到您的预留邮箱。感谢您的耐心。"}}
    assert rows("SELECT event_id, status FROM events") == [("evt_T1042_created", "waiting_human")]


def test_a_real_chat_openai_answer_with_question_and_candidates_becomes_a_question_item(lab, monkeypatch):
    """真的 ChatOpenAI 连本机的 OpenAI 兼容服务:工具定义里有 question / candidates,服务回的工具调用带着它们,
    图交出的就是提问类待办;回答之后按回答起草。"""
    with OpenAIStub() as stub:
        monkeypatch.setenv("LLM_API_KEY", "sk-test")
        monkeypatch.setenv("LLM_BASE_URL", stub.base_url)
        monkeypatch.setenv("LLM_MODEL", "stub-model")
        monkeypatch.setenv("LLM_MAX_RETRIES", "0")
        queue("T1042")
        (request,) = stub.requests
        properties = request["body"]["tools"][0]["function"]["parameters"]["properties"]
        assert {"question", "candidates", "reply"} <= set(properties)
        assert "INV-2026-0121" in request["body"]["messages"][0]["content"]  # 候选是从业务库里读给模型的
        asked = item("T1042")
        assert asked["action_request"]["action"] == "ask_human"
        assert asked["action_request"]["args"]["question"] == QUESTION
        assert [c["id"] for c in asked["action_request"]["args"]["candidates"]] == [
            "INV-2026-0121", "INV-2026-0120", "INV-2026-0119"]
        env = {**lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MODEL": "stub-model",
               "LLM_MAX_RETRIES": "0"}
        answer = inbox(env, "respond", "T1042", CHOSEN)
        assert (answer.returncode, answer.stdout) == (0, f"已按回答起草,新草稿: {answered_draft()}\n")
        assert f"提问:{QUESTION} 回答:{CHOSEN}" in stub.requests[-1]["body"]["messages"][0]["content"]
    assert rows("SELECT model, COUNT(*) FROM llm_usage GROUP BY model") == [("stub-model", 2)]
