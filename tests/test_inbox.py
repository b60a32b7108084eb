"""命令行收件箱:四种处理、多轮 respond、通知类待办、重写上限、拒绝坏输入、崩溃后对账、并发。"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import (LAB, checkpoint_bytes, cli, cut_at, dead_owner, die_at, die_before_checkpoint, drain, free_port,
                      imported_at_exit, rows, run, write_locked)
from openai_stub import OpenAIStub

import inbox as inbox_mod
import inbox_repair
import store
import store_biz
import store_errors
import store_events
import store_inbox
import store_sqlite
import worker_owner
from agent import opened_graph, send, thread_of

T1041_FEEDBACK = "这张已确认是重复扣款,直接告诉客户退款申请已提交、原路退回,别写金额"
T1041_EDIT = "您好,已确认 10 月 8 日的 INV-2026-0123 是重复扣款,退款申请已提交,会原路退回,到账时间以支付渠道为准。给您添麻烦了。"
# 离线模型的草稿是确定的:list 的每一条整行比较
T1012_ITEM = ("T1012  [invoice] 客户反映:电子发票抬头写错需要重开\n        草稿:您好,关于发票的问题,我们已记录您的开票信息,"
              "财务同事核对后会为您重新处理,处理完成后电子发票会发送到您的预留邮箱。感谢您的耐心。\n")
T1041_ITEM = ("T1041  [refund] 客户反映:同一笔账单被扣了两次\n        草稿:您好,关于您提到的扣款和退款问题,我们已转交财务核实扣款记录,"
              "核实后会按原支付渠道处理,进度会在 1–3 个工作日内通过工单告知您。感谢您的耐心。\n")
T1003_ITEM = "T1003  [other] 客户反映:谢谢小周老师的耐心帮助\n        草稿:您好,我们已经收到您的消息,相关同事会尽快查看并回复您。感谢您的耐心。\n"
SORRY = "您好,非常抱歉给您添了麻烦。"  # 意见里要道歉时,重写的草稿这样开头
def test_a_notice_about_a_long_ticket_shows_the_word_that_triggered_it_and_says_it_is_cut(lab):
    """通知主管的待办给工单的前 200 个字,之后再摘出那个词前后各 40 个字,说一共多少字:只给前 200 个字、不说截了的话,
    「律师」写在一长段日志后面时,通知说「工单提到『律师』」,主管在下面却找不到它,又只能 ignore。"""
    log = "日志" * 150
    body = f"导出报表失败,日志如下:{log}再不解决我们就找律师起诉你们"
    conn = store.connect(store.biz_target())
    conn.execute("UPDATE tickets SET body = ? WHERE id = 'T1012'", (body,))
    conn.close()
    queue("T1012")
    text = f"{store_biz.ticket('T1012')['subject']}:{body}"  # 工单原文:标题:正文
    at = text.index("律师")
    r = inbox(lab, "list")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [
        "T1012  【通知】[invoice] 工单提到「律师」,Agent 没有起草回复,请主管看一下",
        f"        工单:{text[:200]}……{text[at - 40:]}(工单共 {len(text)} 字,这里没有全部显示)",
        "        只能 ignore(看过即可)"]


AFTER_FEEDBACK = "到账或处理时间以实际渠道为准,给您添麻烦了。"  # 按意见重写的退款草稿这样结尾
ONLY_HELP = "(inbox.py 只有 -h / --help 一个选项;工单号或文字真的以 - 开头时,写在 -- 后面,比如 inbox.py accept -- -A7)"
AFTER_SORRY = "到账或处理时间以实际渠道为准,感谢您的耐心。"  # 开头已经道过歉的:不再说一遍「给您添麻烦了」


def queue(*tickets: str) -> None:
    for t in tickets:
        payload = json.dumps({"id": f"evt_{t}_created", "type": "ticket.created", "data": {"ticket_id": t}})
        store.add_event(f"evt_{t}_created", "webhook", "ticket.created", payload)
    drain()


def inbox(env, *args, **kw) -> subprocess.CompletedProcess:
    return cli(["inbox.py", *args], env, **kw)


def state(ticket_id: str) -> dict:
    with opened_graph() as graph:
        return graph.get_state(thread_of(ticket_id)).values


def test_list_accept_edit_and_ignore_do_not_import_the_model_client(lab):
    """list、accept、edit、ignore 不调模型,也就不导入 openai 和 langchain-openai(要半秒多);respond 重写草稿时才导入。"""
    queue("T1012", "T1041", "T1003")
    model = imported_at_exit("openai", "langchain_openai")
    assert run([*model, "inbox.py", "list"], lab).stdout == T1012_ITEM + T1041_ITEM + T1003_ITEM + "[]\n"
    for args, out in ((["accept", "T1012"], "T1012 → sent"), (["edit", "T1041", "您好,已为您处理。"], "T1041 → sent"),
                      (["ignore", "T1003"], "T1003 → ignored")):
        r = run([*model, "inbox.py", *args], lab)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"{out}\n[]\n", "")


def test_four_decisions_end_as_in_the_lesson(any_lab):
    queue("T1012", "T1041", "T1003", "T9999")
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, T1012_ITEM + T1041_ITEM + T1003_ITEM, "")
    t1012_draft = T1012_ITEM.splitlines()[1].removeprefix("        草稿:")

    accept = inbox(any_lab, "accept", "T1012")
    assert (accept.returncode, accept.stdout) == (0, "T1012 → sent\n")
    respond = inbox(any_lab, "respond", "T1041", T1041_FEEDBACK)
    assert (respond.returncode, respond.stdout) == (  # 照意见写,「别写金额」没有原样写进去
        0, f"已按意见重写,新草稿: 您好,您这笔扣款已确认是重复扣款,退款申请已提交、原路退回。{AFTER_FEEDBACK}\n")
    assert respond.stderr.startswith("[llm] 没有设置 LLM_API_KEY,使用离线模型") and respond.stderr.count("\n") == 1
    edit = inbox(any_lab, "edit", "T1041", T1041_EDIT)
    assert (edit.returncode, edit.stdout) == (0, "T1041 → sent\n")
    ignore = inbox(any_lab, "ignore", "T1003")
    assert (ignore.returncode, ignore.stdout) == (0, "T1003 → ignored\n")

    assert rows("SELECT event_id, status, attempts FROM events ORDER BY received_at") == [
        ("evt_T1012_created", "done", 1), ("evt_T1041_created", "done", 1),
        ("evt_T1003_created", "ignored", 1), ("evt_T9999_created", "dead", 1)]
    assert rows("SELECT ticket_id, body, sent_by FROM outbox ORDER BY id") == [
        ("T1012", t1012_draft, "agent+reviewer"), ("T1041", T1041_EDIT, "agent+reviewer")]
    # 练习 4:review_log
    log = {r[0]: r[1:] for r in rows("SELECT ticket_id, category, draft, final, action, feedback FROM review_log")}
    assert log["T1012"] == ("invoice", t1012_draft, t1012_draft, "accept", "[]")
    category, draft, final, action, feedback = log["T1041"]
    assert (category, final, action, json.loads(feedback)) == ("refund", T1041_EDIT, "edit", [T1041_FEEDBACK])
    assert draft == T1041_ITEM.splitlines()[1].removeprefix("        草稿:")  # 模型原稿是第一版,不是重写的那版
    assert log["T1003"][3:] == ("ignore", "[]") and log["T1003"][2] is None
    # 自测 6:只有 respond 会再调模型 —— accept、edit、ignore 都不调(T1041 是起草一次 + 重写一次)
    assert rows("SELECT ticket_id, COUNT(*) FROM llm_usage GROUP BY ticket_id ORDER BY ticket_id") == [
        ("T1003", 1), ("T1012", 1), ("T1041", 2)]
    assert inbox(any_lab, "list").stdout == "收件箱是空的\n"


def test_several_respond_rounds_then_accept_sends_the_last_redraft(lab):
    queue("T1041")
    first = inbox(lab, "respond", "T1041", "语气再软一点,先道歉")
    second = inbox(lab, "respond", "T1041", "告诉客户退款申请已提交")
    # 「先道歉」是给起草人的指令:开头道歉,不把这三个字原样写进回复;第二轮在第一轮的基础上照意见写
    assert (first.returncode, first.stdout) == (0, f"已按意见重写,新草稿: {SORRY}关于您提到的扣款和退款问题,我们已转交财务"
                                                   f"核实扣款记录,核实后会按原支付渠道处理,进度会在 1–3 个工作日内通过工单告知您。"
                                                   f"{AFTER_SORRY}\n")
    last = f"{SORRY}退款申请已提交。{AFTER_SORRY}"
    assert (second.returncode, second.stdout) == (0, f"已按意见重写,新草稿: {last}\n")
    assert inbox(lab, "approve", "T1041").stdout == "T1041 → sent\n"  # LangChain v1 的叫法 approve = accept
    assert rows("SELECT body FROM outbox") == [(last,)]
    assert state("T1041")["feedback"] == ["语气再软一点,先道歉", "告诉客户退款申请已提交"]
    assert rows("SELECT COUNT(*) FROM llm_usage WHERE ticket_id = 'T1041'") == [(3,)]  # 起草 1 次 + 重写 2 次


def test_pii_in_respond_feedback_is_masked_before_it_is_stored_anywhere(any_lab):
    """中间件笔记「脱敏在入口做」:意见进模型之前打码还不够。收件箱把意见当作 Command(resume=…) 交给 LangGraph
    之前就打码:交出去的若是原文,LangGraph 会把它原样存进 checkpoint 的 writes(__resume__)、一直留着。"""
    queue("T1041")
    note = "客户留的电话 138-1234-5678,邮箱 caiwu.xie@example.com,身份证 110101199003071234,请提一下会回电"
    masked = "客户留的电话 138****5678,邮箱 c***@example.com,身份证 110101********1234,请提一下会回电"
    r = inbox(any_lab, "respond", "T1041", note)
    assert (r.returncode, r.stdout.startswith("已按意见重写,新草稿: ")) == (0, True)
    assert inbox(any_lab, "accept", "T1041").stdout == "T1041 → sent\n"
    assert state("T1041")["feedback"] == [masked]
    assert rows("SELECT feedback FROM review_log") == [(json.dumps([masked], ensure_ascii=False),)]
    stored = checkpoint_bytes()
    for secret in ("138-1234-5678", "caiwu.xie", "110101199003071234"):
        assert secret.encode() not in stored
        assert secret not in rows("SELECT body FROM outbox")[0][0]
    assert masked.encode() in stored  # 查的地方没查错:打过码的意见确实在里面


def test_reject_alias_ignores(lab):
    queue("T1003")
    assert inbox(lab, "reject", "T1003").stdout == "T1003 → ignored\n"
    assert rows("SELECT status FROM events") == [("ignored",)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


def test_redraft_cap_is_refused_even_after_a_restart(any_lab):
    """每次 inbox.py 都是新进程:计数在 graph state 里,进程重启不清零。"""
    queue("T1012")
    env = {**any_lab, "MAX_REDRAFTS": "2"}
    for note in ("先道歉", "再简短一点"):
        assert inbox(env, "respond", "T1012", note).returncode == 0
    refused = inbox(env, "respond", "T1012", "再改一次")
    assert refused.returncode == 1
    assert refused.stderr == "T1012 已经按意见重写了 2 次,到上限了,不能再 respond;现在可以:accept / edit / ignore\n"
    assert "已按意见重写 2 次,到上限了:只能 accept / edit / ignore" in inbox(env, "list").stdout
    assert state("T1012")["feedback"] == ["先道歉", "再简短一点"]
    assert rows("SELECT status FROM events") == [("waiting_human",)]
    assert inbox(env, "accept", "T1012").stdout == "T1012 → sent\n"


@pytest.mark.parametrize("before, after", [("3", "0"), ("0", "3")])
def test_changing_the_redraft_cap_keeps_the_waiting_item_as_it_was_shown(lab, monkeypatch, before, after):
    """待办给人看到时允许不允许 respond,处理时就照那个来:MAX_REDRAFTS 后来改了,只管以后起草的待办。
    review 不按新的上限重算:那样会和收件箱事先核对的不一致,respond 在图里被拒,这个回答还被 LangGraph 和出错的
    review 绑在一起存下,下一次 respond 拿到的是这一次的旧意见。"""
    monkeypatch.setenv("MAX_REDRAFTS", before)
    queue("T1041")  # worker 在这个进程里起草:用的是当时的上限
    listing = inbox({**lab, "MAX_REDRAFTS": before}, "list").stdout
    env = {**lab, "MAX_REDRAFTS": after}
    assert inbox(env, "list").stdout == listing  # 上限改了,列出的还是同一条待办
    first = inbox(env, "respond", "T1041", "先道歉")
    if before == "0":  # 看到时就不允许 respond:拒绝,什么都没动
        assert (first.returncode, first.stdout) == (1, "")
        assert first.stderr == ("T1041 起草时 MAX_REDRAFTS=0,没有按意见重写这一项,不能 respond;"
                                "现在可以:accept / edit / ignore\n")
        assert "        起草时 MAX_REDRAFTS=0,没有按意见重写这一项:只能 accept / edit / ignore\n" in listing
        assert state("T1041")["feedback"] == []
        assert rows("SELECT COUNT(*) FROM llm_usage") == [(1,)]
    else:  # 看到时允许:照常重写;新的上限 0 从这一版起算,不能再 respond
        assert (first.returncode, first.stderr.count("\n")) == (0, 1)
        assert first.stdout.startswith(f"已按意见重写,新草稿: {SORRY}")
        again = inbox(env, "respond", "T1041", "告诉客户退款申请已提交")
        assert (again.returncode, again.stdout) == (1, "")
        assert again.stderr == "T1041 已经按意见重写了 1 次,到上限了,不能再 respond;现在可以:accept / edit / ignore\n"
        assert state("T1041")["feedback"] == ["先道歉"]
        assert rows("SELECT COUNT(*) FROM llm_usage") == [(2,)]
    assert rows("SELECT status, claimed_by FROM events") == [("waiting_human", None)]
    edit = inbox(env, "edit", "T1041", T1041_EDIT)
    assert (edit.returncode, edit.stdout) == (0, "T1041 → sent\n")
    assert rows("SELECT ticket_id, body FROM outbox") == [("T1041", T1041_EDIT)]


@pytest.mark.parametrize("ticket, args, refused", [
    ("T1010", ["accept"], "【通知】[refund] 工单提到「投诉到」,Agent 没有起草回复,请主管看一下"
                          "(上一个回答不能用:这条待办不接受 'accept',允许的是 ['ignore'])"),
    ("T1041", ["respond", "先道歉"], "[refund] 客户反映:同一笔账单被扣了两次"
                                   "(上一个回答不能用:这条待办不接受 'response',允许的是 ['accept', 'edit', 'ignore'])"),
])
def test_an_answer_the_graph_refuses_after_the_inbox_let_it_through_leaves_the_item_usable(lab, monkeypatch, capsys,
                                                                                           ticket, args, refused):
    """收件箱的核对和图里的不一致时(按说不会:比如升级前起草的待办),图不接受、再问一次;收件箱照实说没处理成,
    不说「已按意见重写」,待办留在收件箱里,接下来能用的处理照常生效。这里让收件箱的核对什么都放过来模拟。"""
    monkeypatch.setenv("MAX_REDRAFTS", "0")
    queue(ticket)
    capsys.readouterr()  # worker 那一行
    checked = inbox_mod.allowed
    monkeypatch.setattr(inbox_mod, "allowed", lambda item: ["accept", "edit", "response", "ignore"])
    assert inbox_mod.main([args[0], ticket, *args[1:]]) == 1
    assert capsys.readouterr() == ("", f"{ticket} 这次没有处理成:{refused};仍在收件箱里\n")
    assert rows("SELECT status, claimed_by FROM events") == [("waiting_human", None)]
    assert state(ticket)["feedback"] == []
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)] and rows("SELECT COUNT(*) FROM review_log") == [(0,)]
    monkeypatch.setattr(inbox_mod, "allowed", checked)
    assert inbox_mod.main(["ignore", ticket]) == 0
    assert capsys.readouterr().out == f"{ticket} → ignored\n"
    assert rows("SELECT status FROM events") == [("ignored",)]


def test_notify_item_only_allows_ignore(lab):
    """练习 5:正文里有「投诉到」的工单(种子数据 T1010)不起草,只通知;accept/edit/respond 被拒。"""
    queue("T1010")
    assert rows("SELECT COUNT(*) FROM llm_usage") == [(0,)]  # 没调模型
    listing = inbox(lab, "list").stdout.splitlines()
    assert listing == ["T1010  【通知】[refund] 工单提到「投诉到」,Agent 没有起草回复,请主管看一下",
                       "        工单:退款申请一个多月无人处理:9 月 3 日我就提交了退款申请，理由是试用期内功能不符合需求，"
                       "你们官网写明试用期内不满意可以全额退。到现在一个多月了，工单没人跟进，打电话也只说在处理。"
                       "再不处理我就投诉到12315。",  # 没有草稿可看:给主管看工单原文(已脱敏)
                       "        只能 ignore(看过即可)"]
    for command, text in (("accept", None), ("edit", "随便回一句"), ("respond", "写个回复")):
        r = inbox(lab, command, "T1010", *([text] if text else []))
        assert (r.returncode, r.stdout) == (1, "")
        assert r.stderr == f"T1010 是通知类待办,Agent 没有起草回复,不能 {command};只能 ignore(看过即可)\n"
    assert rows("SELECT status, claimed_by FROM events") == [("waiting_human", None)]
    assert state("T1010").get("feedback") == []  # 被拒的 respond 没有留下意见
    assert rows("SELECT COUNT(*) FROM review_log") == [(0,)]
    assert rows("SELECT COUNT(*) FROM llm_usage") == [(0,)]
    assert inbox(lab, "ignore", "T1010").stdout == "T1010 → ignored\n"
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    # 记成 notify,不是 ignore:日报的批准率只算有草稿可批的待办
    assert rows("SELECT ticket_id, category, draft, final, action, feedback FROM review_log") == [
        ("T1010", "refund", "", None, "notify", "[]")]


@pytest.mark.parametrize("args, message", [
    ([], "缺少子命令"),
    (["send", "T1012"], "不认识的子命令:send"),
    (["accept"], "accept 需要工单号"),
    (["edit", "T1012"], "edit 需要第三个参数:改好的回复全文(不能为空)"),
    (["respond", "T1012", "   "], "respond 需要第三个参数:给 Agent 的意见(不能为空)"),
    (["respond", "T1012", "语气", "软一点"], "respond 的参数太多了;文字里有空格时请用引号括起来"),
    (["list", "extra"], "list 不带参数"),
    (["accept", "T1012", "好的"], "accept 的参数太多了;文字里有空格时请用引号括起来"),
    (["reject", "T1012", "不回"], "reject 的参数太多了;文字里有空格时请用引号括起来"),
    (["restart"], "restart 需要工单号"),
    (["restart", "T1012", " "], "restart 的工单号不能是空的(第 2 个)"),
    (["restart", "T1012", "--all"], "不认识的选项:--all" + ONLY_HELP),
    (["edit", "T1012", "--"], "edit 需要第三个参数:改好的回复全文(不能为空)"),  # 不把「--」当回复发给客户
    (["accept", "--"], "accept 需要工单号"),
])
def test_bad_command_line_prints_usage_and_exits_2_and_changes_nothing(lab, args, message):
    queue("T1012")
    r = inbox(lab, *args)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"{message}\n用法:{inbox_mod.USAGE}\n")
    assert "uv run python inbox.py respond T1012" in inbox_mod.USAGE
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert rows("SELECT status FROM events") == [("waiting_human",)]
    assert state("T1012").get("feedback") == []


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_usage_and_touches_nothing(lab, flag):
    queue("T1012")
    r = inbox(lab, flag)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"用法:{inbox_mod.USAGE}\n", "")
    assert rows("SELECT status, claimed_by FROM events") == [("waiting_human", None)]


def everything(ticket_id: str) -> tuple:
    """收件箱命令可能动到的一切:事件表、发件箱、审核记录、「谁看过哪一版」、模型用量(都是整张表)和这张工单的图。"""
    tables = ("events", "outbox", "review_log", "inbox_seen", "llm_usage")
    return tuple(rows(f"SELECT * FROM {t} ORDER BY 1") for t in tables) + (state(ticket_id),)


def refused_as_usage(r: subprocess.CompletedProcess, message: str) -> None:
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"{message}\n用法:{inbox_mod.USAGE}\n")


NOT_UTF8 = "参数里有不是 UTF-8 的字节:终端的编码多半不是 UTF-8(比如 GBK),什么都没有改;把终端改成 UTF-8 再试"


@pytest.mark.parametrize("args", [
    [b"edit", b"T1008", "您好,已经退款".encode("gbk")],  # GBK 终端里敲的字
    [b"edit", b"T1008", b"\xff\xfe"],
    [b"respond", b"T1008", b"\xff"],
    [b"respond", b"T1008", "语气软一点".encode() + b"\xa1"],  # 前面都对,只坏了最后一个字节
    [b"accept", b"T1008\xa3"],
    [b"\xb7\xa2\xcb\xcd", b"T1008"],  # 子命令「发送」的 GBK
])
def test_arguments_that_are_not_utf8_are_refused_before_the_database_and_the_worker_sends_nothing(any_lab, args):
    """碰数据库之前就拒绝,说清多半是终端编码不对;之后 worker 跑一遍也什么都不发。不然 edit 会报 UnicodeEncodeError、
    把事件交回 worker,下一次 worker 给客户发出一串「????」;respond 会先把草稿重写了才崩出 traceback。"""
    queue("T1008")
    before = everything("T1008")
    refused_as_usage(inbox(any_lab, *args), NOT_UTF8)
    assert everything("T1008") == before
    worker = cli(["worker.py", "--once"], any_lab)
    assert (worker.returncode, worker.stdout) == (0, "")
    assert everything("T1008") == before
    assert rows("SELECT status FROM events") == [("waiting_human",)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


@pytest.mark.parametrize("command, text", [
    ("edit", "\x01\x02"),
    ("edit", "\u200b"),
    ("edit", " \ufeff\u3000\u200b\n"),  # BOM、全角空格、零宽空格、换行
    ("respond", "\u3000\u200d\t"),
    ("respond", "\x01 \u3000\u2060"),
])
def test_text_with_only_invisible_characters_is_refused_as_empty_and_nothing_is_sent(lab, command, text):
    queue("T1012")
    before = everything("T1012")
    what = "改好的回复全文" if command == "edit" else "给 Agent 的意见"
    refused_as_usage(inbox(lab, command, "T1012", text), f"{command} 需要第三个参数:{what}(不能为空)")
    assert everything("T1012") == before
    assert drain() == []
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


@pytest.mark.parametrize("command, text, shown", [
    ("edit", "您好,已经\x01退款", "\\x01"),
    ("edit", "您好,已经退款\x7f", "\\x7f"),
    ("respond", "语气软一点\x1b[0m", "\\x1b"),
    ("edit", "您好,发票已重开\x85请查收", "\\x85"),
    ("edit", "您好,\x9b31m已处理", "\\x9b"),
    ("respond", "别说\x92退款\x93", "\\x92"),
])
def test_text_with_a_control_character_is_refused_naming_it_and_nothing_is_sent(lab, command, text, shown):
    queue("T1012")
    before = everything("T1012")
    refused_as_usage(inbox(lab, command, "T1012", text),
                     f"{command} 的文字里有控制字符 {shown}(多半是复制粘贴或按错键带进来的),客户那边看到的会是乱码;删掉再试")
    assert everything("T1012") == before
    assert drain() == []


@pytest.mark.parametrize("command", ["edit", "respond"])
def test_text_longer_than_the_limit_is_refused_with_its_length_and_nothing_is_sent(lab, command):
    """整封邮件往来粘贴进来:edit 会原样发给客户,respond 会在之后每次重写时都进提示词。"""
    queue("T1012")
    before = everything("T1012")
    text = "  " + "您" * 2001 + "\n"  # 首尾的空白不算
    refused_as_usage(inbox(lab, command, "T1012", text),
                     f"{command} 的文字有 2001 个字,最多 2000 个(INBOX_MAX_TEXT_CHARS):多半是多粘贴了一段;什么都没有改")
    assert everything("T1012") == before
    assert drain() == []
    short = inbox({**lab, "INBOX_MAX_TEXT_CHARS": "5"}, command, "T1012", text)
    refused_as_usage(short, f"{command} 的文字有 2001 个字,最多 5 个(INBOX_MAX_TEXT_CHARS):多半是多粘贴了一段;什么都没有改")
    assert everything("T1012") == before


def test_a_respond_at_the_limit_that_grows_when_masked_is_refused_by_the_inbox_not_half_way(lab):
    """2000 个字的意见里有一个 16 位卡号:打码后是 2003 个字,图的 review 会拒绝。收件箱按打码后的长度核对,
    一开始就说是打码后的长度,什么都不动;按打码前的长度放行的话,会拿走待办、跑图,最后说「这次没有处理成」。"""
    queue("T1012")
    before = everything("T1012")
    text = "您" * 1984 + "6222021234567890"
    assert len(text) == 2000
    refused_as_usage(inbox(lab, "respond", "T1012", text),
                     "respond 的文字有 2003 个字(手机号、卡号之类打码之后),最多 2000 个(INBOX_MAX_TEXT_CHARS):"
                     "多半是多粘贴了一段;什么都没有改")
    assert everything("T1012") == before
    assert drain() == []


def test_text_exactly_at_the_limit_is_sent_whole(lab):
    queue("T1012")
    text = "您" * 2000
    r = inbox(lab, "edit", "T1012", f" {text} ")
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id, body FROM outbox") == [("T1012", text)]


@pytest.mark.parametrize("args, option", [
    (["edit", "T1012", "--force"], "--force"),  # 不把「--force」当回复发给客户
    (["respond", "T1012", "-v"], "-v"),
    (["accept", "-f"], "-f"),
    (["ignore", "--dry-run"], "--dry-run"),
    (["accept", "T1012", "--force"], "--force"),
    (["edit", "--force", "您好,已经退款"], "--force"),
    (["list", "--all"], "--all"),
    (["edit", "T1012", "-"], "-"),
    (["edit", "T1012", "--reply=您好,发票已重开"], "--reply=您好,发票已重开"),  # 不原样发给客户
    (["respond", "T1012", "--dry_run"], "--dry_run"),  # 不当意见交给模型、写进草稿
    (["edit", "T1012", "--reply=您好 发票已重开"], "--reply=您好 发票已重开"),
])
def test_an_option_in_the_ticket_or_text_position_is_refused_and_nothing_is_sent(lab, args, option):
    queue("T1012")
    before = everything("T1012")
    refused_as_usage(inbox(lab, *args), f"不认识的选项:{option}" + ONLY_HELP)
    assert everything("T1012") == before
    assert drain() == []


def copy_ticket(source: str, *new_ids: str) -> None:
    """业务库里照 source 再建几张工单,换个工单号(外部业务库里的工单号不一定是 T 开头)。"""
    conn = store.connect(store.biz_target())
    for new_id in new_ids:
        conn.execute("INSERT INTO tickets (id, customer_id, subject, body, status, created_at) "
                     "SELECT ?, customer_id, subject, body, status, created_at FROM tickets WHERE id = ?", (new_id, source))
    conn.close()


def test_after_double_dash_a_ticket_id_starting_with_a_dash_is_handled_and_a_plain_one_too(lab):
    """webhook 收得下 -A7、--x9 这样的工单号(ticket_id 允许 A-Z a-z 0-9 _ -),worker 照常起草,list 也列出来;
    收件箱照 Unix 的老规矩把它们写在 -- 后面就能处理,不一律说它们是「不认识的选项」、哪个命令都处理不了(-- 本身也不拒)。"""
    copy_ticket("T1012", "-A7", "--x9")
    queue("-A7", "--x9", "T1012")
    r = inbox(lab, "accept", "--", "-A7")
    assert (r.returncode, r.stdout, r.stderr) == (0, "-A7 → sent\n", "")
    r = inbox(lab, "edit", "--", "--x9", "--您好,已经处理好了")
    assert (r.returncode, r.stdout, r.stderr) == (0, "--x9 → sent\n", "")
    r = inbox(lab, "accept", "--", "T1012")
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id, body FROM outbox WHERE ticket_id LIKE '-%' ORDER BY ticket_id") == [
        ("--x9", "--您好,已经处理好了"), ("-A7", state("-A7")["draft"]["reply"])]
    assert rows("SELECT event_id, status FROM events ORDER BY event_id") == [
        ("evt_--x9_created", "done"), ("evt_-A7_created", "done"), ("evt_T1012_created", "done")]


def test_restart_hint_for_a_ticket_id_starting_with_a_dash_puts_it_after_double_dash(lab):
    """checkpoint 库丢了时,提示里让人照着敲的 restart 命令:以 - 开头的工单号写在 -- 后面,照着敲就能用。"""
    copy_ticket("T1012", "-A7")
    queue("-A7")
    lose_checkpoints(lab)
    r = inbox(lab, "list")
    assert r.returncode == 1
    assert r.stderr.rstrip("\n").endswith("运行 uv run python inbox.py restart -- -A7 让 worker 从头重新起草)"), r.stderr
    r = inbox(lab, "restart", "--", "-A7")
    assert (r.returncode, r.stdout, r.stderr) == (
        0, "-A7 已交回 worker 从头起草(checkpoint 库里找不到它,worker 会再调一次模型)\n", "")
    assert rows("SELECT event_id, status FROM events") == [("evt_-A7_created", "pending")]


def test_control_characters_in_ticket_text_and_typed_ids_are_shown_escaped_not_sent_to_the_terminal(lab):
    """客户邮件里的「\\x9b8m」(C1 的 CSI:把后面的字藏起来)和命令行上敲错的工单号里的 ESC[2J(清屏)都写成 \\xNN,
    不原样打到终端上:不然主管在通知里正好看不见「我就找律师」,敲错的工单号一回显就清了屏。"""
    conn = store.connect(store.biz_target())
    conn.execute("UPDATE tickets SET body = ? WHERE id = 'T1010'", ("再不退款\x9b8m我就找律师\x9b0m",))
    conn.close()
    queue("T1010")
    r = inbox(lab, "list")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[1] == "        工单:退款申请一个多月无人处理:再不退款\\x9b8m我就找律师\\x9b0m"
    r = inbox(lab, "accept", "T10\x1b[2J10")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "T10\\x1b[2J10 不在收件箱里(已经处理过,或者还没轮到 worker)\n")
    assert rows("SELECT event_id, status FROM events") == [("evt_T1010_created", "waiting_human")]


def test_a_full_width_ticket_id_gets_the_did_you_mean_hint(lab):
    """中文输入法全角模式下敲的 Ｔ１０１２:提示「是不是 T1012?」,不只说「不在收件箱里(已经处理过……)」,好像这张已经处理过了。"""
    queue("T1012")
    r = inbox(lab, "accept", "Ｔ１０１２")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "Ｔ１０１２ 不在收件箱里(已经处理过,或者还没轮到 worker);是不是 T1012?\n")
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "waiting_human")]


@pytest.mark.parametrize("typed", ["T1012\u200b", "\ufeffT1012", "T10\u200d12 "])
def test_a_ticket_id_copied_with_invisible_characters_is_the_ticket_it_looks_like(lab, typed):
    """从聊天软件、网页、带 BOM 的文件里复制来的工单号夹着零宽字符:去掉这些看不见的字符,就是它看上去的那张。
    不然 list 刚列出 T1012,accept 却说「T1012 不在收件箱里」,看上去一模一样,也没有「是不是」的提示。"""
    queue("T1012")
    r = inbox(lab, "accept", typed)
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "done")]
    assert rows("SELECT ticket_id FROM outbox") == [("T1012",)]
    again = inbox(lab, "restart", typed)  # restart 也一样认(这里它已经处理完了)
    assert again.returncode == 1 and again.stderr.startswith("T1012 ")


@pytest.mark.parametrize("reply", [
    "- 第一步:在「设置—订阅管理」里关掉自动续费\n- 第二步:把扣款截图发给我们",
    "-5 元已退回,请查收",
    "-5元已退回,请查收",
    "--\t客服小周",
])
def test_a_reply_that_merely_starts_with_a_dash_is_sent_as_written(lab, reply):
    queue("T1012")
    r = inbox(lab, "edit", "T1012", reply)
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id, body FROM outbox") == [("T1012", reply)]
    assert rows("SELECT status FROM events") == [("done",)]


def test_feedback_that_merely_starts_with_a_dash_is_taken_as_feedback(lab):
    queue("T1041")
    r = inbox(lab, "respond", "T1041", "- 先道歉")
    assert (r.returncode, r.stdout.startswith(f"已按意见重写,新草稿: {SORRY}")) == (0, True)
    assert state("T1041")["feedback"] == ["- 先道歉"]
    assert rows("SELECT status FROM events") == [("waiting_human",)]


@pytest.mark.parametrize("args", [
    ["accept", "--help"],  # 不说「--help 不在收件箱里」
    ["edit", "T1012", "-h"],
    ["respond", "T1012", "--help"],
    ["edit", "--help", "您好,已经退款"],
    ["list", "-h"],
    ["send", "--help"],
])
def test_help_anywhere_on_the_command_line_prints_usage_and_touches_nothing(lab, args):
    queue("T1012")
    before = everything("T1012")
    r = inbox(lab, *args)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"用法:{inbox_mod.USAGE}\n", "")
    assert everything("T1012") == before


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_while_the_inbox_is_still_importing_says_one_line_and_touches_nothing(lab, sig, code):
    """收件箱命令要 3–4 秒,大半是导入 LangGraph:人按 Ctrl-C 多半落在这几秒里。一开头就装好处理函数
    (装好之后马上发信号,这时慢的导入才刚开始):一行、退出码 130,什么都没动,不是一段 KeyboardInterrupt 的 traceback。"""
    from test_worker import signal_while_importing

    queue("T1012")
    before = everything("T1012")
    proc = subprocess.Popen([sys.executable, "inbox.py", "accept", "T1012"], cwd=LAB, env=lab, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = signal_while_importing(proc, sig)
    assert (proc.returncode, out, err) == (code, "", "已中断(Ctrl-C):什么都还没动\n")
    assert everything("T1012") == before


def test_ctrl_c_after_accept_took_the_item_puts_it_back_in_the_inbox(lab, monkeypatch, capsys):
    """accept 已经把待办拿走、还在核对「你看到的是不是这一版」时按了 Ctrl-C:原样放回收件箱,一行说明;再 accept 照常发出。
    不是 traceback、把事件留在 processing、要等下一次 list 更正。"""
    queue("T1012")
    before = everything("T1012")
    capsys.readouterr()

    def pressed(*_):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(store_inbox, "seen_draft", pressed)
        assert inbox_mod.main(["accept", "T1012"]) == 1
    assert capsys.readouterr() == ("", "T1012 这次被中断(Ctrl-C),仍在收件箱里\n")
    assert everything("T1012")[1:] == before[1:]
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "waiting_human", 1)]
    r = inbox(lab, "accept", "T1012")
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT COUNT(*) FROM outbox") == [(1,)]


def test_a_checkpoint_db_that_is_not_the_workers_leaves_every_item_alone_and_says_so(lab, tmp_path):
    """CHECKPOINTS_DB 指到了别的文件(worker 起草时用的不是它):一条都不动:一行说明、退出码 1;
    处理其中一条也是一样。改回来之后照常。list 不把收件箱里每一条都当成「上次处理中途中断」改成 pending:那样 worker
    接着会在错的库里把每一条重新起草一遍(每条多调一次模型,人看过的草稿也换了)。"""
    queue("T1012", "T1041")
    before = everything("T1012")
    wrong = tmp_path / "other-checkpoints.db"
    line = (f"(收件箱里的 T1012、T1041 在 checkpoint 库里找不到(CHECKPOINTS_DB={wrong}):多半指错了库,"
            "worker 起草时用的是另一个;把设置改回来,这几条没有动。库确实丢了(删掉了)的话,运行 "
            "uv run python inbox.py restart T1012 T1041 让 worker 从头重新起草)\n")
    r = inbox({**lab, "CHECKPOINTS_DB": str(wrong)}, "list")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", line)
    r = inbox({**lab, "CHECKPOINTS_DB": str(wrong)}, "accept", "T1012")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", line + "T1012 在 checkpoint 库里找不到,没有处理(见上一行)\n")
    assert everything("T1012") == before
    r = inbox(lab, "list")
    assert (r.returncode, r.stdout, r.stderr) == (0, T1012_ITEM + T1041_ITEM, "")


def lose_checkpoints(env: dict, *tickets: str) -> None:
    """checkpoint 丢了:不给工单号时整个库丢了(SQLite 的 checkpoints.db 被删掉,PostgreSQL 的 checkpoint 表被清空);
    给了就只丢这几张工单的 thread。"""
    if tickets:
        with opened_graph() as graph:
            for t in tickets:
                graph.checkpointer.delete_thread(thread_of(t)["configurable"]["thread_id"])
    elif "DATABASE_URL" in env:
        conn = store.connect()
        try:
            conn.execute("TRUNCATE checkpoints, checkpoint_blobs, checkpoint_writes")
        finally:
            conn.close()
    else:
        store_sqlite.close_connections()
        for suffix in ("", "-wal", "-shm"):
            Path(env["CHECKPOINTS_DB"] + suffix).unlink(missing_ok=True)


def where_checkpoints_are(env: dict) -> str:
    return store_errors._safe_url(env["DATABASE_URL"]) if "DATABASE_URL" in env else f"CHECKPOINTS_DB={env['CHECKPOINTS_DB']}"


RESTARTED = "{} 已交回 worker 从头起草(checkpoint 库里找不到它,worker 会再调一次模型)\n"


def test_restart_hands_items_whose_checkpoints_were_lost_to_the_worker_which_drafts_them_again(any_lab):
    """checkpoint 库真的丢了(删掉了 checkpoints.db,或者清空了 PostgreSQL 的 checkpoint 表):list 那一行给出
    restart 命令;restart 之后事件回到队列、尝试次数从 0 算,worker 当新工单从头起草(再调一次模型),待办回到收件箱,
    照常能处理。没有 restart 的话这些待办哪个命令都处理不了,list 每次都说一遍「多半指错了库」,只能手改事件表。"""
    queue("T1012", "T1041")
    lose_checkpoints(any_lab)
    r = inbox(any_lab, "list")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", f"(收件箱里的 T1012、T1041 在 checkpoint 库里找不到({where_checkpoints_are(any_lab)}):多半指错了库,"
               "worker 起草时用的是另一个;把设置改回来,这几条没有动。库确实丢了(删掉了)的话,运行 "
               "uv run python inbox.py restart T1012 T1041 让 worker 从头重新起草)\n")
    r = inbox(any_lab, "restart", "T1012", "T1041")
    assert (r.returncode, r.stdout, r.stderr) == (0, RESTARTED.format("T1012") + RESTARTED.format("T1041"), "")
    assert rows("SELECT event_id, status, attempts, claimed_by FROM events ORDER BY event_id") == [
        ("evt_T1012_created", "pending", 0, None), ("evt_T1041_created", "pending", 0, None)]
    assert drain() == [("evt_T1012_created", "waiting_human"), ("evt_T1041_created", "waiting_human")]
    assert rows("SELECT ticket_id, COUNT(*) FROM llm_usage GROUP BY ticket_id ORDER BY ticket_id") == [
        ("T1012", 2), ("T1041", 2)]  # 第一次起草 + 丢了之后重新起草
    r = inbox(any_lab, "list")
    assert (r.returncode, r.stdout, r.stderr) == (0, T1012_ITEM + T1041_ITEM, "")
    r = inbox(any_lab, "accept", "T1012")
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id FROM outbox") == [("T1012",)]


@pytest.mark.parametrize("args, message", [
    (["T1041"], "T1041 的 checkpoint 还在,不用 restart:直接 accept / edit / respond / ignore;这次什么都没有动"),
    (["T1012", "T1041"], "T1041 的 checkpoint 还在,不用 restart:直接 accept / edit / respond / ignore;这次什么都没有动"),
    (["T1012", "T4040"], "T4040 不在收件箱里(已经处理过,或者还没轮到 worker)"),
    (["t1012"], "t1012 不在收件箱里(已经处理过,或者还没轮到 worker);是不是 T1012?"),
    (["T9999"], "T9999 的事件 evt_T9999_created 在死信队列里(PermanentError: 工单不存在:T9999),没有进收件箱;"
                "查清原因后运行 uv run python worker.py --requeue-dead evt_T9999_created 放回队列"),
])
def test_restart_of_an_item_that_still_has_its_checkpoint_or_is_not_in_the_inbox_moves_nothing(lab, args, message):
    """restart 只给 checkpoint 丢了的待办用:checkpoint 还在的(照常处理就行,restart 会白白再调一次模型、换掉人看过的
    草稿)、不在收件箱里的,说清楚,退出码 1;一次给了好几张、其中一张不对时,一张都不动。"""
    queue("T1012", "T1041", "T9999")
    lose_checkpoints(lab, "T1012")
    before = everything("T1041")
    r = inbox(lab, "restart", *args)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", message + "\n")
    assert everything("T1041") == before
    assert rows("SELECT event_id, status FROM events ORDER BY event_id") == [
        ("evt_T1012_created", "waiting_human"), ("evt_T1041_created", "waiting_human"), ("evt_T9999_created", "dead")]


def test_restart_of_an_item_another_restart_just_handed_back_says_so_and_queues_it_once(lab, monkeypatch, capsys):
    """两个人同时 restart 同一张:后到的在对账之后、改状态之前被抢先了。说清楚,退出码 1;事件只回队列一次,
    worker 只起草一次。两个进程真的同时跑时谁先谁后不确定,这里在本进程里把「别人先放回去」放在确定的时刻。"""
    queue("T1012")
    lose_checkpoints(lab)
    real_restart = store_events.restart_waiting

    def someone_else_first(event_ids):
        assert real_restart(event_ids) == ["evt_T1012_created"]  # 另一个收件箱命令先放回去了
        return real_restart(event_ids)

    monkeypatch.setattr(store_events, "restart_waiting", someone_else_first)
    capsys.readouterr()
    assert inbox_mod.main(["restart", "T1012"]) == 1
    assert capsys.readouterr() == ("", "T1012 刚被另一个收件箱命令交回 worker 了,这次没有再动\n")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]
    assert drain() == [("evt_T1012_created", "waiting_human")]
    assert drain() == []
    assert rows("SELECT COUNT(*) FROM llm_usage") == [(2,)]


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
def test_list_into_a_pipe_that_is_already_closed_exits_141_quietly_and_records_no_draft_as_seen(lab, unbuffered):
    """inbox.py list | head -2,收件箱里有 30 条:head 走了之后不该是一段英文的 BrokenPipeError traceback。
    这里让看输出的一方一开始就走掉(管道的读端先关了),每次都一样:退出码 141,stderr 什么都没有;
    没送到人眼前的草稿不记成「看过了」,别的什么都不动。两种输出方式都试:平常(有缓冲,最后一块要到 flush 时
    才写出去、才发现管道断了)和 PYTHONUNBUFFERED=1(Docker、CI 里常设,每个 print 马上就撞上):
    只试后一种的话,记「看过了」之前的那个 flush 删掉也看不出来。"""
    queue(*(f"T{n}" for n in range(1001, 1031)))
    assert rows("SELECT COUNT(*) FROM events WHERE status = 'waiting_human'") == [(30,)]
    before = everything("T1012")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen([sys.executable, "inbox.py", "list"], cwd=LAB, env={**lab, "PYTHONUNBUFFERED": unbuffered},
                                stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (141, "")
    assert everything("T1012") == before
    assert rows("SELECT COUNT(*) FROM inbox_seen") == [(0,)]
    shown = inbox(lab, "list")  # 管道好好的时候照常:每一版草稿都记下
    assert (shown.returncode, shown.stdout.count("\n"), shown.stderr) == (0, 30 * 2 + 1, "")  # 通知类 T1010 多一行
    assert rows("SELECT COUNT(*) FROM inbox_seen") == [(shown.stdout.count("        草稿:"),)] == [(29,)]


def test_a_multi_line_redraft_is_printed_with_its_later_lines_indented_like_list(lab):
    """真模型重写的草稿常分几行:第二行起和 list 一样缩进。顶格打印的话,和下一行输出分不清哪些是草稿。"""
    queue("T1012")  # 第一版是离线模型写的
    with OpenAIStub() as stub:
        stub.multiline = True
        r = inbox({**lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url}, "respond", "T1012", "先道歉")
    reply = state("T1012")["draft"]["reply"]
    first, *rest = reply.splitlines()
    assert rest  # 确实是好几行
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "已按意见重写,新草稿: " + first + "".join(f"\n        {line}" for line in rest) + "\n"


@pytest.mark.parametrize("setting, value, message", [
    ("MAX_REDRAFTS", "-1", "配置错误:MAX_REDRAFTS='-1' 不能小于 0"),
    ("MAX_TICKET_CHARS", "4k", "配置错误:MAX_TICKET_CHARS='4k' 不是数字"),
    ("INBOX_MAX_TEXT_CHARS", "abc", "配置错误:INBOX_MAX_TEXT_CHARS='abc' 不是数字"),
    ("INBOX_MAX_TEXT_CHARS", "0", "配置错误:INBOX_MAX_TEXT_CHARS='0' 不能小于 1"),
    ("LLM_EXTRA_BODY", "{oops", "配置错误:LLM_EXTRA_BODY 不是合法 JSON:{oops"),
    ("LLM_DEADLINE_S", "inf", "配置错误:LLM_DEADLINE_S='inf' 不是数字"),
    ("LLM_PRIMARY_SHARE", "1.5", "配置错误:LLM_PRIMARY_SHARE='1.5' 不能大于 1"),  # 没配备用模型也照样查
    ("LLM_EXTRA_BODY", '"str"', '配置错误:LLM_EXTRA_BODY 应该是 JSON 对象({…}):"str"'),
    # 拿走待办之前就拦下:不然要到重写时才出错:「处理失败(UnicodeEncodeError…),已交回 worker 续跑」,worker 那边也一样失败
    ("LLM_API_KEY", "sk-abc１２３", "配置错误:LLM_API_KEY 的第 7 个字符不是英文半角的字母、数字或符号(全角字符、空格或换行?):"
                                    "API key 里只有这些;重新从模型服务的控制台复制一遍"),
])
def test_a_bad_setting_stops_the_inbox_before_it_takes_the_item(lab, setting, value, message):
    queue("T1012")
    r = inbox({**lab, setting: value}, "respond", "T1012", "语气软一点")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", message + "\n")
    assert rows("SELECT status FROM events") == [("waiting_human",)]  # 还在收件箱里,没有卡在 processing
    assert state("T1012").get("feedback") == []
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


def test_respond_whose_redraft_fails_is_handed_to_the_worker_with_the_feedback_kept(lab):
    queue("T1012")
    dead_model = {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "LLM_MAX_RETRIES": "0"}
    r = inbox({**lab, **dead_model}, "respond", "T1012", "语气软一点")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "T1012 处理失败(OpenAIConnectionError: Connection error.),已交回 worker 续跑\n"
    assert rows("SELECT status, last_error FROM events") == [("pending", "OpenAIConnectionError: Connection error.")]
    assert state("T1012")["feedback"] == ["语气软一点"]  # 人的意见没丢
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert drain() == [("evt_T1012_created", "waiting_human")]  # worker 从 draft 接着跑,带着意见重写
    assert state("T1012")["feedback"] == ["语气软一点"]


def test_a_handed_back_respond_is_redrafted_by_a_worker_with_a_lower_text_limit(lab, monkeypatch):
    """收件箱这台机器放宽了 INBOX_MAX_TEXT_CHARS,worker 那台没有:意见在收件箱这边已经过了 review、记进了 checkpoint,
    worker 从 draft 接着跑,不按自己的上限再拦一次、不把待办带着拒绝退回收件箱,意见也没丢。"""
    queue("T1012")
    dead_model = {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "LLM_MAX_RETRIES": "0"}
    feedback = "语气软一点," * 500  # 3000 个字:比默认的 2000 长
    r = inbox({**lab, **dead_model, "INBOX_MAX_TEXT_CHARS": "5000"}, "respond", "T1012", feedback)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "T1012 处理失败(OpenAIConnectionError: Connection error.),"
                                                        "已交回 worker 续跑\n")
    monkeypatch.setenv("INBOX_MAX_TEXT_CHARS", "2000")
    assert drain() == [("evt_T1012_created", "waiting_human")]
    with opened_graph() as graph:
        snapshot = graph.get_state(thread_of("T1012"))
    assert snapshot.values["feedback"] == [feedback]
    assert "上一个回答不能用" not in snapshot.interrupts[0].value["description"]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


def test_respond_whose_redraft_is_refused_for_the_api_key_says_the_worker_retries_not_requeue_dead(lab):
    """key 错了:事件交回 worker(pending),修好 key 后 worker 自己会再试。括号里不叫人运行 --requeue-dead:
    那个命令只放回死信,对这个事件什么都不做,不给事件号时还把别的死信都放回队列。"""
    queue("T1012", "T9999")
    with OpenAIStub() as stub:
        stub.fail["key:sk-wrong"] = (401, "invalid_api_key")
        r = inbox({**lab, "LLM_API_KEY": "sk-wrong", "LLM_BASE_URL": stub.base_url, "LLM_MAX_RETRIES": "0"},
                  "respond", "T1012", "语气软一点")
    why = ("OpenAIAuthenticationError: Error code: 401 - stub says invalid_api_key"
           "(模型服务拒绝了 API key:检查 LLM_API_KEY,修好后它会自动再试,不用放回)")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"T1012 处理失败({why}),已交回 worker 续跑\n")
    assert rows("SELECT event_id, status, last_error FROM events ORDER BY event_id") == [
        ("evt_T1012_created", "pending", why), ("evt_T9999_created", "dead", "PermanentError: 工单不存在:T9999")]
    assert state("T1012")["feedback"] == ["语气软一点"]
    assert drain() == [("evt_T1012_created", "waiting_human")]  # 修好了(这里是离线模型):worker 带着意见重写


def test_respond_whose_redraft_the_model_rejects_as_invalid_goes_dead_with_the_feedback_kept(lab):
    """重写时模型说请求不对(400):重试也不会好。直接进死信、说清怎么放回;意见记在 checkpoint 里,
    放回后带着它重写。不交回 worker、不说「修好后它会自动再试,不用放回」:worker 会原样再发一次、进了死信,叫人运行
    --requeue-dead。放回的命令带着这个事件号:不带事件号的 --requeue-dead,照着敲会把别的死信(这里是工单不存在的 T9999)
    也都放回去。"""
    queue("T1012", "T9999")
    with OpenAIStub() as stub:
        stub.fail["stub-model"] = (400, "invalid_request_error")
        model = {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MODEL": "stub-model", "LLM_MAX_RETRIES": "2"}
        r = inbox({**lab, **model}, "respond", "T1012", "语气软一点")
        assert len(stub.requests) == 1  # 一次都不重试
    command = "uv run python worker.py --requeue-dead evt_T1012_created"
    why = ("OpenAIInvalidRequestError: Error code: 400 - stub says invalid_request_error(模型服务说请求不对:检查 LLM_MODEL、"
           f"LLM_EXTRA_BODY,或者 MAX_TICKET_CHARS 对这个模型太大,修好后运行 {command})")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"T1012 处理失败({why}),进了死信\n")
    assert rows("SELECT event_id, status, last_error, claimed_by FROM events ORDER BY event_id") == [
        ("evt_T1012_created", "dead", why, None), ("evt_T9999_created", "dead", "PermanentError: 工单不存在:T9999", None)]
    assert state("T1012")["feedback"] == ["语气软一点"]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert drain() == []  # worker 不会再白发一次
    requeued = run(command.split()[3:], lab)  # 修好了(这里是离线模型),照着提示敲
    assert (requeued.returncode, requeued.stdout, requeued.stderr) == (0, "已把 1 个死信放回队列\n", "")
    assert drain() == [("evt_T1012_created", "waiting_human")]
    assert state("T1012")["feedback"] == ["语气软一点"]


def test_a_decision_the_checkpoint_store_cannot_save_leaves_the_item_in_the_inbox_and_sends_nothing(lab):
    """人的决定写不进 checkpoint(磁盘满之类,不是「数据库暂时用不了」):thread 还停在 interrupt,
    待办留在收件箱里,说清楚;修好之后同一条命令照常做完,发件箱只有一行。"""
    queue("T1012")
    conn = sqlite3.connect(store.checkpoints_db())
    for table in ("writes", "checkpoints"):  # 磁盘满了:哪张表都写不进去
        conn.execute(f"CREATE TRIGGER broken_{table} BEFORE INSERT ON {table} "
                     "BEGIN SELECT RAISE(ABORT, '磁盘写满了(测试制造的故障)'); END")
    conn.commit()
    r = inbox(lab, "accept", "T1012")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "T1012 处理失败(IntegrityError: 磁盘写满了(测试制造的故障)),仍在收件箱里\n"
    assert rows("SELECT status, last_error FROM events") == [("waiting_human", "IntegrityError: 磁盘写满了(测试制造的故障)")]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert inbox(lab, "list").stdout == T1012_ITEM
    conn.executescript("DROP TRIGGER broken_writes; DROP TRIGGER broken_checkpoints;")
    conn.close()
    again = inbox(lab, "accept", "T1012")
    assert (again.returncode, again.stdout, again.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT status, last_error FROM events") == [("done", None)]
    assert rows("SELECT ticket_id FROM outbox") == [("T1012",)]


def test_an_accept_that_finished_although_one_checkpoint_write_failed_says_sent_not_handed_back(lab):
    """只有 writes 表写不进去(review 那一步的结果),下一个 checkpoint 照样写下了:图其实走完了,回复进了发件箱。
    按 checkpoint 说 sent,事件是 done,只有一行回复;不说「处理失败,已交回 worker 续跑」、不把事件改成 pending。"""
    queue("T1012")
    conn = sqlite3.connect(store.checkpoints_db())
    conn.execute("CREATE TRIGGER broken BEFORE INSERT ON writes BEGIN SELECT RAISE(ABORT, '磁盘写满了(测试制造的故障)'); END")
    conn.commit()
    conn.close()
    r = inbox(lab, "accept", "T1012")
    assert (r.returncode, r.stdout) == (0, "T1012 → sent\n")
    assert r.stderr == "(途中出过错:IntegrityError: 磁盘写满了(测试制造的故障);这张工单已经处理完了)\n"
    assert rows("SELECT status, last_error FROM events") == [("done", None)]
    assert rows("SELECT ticket_id FROM outbox") == [("T1012",)]
    assert drain() == []  # worker 没有要续跑的


def test_respond_with_a_model_slower_than_the_deadline_returns_the_terminal_with_the_feedback_kept(lab):
    queue("T1012")
    started = time.monotonic()
    assert inbox(lab, "list").returncode == 0
    startup = time.monotonic() - started  # 一个收件箱命令本身要多久(导入 LangGraph、开库):下面只多出时限那 1 秒
    with OpenAIStub(delay=30) as stub:  # 没有整体时限的话,人要在终端前等 30 秒
        slow_model = {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MAX_RETRIES": "0",
                      "LLM_TIMEOUT_S": "60", "LLM_DEADLINE_S": "1"}
        started = time.monotonic()
        r = inbox({**lab, **slow_model}, "respond", "T1012", "语气软一点")
        took = time.monotonic() - started
        assert len(stub.requests) == 1 and stub.abandoned == 1
    assert took < startup + 1 + 5, (took, startup)  # 消息里的「1 秒」是设置;这里量的是真的只等了这么久
    message = "DeadlineExceeded: 起草用完了整体时限 LLM_DEADLINE_S=1 秒(含客户端重试),稍后自动再试"
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"T1012 处理失败({message}),已交回 worker 续跑\n"
    assert rows("SELECT status, last_error FROM events") == [("pending", message)]
    assert state("T1012")["feedback"] == ["语气软一点"]  # 人的意见没丢
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


def test_unknown_or_finished_ticket_is_not_in_the_inbox(lab):
    queue("T1012")
    r = inbox(lab, "accept", "T4040")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "T4040 不在收件箱里(已经处理过,或者还没轮到 worker)\n")
    assert rows("SELECT event_id, status, claimed_by FROM events") == [("evt_T1012_created", "waiting_human", None)]
    assert (inbox(lab, "accept", "T1012").returncode, rows("SELECT COUNT(*) FROM outbox")) == (0, [(1,)])
    sent = rows("SELECT * FROM outbox")
    again = inbox(lab, "edit", "T1012", "再发一次")
    assert (again.returncode, again.stdout, again.stderr) == (1, "", "T1012 不在收件箱里(已经处理过,或者还没轮到 worker)\n")
    assert rows("SELECT * FROM outbox") == sent  # 发出去的那一行没被改成「再发一次」
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "done")]
    assert rows("SELECT COUNT(*) FROM review_log") == [(1,)]


def test_a_ticket_whose_event_is_dead_is_refused_with_the_reason_and_the_requeue_command(any_lab):
    """T9999 的事件进了死信:说在死信队列里、为什么(last_error 的第一行)、怎么放回队列;退出码 1,什么都不动。
    不说「不在收件箱里(已经处理过,或者还没轮到 worker)」,那样人以为再等等就好。"""
    queue("T9999", "T1012")
    before = everything("T9999")
    r = inbox(any_lab, "accept", "T9999")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "T9999 的事件 evt_T9999_created 在死信队列里(PermanentError: 工单不存在:T9999),没有进收件箱;"
               "查清原因后运行 uv run python worker.py --requeue-dead evt_T9999_created 放回队列\n")
    assert everything("T9999") == before
    rows("UPDATE events SET last_error = ? WHERE event_id = 'evt_T9999_created' RETURNING event_id",
         ("OperationalError: 连不上业务库\nDETAIL:  第二行不用给人看",))
    before = everything("T9999")
    r = inbox(any_lab, "edit", "T9999", "您好")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "T9999 的事件 evt_T9999_created 在死信队列里(OperationalError: 连不上业务库),没有进收件箱;"
               "查清原因后运行 uv run python worker.py --requeue-dead evt_T9999_created 放回队列\n")
    assert everything("T9999") == before
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


def test_a_ticket_id_in_the_wrong_case_is_refused_with_the_right_one_suggested(lab):
    queue("T1012")
    before = everything("T1012")
    r = inbox(lab, "accept", "t1012")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "t1012 不在收件箱里(已经处理过,或者还没轮到 worker);是不是 T1012?\n")
    assert everything("T1012") == before


def test_send_run_twice_leaves_one_outbox_row(any_lab):
    queue("T1012")
    assert inbox(any_lab, "accept", "T1012").returncode == 0
    values = state("T1012")
    assert send(values) == {"outcome": "already_sent"}
    assert send(values) == {"outcome": "already_sent"}
    assert rows("SELECT COUNT(*) FROM outbox") == [(1,)]
    assert rows("SELECT COUNT(*) FROM review_log") == [(1,)]


def finished_by_a_dead_inbox_command(env: dict, ticket_id: str, answer: str) -> None:
    """另一个进程用 answer 把这张工单的图跑完,然后「死」在改事件状态之前:事件卡在 processing,主人是已经不在的进程。"""
    script = ("import sys; sys.path.insert(0, '.'); from langgraph.types import Command; "
              "from agent import opened_graph, thread_of\nwith opened_graph() as g: "
              f"g.invoke(Command(resume={{'type': {answer!r}, 'args': None}}), thread_of({ticket_id!r}))")
    assert subprocess.run([sys.executable, "-c", script], cwd=LAB, env=env).returncode == 0
    conn = store.connect()
    conn.execute("UPDATE events SET status = 'processing', claimed_by = ? WHERE ticket_id = ?", (dead_owner(), ticket_id))
    conn.close()


def test_list_and_actions_reconcile_after_a_resume_that_crashed_before_the_status_update(any_lab):
    """收件箱命令在「图已经跑完」和「改事件状态」之间被杀:事件卡在 processing,进程已经不在了。"""
    queue("T1012", "T1041")
    finished_by_a_dead_inbox_command(any_lab, "T1012", "accept")
    listing = inbox(any_lab, "list")
    assert listing.returncode == 0
    assert listing.stderr == "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 done)\n"
    assert listing.stdout == T1041_ITEM
    assert rows("SELECT event_id, status FROM events ORDER BY received_at") == [
        ("evt_T1012_created", "done"), ("evt_T1041_created", "waiting_human")]
    assert rows("SELECT COUNT(*) FROM outbox") == [(1,)]


def test_list_reconciles_an_ignore_that_crashed_before_the_status_update_to_ignored_not_back_to_the_worker(any_lab):
    """同上,处理是 ignore:图走完了(outcome ignored),事件还卡在 processing。按 checkpoint 直接改成 ignored;
    不能当成「跑到一半」交回 worker(那样先说「改为 pending」,worker 再跑一遍才对上)。"""
    queue("T1003")
    finished_by_a_dead_inbox_command(any_lab, "T1003", "ignore")
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, "收件箱是空的\n", "(更正:T1003 上次处理中途中断,事件 evt_T1003_created 改为 ignored)\n")
    assert rows("SELECT event_id, status, claimed_by FROM events") == [("evt_T1003_created", "ignored", None)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert drain() == []  # 没有交回 worker


@pytest.mark.parametrize("seen, now", [
    # list 读到它在收件箱里;另一个收件箱命令随后拿走它、把图跑完了,还没来得及改状态
    (("waiting_human", None), ("processing", "inbox-someone-else")),
    # list 读到它是死掉的 worker 留下的;worker 随后把它放回队列、又领走了
    (("processing", "worker-that-died"), ("processing", "worker-alive-now")),
])
def test_a_correction_based_on_a_stale_read_does_not_overwrite_what_another_process_did_meanwhile(lab, seen, now):
    """更正按读到的那一刻的状态做,改的时候核对它还是那样(还在收件箱 / 还是那个已死的主人):中间被别的进程拿走了,
    就不动它。不核对的话,收件箱把别人正拿着的事件改掉,那个进程之后改不了自己的状态,同一个事件可能被处理两遍。"""
    from langgraph.types import Command

    queue("T1012")
    with opened_graph() as graph:
        graph.invoke(Command(resume={"type": "accept", "args": None}), thread_of("T1012"))
        conn = store.connect()
        conn.execute("UPDATE events SET status = ?, claimed_by = ?", now)
        conn.close()
        stale = {"event_id": "evt_T1012_created", "ticket_id": "T1012", "status": seen[0], "claimed_by": seen[1]}
        assert inbox_repair.reconcile(graph, stale) is None
    assert rows("SELECT event_id, status, claimed_by FROM events") == [("evt_T1012_created", *now)]


def test_an_orphaned_second_event_for_a_ticket_already_in_the_inbox_is_done_not_a_second_item(any_lab):
    """上游换了个 event_id 又通知了一次,领它的 worker 中途没了(thread 早就停在收件箱):list 和 worker 处理它时
    一样把它记成 done,收件箱里只有一条。也改成 waiting_human 的话,同一张工单在收件箱里列两遍、日报多算一条,
    accept 之后下一次 list 又说它「上次处理中途中断」。"""
    queue("T1012")
    payload = json.dumps({"id": "evt_T1012_again", "type": "ticket.updated", "data": {"ticket_id": "T1012"}})
    assert store.add_event("evt_T1012_again", "webhook", "ticket.updated", payload)
    dead = dead_owner()
    conn = store.connect()
    conn.execute("UPDATE events SET status = 'processing', attempts = 1, claimed_by = ? WHERE event_id = 'evt_T1012_again'",
                 (dead,))
    conn.close()
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, T1012_ITEM, "(更正:T1012 上次处理中途中断,事件 evt_T1012_again 改为 done)\n")
    assert rows("SELECT event_id, status, claimed_by FROM events ORDER BY received_at, event_id") == [
        ("evt_T1012_created", "waiting_human", None), ("evt_T1012_again", "done", None)]
    accept = inbox(any_lab, "accept", "T1012")
    assert (accept.returncode, accept.stdout, accept.stderr) == (0, "T1012 → sent\n", "")
    again = inbox(any_lab, "list")
    assert (again.returncode, again.stdout, again.stderr) == (0, "收件箱是空的\n", "")
    assert rows("SELECT event_id, status FROM events ORDER BY received_at, event_id") == [
        ("evt_T1012_created", "done"), ("evt_T1012_again", "done")]
    assert rows("SELECT ticket_id FROM outbox") == [("T1012",)]


def test_inbox_killed_after_the_decision_is_saved_is_finished_by_the_worker_not_asked_again(any_lab):
    """accept 之后、review 的结果写下了、下一个 checkpoint 还没写时收件箱命令被杀:人已经做了决定。
    下一次 list 把事件交回 worker;worker 用写下的决定把它发完 —— 不再把同一张工单放回收件箱问第二遍,只发一封。"""
    queue("T1012")
    die_before_checkpoint(any_lab, 3, "inbox.py", "accept", "T1012")  # 第 2 步停在 review,第 3 步是 review 之后
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, "收件箱是空的\n", "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 pending)\n")
    assert drain() == [("evt_T1012_created", "done")]
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, "收件箱是空的\n", "")
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "done")]
    assert rows("SELECT ticket_id, sent_by FROM outbox") == [("T1012", "agent+reviewer")]
    assert rows("SELECT ticket_id, action FROM review_log") == [("T1012", "accept")]
    assert state("T1012")["outcome"] in ("sent", "already_sent")  # send 有没有在被杀之前跑完,看时机


def test_a_decision_left_by_a_killed_inbox_is_sent_by_the_worker_even_when_the_draft_used_every_attempt(any_lab,
                                                                                                    capsys):
    """起草用满了 MAX_ATTEMPTS(默认 3)次的事件,人 accept 了、决定写下了,收件箱命令随后被杀;先发现的是常驻 worker
    (不是 list)。收件箱命令拿走的事件交回时 worker 的尝试次数从头算,worker 接着发,只发一封。不从头算的话,worker
    把它当成「每次都让 worker 崩溃」的事件:第 4 次 → dead,人批准的回复发不出去、还怪到 worker 头上。"""
    queue("T1012")
    conn = store.connect()
    conn.execute("UPDATE events SET attempts = 3")  # 前两次起草失败,第 3 次才成
    conn.close()
    die_before_checkpoint(any_lab, 3, "inbox.py", "accept", "T1012")  # 第 2 步停在 review,第 3 步是 review 之后
    [(status, attempts, owner)] = rows("SELECT status, attempts, claimed_by FROM events")
    assert (status, attempts, owner.startswith(worker_owner.INBOX_OWNER_PREFIX)) == ("processing", 3, True)
    capsys.readouterr()
    assert drain() == [("evt_T1012_created", "done")]
    assert capsys.readouterr().out == "放回队列 1 个卡住的事件\nevt_T1012_created → done\n"
    assert rows("SELECT status, attempts, last_error FROM events") == [("done", 1, None)]
    assert rows("SELECT ticket_id, sent_by FROM outbox") == [("T1012", "agent+reviewer")]
    assert rows("SELECT ticket_id, action FROM review_log") == [("T1012", "accept")]
    assert rows("SELECT COUNT(*) FROM llm_usage") == [(1,)]  # 人批准的是原稿:没有再调模型


def test_list_hands_a_dead_workers_event_back_with_the_crash_mark_so_a_crash_loop_still_ends(lab, capsys):
    """worker 起草到一半被杀(MAX_ATTEMPTS=1,这是它最后一次),事件停在 processing。先来的是 inbox.py list:
    它按 checkpoint 把事件交回 worker,和 worker 自己放回时一样在 last_error 记上「上次是进程没了」的标记,
    worker 领到时直接进死信,不调模型。清空 last_error 的话标记就没了,worker 照常再起草一遍、再调一次模型 ——
    每次都让 worker 崩溃的事件,每 list 一次就多转一圈。"""
    env = {**lab, "MAX_ATTEMPTS": "1"}
    payload = json.dumps({"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}})
    store.add_event("evt_T1012_created", "webhook", "ticket.created", payload)
    die_at(env, "writes:first_draft", "worker.py", "--once")  # 模型回答了,结果还没写下
    assert rows("SELECT status, attempts FROM events") == [("processing", 1)]
    listing = inbox(env, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, "收件箱是空的\n", "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 pending)\n")
    assert rows("SELECT status, attempts, last_error FROM events") == [("pending", 1, worker_owner.REQUEUED_STALE)]
    r = cli(["worker.py", "--once"], env)
    reason = ("领了 2 次都没做完,超过 MAX_ATTEMPTS=1:最后一次处理到一半进程没了(被杀、崩溃或卡住),"
              "多半是这个事件让 worker 崩溃;查清原因后运行 uv run python worker.py --requeue-dead evt_T1012_created")
    assert (r.returncode, r.stdout) == (0, f"evt_T1012_created 第 2 次失败 → dead: {reason}\n")
    assert rows("SELECT COUNT(*) FROM llm_usage") == [(1,)]  # 被杀的那一次;没有再调


@pytest.mark.parametrize("again_and_again", [False, True], ids=["once", "again-and-again"])
def test_ctrl_c_while_respond_waits_for_the_redraft_hands_it_to_the_worker_in_one_line(lab, again_and_again):
    """respond 正在等模型重写,人等不及按了 Ctrl-C。意见已经写下:一行说明、退出码 1,事件交回 worker(尝试次数从头算),
    worker 照意见重写,新草稿回到收件箱。不带着 traceback 退出、把事件留在 processing:那样之后被 worker 当成
    崩溃放回(起草用满了次数的就进死信)。
    人连按几下(或者 uv run 把发给进程组的 SIGINT 再转发一次):第一下之后的都不理,结果和按一下一样。不然第二下
    会打断交回,一行「已中断(Ctrl-C)」、进程被信号结束,事件留在 processing。"""
    from test_worker import signal_until_it_exits

    queue("T1012")
    with OpenAIStub(delay=30) as stub:
        env = {**lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url}
        proc = subprocess.Popen([sys.executable, "inbox.py", "respond", "T1012", "先道歉"], cwd=LAB, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while not stub.requests:
                assert time.time() < deadline and proc.poll() is None, "respond 没有去调模型"
                time.sleep(0.05)
            if again_and_again:
                out, err = signal_until_it_exits(proc, signal.SIGINT)
            else:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert (proc.returncode, out, err) == (1, "", "T1012 这次被中断(Ctrl-C),已交回 worker 续跑\n")
    assert rows("SELECT status, attempts, claimed_by, last_error FROM events") == [
        ("pending", 0, None, "被中断(Ctrl-C)")]
    assert drain() == [("evt_T1012_created", "waiting_human")]
    assert state("T1012")["feedback"] == ["先道歉"]
    listing = inbox(lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, T1012_ITEM.replace("您好,", SORRY), "")


def test_respond_started_with_ctrl_c_ignored_like_a_background_job_still_ignores_it_and_prints_the_new_draft(lab):
    """脚本里 `uv run python inbox.py respond T1012 "先道歉" &`:shell 让后台的程序不理 SIGINT。收件箱保留这个
    「不理」:导入时、等模型时各收到几次 SIGINT,照常打印新草稿,待办回到收件箱。导入时装上自己的处理函数的话,
    「不理」就被盖掉了:导入途中的 Ctrl-C 让它什么都没做就退出(退出码 130),等重写时的让它把事件交回。"""
    queue("T1012")
    draft = T1012_ITEM.splitlines()[1].removeprefix("        草稿:").replace("您好,", SORRY)
    with OpenAIStub(delay=2) as stub:
        env = {**lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url}
        proc = subprocess.Popen([sys.executable, "inbox.py", "respond", "T1012", "先道歉"], cwd=LAB, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            for _ in range(5):  # 落在启动、导入 LangGraph 的途中
                proc.send_signal(signal.SIGINT)
                time.sleep(0.05)
            deadline = time.time() + 30
            while not stub.requests:
                assert time.time() < deadline and proc.poll() is None, "respond 没有去调模型"
                time.sleep(0.05)
            for _ in range(5):  # 在等模型重写
                proc.send_signal(signal.SIGINT)
                time.sleep(0.05)
            assert proc.poll() is None, "不理 SIGINT 的收件箱被 Ctrl-C 停下了"
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert (proc.returncode, out, err) == (0, f"已按意见重写,新草稿: {draft}\n", "")
    assert rows("SELECT status, attempts, claimed_by FROM events") == [("waiting_human", 1, None)]
    assert state("T1012")["feedback"] == ["先道歉"]
    listing = inbox(lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, T1012_ITEM.replace("您好,", SORRY), "")


def test_inbox_killed_after_the_answer_is_saved_but_before_review_used_it_asks_again_and_the_new_answer_wins(any_lab):
    """accept 的回答已经写进 checkpoint(__resume__),review 还没用它跑完就被杀:命令没有打印结果,人不知道做没做成。
    下一次 list 把同一条待办原样放回收件箱;worker 不碰它;人再给的回答盖掉旧的,只发一封。"""
    queue("T1012")
    before = inbox(any_lab, "list").stdout
    die_at(any_lab, "writes:outcome", "inbox.py", "accept", "T1012")  # review 的结果里有 outcome
    assert rows("SELECT status FROM events") == [("processing",)]
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, before, "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 waiting_human)\n")
    assert drain() == []  # 等人的工单 worker 不领
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    edit = inbox(any_lab, "edit", "T1012", "改过的回复")
    assert (edit.returncode, edit.stdout, edit.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id, body FROM outbox") == [("T1012", "改过的回复")]
    assert rows("SELECT ticket_id, action FROM review_log") == [("T1012", "edit")]
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "done")]


def test_inbox_killed_before_an_ignore_is_saved_asks_again_and_the_log_shows_only_what_was_done(any_lab):
    """ignore 的决定(review 的结果)还没写下就被杀:什么都还没记,下一次 list 照样再问一遍。
    人这次选了 accept,回复发出去了:review_log 里那张工单只有一行 accept。"""
    queue("T1012")
    die_at(any_lab, "writes:outcome", "inbox.py", "ignore", "T1012")  # review 的结果里有 outcome
    assert rows("SELECT COUNT(*) FROM review_log") == [(0,)]
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stderr) == (
        0, "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 waiting_human)\n")
    assert listing.stdout == T1012_ITEM
    accept = inbox(any_lab, "accept", "T1012")
    assert (accept.returncode, accept.stdout, accept.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id, action, draft = final FROM review_log") == [("T1012", "accept", 1)]
    assert rows("SELECT ticket_id, sent_by FROM outbox") == [("T1012", "agent+reviewer")]
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "done")]


def test_inbox_killed_after_an_ignore_was_recorded_is_finished_by_the_worker_with_one_log_row(any_lab):
    """ignore 的决定写下了,ignore 节点记完 review_log、它的结果还没写下时被杀:人已经做了决定,不再问。
    下一次 list 把事件交回 worker;worker 重跑 ignore 节点(按工单号去重,不多记),事件是 ignored,什么都没发。"""
    queue("T1012")
    die_at(any_lab, "writes:outcome=ignored", "inbox.py", "ignore", "T1012")
    assert rows("SELECT ticket_id, action FROM review_log") == [("T1012", "ignore")]
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, "收件箱是空的\n", "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 pending)\n")
    assert drain() == [("evt_T1012_created", "ignored")]
    assert rows("SELECT ticket_id, action, final FROM review_log") == [("T1012", "ignore", None)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert state("T1012")["outcome"] == "ignored"


def test_inbox_killed_while_redrafting_is_finished_by_the_worker_with_the_feedback_kept(any_lab):
    """respond 之后 review 的结果(意见)写下了,重写的 draft 刚跑完、结果还没写下时被杀:意见不丢。
    下一次 list 把事件交回 worker,worker 从 draft 接着跑(不从 load 重来),新草稿回到收件箱,重写只算一次。"""
    queue("T1012")
    die_at(any_lab, "writes:first_draft", "inbox.py", "respond", "T1012", "先道歉")  # draft 的结果里有 first_draft
    listing = inbox(any_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, "收件箱是空的\n", "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 pending)\n")
    assert drain() == [("evt_T1012_created", "waiting_human")]
    assert state("T1012")["feedback"] == ["先道歉"]
    listing = inbox(any_lab, "list")
    redraft = T1012_ITEM.replace("您好,", SORRY)  # 照「先道歉」重写的那版(发票:结尾不说到账时间)
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, redraft, "")
    # 模型调用:第一版、被杀的那次重写(回答了,结果没存下)、worker 续跑的重写
    assert rows("SELECT COUNT(*) FROM llm_usage") == [(3,)]
    with opened_graph() as graph:
        sources = [s.metadata["source"] for s in graph.get_state_history(thread_of("T1012"))]
    assert sources.count("input") == 1  # 没有从头再来
    accept = inbox(any_lab, "accept", "T1012")
    assert (accept.returncode, accept.stdout, accept.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id, action, feedback FROM review_log") == [("T1012", "accept", '["先道歉"]')]
    assert rows("SELECT COUNT(*) FROM outbox") == [(1,)]


def test_two_inbox_commands_on_one_ticket_at_once_send_one_reply(any_lab):
    queue("T1012")
    procs = [subprocess.Popen([sys.executable, "inbox.py", cmd, "T1012", *extra], cwd=LAB, env=any_lab, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for cmd, extra in (("accept", []), ("edit", ["同时改的版本"]), ("accept", []))]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    winners = [r for r in results if r[0] == 0]
    losers = [r for r in results if r[0] == 1]
    assert len(winners) == 1 and len(losers) == 2
    assert winners[0][1] == "T1012 → sent\n"
    for _, out, err in losers:
        assert err in ("T1012 不在收件箱里(已经处理过,或者还没轮到 worker)\n",
                       "T1012 刚被另一个收件箱命令拿走处理了,稍后再 list 看看\n",
                       "T1012 正在被处理(另一个收件箱命令或 worker),稍后再 list 看看\n"), err
    assert rows("SELECT COUNT(*) FROM outbox") == [(1,)]
    assert rows("SELECT status FROM events") == [("done",)]


NOT_THE_DRAFT_YOU_SAW = ("T1041 的草稿在你上次看过之后被改写了(有人 respond 过),这次没有发;"
                         "先 uv run python inbox.py list 看看新草稿,再决定\n")
T1041_FIRST_REDRAFT = (f"{SORRY}关于您提到的扣款和退款问题,我们已转交财务核实扣款记录,核实后会按原支付渠道处理,"
                       f"进度会在 1–3 个工作日内通过工单告知您。{AFTER_SORRY}")


def test_accept_of_a_draft_someone_else_rewrote_since_your_list_is_refused_until_you_list_again(any_lab):
    """甲 list 看到第一版;乙 respond 出了第二版;甲 accept:不发甲没看过的第二版,一行说明、退出码 1,
    待办原样留在收件箱。甲再 list 一次看到第二版,accept 发出的就是它,只发一封。"""
    jia, yi = {**any_lab, "INBOX_USER": "甲"}, {**any_lab, "INBOX_USER": "乙"}
    queue("T1041")
    assert inbox(jia, "list").stdout == T1041_ITEM
    respond = inbox(yi, "respond", "T1041", "语气再软一点,先道歉")
    assert (respond.returncode, respond.stdout) == (0, f"已按意见重写,新草稿: {T1041_FIRST_REDRAFT}\n")

    refused = inbox(jia, "accept", "T1041")
    assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", NOT_THE_DRAFT_YOU_SAW)
    assert rows("SELECT event_id, status, claimed_by FROM events") == [("evt_T1041_created", "waiting_human", None)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert rows("SELECT COUNT(*) FROM review_log") == [(0,)]

    listing = inbox(jia, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, f"T1041  [refund] 客户反映:同一笔账单被扣了两次\n        草稿:{T1041_FIRST_REDRAFT}\n", "")
    accept = inbox(jia, "accept", "T1041")
    assert (accept.returncode, accept.stdout, accept.stderr) == (0, "T1041 → sent\n", "")
    assert rows("SELECT ticket_id, body, sent_by FROM outbox") == [("T1041", T1041_FIRST_REDRAFT, "agent+reviewer")]
    assert rows("SELECT status FROM events") == [("done",)]


def entered_inbox_hours_ago(**hours: float) -> dict[str, str]:
    """把这几张工单的待办改成几小时前进的收件箱(waiting_since);返回 {工单: 进收件箱的时刻}。"""
    entered = {ticket: store.minutes_from_now(-h * 60) for ticket, h in hours.items()}
    for ticket, moment in entered.items():
        rows("UPDATE events SET waiting_since = ? WHERE ticket_id = ? RETURNING event_id", (moment, ticket))
    return entered


def report_still_counts_from(entered: dict[str, str], env: dict) -> None:
    """待办都还在收件箱里,进收件箱的时刻没变;日报说等得最久的是 T1041(50 小时),该提醒值班的人了。"""
    waiting = rows("SELECT ticket_id, status, waiting_since FROM events ORDER BY ticket_id")
    assert [(t, s, store.parse_time(u)) for t, s, u in waiting] == [
        (t, "waiting_human", store.parse_time(entered[t])) for t in sorted(entered)]
    report = cli(["cron_jobs.py", "report"], env)
    assert report.returncode == 0, report.stderr
    assert ("收件箱里等得最久的:evt_T1041_created,已等 50.0 小时(超过 24 小时,该提醒值班的人了)(收件箱共 2 条)"
            in report.stdout.splitlines())


def test_respond_and_a_refused_accept_leave_the_waiting_time_in_the_daily_report_where_it_was(any_lab):
    """T1041 进收件箱 50 小时、T1012 30 小时。乙 respond T1041、甲的 accept 因为草稿变了没发出:T1041 还在收件箱里,
    客户还在等,日报的「等得最久」还是它、还是 50 小时(课文的 respond 不碰事件表)。两次都把时间改成命令运行的
    那一刻的话,日报会说等得最久的是 T1012。"""
    jia, yi = {**any_lab, "INBOX_USER": "甲"}, {**any_lab, "INBOX_USER": "乙"}
    queue("T1041", "T1012")
    entered = entered_inbox_hours_ago(T1041=50, T1012=30)
    assert inbox(jia, "list").stdout == T1041_ITEM + T1012_ITEM
    respond = inbox(yi, "respond", "T1041", "语气再软一点,先道歉")
    assert (respond.returncode, respond.stdout) == (0, f"已按意见重写,新草稿: {T1041_FIRST_REDRAFT}\n")
    refused = inbox(jia, "accept", "T1041")
    assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", NOT_THE_DRAFT_YOU_SAW)

    report_still_counts_from(entered, any_lab)


def test_a_respond_the_worker_has_to_finish_keeps_the_waiting_time_in_the_daily_report(any_lab):
    """T1041 进收件箱 50 小时了。乙 respond 时模型连不上:交回 worker,worker 重写完又放回收件箱。客户一直在等,
    日报的「等得最久」还是 T1041、还是 50 小时。worker 放回收件箱时不改时间:改成放回的那一刻的话,
    日报会说它只等了 0 小时,超过 24 小时的提醒也没了。"""
    yi = {**any_lab, "INBOX_USER": "乙"}
    queue("T1041", "T1012")
    entered = entered_inbox_hours_ago(T1041=50, T1012=30)
    dead_model = {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "LLM_MAX_RETRIES": "0"}
    r = inbox({**yi, **dead_model}, "respond", "T1041", "语气再软一点,先道歉")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "T1041 处理失败(OpenAIConnectionError: Connection error.),已交回 worker 续跑\n"
    assert drain() == [("evt_T1041_created", "waiting_human")]  # worker 带着意见重写完,放回收件箱
    assert state("T1041")["feedback"] == ["语气再软一点,先道歉"]

    report_still_counts_from(entered, any_lab)


def test_whoever_asked_for_the_redraft_or_never_listed_can_accept_it(lab):
    """respond 打印了新草稿,就算这个人看过了:乙 list、respond、accept 照常发出。丙从没 list 过,accept 照课文发。"""
    yi, bing = {**lab, "INBOX_USER": "乙"}, {**lab, "INBOX_USER": "丙"}
    queue("T1041", "T1012")
    assert inbox(yi, "list").stdout == T1041_ITEM + T1012_ITEM
    assert inbox(yi, "respond", "T1041", "语气再软一点,先道歉").returncode == 0
    assert inbox(yi, "accept", "T1041").stdout == "T1041 → sent\n"
    assert inbox(bing, "accept", "T1012").stdout == "T1012 → sent\n"
    t1012_draft = T1012_ITEM.splitlines()[1].removeprefix("        草稿:")
    assert rows("SELECT ticket_id, body FROM outbox ORDER BY id") == [("T1041", T1041_FIRST_REDRAFT),
                                                                      ("T1012", t1012_draft)]


def test_a_redraft_that_lands_just_before_your_accept_takes_the_item_is_not_sent(lab, monkeypatch, capsys):
    """甲的 accept 核对时还是第一版、正要拿走待办的那一刻乙的 respond 做完了:核对放在拿到手之后,照样不发第二版,
    待办放回收件箱。两个进程真的同时跑时谁先谁后不确定,这里在本进程里把乙的 respond 放在确定的时刻。"""
    queue("T1041")
    monkeypatch.setenv("INBOX_USER", "甲")
    assert inbox_mod.main(["list"]) == 0
    real_take = store_inbox.take_for_review

    def yi_responds_first(event_id, owner=None):
        monkeypatch.setattr(store_inbox, "take_for_review", real_take)  # 乙的命令照常拿待办
        r = inbox({**lab, "INBOX_USER": "乙"}, "respond", "T1041", "语气再软一点,先道歉")
        assert (r.returncode, r.stdout) == (0, f"已按意见重写,新草稿: {T1041_FIRST_REDRAFT}\n")
        return real_take(event_id, owner)

    monkeypatch.setattr(store_inbox, "take_for_review", yi_responds_first)
    capsys.readouterr()
    assert inbox_mod.main(["accept", "T1041"]) == 1
    assert capsys.readouterr() == ("", NOT_THE_DRAFT_YOU_SAW)
    assert rows("SELECT event_id, status, claimed_by FROM events") == [("evt_T1041_created", "waiting_human", None)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert state("T1041")["outcome"] == "redraft"  # 图里最后一个决定是乙的 respond,甲的 accept 没有交给图


def test_a_respond_that_loses_the_last_rewrite_to_another_is_refused_and_its_feedback_is_not_lost_silently(
        lab, monkeypatch, capsys):
    """MAX_REDRAFTS=1:甲的 respond 核对时还能重写一次,正要拿走待办的那一刻乙的 respond 用掉了这一次。拿到手之后再核对:
    说到上限了,退出码 1,待办原样放回收件箱,里面是乙的那一版。只在拿到手之前核对的话,甲照样把意见交给图,图拒了(list 里
    多出一句「上一个回答不能用…」),甲却看到「已按意见重写」、退出码 0,甲的意见就这么没了。"""
    monkeypatch.setenv("MAX_REDRAFTS", "1")
    queue("T1041")
    real_take = store_inbox.take_for_review

    def yi_responds_first(event_id, owner=None):
        monkeypatch.setattr(store_inbox, "take_for_review", real_take)  # 乙的命令照常拿待办
        r = inbox({**lab, "MAX_REDRAFTS": "1", "INBOX_USER": "乙"}, "respond", "T1041", "语气再软一点,先道歉")
        assert (r.returncode, r.stdout) == (0, f"已按意见重写,新草稿: {T1041_FIRST_REDRAFT}\n")
        return real_take(event_id, owner)

    monkeypatch.setattr(store_inbox, "take_for_review", yi_responds_first)
    capsys.readouterr()
    assert inbox_mod.main(["respond", "T1041", "提一下发票号"]) == 1
    assert capsys.readouterr() == ("", "T1041 已经按意见重写了 1 次,到上限了,不能再 respond;现在可以:accept / edit / ignore\n")
    assert rows("SELECT event_id, status, claimed_by FROM events") == [("evt_T1041_created", "waiting_human", None)]
    after = state("T1041")
    assert (after["feedback"], after.get("refused")) == (["语气再软一点,先道歉"], None)
    monkeypatch.setattr(store_inbox, "take_for_review", real_take)
    listing = inbox({**lab, "MAX_REDRAFTS": "1"}, "list").stdout.splitlines()
    assert listing[0].startswith("T1041  [refund] ") and "上一个回答不能用" not in listing[0]
    assert listing[1] == f"        草稿:{T1041_FIRST_REDRAFT}"


@contextmanager
def seen_table_locked(env: dict):
    """有人开着事务、占着锁没提交:SQLite 是整个事件库的写锁(BUSY_TIMEOUT_S 默认等 30 秒),
    PostgreSQL 是 inbox_seen 表上的锁(像 psql 里 ALTER TABLE 了没提交;不设 lock_timeout 会一直等)。"""
    if "DATABASE_URL" not in env:
        with write_locked():
            yield
        return
    import psycopg

    with psycopg.connect(env["DATABASE_URL"]) as conn:
        conn.execute("LOCK TABLE inbox_seen IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def test_a_list_that_cannot_record_what_you_saw_still_shows_the_inbox_at_once_and_accept_asks_you_to_list_again(
        any_lab):
    """记「你看到了哪一版」的表被别人锁着:list 照样马上列出来,只是记不下你看到了第二版;
    锁放开后 accept 按上一次记下的第一版核对,对不上就请你再 list,不会发出去。再 list 一次就能发。"""
    lab = any_lab
    jia, yi = {**lab, "INBOX_USER": "甲"}, {**lab, "INBOX_USER": "乙"}
    queue("T1041")
    assert inbox(jia, "list").stdout == T1041_ITEM
    assert inbox(yi, "respond", "T1041", "语气再软一点,先道歉").returncode == 0
    second = f"T1041  [refund] 客户反映:同一笔账单被扣了两次\n        草稿:{T1041_FIRST_REDRAFT}\n"
    started = time.monotonic()
    assert inbox(yi, "list").stdout == second
    unlocked = time.monotonic() - started  # 没有锁时一次 list 要多久(导入、开库)
    with seen_table_locked(lab):
        started = time.monotonic()
        listing = inbox(jia, "list")
        took = time.monotonic() - started
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, second, "")
    assert took < unlocked + 0.5 + 2.5, (took, unlocked)  # 只多等 SEEN_WAIT_S(0.5 秒)
    refused = inbox(jia, "accept", "T1041")
    assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", NOT_THE_DRAFT_YOU_SAW)
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert inbox(jia, "list").stdout == second
    assert inbox(jia, "accept", "T1041").stdout == "T1041 → sent\n"
    assert rows("SELECT body FROM outbox") == [(T1041_FIRST_REDRAFT,)]


def test_an_item_is_not_taken_while_another_event_of_its_ticket_is_being_processed(any_lab):
    queue("T1012")
    second = "evt_T1012_again"
    store.add_event(second, "webhook", "ticket.created",
                    json.dumps({"id": second, "type": "ticket.created", "data": {"ticket_id": "T1012"}}))
    conn = store.connect()
    conn.execute("UPDATE events SET status = 'processing', claimed_by = 'worker-elsewhere:1' WHERE event_id = ?",
                 (second,))
    conn.close()
    assert store_inbox.take_for_review("evt_T1012_created") is False  # 数据库的唯一索引挡住,不只是收件箱先查了一遍
    r = inbox(any_lab, "accept", "T1012")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "T1012 正在被处理(另一个收件箱命令或 worker),稍后再 list 看看\n"
    assert rows("SELECT event_id, status FROM events ORDER BY event_id") == [
        (second, "processing"), ("evt_T1012_created", "waiting_human")]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]


REFUSE_REVIEW_LOG = ("CREATE TRIGGER refuse BEFORE INSERT ON review_log "
                     "BEGIN SELECT RAISE(ABORT, '磁盘写满了(测试制造的故障)'); END")


def refuse_review_log(on: bool) -> None:
    conn = store.connect()
    conn.execute(REFUSE_REVIEW_LOG if on else "DROP TRIGGER refuse")
    conn.close()


def test_an_ignore_that_cannot_be_recorded_is_handed_to_the_worker_and_nothing_is_recorded(lab):
    """ignore 要记一笔 review_log;记不进去时(这里用触发器,和磁盘满一样是真的 SQLite 错误):说明原因、退出码 1。
    人的决定已经写进 checkpoint,所以和发信失败一样交回 worker 续跑,不回收件箱;review_log、发件箱都是空的。"""
    queue("T1012")
    refuse_review_log(True)
    r = inbox(lab, "ignore", "T1012")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "T1012 处理失败(IntegrityError: 磁盘写满了(测试制造的故障)),已交回 worker 续跑\n")
    assert rows("SELECT event_id, status, last_error, claimed_by FROM events") == [
        ("evt_T1012_created", "pending", "IntegrityError: 磁盘写满了(测试制造的故障)", None)]
    assert rows("SELECT COUNT(*) FROM review_log") == [(0,)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    listing = inbox(lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, "收件箱是空的\n", "")


def test_an_ignore_that_failed_to_be_recorded_is_carried_out_by_the_worker_and_not_replaced_later(lab):
    """上一条之后:故障修好,worker 把人已经做的 ignore 做完(记一笔,不发信);之后再 accept 被拒,什么都不发。
    ignore 在 ignore 节点里记账,不在 review 里 interrupt() 之后记:那样记账失败时 LangGraph 把这次的回答和出错的
    review 绑在一起存下,待办回到收件箱,人再 accept,打印的却是 T1012 → ignored,回复没有发出。"""
    queue("T1012")
    refuse_review_log(True)
    assert inbox(lab, "ignore", "T1012").returncode == 1
    refuse_review_log(False)
    assert drain() == [("evt_T1012_created", "ignored")]
    assert rows("SELECT ticket_id, action, final FROM review_log") == [("T1012", "ignore", None)]
    accept = inbox(lab, "accept", "T1012")
    assert (accept.returncode, accept.stdout, accept.stderr) == (
        1, "", "T1012 不在收件箱里(已经处理过,或者还没轮到 worker)\n")
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "ignored")]


def test_a_ticket_whose_event_is_still_with_the_worker_is_refused_as_busy_and_left_alone(any_lab):
    """事件还在 worker 手里(processing,还没进收件箱):说「正在被处理」而不是「不在收件箱里」,什么都不动。"""
    payload = json.dumps({"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}})
    store.add_event("evt_T1012_created", "webhook", "ticket.created", payload)
    conn = store.connect()
    conn.execute("UPDATE events SET status = 'processing', attempts = 1, claimed_by = 'worker-elsewhere:1'")
    conn.close()
    r = inbox(any_lab, "accept", "T1012")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "T1012 正在被处理(另一个收件箱命令或 worker),稍后再 list 看看\n")
    assert rows("SELECT event_id, status, attempts, claimed_by FROM events") == [
        ("evt_T1012_created", "processing", 1, "worker-elsewhere:1")]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert state("T1012") == {}  # 没有替 worker 开跑这张工单的图


def test_an_item_another_inbox_command_finished_in_between_is_refused_and_not_listed(any_lab, monkeypatch, capsys):
    """这个命令查完收件箱、还没读 checkpoint 时,另一个收件箱命令把同一条待办整个处理完了(发出、事件改成 done):
    accept 说清楚、退出码 1,什么都不再做;list 不列它。两个都不是 IndexError 的 traceback。"""
    from langgraph.types import Command

    queue("T1012", "T1041")
    real_thread_of = inbox_mod.thread_of

    def the_other_command_finishes(ticket_id, event_id=None):
        if event_id is not None:  # act() 找到了待办,正要读它的 checkpoint
            with opened_graph() as graph:
                graph.invoke(Command(resume={"type": "accept", "args": None}), real_thread_of(ticket_id))
            store.set_status(event_id, "done")
        return real_thread_of(ticket_id, event_id)

    monkeypatch.setattr(inbox_mod, "thread_of", the_other_command_finishes)
    capsys.readouterr()
    assert inbox_mod.main(["accept", "T1012"]) == 1
    assert capsys.readouterr() == ("", "T1012 刚被另一个收件箱命令拿走处理了,稍后再 list 看看\n")
    assert rows("SELECT ticket_id, sent_by FROM outbox") == [("T1012", "agent+reviewer")]
    assert rows("SELECT ticket_id, action FROM review_log") == [("T1012", "accept")]
    monkeypatch.setattr(inbox_mod, "thread_of", real_thread_of)
    # list 读完事件表之后才被处理完的那一条:事件表里还是 waiting_human,checkpoint 里已经做完了
    with opened_graph() as graph:
        graph.invoke(Command(resume={"type": "ignore", "args": None}), real_thread_of("T1041"))
        inbox_mod.show_list(graph, set())
    assert capsys.readouterr() == ("收件箱是空的\n", "")


def test_an_item_taken_by_another_inbox_command_in_between_is_refused_and_not_touched(lab, monkeypatch, capsys):
    """list 看到了、正要拿走时被另一个收件箱命令抢先拿走:说清楚,退出码 1,不动别人手里的事件。
    两个进程真的同时跑时谁先谁后不确定(见 test_two_inbox_commands_on_one_ticket_at_once_send_one_reply),
    这里在本进程里把「别人先拿走」放在确定的时刻。"""
    queue("T1012")
    real_take = store_inbox.take_for_review

    def someone_else_first(event_id, owner=None):
        assert real_take(event_id, owner="其他收件箱:1")  # 另一个收件箱命令先拿走了
        return real_take(event_id, owner)

    monkeypatch.setattr(store_inbox, "take_for_review", someone_else_first)
    capsys.readouterr()
    assert inbox_mod.main(["accept", "T1012"]) == 1
    assert capsys.readouterr() == ("", "T1012 刚被另一个收件箱命令拿走处理了,稍后再 list 看看\n")
    assert rows("SELECT event_id, status, claimed_by FROM events") == [
        ("evt_T1012_created", "processing", "其他收件箱:1")]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    assert rows("SELECT COUNT(*) FROM review_log") == [(0,)]
    assert state("T1012").get("outcome") is None  # 人的决定没有交给图


# ---------------------------------------------------------------- 数据库暂时用不了
UNAVAILABLE_TAIL = ",这次没有做完;稍后再试,做到一半的下次运行 inbox.py 时会按 checkpoint 更正\n"


def test_a_decision_on_a_write_locked_database_is_refused_in_one_line_and_nothing_changes(lab):
    """事件库被别人占着写锁超过 BUSY_TIMEOUT_S(有人在 sqlite3 里改了东西没提交):list 照样能看(WAL 下读不等写锁);
    accept 拿不到待办,一行说明、退出码 1,待办原样还在,什么都没发。锁放开之后照常处理。"""
    queue("T1012")
    before = inbox(lab, "list").stdout
    env = {**lab, "BUSY_TIMEOUT_S": "0.2"}
    with write_locked():
        listing = inbox(env, "list")
        r = inbox(env, "accept", "T1012")
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, before, "")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "数据库暂时用不了(OperationalError: database is locked)" + UNAVAILABLE_TAIL
    assert rows("SELECT event_id, status FROM events") == [("evt_T1012_created", "waiting_human")]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    r = inbox(lab, "accept", "T1012")
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n", "")
    assert rows("SELECT ticket_id, sent_by FROM outbox") == [("T1012", "agent+reviewer")]


def test_a_decision_whose_database_connections_are_cut_midway_says_so_and_the_worker_sends_it_once(pg_lab):
    """人 accept 之后、review 的结果正要写下时,PostgreSQL 断了这个进程的所有连接(重启、主备切换):一行说明、
    退出码 1,没有 traceback,什么都没发。人的决定已经进了 checkpoint(下一步的 checkpoint 换了新连接写下),
    下一次 list 说明交回 worker;worker 把回复发出去,只发一封,人不用再决定一次。"""
    queue("T1012")
    # PG_IDLE_CHECK_S 很大:借连接前不查,断掉的连接一定会被用上
    r = cut_at({**pg_lab, "PG_IDLE_CHECK_S": "86400"}, "writes:outcome", "inbox.py", "accept", "T1012")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("数据库暂时用不了(AdminShutdown: terminating connection due to administrator command)"
                        + UNAVAILABLE_TAIL)
    assert rows("SELECT status FROM events") == [("processing",)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    listing = inbox(pg_lab, "list")
    assert (listing.returncode, listing.stdout, listing.stderr) == (
        0, "收件箱是空的\n", "(更正:T1012 上次处理中途中断,事件 evt_T1012_created 改为 pending)\n")
    assert drain() == [("evt_T1012_created", "done")]
    assert rows("SELECT ticket_id, sent_by FROM outbox") == [("T1012", "agent+reviewer")]
    assert rows("SELECT ticket_id, action FROM review_log") == [("T1012", "accept")]
