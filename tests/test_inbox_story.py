"""inbox.py show:一张工单的经过(事件、模型调用、第一版草稿、每轮意见和重写、决定、发件箱),课文走一遍之后的几种工单。"""
import json

import pytest
from conftest import cli, rows
from test_inbox import T1041_FIRST_REDRAFT, everything, queue

import config

FEEDBACK = "语气再软一点,先道歉"
EDITED = "您好,重复扣的那一笔已经原路退回,请留意银行短信。"
T1003_TEXT = ("谢谢小周老师的耐心帮助:上周五你们的实施顾问小周远程帮我们把去年的旧数据从 Excel 迁移进系统，前后忙了快两个小时，"
              "一点都不急躁。我们店里几个人都说服务太好了，特意留言道个谢，也祝团队工作顺利！这条不用回复哈。")
T1003_DRAFT = "您好,我们已经收到您的消息,相关同事会尽快查看并回复您。感谢您的耐心。"


@pytest.fixture
def walked(any_lab):
    """课文走一遍:T1012 accept,T1041 先 respond 再 edit,T1003 ignore(都由 alice),T9999 进死信,T1020 还等在收件箱里。"""
    queue("T1012", "T1041", "T1003", "T9999", "T1020")
    for args in (["accept", "T1012"], ["respond", "T1041", FEEDBACK], ["edit", "T1041", EDITED], ["ignore", "T1003"]):
        assert cli(["inbox.py", *args], {**any_lab, "INBOX_USER": "alice"}).returncode == 0
    return any_lab


def show(env: dict, *args: str):
    return cli(["inbox.py", "show", *args], env)


def stamps(table: str, column: str, ticket_id: str) -> list[str]:
    """这张工单在 table 里各行的 column(时间),照 show 打印的样子。"""
    return [str(v) for v, in rows(f"SELECT {column} FROM {table} WHERE ticket_id = ? ORDER BY 1", (ticket_id,))]


def test_show_of_an_ignored_ticket_prints_its_whole_story(walked):
    r = show(walked, "T1003")
    (received,), (called,), (decided,) = (stamps("events", "received_at", "T1003"), stamps("llm_usage", "created_at", "T1003"),
                                          stamps("review_log", "created_at", "T1003"))
    *tokens, took_ms = rows("SELECT input_tokens, output_tokens, duration_ms FROM llm_usage WHERE ticket_id = 'T1003'")[0]
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (f"T1003  {T1003_TEXT}\n"
                        "事件\n"
                        f"        evt_T1003_created  webhook ticket.created  收到 {received}  尝试 1 次  ignored\n"
                        "模型调用\n"
                        f"        {called}  offline-cloudledger  输入 {tokens[0]} / 输出 {tokens[1]} token  "
                        f"约 ¥{sum(tokens) / 1000 * config.value('LLM_PRICE_PER_1K_TOKENS'):.4f}  用时 {took_ms / 1000:.2f} 秒\n"
                        "草稿\n"
                        f"        第一版:{T1003_DRAFT}\n"
                        "决定\n"
                        f"        ignore  alice  {decided}\n")


def test_show_of_a_ticket_redrafted_then_edited_gives_the_feedback_the_redraft_edit_and_the_sent_text(walked):
    r = show(walked, "T1041")
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr
    assert lines[lines.index("草稿") + 2:lines.index("决定")] == [f"        意见 1:{FEEDBACK}",
                                                               f"        重写 1:{T1041_FIRST_REDRAFT}"]
    assert len([line for line in lines if "offline-cloudledger" in line]) == 2  # 第一版和按意见重写的那一版
    assert lines[lines.index("决定") + 1] == f"        edit  alice  {stamps('review_log', 'created_at', 'T1041')[0]}"
    assert lines[lines.index("发件箱") + 1:] == [f"        {stamps('outbox', 'sent_at', 'T1041')[0]}  agent+reviewer",
                                                f"        {EDITED}"]


def test_show_of_a_dead_ticket_says_why_and_that_nothing_was_decided(walked):
    r = show(walked, "T9999")
    (received,) = stamps("events", "received_at", "T9999")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == ("T9999  (还没有读到工单)\n事件\n"
                        f"        evt_T9999_created  webhook ticket.created  收到 {received}  尝试 1 次  dead\n"
                        "        原因:PermanentError: 工单不存在:T9999\n"
                        "模型调用:没有\n决定:没有\n")


def test_show_of_a_waiting_ticket_says_it_waits_and_changes_nothing(walked):
    before = everything("T1020")
    r = show(walked, "T1020")
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("决定:还在收件箱里等人处理\n") and "发件箱" not in r.stdout
    assert everything("T1020") == before


def test_show_json_is_the_same_story_as_one_document(walked):
    r = show(walked, "T1041", "--json")
    story = json.loads(r.stdout)
    assert (r.returncode, r.stderr) == (0, "")
    assert list(story) == ["ticket_id", "ticket_text", "events", "model_calls", "first_draft", "rounds", "waiting",
                           "decision", "outbox"]
    assert [(e["event_id"], e["status"], e["attempts"]) for e in story["events"]] == [("evt_T1041_created", "done", 1)]
    assert [(c["model"], c["fallback"], type(c["duration_ms"])) for c in story["model_calls"]] == [
        ("offline-cloudledger", False, int)] * 2
    assert [(r["feedback"], r["redraft"]["reply"]) for r in story["rounds"]] == [(FEEDBACK, T1041_FIRST_REDRAFT)]
    assert (story["waiting"], story["decision"]["action"], story["decision"]["reviewer"], story["decision"]["final"],
            story["outbox"]["body"]) == (False, "edit", "alice", EDITED, EDITED)


def test_show_of_an_unknown_ticket_says_it_is_not_there_exits_1_and_changes_nothing(walked):
    before = everything("T1012")
    r = show(walked, "T7777")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.endswith("T7777 不在收件箱里,事件表和 checkpoint 里也没有它:工单号写错了,或者还没有事件进来\n")
    assert everything("T1012") == before


@pytest.mark.parametrize("args, problem", [
    (["show"], "show 需要工单号"),
    (["show", "T1041", "T1012"], "show 的参数太多了;文字里有空格时请用引号括起来"),
    (["list", "--json"], "不认识的选项:--json"),
])
def test_show_written_wrong_prints_usage_exits_2_and_changes_nothing(walked, args, problem):
    before = everything("T1041")
    r = cli(["inbox.py", *args], walked)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(problem) and "inbox.py show    T1041 [--json]" in r.stderr
    assert everything("T1041") == before
