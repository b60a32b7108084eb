"""email_poller.py:对着测试里起的真 IMAP 服务器(pymap,内存后端,只听 127.0.0.1)收信,以及离线 .eml 模式。"""
import argparse
import asyncio
import base64
import hashlib
import imaplib
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import unicodedata
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import email_poller
import mail_imap
import mail_text
import store
import store_biz
import store_events
import store_pg
from conftest import LAB, cli, cut_connections, rows, run, write_locked

SAMPLES = LAB / "samples"
USER, PASSWORD = "kefu@cloudledger.test", "imap-app-code-7788"  # 测试邮箱的账号和「授权码」
MAIL_TICKETS = "SELECT id, customer_id, subject, body, status FROM tickets WHERE id LIKE 'M%' ORDER BY id"
EVENTS = "SELECT event_id, source, kind, payload, status FROM events ORDER BY event_id"


def ticket_of(message_id: str, length: int = 6) -> str:
    return "M" + hashlib.sha1(message_id.encode()).hexdigest()[:length]


def biz_rows(sql: str, args: tuple = ()) -> list[tuple]:
    return rows(sql, args, path=store.biz_target())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mail(message_id: str | None, sender: str, subject: str, body: str) -> bytes:
    """一封最简单的 utf-8 纯文本邮件(LF 换行,和 .eml 文件一样)。"""
    head = [f"From: {sender}", "To: support@cloudledger.example", f"Subject: {subject}", "MIME-Version: 1.0",
            "Content-Type: text/plain; charset=utf-8", "Content-Transfer-Encoding: 8bit"]
    if message_id:
        head.insert(0, f"Message-ID: {message_id}")
    return ("\n".join(head) + "\n\n" + body + "\n").encode()


# ---------------------------------------------------------------- 真 IMAP 服务器
class ImapServer:
    """pymap 的内存后端,跑在 pytest 进程的一个线程里,每个模块起一个(见 pymap_server)。每个测试开始前清空这个账号的
    邮箱(reset),所以每个测试拿到的都是空收件箱、UID 从 101 开始。测试用它往收件箱里投信、看哪些信还没读。"""

    def __init__(self) -> None:
        from pymap.backend.dict import DictBackend
        from pymap.imap import IMAPService
        from pysasl.hashing import BuiltinHash

        self.port = free_port()
        parser = argparse.ArgumentParser()  # 和命令行 pymap --host … --no-tls dict --demo-user … 一样的参数
        DictBackend.add_subparser("dict", parser.add_subparsers(dest="backend"))
        IMAPService.add_arguments(parser)
        parser.set_defaults(debug=False, skip_services=[], passlib_cfg=None)
        args = parser.parse_args(["--host", "127.0.0.1", "--port", str(self.port), "--no-tls",
                                  "dict", "--demo-user", USER, "--demo-password", PASSWORD])
        ready, failed = threading.Event(), []

        async def serve() -> None:
            try:
                # 登录时的密码校验用便宜的哈希:默认的 pbkdf2 50 万轮每次登录要 0.13 秒,每个测试登录十来次
                backend, self.config = await DictBackend.init(args, hash_context=BuiltinHash(rounds=1))
                self.config.apply_context()
                self.loop = asyncio.get_running_loop()
                self.stopped = self.loop.create_future()
                async with AsyncExitStack() as stack:
                    await IMAPService(backend, self.config).start(stack)
                    ready.set()
                    await self.stopped
            except BaseException as e:
                failed.append(e)
                ready.set()
                raise

        self.thread = threading.Thread(target=asyncio.run, args=(serve(),), name="pymap", daemon=True)
        self.thread.start()
        if not ready.wait(20) or failed:
            raise RuntimeError(f"pymap 没起来:{failed!r}")

    def reset(self) -> None:
        """这个账号的邮箱全部清掉(文件夹、信、旗标):下次登录时是一个新的空收件箱,UID 又从 101 开始。"""
        asyncio.run_coroutine_threadsafe(self._forget_mailboxes(), self.loop).result(10)

    async def _forget_mailboxes(self) -> None:
        self.config.set_cache.pop(USER, None)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopped.set_result, None)
        self.thread.join(10)

    def client(self) -> imaplib.IMAP4:
        imap = imaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        imap.login(USER, PASSWORD)
        imap.select("INBOX")
        return imap

    def append(self, *messages: bytes) -> None:
        imap = self.client()
        try:
            for raw in messages:
                assert imap.append("INBOX", None, None, raw)[0] == "OK"
        finally:
            imap.logout()

    def flags(self) -> dict[int, set[str]]:
        """{UID: 旗标};\\Recent 是服务器自己的,不算。"""
        imap = self.client()
        try:
            typ, data = imap.uid("FETCH", "1:*", "(FLAGS)")
        finally:
            imap.logout()
        out = {}
        for line in data:
            if line:
                text = line.decode()
                uid = int(re.search(r"UID (\d+)", text).group(1))
                out[uid] = set(re.search(r"FLAGS \(([^)]*)\)", text).group(1).split()) - {"\\Recent"}
        return out

    def unseen(self) -> list[int]:
        return sorted(uid for uid, f in self.flags().items() if "\\Seen" not in f)


@pytest.fixture(scope="module")
def pymap_server():
    server = ImapServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def imap_server(pymap_server):
    """这个测试自己的空收件箱(同一个 pymap,开始前清空)。"""
    pymap_server.reset()
    return pymap_server


@pytest.fixture(autouse=True)
def in_lab(monkeypatch):
    """cli() 在 pytest 进程里跑命令:和 run() 一样在实验目录里,samples/… 这样的相对路径才找得到。"""
    monkeypatch.chdir(LAB)


@pytest.fixture
def imap_env(lab, imap_server):
    return {**lab, "IMAP_HOST": "127.0.0.1", "IMAP_PORT": str(imap_server.port), "IMAP_USER": USER,
            "IMAP_PASSWORD": PASSWORD, "IMAP_SSL": "0"}


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


ZHANG = mail("<t1@example.com>", "张伟 <Zhang.Wei@Example.com>", "发票开错了", "发票抬头写错了,麻烦重开。")
STRANGER = mail("<t2@example.org>", "someone@example.org", "合作", "想谈谈合作。")
LI = mail("<t3@example.com>", "li.na@example.com", "扣款", "又被扣了一次款。")


# ---------------------------------------------------------------- 收信:正常路径
def test_poll_stores_known_customers_skips_strangers_and_marks_every_handled_mail_seen(imap_env, imap_server):
    imap_server.append(ZHANG, STRANGER, LI)
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stderr) == (0, "")
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert r.stdout.splitlines() == [
        f"{t1}  UID 101",
        "skip: 不是已知客户  UID 102",
        f"{t3}  UID 103",
        "本次收取 3 封:新工单 2,重复 0,跳过 1,无法解析 0,存储失败 0",
    ]
    today = store.now()[:10]
    assert biz_rows("SELECT id, customer_id, subject, body, status, created_at FROM tickets WHERE id LIKE 'M%' "
                    "ORDER BY customer_id") == [
        (t1, "C001", "发票开错了", "发票抬头写错了,麻烦重开。", "open", today),
        (t3, "C002", "扣款", "又被扣了一次款。", "open", today),
    ]
    assert rows(EVENTS) == [
        ("<t1@example.com>", "email", "ticket.created",
         f'{{"id": "<t1@example.com>", "type": "ticket.created", "data": {{"ticket_id": "{t1}"}}}}', "pending"),
        ("<t3@example.com>", "email", "ticket.created",
         f'{{"id": "<t3@example.com>", "type": "ticket.created", "data": {{"ticket_id": "{t3}"}}}}', "pending"),
    ]
    assert imap_server.flags() == {101: {"\\Seen"}, 102: {"\\Seen"}, 103: {"\\Seen"}}

    again = cli(["email_poller.py"], imap_env)  # 没有新信:什么都不做
    assert (again.returncode, again.stdout, again.stderr) == (
        0, "本次收取 0 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    assert len(rows(EVENTS)) == 2


def test_same_mail_delivered_again_is_reported_duplicate_and_marked_seen(imap_env, imap_server):
    imap_server.append(ZHANG)
    assert cli(["email_poller.py"], imap_env).returncode == 0
    imap_server.append(ZHANG)  # 上游重投:同一个 Message-ID,新的 UID
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == ["duplicate  UID 102",
                                     "本次收取 1 封:新工单 0,重复 1,跳过 0,无法解析 0,存储失败 0"]
    assert imap_server.unseen() == []
    assert len(rows(EVENTS)) == 1 and len(biz_rows(MAIL_TICKETS)) == 1


def test_broken_mail_is_reported_with_its_reason_flagged_for_a_human_and_others_go_on(imap_env, imap_server):
    imap_server.append(sample("10_broken.eml"), ZHANG)
    r = cli(["email_poller.py"], imap_env)
    assert r.returncode == 1
    assert r.stderr == "无法解析:没有邮件头,不像一封邮件(文件被截断或损坏?)  UID 101\n"
    assert r.stdout.splitlines() == [f"{ticket_of('<t1@example.com>')}  UID 102",
                                     "本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 1,存储失败 0"]
    assert imap_server.flags() == {101: {"\\Seen", "\\Flagged"}, 102: {"\\Seen"}}
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>"]


def test_a_mail_the_email_library_chokes_on_is_reported_with_the_library_error_and_flagged(imap_env, imap_server):
    """email 库自己抛异常的邮件(这里是 RFC 2231 写法的 filename*= 参数里夹着 NUL 字节,email 库拿它当编码名去解码时
    抛 ValueError;模糊测试里碰到过。charset 里夹着 NUL 的另行换着字符集解,见下面的测试):
    和别的坏信一样一行原因、标已读加星标,其他邮件照常,退出码 1。"""
    choking = mail("<nul@example.com>", "zhang.wei@example.com", "发票", "发票开错了。").replace(
        b"Content-Transfer-Encoding: 8bit", b"Content-Transfer-Encoding: 8bit\nContent-Disposition: inline; "
                                            b"filename*=\x00''note.txt")
    imap_server.append(choking, ZHANG)
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stderr) == (1, "无法解析:ValueError: embedded null character  UID 101\n")
    assert r.stdout.splitlines() == [f"{ticket_of('<t1@example.com>')}  UID 102",
                                     "本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 1,存储失败 0"]
    assert imap_server.flags() == {101: {"\\Seen", "\\Flagged"}, 102: {"\\Seen"}}
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>"]
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == [ticket_of("<t1@example.com>")]


def test_a_mail_without_a_sender_address_is_reported_with_the_phone_number_in_its_from_masked(imap_env, imap_server):
    """From 头里没有地址、只有名字和手机号:原因里带的 From 头先打码再打到 stderr(手机号不能原样进 cron 的日志)。
    这封信和别的坏信一样标已读加星标留给人看,其他邮件照常。"""
    imap_server.append(mail("<nofrom@example.com>", "张伟 13812345678", "发票", "发票开错了。"), ZHANG)
    r = cli(["email_poller.py"], imap_env)
    assert r.returncode == 1
    assert r.stderr == "无法解析:找不到发件人地址(From: '张伟 138****5678')  UID 101\n"
    assert "13812345678" not in r.stderr + r.stdout
    assert r.stdout.splitlines() == [f"{ticket_of('<t1@example.com>')}  UID 102",
                                     "本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 1,存储失败 0"]
    assert imap_server.flags() == {101: {"\\Seen", "\\Flagged"}, 102: {"\\Seen"}}
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>"]
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == [ticket_of("<t1@example.com>")]


def test_a_mail_cut_inside_its_headers_is_flagged_not_stored_and_its_full_copy_later_becomes_the_ticket(imap_env,
                                                                                                       imap_server):
    """邮箱里的一封信只有前 300 个字节(投递中断),截在半行邮件头「Content-T」上。防的是:它成了一张正文是「Content-T」的工单,
    退出码 0;完整的那封再来时 Message-ID 一样,只说 duplicate,客户写的内容就丢了。它和别的坏信一样:
    一行原因、标已读加星标留给人看、不入库,其他邮件照常;完整的那封到了照常建工单,正文是客户写的。"""
    full = sample("01_utf8_plain.eml")
    imap_server.append(full[:300], LI)
    r = cli(["email_poller.py"], imap_env)
    t3 = ticket_of("<t3@example.com>")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, f"{t3}  UID 102\n本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 1,存储失败 0\n",
        "无法解析:邮件头没有以空行结束(邮件被截断或损坏?)  UID 101\n")
    assert imap_server.flags() == {101: {"\\Seen", "\\Flagged"}, 102: {"\\Seen"}}
    assert biz_rows(MAIL_TICKETS) == [(t3, "C002", "扣款", "又被扣了一次款。", "open")]
    assert [e[0] for e in rows(EVENTS)] == ["<t3@example.com>"]

    imap_server.append(full)  # 完整的那封(上游重投)
    again = cli(["email_poller.py"], imap_env)
    t1 = ticket_of(sample_id("01_utf8_plain.eml"))
    assert (again.returncode, again.stdout, again.stderr) == (
        0, f"{t1}  UID 103\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    _, customer, subject, body = EXPECTED_SAMPLES["01_utf8_plain.eml"]
    assert biz_rows(MAIL_TICKETS) == sorted([(t1, customer, subject, body, "open"),
                                             (t3, "C002", "扣款", "又被扣了一次款。", "open")])
    assert sorted(e[0] for e in rows(EVENTS)) == sorted([sample_id("01_utf8_plain.eml"), "<t3@example.com>"])
    assert imap_server.flags() == {101: {"\\Seen", "\\Flagged"}, 102: {"\\Seen"}, 103: {"\\Seen"}}


def test_mails_whose_message_ids_differ_only_in_chinese_characters_are_two_tickets_not_duplicates(imap_env,
                                                                                                  imap_server):
    """Message-ID 里直接写着 UTF-8 字节(<工单三@…>):和别的邮件头一样解码。防的是:非 ASCII 的字节一律变成 U+FFFD,
    字节数一样的两封信得到同一个事件 id,都说 duplicate、标了已读,退出码 0,两封客户来信就这么丢了。"""
    a, b = "<工单三@example.com>", "<退款四@example.com>"
    imap_server.append(mail(a, "zhang.wei@example.com", "第三封", "发票开错了。"),
                       mail(b, "li.na@example.com", "第四封", "我要退款。"))
    r = cli(["email_poller.py"], imap_env)
    ta, tb = ticket_of(a), ticket_of(b)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{ta}  UID 101\n{tb}  UID 102\n本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    assert imap_server.flags() == {101: {"\\Seen"}, 102: {"\\Seen"}}
    assert biz_rows(MAIL_TICKETS) == sorted([(ta, "C001", "第三封", "发票开错了。", "open"),
                                             (tb, "C002", "第四封", "我要退款。", "open")])
    assert sorted((e[0], store_events.ticket_of(e[3])) for e in rows(EVENTS)) == sorted([(a, ta), (b, tb)])

    imap_server.append(mail(b, "li.na@example.com", "第四封", "我要退款。"))  # 上游重投:这才是重复
    again = cli(["email_poller.py"], imap_env)
    assert (again.returncode, again.stdout, again.stderr) == (
        0, "duplicate  UID 103\n本次收取 1 封:新工单 0,重复 1,跳过 0,无法解析 0,存储失败 0\n", "")
    assert imap_server.unseen() == [] and len(rows(EVENTS)) == len(biz_rows(MAIL_TICKETS)) == 2


# ---------------------------------------------------------------- 不丢邮件:存储失败、两个库之间崩溃
FAIL_EVENTS = ("CREATE TRIGGER broken BEFORE INSERT ON events "
               "BEGIN SELECT RAISE(ABORT, '磁盘写满了(测试制造的故障)'); END")
FAIL_TICKETS = FAIL_EVENTS.replace("ON events", "ON tickets")


def sql_on(path, sql: str) -> None:
    conn = store.connect(path)
    try:
        conn.execute(sql)
    finally:
        conn.close()


def test_mail_stays_unseen_when_storing_the_event_fails_and_is_picked_up_next_run(imap_env, imap_server):
    """工单已经写进业务库、事件写失败 —— 和「两个库之间进程崩了」是同一个局面。下次运行要补上事件,工单号不变。"""
    imap_server.append(ZHANG)
    sql_on(store.events_db(), FAIL_EVENTS)
    r = cli(["email_poller.py"], imap_env)
    assert r.returncode == 1
    assert r.stderr == ("存储失败,邮件保持未读,下次再收:IntegrityError: 磁盘写满了(测试制造的故障)  UID 101\n")
    assert r.stdout == "本次收取 1 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 1\n"
    assert imap_server.unseen() == [101]
    t1 = ticket_of("<t1@example.com>")
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == [t1]  # 业务库里的那一半
    assert rows(EVENTS) == []

    sql_on(store.events_db(), "DROP TRIGGER broken")  # 故障修好了
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [f"{t1}  UID 101", "本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0"]
    assert imap_server.unseen() == []
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == [t1]
    assert [(e[0], e[3]) for e in rows(EVENTS)] == [
        ("<t1@example.com>", f'{{"id": "<t1@example.com>", "type": "ticket.created", "data": {{"ticket_id": "{t1}"}}}}')]


def test_mail_stays_unseen_when_storing_the_ticket_fails_and_nothing_is_half_stored(imap_env, imap_server):
    imap_server.append(ZHANG, LI)
    sql_on(store.biz_db(), FAIL_TICKETS)
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stdout) == (1, "本次收取 2 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 2\n")
    assert r.stderr.splitlines() == [
        "存储失败,邮件保持未读,下次再收:IntegrityError: 磁盘写满了(测试制造的故障)  UID 101",
        "存储失败,邮件保持未读,下次再收:IntegrityError: 磁盘写满了(测试制造的故障)  UID 102"]
    assert (imap_server.unseen(), biz_rows(MAIL_TICKETS), rows(EVENTS)) == ([101, 102], [], [])

    sql_on(store.biz_db(), "DROP TRIGGER broken")
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [f"{ticket_of('<t1@example.com>')}  UID 101",
                                     f"{ticket_of('<t3@example.com>')}  UID 102",
                                     "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0"]
    assert imap_server.unseen() == [] and len(rows(EVENTS)) == 2


def test_a_write_locked_database_stops_the_run_at_the_first_mail_and_leaves_the_rest_unseen(imap_env, imap_server):
    """事件库被别人占着写锁超过 BUSY_TIMEOUT_S:第一封已知客户的信存不进去,这一轮就停下(后面的每封都要白等一遍锁),
    剩下的不取、保持未读;一行说明,退出码 1。锁放开之后下一次全部收好,工单号不变。"""
    imap_server.append(ZHANG, STRANGER, LI)
    with write_locked():
        r = cli(["email_poller.py"], {**imap_env, "BUSY_TIMEOUT_S": "0.2"})
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "存储失败,邮件保持未读,下次再收:数据库暂时用不了(OperationalError: database is locked)  UID 101",
        "数据库暂时用不了,这一轮停下:剩下的 2 封这次不收,保持未读,下次再收"]
    assert r.stdout == "本次收取 1 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 1\n"
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert (imap_server.unseen(), [t[0] for t in biz_rows(MAIL_TICKETS)], rows(EVENTS)) == ([101, 102, 103], [t1], [])

    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [f"{t1}  UID 101", "skip: 不是已知客户  UID 102", f"{t3}  UID 103",
                                     "本次收取 3 封:新工单 2,重复 0,跳过 1,无法解析 0,存储失败 0"]
    assert imap_server.unseen() == [] and [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]


def test_offline_run_on_a_write_locked_database_stops_at_the_first_failure_and_says_what_is_left(lab, tmp_path):
    (tmp_path / "a.eml").write_bytes(ZHANG)
    (tmp_path / "b.eml").write_bytes(LI)
    with write_locked():
        r = cli(["email_poller.py", "--eml", str(tmp_path)], {**lab, "BUSY_TIMEOUT_S": "0.2"})
    assert (r.returncode, r.stdout) == (1, "本次收取 1 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 1\n")
    assert r.stderr.splitlines() == [
        "存储失败,修好后重跑这条命令,已经存好的会显示 duplicate:数据库暂时用不了(OperationalError: database is locked)"
        f"  {tmp_path}/a.eml",
        "数据库暂时用不了,这一轮停下:剩下的 1 个文件没有处理,修好后重跑这条命令"]
    assert rows(EVENTS) == []
    again = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.splitlines() == [f"{ticket_of('<t1@example.com>')}  {tmp_path}/a.eml",
                                         f"{ticket_of('<t3@example.com>')}  {tmp_path}/b.eml",
                                         "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0"]


def test_cut_database_connections_before_the_first_mail_stop_the_run_in_one_line(pg_lab, tmp_path, monkeypatch,
                                                                                 capsys):
    """PostgreSQL 重启、连接在服务器那头被掐断之后,一开始建表就用上了死连接:一行说明、退出码 1,一封都没碰;
    下一次照常。"""
    (tmp_path / "a.eml").write_bytes(ZHANG)
    monkeypatch.setenv("PG_IDLE_CHECK_S", "86400")  # 借连接前不查,死连接一定会被用上
    store_pg.close_pools()
    assert rows(EVENTS) == []  # 开好连接池
    assert cut_connections(os.getpid()) >= 1
    assert email_poller.main(["--eml", str(tmp_path)]) == 1
    assert capsys.readouterr() == ("", "数据库暂时用不了(AdminShutdown: terminating connection due to administrator "
                                       "command),这一轮一封都没有处理,稍后再跑\n")
    assert (rows(EVENTS), biz_rows(MAIL_TICKETS)) == ([], [])
    assert email_poller.main(["--eml", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{ticket_of('<t1@example.com>')}  {tmp_path}/a.eml"
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>"]


def test_offline_storage_failure_says_to_rerun_and_the_rerun_heals(lab, tmp_path):
    (tmp_path / "a.eml").write_bytes(ZHANG)
    sql_on(store.events_db(), FAIL_EVENTS)
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (r.returncode, r.stderr) == (1, "存储失败,修好后重跑这条命令,已经存好的会显示 duplicate:"
                                           f"IntegrityError: 磁盘写满了(测试制造的故障)  {tmp_path}/a.eml\n")
    assert r.stdout == "本次收取 1 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 1\n"
    t1 = ticket_of("<t1@example.com>")
    assert ([t[0] for t in biz_rows(MAIL_TICKETS)], rows(EVENTS)) == ([t1], [])  # 业务库里的那一半,没有事件
    sql_on(store.events_db(), "DROP TRIGGER broken")
    again = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (again.returncode, again.stdout.splitlines()[0]) == (0, f"{t1}  {tmp_path}/a.eml")
    assert (again.stderr, again.stdout.splitlines()[1]) == ("", "本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0")
    assert len(rows(EVENTS)) == 1 and len(biz_rows(MAIL_TICKETS)) == 1
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == [t1]  # 工单号不变,补上的事件指向它
    assert store_events.ticket_of(rows(EVENTS)[0][3]) == t1


def test_an_eml_file_that_cannot_be_read_is_one_line_and_the_other_files_are_still_stored(lab, tmp_path):
    """文件在,但读不了(这里用 /proc/self/mem:谁读都是 EIO,root 也一样):说是哪个文件、为什么,其余照常,
    退出码 1。防的是:前面的文件存好之后整个崩掉,后面的不处理、只有一段 Traceback。"""
    (tmp_path / "a.eml").write_bytes(ZHANG)
    (tmp_path / "b.eml").write_bytes(LI)
    a, b = f"{tmp_path}/a.eml", f"{tmp_path}/b.eml"
    r = cli(["email_poller.py", "--eml", a, "/proc/self/mem", b], lab)
    assert r.returncode == 1
    assert r.stderr == "读不了这个文件,修好后重跑这条命令:Input/output error  /proc/self/mem\n"
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert r.stdout.splitlines() == [f"{t1}  {a}", f"{t3}  {b}",
                                     "本次收取 3 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0,读取失败 1"]
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == sorted([t1, t3])
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]


def test_a_dangling_mail_link_in_a_folder_is_reported_and_the_other_files_are_still_stored(lab, tmp_path):
    """目录里的 a.eml 是符号链接,指向的文件已经被移走:不能不声不响地跳过(汇总里看不出少了一封)。
    它和读不了的文件一样:一行说是哪个文件、指向哪里,其余照常,退出码 1;把文件放回去再跑,它就入库了。"""
    gone = tmp_path / "moved-away.eml"
    (tmp_path / "a.eml").symlink_to(gone)
    (tmp_path / "b.eml").write_bytes(LI)
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, f"{t3}  {tmp_path}/b.eml\n本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0,读取失败 1\n",
        f"读不了这个文件,修好后重跑这条命令:No such file or directory(它是符号链接,指向的 {gone} 不存在)"
        f"  {tmp_path}/a.eml\n")
    assert [e[0] for e in rows(EVENTS)] == ["<t3@example.com>"]
    gone.write_bytes(ZHANG)
    again = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (again.returncode, again.stdout, again.stderr) == (
        0, f"{t1}  {tmp_path}/a.eml\nduplicate  {tmp_path}/b.eml\nduplicate  {tmp_path}/moved-away.eml\n"
           "本次收取 3 封:新工单 1,重复 2,跳过 0,无法解析 0,存储失败 0\n", "")
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]


def test_a_dangling_mail_link_given_by_name_says_where_it_points_and_nothing_is_stored(lab, tmp_path):
    link = tmp_path / "a.eml"
    link.symlink_to("gone.eml")
    r = cli(["email_poller.py", "--eml", str(link), "samples/01_utf8_plain.eml"], lab)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", f"找不到文件或目录:{link}(它是符号链接,指向的 gone.eml 不存在)\n")
    nothing_stored()


def test_process_killed_after_storing_but_before_marking_seen_gives_duplicate_next_run(lab, imap_env, imap_server):
    """入库之后、标已读之前进程没了:信还是未读,下次收到时说 duplicate 并标已读,不会多一张工单。"""
    imap_server.append(ZHANG)
    raw = imap_server.client().uid("FETCH", "101", "(BODY.PEEK[])")[1][0][1]
    assert email_poller.handle(raw, "UID 101").kind == "ticket"  # 模拟:存好了,还没来得及 STORE \Seen
    assert imap_server.unseen() == [101]
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, "duplicate  UID 101\n本次收取 1 封:新工单 0,重复 1,跳过 0,无法解析 0,存储失败 0\n", "")
    assert imap_server.unseen() == [] and len(rows(EVENTS)) == 1 and len(biz_rows(MAIL_TICKETS)) == 1


# ---------------------------------------------------------------- 邮箱连不上、登录失败、设置不全
def nothing_stored(server: ImapServer | None = None, unseen: list[int] | None = None) -> None:
    assert rows(EVENTS) == [] and biz_rows(MAIL_TICKETS) == []
    if server:
        assert server.unseen() == unseen


def test_wrong_password_is_one_clear_line_and_no_mail_is_touched(imap_env, imap_server):
    imap_server.append(ZHANG)
    r = cli(["email_poller.py"], {**imap_env, "IMAP_PASSWORD": "not-the-app-code"})
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (f"IMAP 登录失败(用户 {USER}):[AUTHENTICATIONFAILED] Invalid authentication credentials.;"
                        "检查 IMAP_USER 和 IMAP_PASSWORD(很多邮箱要填授权码,不是网页登录密码)\n")
    nothing_stored(imap_server, [101])


def test_missing_mailbox_folder_is_reported(imap_env, imap_server):
    imap_server.append(ZHANG)
    r = cli(["email_poller.py"], {**imap_env, "IMAP_MAILBOX": "没有这个文件夹"})
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr.startswith("打不开邮箱文件夹 没有这个文件夹:") and r.stderr.endswith("(检查 IMAP_MAILBOX)\n")
    assert len(r.stderr.splitlines()) == 1
    nothing_stored(imap_server, [101])


def test_chinese_folder_names_are_sent_in_modified_utf7(imap_env, imap_server):
    assert mail_imap.mailbox_name("~peter/mail/台北/日本語") == '"~peter/mail/&U,BTFw-/&ZeVnLIqe-"'  # RFC 3501 的例子
    assert mail_imap.mailbox_name("客服 收件箱") == '"&W6JnDQ- &ZTZO9nux-"'
    assert mail_imap.mailbox_name("INBOX") == "INBOX"
    imap = imap_server.client()
    try:
        assert imap.create('"&W6JnDQ- &ZTZO9nux-"')[0] == "OK"
        assert imap.append('"&W6JnDQ- &ZTZO9nux-"', None, None, ZHANG)[0] == "OK"
    finally:
        imap.logout()
    r = cli(["email_poller.py"], {**imap_env, "IMAP_MAILBOX": "客服 收件箱"})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[0] == f"{ticket_of('<t1@example.com>')}  UID 101"


def test_unreachable_host_is_one_clear_line(imap_env):
    port = free_port()  # 没有人在听
    r = cli(["email_poller.py"], {**imap_env, "IMAP_PORT": str(port)})
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == f"连不上 IMAP 服务器 127.0.0.1:{port}:Connection refused\n"
    nothing_stored()


def test_server_that_never_answers_times_out_instead_of_hanging(imap_env):
    with socket.socket() as silent:  # 接受连接,但一个字节也不回
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        started = time.monotonic()
        r = cli(["email_poller.py"], {**imap_env, "IMAP_PORT": str(port), "IMAP_TIMEOUT_S": "1"})
    assert time.monotonic() - started < 15
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (f"连接 IMAP 服务器 127.0.0.1:{port} 超时(1 秒没有回应;IMAP_SSL=0 连上 SSL 直连的端口"
                        "(一般是 993)也是这样,那就设 IMAP_SSL=1)\n")
    nothing_stored()


@pytest.mark.parametrize("cut_at, reset, message", [
    (b" LOGIN ", False, "登录 IMAP 服务器 127.0.0.1:{port} 时连接断了:command: LOGIN => socket error: EOF"),
    (b" SELECT ", False,
     "打开邮箱文件夹 INBOX 时和 IMAP 服务器 127.0.0.1:{port} 的连接断了:command: SELECT => socket error: EOF"),
    (b"UID SEARCH", False, "收信中途出错:command: UID => socket error: EOF;已处理 0 封,没标已读的下次再收"),
    (b"UID FETCH", False, "收信中途出错:command: UID => socket error: EOF;已处理 0 封,没标已读的下次再收"),
    # 对方重置了连接(防火墙、服务器重启):socket 错误的 args[0] 只是错误号,要说原因,不说「收信中途出错:104」
    (b" LOGIN ", True, "登录 IMAP 服务器 127.0.0.1:{port} 时连接断了:Connection reset by peer"),
    (b"UID SEARCH", True, "收信中途出错:Connection reset by peer;已处理 0 封,没标已读的下次再收"),
    (b"UID FETCH", True, "收信中途出错:Connection reset by peer;已处理 0 封,没标已读的下次再收"),
], ids=["login", "select", "search", "fetch", "login-reset", "search-reset", "fetch-reset"])
def test_connection_lost_before_a_mail_is_read_is_one_clear_line_and_nothing_is_stored(imap_env, imap_server, cut_at,
                                                                                        reset, message):
    """登录、选文件夹时连接断了,说的是连接断了,不是「检查 IMAP_USER 和 IMAP_PASSWORD」「检查 IMAP_MAILBOX」。"""
    imap_server.append(ZHANG)
    front = Front(imap_server.port, cut_at=cut_at, reset=reset)
    try:
        r = cli(["email_poller.py"], {**imap_env, "IMAP_PORT": str(front.port)})
    finally:
        front.close()
    assert (r.returncode, r.stdout, r.stderr) == (3, "", message.format(port=front.port) + "\n")
    nothing_stored(imap_server, [101])


def test_connection_lost_while_marking_a_stored_mail_read_loses_nothing_and_the_next_run_says_duplicate(
        imap_env, imap_server):
    imap_server.append(ZHANG)
    front = Front(imap_server.port, cut_at=b"UID STORE")
    try:
        r = cli(["email_poller.py"], {**imap_env, "IMAP_PORT": str(front.port)})
    finally:
        front.close()
    ticket = ticket_of("<t1@example.com>")
    assert (r.returncode, r.stdout) == (3, f"{ticket}  UID 101\n")
    assert r.stderr == "收信中途出错:command: UID => socket error: EOF;已处理 1 封,没标已读的下次再收\n"
    assert len(rows(EVENTS)) == 1 and imap_server.unseen() == [101]  # 存好了,信还是未读
    again = cli(["email_poller.py"], imap_env)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == "duplicate  UID 101\n本次收取 1 封:新工单 0,重复 1,跳过 0,无法解析 0,存储失败 0\n"
    assert len(rows(EVENTS)) == 1 and imap_server.unseen() == []


def test_output_closed_early_exits_141_quietly_and_the_next_run_picks_up_every_mail(imap_env, imap_server):
    """email_poller.py | head -1,head 先走了:写标准输出时的 BrokenPipeError 不是邮箱出错
    (不说「收信中途出错:32」、退出码 3):和 --eml 一样安静退出,退出码 141。已经存好、还没标已读的那封
    下次是 duplicate,没收的下次照常收,一封都不丢。"""
    from test_config import into_a_closed_pipe

    imap_server.append(ZHANG, LI)
    code, err = into_a_closed_pipe(["email_poller.py"], imap_env)
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert (code, err) == (141, "")
    assert imap_server.unseen() == [101, 102]
    assert ([t[0] for t in biz_rows(MAIL_TICKETS)], [e[0] for e in rows(EVENTS)]) == ([t1], ["<t1@example.com>"])
    again = cli(["email_poller.py"], imap_env)
    assert (again.returncode, again.stdout, again.stderr) == (
        0, f"duplicate  UID 101\n{t3}  UID 102\n本次收取 2 封:新工单 1,重复 1,跳过 0,无法解析 0,存储失败 0\n", "")
    assert imap_server.unseen() == [] and [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]


@pytest.mark.parametrize("change, message", [
    ({"IMAP_HOST": "", "IMAP_USER": "", "IMAP_PASSWORD": ""},
     "缺少邮箱设置:IMAP_HOST、IMAP_USER、IMAP_PASSWORD(写进环境变量或 .env;IMAP_PASSWORD 填邮箱的授权码)"),
    ({"IMAP_PASSWORD": ""}, "缺少邮箱设置:IMAP_PASSWORD(写进环境变量或 .env;IMAP_PASSWORD 填邮箱的授权码)"),
    ({"IMAP_SSL": "yes"}, "IMAP_SSL 只能是 1(SSL 直连,默认)或 0(明文),现在是 'yes'"),
    ({"IMAP_SSL": "1", "IMAP_CAFILE": "/nonexistent/ca.pem"}, "IMAP_CAFILE 指的 CA 证书文件不存在:/nonexistent/ca.pem"),
    # 明文连接时不能悄悄不用它:以为设了 CA 就加密了,密码却是明文发的
    ({"IMAP_SSL": "0", "IMAP_CAFILE": str(LAB / "crontab.example")},
     "IMAP_CAFILE 只在 IMAP_SSL=1(SSL 直连)时用得上;IMAP_SSL=0 是明文连接,密码不加密、也不校验证书。"
     "用自建邮箱的私有 CA 时把 IMAP_SSL 设成 1"),
    ({"IMAP_PORT": "abc"}, "配置错误:IMAP_PORT='abc' 不是数字"),
    ({"IMAP_PORT": "-1"}, "配置错误:IMAP_PORT='-1' 不能小于 1"),
    ({"IMAP_TIMEOUT_S": "0"}, "配置错误:IMAP_TIMEOUT_S='0' 不能小于 0.1"),
    ({"IMAP_SSL": "1", "IMAP_CAFILE": str(LAB / "crontab.example")},
     f"IMAP_CAFILE 不是能用的 CA 证书文件:{LAB / 'crontab.example'}(NO_CERTIFICATE_OR_CRL_FOUND)"),
    # 在、是文件,读的时候出错(没有读权限也走这里;测试以 root 运行,权限挡不住,用读出来就是 I/O 错误的文件)
    ({"IMAP_SSL": "1", "IMAP_CAFILE": "/proc/self/mem"}, "IMAP_CAFILE 读不了:/proc/self/mem(Input/output error)"),
    # idna 编不出来的主机名:一行说明,不是 traceback、退出码 1
    ({"IMAP_HOST": "imap..example.com"}, "IMAP_HOST='imap..example.com' 不是合法的主机名:有一段是空的(连着两个点、"
                                          "以点开头)或者超过 63 个字符"),
    ({"IMAP_HOST": "a" * 64 + ".example.com"}, f"IMAP_HOST={'a' * 64 + '.example.com'!r} 不是合法的主机名:有一段是空的"
                                               "(连着两个点、以点开头)或者超过 63 个字符"),
    # 照邮箱帮助页抄来的写法:是设置错,不是「连不上 IMAP 服务器…:域名解析失败」、退出码 3(像是暂时的)
    ({"IMAP_HOST": "imap://imap.qq.com"}, "IMAP_HOST='imap://imap.qq.com' 只写主机名,不带 imap:// 前缀:"
                                          "写成 IMAP_HOST=imap.qq.com,端口写进 IMAP_PORT"),
    ({"IMAP_HOST": "imaps://imap.qq.com:993/"}, "IMAP_HOST='imaps://imap.qq.com:993/' 只写主机名,不带 imaps:// 前缀:"
                                                "写成 IMAP_HOST=imap.qq.com,端口写进 IMAP_PORT"),
    ({"IMAP_HOST": "imap.qq.com:993"}, "IMAP_HOST='imap.qq.com:993' 里带了端口:写成 IMAP_HOST=imap.qq.com 和 IMAP_PORT=993"),
    ({"IMAP_HOST": "[::1]"}, "IMAP_HOST='[::1]' 的 IPv6 地址不加方括号(写成 IMAP_HOST=::1 这样),端口写进 IMAP_PORT"),
    ({"IMAP_HOST": "imap qq.com"}, "IMAP_HOST='imap qq.com' 不是合法的主机名:里面不能有空格或 /"),
    ({"IMAP_HOST": "imap\x80.qq.com"}, "IMAP_HOST='imap\\x80.qq.com' 不是合法的主机名:有域名里不允许的字符:'imap\\x80'"),
])
def test_bad_settings_are_named_and_nothing_is_stored(imap_env, imap_server, change, message):
    imap_server.append(ZHANG)
    r = cli(["email_poller.py"], {**imap_env, **change})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == message + "\n"
    nothing_stored(imap_server, [101])


@pytest.mark.parametrize("change, message", [
    # 授权码是从网页上复制的,带进了一个全角字符:不打印授权码,也不打印那个字符
    ({"IMAP_PASSWORD": "imap－app-code-7788"}, "IMAP_PASSWORD 里有非 ASCII 的字符(第 5 个),IMAP 登录只认 ASCII:"
                                              "多半是复制授权码时带进了全角字符或中文"),
    ({"IMAP_PASSWORD": "imap-app-code-７788"}, "IMAP_PASSWORD 里有非 ASCII 的字符(第 15 个),IMAP 登录只认 ASCII:"
                                               "多半是复制授权码时带进了全角字符或中文"),  # 全角的 7
    ({"IMAP_USER": "kefu＠cloudledger.test"}, "IMAP_USER 里有非 ASCII 的字符(第 5 个 '＠'):'kefu＠cloudledger.test',"
                                              "IMAP 登录只认 ASCII:多半是复制邮箱地址时带进了全角字符或中文"),
])
def test_a_non_ascii_imap_user_or_password_is_a_setting_error_that_never_shows_the_password(imap_env, imap_server,
                                                                                            change, message):
    """防的是:登录时 imaplib 抛 UnicodeEncodeError,只打出一句「…:ascii;…」、退出码 3,像是邮箱那头的问题。"""
    imap_server.append(ZHANG)
    r = cli(["email_poller.py"], {**imap_env, **change})
    assert (r.returncode, r.stdout, r.stderr) == (2, "", message + "\n")
    if password := change.get("IMAP_PASSWORD"):
        assert not any(ch in r.stderr for ch in password if not ch.isascii()) and "7788" not in r.stderr
    nothing_stored(imap_server, [101])


# ---------------------------------------------------------------- TLS:默认校验证书
def make_ca_and_server_cert(tmp: Path) -> tuple[Path, Path, Path]:
    """用 openssl 命令行造一个私有 CA,再签一张 127.0.0.1 / localhost 的服务器证书。"""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=CloudLedger Test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    (tmp / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"


def test_ssl_context_verifies_the_server_and_trusts_imap_cafile(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("没有 openssl 命令,造不了测试 CA")
    default = mail_imap.ssl_context()
    assert (default.check_hostname, default.verify_mode) == (True, ssl.CERT_REQUIRED)
    ca, _, _ = make_ca_and_server_cert(tmp_path)
    private = mail_imap.ssl_context(str(ca))
    assert (private.check_hostname, private.verify_mode) == (True, ssl.CERT_REQUIRED)
    assert {"commonName": "CloudLedger Test CA"} in [dict(x[0] for x in c["subject"]) for c in private.get_ca_certs()]
    assert {"commonName": "CloudLedger Test CA"} not in [dict(x[0] for x in c["subject"]) for c in default.get_ca_certs()]


class Front:
    """pymap 前面的一层转发,在 127.0.0.1 上。
    tls=(证书, 私钥):SSL 直连(IMAPS)的前端,做完 TLS 把解密后的字节转给 pymap 的明文端口。pymap 自己只支持
    STARTTLS,所以 IMAP_SSL=1 的路径靠它测。
    cut_at:客户端发出含这段字节的命令时,两头的连接都断掉,命令不转给服务器 —— 像网络恰好在这一刻断了。
    reset:cut_at 时不是好好关掉,而是重置连接(SO_LINGER 0 再关,发出 RST),客户端读到的是 ConnectionResetError 不是 EOF。
    answer(行, 客户端这个连接上到现在发过的全部字节):服务器的每一行回答先过它,返回的字节才交给客户端
    (改写、删掉一行),用来扮演行为不一样的服务器。"""

    def __init__(self, backend_port: int, tls: tuple[Path, Path] | None = None, cut_at: bytes | None = None,
                 answer=None, reset: bool = False):
        self.ctx = None
        if tls:
            self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ctx.load_cert_chain(*tls)
        self.backend_port, self.cut_at, self.answer, self.reset = backend_port, cut_at, answer, reset
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        front = conn
        if self.ctx:
            try:
                front = self.ctx.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                conn.close()  # 客户端不信我们的证书,握手失败
                return
        back = socket.create_connection(("127.0.0.1", self.backend_port))
        sent = bytearray()
        rewrite = (lambda line: self.answer(line, bytes(sent))) if self.answer else None
        threading.Thread(target=self._pipe, args=(back, front, None, None, rewrite), daemon=True).start()
        self._pipe(front, back, self.cut_at, sent, reset=self.reset)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, cut_at: bytes | None = None, record: bytearray | None = None,
              rewrite=None, reset: bool = False) -> None:
        held = b""  # rewrite 时:还没凑成一整行的字节
        try:
            while data := src.recv(65536):
                if cut_at and cut_at in data:
                    if reset:
                        src.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    break
                if record is not None:
                    record += data
                if rewrite:
                    *lines, held = (held + data).split(b"\r\n")
                    data = b"".join(rewrite(line + b"\r\n") for line in lines)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_tls_poll_trusts_only_a_verified_certificate(imap_env, imap_server, tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("没有 openssl 命令,造不了测试证书")
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    front = Front(imap_server.port, tls=(cert, key))
    imap_server.append(ZHANG)
    tls_env = {**imap_env, "IMAP_SSL": "1", "IMAP_PORT": str(front.port), "IMAP_HOST": "localhost"}
    try:
        refused = cli(["email_poller.py"], tls_env)  # 不认识这个私有 CA:拒绝连接,一封信都不动
        assert (refused.returncode, refused.stdout) == (3, "")
        assert refused.stderr.startswith(f"IMAP 服务器 localhost:{front.port} 的证书校验失败:")
        assert refused.stderr.endswith("(自建邮箱用私有 CA 的,把 CA 证书路径写进 IMAP_CAFILE)\n")
        assert len(refused.stderr.splitlines()) == 1
        nothing_stored(imap_server, [101])

        ok = cli(["email_poller.py"], {**tls_env, "IMAP_CAFILE": str(ca)})
        assert (ok.returncode, ok.stderr) == (0, "")
        assert ok.stdout.splitlines()[0] == f"{ticket_of('<t1@example.com>')}  UID 101"
        assert imap_server.unseen() == []
    finally:
        front.close()


def test_ssl_to_a_plain_imap_port_fails_the_handshake_clearly(imap_env, imap_server):
    imap_server.append(ZHANG)
    r = cli(["email_poller.py"], {**imap_env, "IMAP_SSL": "1"})
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr.startswith(f"和 IMAP 服务器 127.0.0.1:{imap_server.port} 的 TLS 握手失败:")
    assert r.stderr.endswith("(这个端口是不是不支持 SSL 直连?)\n") and len(r.stderr.splitlines()) == 1
    nothing_stored(imap_server, [101])  # 信还是未读,下次设对了照常收


# ---------------------------------------------------------------- 离线 .eml:各种真实邮件
EXPECTED_SAMPLES = {  # 文件 → (Message-ID, 客户, 主题, 正文)
    "01_utf8_plain.eml": ("<20261122090112.zw01@example.com>", "C001", "凭证导出 Excel 又失败了",
                          "你好,\n今天导出 10 月的凭证,点「导出 Excel」还是提示失败,\n换了 Chrome 和 Edge 都一样。麻烦看一下。\n"
                          "张伟\n北京启明文化传媒有限公司"),
    "02_gbk_base64.eml": ("<GBK.20261122101540.lina@example.com>", "C002", "关闭自动续费后又被扣款",
                          "客服你好:\n上个月已经关闭了自动续费,这个月 1 号还是扣了一年的费用。\n"
                          "我们财务王喆核对过银行流水,确实扣了。请尽快处理退款。"),
    "03_gb2312_qp.eml": ("<qp-gb2312-0001@qinghe-trade.cn>", "C003", "发票抬头写错了",
                         "您好,上周开的电子发票抬头少了「有限公司」四个字,麻烦重开一张。\n经办人:财务蔡堃"),  # 堃 只在 GBK 里
    "04_gb18030_base64.eml": ("<gb18030.7731@xingchen-tech.cn>", "C004", "子账号改名后显示乱码",
                              "你好,我们新同事叫刘䶮,子账号名字改成他的名字以后,报表页眉里显示成了问号。"),
    "05_big5_qp.eml": ("<big5-qp-20261122@mingyue-design.cn>", "C005", "發票郵寄地址要更改",
                       "您好:\n我們公司搬家了,之後的紙本發票請寄到新地址,謝謝。"),
    "06_multipart_alternative.eml": ("<alt-6f1c@hengtong-logistics.cn>", "C006", "账单里多了一项超量费用",
                                     "您好,\n账单里多了一项超量费用,我们这个月的凭证数并没有超。"),  # 纯文本那份,不是 HTML
    "07_html_only.eml": ("<html-only-77@lanshan-tea.cn>", "C007", "进销存同步失败",
                         "您好:\n茶叶店的 进销存 & 凭证 同步失败,\n提示 <错误码 502>。\n赵敏\n福州岚山茶业"),
    "08_no_message_id.eml": (None, "C008", "专票什么时候能开出来",
                             "您好,上周申请的增值税专用发票还没收到,这封信是从老的邮件系统发的,没有 Message-ID。"),
    "11_complaint.eml": ("<complaint-0915@huayang-edu.cn>", "C009", "银行流水导入报错一直没人管",
                         "银行流水导入报错的问题提了一个月都没解决,再没人处理,我要投诉到消费者协会。\n周婷"),
}


def sample_id(name: str) -> str:
    mid = EXPECTED_SAMPLES[name][0]
    return mid or "no-message-id:" + hashlib.sha1(sample(name).replace(b"\r\n", b"\n")).hexdigest()


def test_offline_samples_cover_charsets_encodings_html_and_missing_message_id(any_lab):
    r = cli(["email_poller.py", "--eml", "samples"], any_lab)
    assert r.returncode == 1  # 有一封坏信
    assert r.stderr == "无法解析:没有邮件头,不像一封邮件(文件被截断或损坏?)  samples/10_broken.eml\n"
    expected_lines = [f"{ticket_of(sample_id(n))}  samples/{n}" for n in list(EXPECTED_SAMPLES)[:8]]
    expected_lines += ["skip: 不是已知客户  samples/09_unknown_sender.eml",
                       f"{ticket_of(sample_id('11_complaint.eml'))}  samples/11_complaint.eml",
                       "本次收取 11 封:新工单 9,重复 0,跳过 1,无法解析 1,存储失败 0"]
    assert r.stdout.splitlines() == expected_lines
    assert biz_rows(MAIL_TICKETS) == sorted(
        (ticket_of(sample_id(n)), cust, subj, body, "open") for n, (_, cust, subj, body) in EXPECTED_SAMPLES.items())
    assert [e[0] for e in rows(EVENTS)] == sorted(sample_id(n) for n in EXPECTED_SAMPLES)

    again = cli(["email_poller.py", "--eml", "samples"], any_lab)
    assert (again.returncode, again.stderr) == (1, r.stderr)  # 坏信每次都报
    assert again.stdout.splitlines() == [f"duplicate  samples/{n}" for n in list(EXPECTED_SAMPLES)[:8]] + [
        "skip: 不是已知客户  samples/09_unknown_sender.eml", "duplicate  samples/11_complaint.eml",
        "本次收取 11 封:新工单 0,重复 9,跳过 1,无法解析 1,存储失败 0"]
    assert len(biz_rows(MAIL_TICKETS)) == 9 and len(rows(EVENTS)) == 9


def test_a_mail_with_nul_bytes_in_its_message_id_and_text_becomes_a_ticket_and_reaches_the_inbox(any_lab, tmp_path):
    """Message-ID 就是事件 id:里面夹着 NUL 时,PostgreSQL 不收,这封信会每次都「存储失败」、永远收不进来;
    正文里的 NUL 进了 checkpoint 也一样写不进去。所以 id 去掉不可打印的字符,主题和正文去掉 NUL 再进业务库
    (业务库在 PostgreSQL 里时也存不了它),进图时再清掉别的控制字符。"""
    (tmp_path / "nul.eml").write_bytes(mail("<a\x00b@example.com>", "zhang.wei@example.com", "发票\x00开错了",
                                            "发票抬头\x00写错了,麻烦重开。"))
    r = cli(["email_poller.py", "--eml", str(tmp_path)], any_lab)
    ticket = ticket_of("<ab@example.com>")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (f"{ticket}  {tmp_path / 'nul.eml'}\n"
                        "本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n")
    assert [(e[0], e[4]) for e in rows(EVENTS)] == [("<ab@example.com>", "pending")]
    assert biz_rows(MAIL_TICKETS) == [(ticket, "C001", "发票开错了", "发票抬头写错了,麻烦重开。", "open")]
    worker = cli(["worker.py", "--once"], any_lab)
    assert (worker.returncode, worker.stdout) == (0, "<ab@example.com> → waiting_human\n")


def test_missing_message_id_gives_the_same_id_from_imap_and_from_the_eml_file(imap_env, imap_server):
    """imaplib 投信时把 LF 换成 CRLF;派生 id 先统一换行符,所以同一封信两条路进来还是同一个事件。"""
    first = cli(["email_poller.py", "--eml", "samples/08_no_message_id.eml"], imap_env)
    assert (first.returncode, first.stdout, first.stderr) == (
        0, f"{ticket_of(sample_id('08_no_message_id.eml'))}  samples/08_no_message_id.eml\n"
           "本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    imap_server.append(sample("08_no_message_id.eml"))
    r = cli(["email_poller.py"], imap_env)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, "duplicate  UID 101\n本次收取 1 封:新工单 0,重复 1,跳过 0,无法解析 0,存储失败 0\n", "")
    assert len(rows(EVENTS)) == 1 and imap_server.unseen() == []


@pytest.mark.parametrize("args, message", [
    (["--eml", "samples/01_utf8_plain.eml", "samples/nope.eml"], "找不到文件或目录:samples/nope.eml"),
    (["--eml", "tests"], "目录里没有 .eml 文件:tests"),
    # 一行说明,不是 traceback、退出码 1(没有读或进入权限的目录也走这一支;测试以 root 运行,权限挡不住它)
    (["--eml", "samples/01_utf8_plain.eml", "x" * 300 + ".eml"], f"读不了 {'x' * 300}.eml:File name too long"),
    (["--eml", "/dev/null"], "不是普通文件或目录:/dev/null"),  # 不说「找不到」:它明明在
    # --eml "$DIR",变量是空的:Path("") 是当前目录,在 samples/ 里这样跑的话,那里的信会全成工单
    (["--eml", "samples/01_utf8_plain.eml", ""], "--eml 给的路径是空的(要读当前目录,写 --eml .)"),
])
def test_offline_bad_paths_are_rejected_before_anything_is_stored(lab, args, message):
    r = cli(["email_poller.py", *args], lab)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", message + "\n")
    nothing_stored()


def test_an_empty_eml_path_in_a_folder_of_mails_stores_none_of_them(lab, monkeypatch):
    monkeypatch.chdir(LAB / "samples")
    r = cli(["email_poller.py", "--eml", ""], lab)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "--eml 给的路径是空的(要读当前目录,写 --eml .)\n")
    nothing_stored()


def test_eml_given_twice_reads_the_files_of_both(lab):
    """--eml 写两次,两次给的都读。防的是:argparse 只留最后一次的,第一次给的信不声不响地没收,退出码还是 0。"""
    r = cli(["email_poller.py", "--eml", "samples/01_utf8_plain.eml", "--eml=samples/02_gbk_base64.eml"], lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [f"{ticket_of(sample_id('01_utf8_plain.eml'))}  samples/01_utf8_plain.eml",
                                     f"{ticket_of(sample_id('02_gbk_base64.eml'))}  samples/02_gbk_base64.eml",
                                     "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0"]
    assert len(rows(EVENTS)) == 2


def test_different_mails_whose_message_id_is_an_empty_pair_of_brackets_are_not_duplicates(lab, tmp_path):
    """「Message-ID: <>」当成没有 Message-ID(按整封信的 sha1):否则第二封说 duplicate,IMAP 上还会被标成已读、就丢了。"""
    for name, body in (("a.eml", "第一封:凭证导出失败。"), ("b.eml", "第二封:发票抬头写错了。")):
        (tmp_path / name).write_bytes(mail("<>", "zhang.wei@example.com", "问题", body))
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[-1] == "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0"
    assert sorted(e[0][:14] for e in rows(EVENTS)) == ["no-message-id:", "no-message-id:"]
    assert sorted(body for *_, body, _ in biz_rows(MAIL_TICKETS)) == ["第一封:凭证导出失败。", "第二封:发票抬头写错了。"]


def test_a_folder_named_like_a_mail_is_not_read_as_one(lab, tmp_path):
    (tmp_path / "archive.eml").mkdir()
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"目录里没有 .eml 文件:{tmp_path}\n")
    nothing_stored()
    (tmp_path / "a.eml").write_bytes((LAB / "samples" / "01_utf8_plain.eml").read_bytes())
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[0] == f"{ticket_of(sample_id('01_utf8_plain.eml'))}  {tmp_path}/a.eml"
    assert len(rows(EVENTS)) == 1


def test_a_folder_scan_finds_mail_files_whatever_the_case_of_their_extension(lab, tmp_path):
    """a.EML、b.Eml(Windows、Outlook 导出的文件常是大写扩展名):直接给文件时照收,给目录时也不能说
    「目录里没有 .eml 文件」、退出码 2:目录里的扩展名也不分大小写;别的文件、名字像 x.EML 的子目录照样不算。"""
    (tmp_path / "a.EML").write_bytes(ZHANG)
    (tmp_path / "b.Eml").write_bytes(LI)
    (tmp_path / "notes.txt").write_text("不是邮件")
    (tmp_path / "archive.EML").mkdir()
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{t1}  {tmp_path}/a.EML\n{t3}  {tmp_path}/b.Eml\n本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0\n",
        "")
    assert biz_rows(MAIL_TICKETS) == sorted([(t1, "C001", "发票开错了", "发票抬头写错了,麻烦重开。", "open"),
                                             (t3, "C002", "扣款", "又被扣了一次款。", "open")])
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]


def test_eml_files_whose_names_are_not_utf8_are_named_with_byte_escapes_and_stored_on_a_strict_utf8_output(lab,
                                                                                                           tmp_path):
    """Windows 压缩包解出来的文件名常是 GBK 字节(导出.eml、工单.eml),不是 UTF-8:原样打印的话,标准输出是严格的 UTF-8 时
    UnicodeEncodeError 崩掉,每次重跑都崩在同一个文件上,后面的文件永远存不进去。所以不是 UTF-8 的字节写成 \\xNN,
    标准输出、标准错误都是这样。"""
    folder = os.fsencode(tmp_path)
    (tmp_path / "b.eml").write_bytes(LI)
    Path(os.fsdecode(folder + b"/" + "导出.eml".encode("gbk"))).write_bytes(ZHANG)
    Path(os.fsdecode(folder + b"/" + "工单.eml".encode("gbk"))).write_bytes(sample("10_broken.eml"))
    strict = {**lab, "PYTHONIOENCODING": "utf-8:strict"}
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    broken = f"无法解析:没有邮件头,不像一封邮件(文件被截断或损坏?)  {tmp_path}/\\xb9\\xa4\\xb5\\xa5.eml\n"
    r = run(["email_poller.py", "--eml", str(tmp_path)], strict)
    assert (r.returncode, r.stdout, r.stderr) == (
        1, f"{t3}  {tmp_path}/b.eml\n{t1}  {tmp_path}/\\xb5\\xbc\\xb3\\xf6.eml\n"
           "本次收取 3 封:新工单 2,重复 0,跳过 0,无法解析 1,存储失败 0\n", broken)
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]
    again = run(["email_poller.py", "--eml", str(tmp_path)], strict)
    assert (again.returncode, again.stdout, again.stderr) == (
        1, f"duplicate  {tmp_path}/b.eml\nduplicate  {tmp_path}/\\xb5\\xbc\\xb3\\xf6.eml\n"
           "本次收取 3 封:新工单 0,重复 2,跳过 0,无法解析 1,存储失败 0\n", broken)
    missing = run(["email_poller.py", "--eml", os.fsdecode(folder + b"/" + "发票.eml".encode("gbk"))], strict)
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        2, "", f"找不到文件或目录:{tmp_path}/\\xb7\\xa2Ʊ.eml\n")  # 发票 的 GBK 字节里 C6 B1 恰好是合法的 UTF-8(Ʊ)
    assert len(biz_rows(MAIL_TICKETS)) == 2 and len(rows(EVENTS)) == 2


def broken_beside_a_good_one(env: dict, folder, raw: bytes, reason: str) -> str:
    """目录里一封坏信 a.eml、一封好信 b.eml(LI):坏信一行原因,好信照常建工单,退出码 1。返回好信的工单号。"""
    (folder / "a.eml").write_bytes(raw)
    (folder / "b.eml").write_bytes(LI)
    r = cli(["email_poller.py", "--eml", str(folder)], env)
    t3 = ticket_of("<t3@example.com>")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, f"{t3}  {folder}/b.eml\n本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 1,存储失败 0\n",
        f"无法解析:{reason}  {folder}/a.eml\n")
    return t3


@pytest.mark.parametrize("name, cut_at, reason", [
    # 截在半行邮件头「Content-T」上(审计时复现的那一封:head -c 300)
    ("01_utf8_plain.eml", 300, "邮件头没有以空行结束(邮件被截断或损坏?)"),
    # 截在某个邮件头的值中间:每一行都像邮件头,只是没有空行、没有正文
    ("02_gbk_base64.eml", sample("02_gbk_base64.eml").index(b"charset=") + 4, "邮件头没有以空行结束(邮件被截断或损坏?)"),
    # multipart 截在 HTML 那一段中间:纯文本那段是完整的,可后面的都没了
    ("06_multipart_alternative.eml", sample("06_multipart_alternative.eml").index(b"PGh0bWw+") + 8,
     "multipart 邮件没有结束边界(邮件被截断或损坏?)"),
    # multipart 截在第一段的边界之前(只剩 This is a multi-part message…)
    ("06_multipart_alternative.eml", sample("06_multipart_alternative.eml").index(b"------=_Part_6_alt\n"),
     "multipart 邮件里找不到分段的边界(邮件被截断或损坏?)"),
    # 单段的正文截在中间、留下了痕迹的(存下的话是正文缺一截的工单;后两种存下的是乱码和「<di」)
    ("02_gbk_base64.eml", sample("02_gbk_base64.eml").index(b"6rXEt9HT") + 3,
     "正文的 base64 长度不对,后面缺了一截(邮件被截断或损坏?)"),
    ("01_utf8_plain.eml", sample("01_utf8_plain.eml").index("凭证".encode()) + 1,
     "正文的最后一个字不完整,后面缺了一截(邮件被截断或损坏?)"),
    ("03_gb2312_qp.eml", sample("03_gb2312_qp.eml").index(b"=C4=FA=BA=C3") + 11,
     "正文的 quoted-printable 转义只剩半个,后面缺了一截(邮件被截断或损坏?)"),
    ("07_html_only.eml", sample("07_html_only.eml").index(b"<div>") + 3,
     "HTML 正文截在一个标签或 & 实体的中间,后面缺了一截(邮件被截断或损坏?)"),
], ids=["cut-mid-header-line", "cut-mid-header-value", "multipart-no-close-boundary", "multipart-no-first-boundary",
        "base64-length", "utf8-half-character", "qp-half-escape", "html-half-tag"])
def test_a_cut_eml_file_is_reported_and_not_stored_so_the_full_file_later_becomes_the_ticket(lab, tmp_path, name,
                                                                                             cut_at, reason):
    """文件只存下了前半截(复制中断、磁盘写满)。防的是:截在邮件头里的存成一张正文是半行邮件头的工单,multipart 截在中间的
    存成正文不全的工单,退出码 0;完整的文件再收时,Message-ID 一样,只说 duplicate,客户写的内容就丢了。
    它一行原因、不入库,其他文件照常,退出码 1;再收完整的文件时照常建工单,正文是客户写的。"""
    t3 = broken_beside_a_good_one(lab, tmp_path, sample(name)[:cut_at], reason)
    assert biz_rows(MAIL_TICKETS) == [(t3, "C002", "扣款", "又被扣了一次款。", "open")]
    assert [e[0] for e in rows(EVENTS)] == ["<t3@example.com>"]

    full = cli(["email_poller.py", "--eml", f"samples/{name}"], lab)
    ticket = ticket_of(sample_id(name))
    assert (full.returncode, full.stdout, full.stderr) == (
        0, f"{ticket}  samples/{name}\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    _, customer, subject, body = EXPECTED_SAMPLES[name]
    assert biz_rows(MAIL_TICKETS) == sorted([(ticket, customer, subject, body, "open"),
                                             (t3, "C002", "扣款", "又被扣了一次款。", "open")])
    assert sorted(e[0] for e in rows(EVENTS)) == sorted([sample_id(name), "<t3@example.com>"])


def test_missing_business_database_is_rejected_without_creating_an_empty_one(lab, tmp_path):
    missing = tmp_path / "nowhere" / "cloudledger.db"
    r = cli(["email_poller.py", "--eml", "samples"], {**lab, "BIZ_DB": str(missing)})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"业务库不存在:{missing}(先运行 uv run python store.py 建库)\n"
    assert not missing.exists() and rows(EVENTS) == []


def colliding_message_ids() -> tuple[str, str]:
    """找两个 sha1 前 6 位相同的 Message-ID(生日问题:几千个里就有一对)。"""
    seen: dict[str, str] = {}
    for i in range(1_000_000):
        mid = f"<collide-{i}@example.com>"
        prefix = hashlib.sha1(mid.encode()).hexdigest()[:6]
        if prefix in seen:
            return seen[prefix], mid
        seen[prefix] = mid
    raise AssertionError("没找到")


def test_two_mails_whose_ticket_ids_collide_get_separate_tickets(lab, tmp_path):
    """工单号只取 sha1 的前 6 位,几千封信里就会撞。撞了不能把第二封信的事件指到第一封信的工单上。"""
    a, b = colliding_message_ids()
    (tmp_path / "a.eml").write_bytes(mail(a, "zhang.wei@example.com", "第一封", "张伟的问题"))
    (tmp_path / "b.eml").write_bytes(mail(b, "li.na@example.com", "第二封", "李娜的问题"))
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    ta, tb = ticket_of(a), ticket_of(b, 8)
    assert ta == ticket_of(b) and ta != tb
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{ta}  {tmp_path}/a.eml\n{tb}  {tmp_path}/b.eml\n"
                                                     "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    assert biz_rows(MAIL_TICKETS) == sorted([(ta, "C001", "第一封", "张伟的问题", "open"),
                                             (tb, "C002", "第二封", "李娜的问题", "open")])
    assert sorted(store_events.ticket_of(e[3]) for e in rows(EVENTS)) == sorted([ta, tb])
    again = cli(["email_poller.py", "--eml", str(tmp_path)], lab)  # 重跑:工单号不变,都是 duplicate
    assert (again.returncode, again.stdout, again.stderr) == (
        0, f"duplicate  {tmp_path}/a.eml\nduplicate  {tmp_path}/b.eml\n"
           "本次收取 2 封:新工单 0,重复 2,跳过 0,无法解析 0,存储失败 0\n", "")
    assert len(biz_rows(MAIL_TICKETS)) == 2


def test_a_message_id_over_200_characters_is_stored_under_its_sha1_and_the_mails_after_it_still_come_in(any_lab,
                                                                                                        tmp_path):
    """事件 id 就是 Message-ID,可 PostgreSQL 主键索引的一行最多 2704 字节:4000 个字的 Message-ID 原样在 PostgreSQL 上
    每次都存不进去,还被当成「数据库暂时用不了」,每一轮都停在它上面,后面的信永远收不进来(SQLite 上却存得进去)。
    超过 200 个字(webhook 收的 id 也最长这么多)就用这个头原始字节的 sha1,两种库一样。"""
    # 不能是 abab… 这样重复的:PostgreSQL 会先压缩再进索引,压得下就存进去了。十六进制的 sha256 压不下
    long_id = "<" + "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(63)) + "@example.com>"
    (tmp_path / "a.eml").write_bytes(mail(long_id, "zhang.wei@example.com", "长 id", "发票开错了。"))
    (tmp_path / "b.eml").write_bytes(LI)
    event_id = "message-id-sha1:" + hashlib.sha1(long_id.encode()).hexdigest()
    ta, tb = ticket_of(event_id), ticket_of("<t3@example.com>")
    r = cli(["email_poller.py", "--eml", str(tmp_path)], any_lab)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{ta}  {tmp_path}/a.eml\n{tb}  {tmp_path}/b.eml\n"
           "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    assert sorted((e[0], store_events.ticket_of(e[3]), e[4]) for e in rows(EVENTS)) == sorted(
        [(event_id, ta, "pending"), ("<t3@example.com>", tb, "pending")])
    assert biz_rows(MAIL_TICKETS) == sorted([(ta, "C001", "长 id", "发票开错了。", "open"),
                                             (tb, "C002", "扣款", "又被扣了一次款。", "open")])
    again = cli(["email_poller.py", "--eml", str(tmp_path)], any_lab)
    assert (again.returncode, again.stdout, again.stderr) == (
        0, f"duplicate  {tmp_path}/a.eml\nduplicate  {tmp_path}/b.eml\n"
           "本次收取 2 封:新工单 0,重复 2,跳过 0,无法解析 0,存储失败 0\n", "")


def test_a_charset_that_decodes_to_lone_surrogates_is_decoded_another_way_and_the_mail_is_stored(lab, tmp_path):
    """utf-7 的 +2AA-、unicode_escape 的 \\ud800 解出来是落单的代理项,utf-8 编不出来:防的是这封信每次都「存储失败」、
    保持未读、不标星,cron 每分钟退出码 1。这样的解法算解不通,接着试 utf-8。"""
    (tmp_path / "a.eml").write_bytes(b"Message-ID: <u7@example.com>\nFrom: zhang.wei@example.com\n"
                                     b"Subject: =?utf-7?Q?+2AA-?=\nContent-Type: text/plain; charset=utf-7\n\n"
                                     b"hi +2AA- there\n")
    (tmp_path / "b.eml").write_bytes(b"Message-ID: <ue@example.com>\nFrom: li.na@example.com\nSubject: x\n"
                                     b"Content-Type: text/plain; charset=unicode_escape\n\nhi \\ud800 there\n")
    ta, tb = ticket_of("<u7@example.com>"), ticket_of("<ue@example.com>")
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{ta}  {tmp_path}/a.eml\n{tb}  {tmp_path}/b.eml\n"
           "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    assert biz_rows(MAIL_TICKETS) == sorted([(ta, "C001", "+2AA-", "hi +2AA- there", "open"),
                                             (tb, "C002", "x", "hi \\ud800 there", "open")])
    assert sorted(e[0] for e in rows(EVENTS)) == ["<u7@example.com>", "<ue@example.com>"]


def test_a_from_address_with_control_characters_is_broken_mail_the_same_on_both_databases(any_lab, tmp_path):
    """From 的地址里夹着 NUL:不当坏信的话,PostgreSQL 上查客户时报 DataError,这封信每次都「存储失败」;
    SQLite 上却说「不是已知客户」、标已读。两种库都是坏信:一行原因(打过码),其余照常,退出码 1。"""
    t3 = broken_beside_a_good_one(any_lab, tmp_path, mail("<nul-from@example.com>", "zh\x00ang.wei@example.com", "发票",
                                                          "发票开错了。"),
                                  "发件人地址里有控制字符(From: 'zh\\x***@example.com')")
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == [t3]
    assert [e[0] for e in rows(EVENTS)] == ["<t3@example.com>"]


def test_a_different_mail_with_a_stored_message_id_is_a_duplicate_that_adds_no_ticket_for_scan_to_queue(lab,
                                                                                                        tmp_path):
    """同一个 Message-ID、别的发件人和内容:说 duplicate,不建工单。防的是:先建了一张没有事件的工单(工单号撞了就加长),
    过些天定时扫描把它当成久未回复的工单入队,草稿还为久等道歉。"""
    (tmp_path / "1.eml").write_bytes(mail("<same@example.com>", "zhang.wei@example.com", "第一封", "张伟的问题"))
    (tmp_path / "2.eml").write_bytes(mail("<same@example.com>", "li.na@example.com", "第二封", "李娜的问题"))
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    ticket = ticket_of("<same@example.com>")
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{ticket}  {tmp_path}/1.eml\nduplicate  {tmp_path}/2.eml\n"
           "本次收取 2 封:新工单 1,重复 1,跳过 0,无法解析 0,存储失败 0\n", "")
    assert biz_rows(MAIL_TICKETS) == [(ticket, "C001", "第一封", "张伟的问题", "open")]

    seeded = len(biz_rows("SELECT id FROM tickets WHERE status = 'open' AND id NOT LIKE 'M%'"))
    scan = cli(["cron_jobs.py", "scan", "--limit", "100"], {**lab, "STALE_DAYS": "0"})  # 今天建的也算「久未回复」
    assert (scan.returncode, scan.stdout, scan.stderr) == (
        0, f"超过 0 天还开着的工单 {seeded + 1} 张,其中没回复过的 {seeded + 1} 张,本次入队 {seeded} 个\n"
           "没有入队的:已在队列或收件箱里 1 张\n", "")
    assert rows("SELECT event_id FROM events WHERE ticket_id LIKE 'M%'") == [("<same@example.com>",)]


def test_a_message_id_shaped_like_a_cron_event_id_cannot_take_that_days_stale_reminder(lab, tmp_path):
    """邮件的事件 id 和定时任务的 cron:stale:<工单>:<日期> 在同一张表里:不是 <…> 形式的 Message-ID 加上尖括号,占不了
    这个 id。防的是:Message-ID 写成这个样子的信占了它,这天 T1007 就不提醒了(「今天已经入过队」)。"""
    today = store.now()[:10]
    (tmp_path / "a.eml").write_bytes(mail(f"cron:stale:T1007:{today}", "zhang.wei@example.com", "催一下", "还没处理。"))
    mid = f"<cron:stale:T1007:{today}>"
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{ticket_of(mid)}  {tmp_path}/a.eml\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    scan = cli(["cron_jobs.py", "scan"], lab)
    assert (scan.returncode, scan.stdout, scan.stderr) == (
        0, "超过 20 天还开着的工单 9 张,其中没回复过的 9 张,本次入队 5 个\n没有入队的:超出 --limit 5 4 张\n", "")
    assert sorted((e[0], e[1]) for e in rows(EVENTS)) == sorted(
        [(mid, "email")] + [(f"cron:stale:{t}:{today}", "cron") for t in ("T1029", "T1020", "T1010", "T1007", "T1022")])


# ---------------------------------------------------------------- 解析的细节
def test_raw_eight_bit_headers_and_unknown_charsets_still_decode():
    raw = ("From: zhang.wei@example.com\nSubject: ".encode() + "退款进度".encode("gbk")
           + b"\nContent-Type: text/plain; charset=x-made-up\n\n" + "正文是 utf-8".encode())
    assert email_poller.parse(raw) == {"message_id": "no-message-id:" + hashlib.sha1(raw).hexdigest(),
                                       "from": "zhang.wei@example.com", "subject": "退款进度", "body": "正文是 utf-8"}


@pytest.mark.parametrize("header, event_id", [
    (b"<20261122090112.zw01@example.com>", "<20261122090112.zw01@example.com>"),  # 平常的 Message-ID:原样
    (b"<a@example.com>  \n\t<b@example.com>", "<a@example.com> <b@example.com>"),  # 折行、连续空白并成一个空格
    ("<工单一@example.com>".encode(), "<工单一@example.com>"),  # 直接写的 8 位字节:和别的邮件头一样解码
    ("<退款@example.com>".encode("gbk"), "<退款@example.com>"),
    (b"cron:stale:T1007:2026-12-03", "<cron:stale:T1007:2026-12-03>"),  # 不是 <…> 的加上尖括号
    (b"evt_T1012_created", "<evt_T1012_created>"),
    (b"no-message-id:0123", "<no-message-id:0123>"),
    (b"<" + b"a" * 198 + b">", "<" + "a" * 198 + ">"),  # 正好 200 个字
    (b"<" + b"a" * 199 + b">", "message-id-sha1:" + hashlib.sha1(b"<" + b"a" * 199 + b">").hexdigest()),
    (b"<\xff\xfe@example.com>", "message-id-sha1:" + hashlib.sha1(b"<\xff\xfe@example.com>").hexdigest()),  # 解不出来
])
def test_the_event_id_is_the_decoded_message_id_in_angle_brackets_or_else_a_sha1_of_its_bytes(header, event_id):
    raw = b"Message-ID: " + header + b"\nFrom: zhang.wei@example.com\nSubject: x\n\nbody\n"
    assert email_poller.parse(raw)["message_id"] == event_id
    assert email_poller.parse(raw.replace(b"\n", b"\r\n"))["message_id"] == event_id  # IMAP 收到的是 CRLF


def multipart(subtype: str, *parts: str, boundary: str = "b1") -> str:
    body = "".join(f"--{boundary}\n{part}\n" for part in parts)
    return f"Content-Type: multipart/{subtype}; boundary={boundary}\n\n{body}--{boundary}--\n"


HEAD = "From: zhang.wei@example.com\nSubject: 导出失败\nMessage-ID: <parts@example.com>\nMIME-Version: 1.0\n"
FORWARDED = ("Content-Type: message/rfc822\nContent-Disposition: attachment\n\n"
             "From: bank@example.com\nSubject: 对账单\nContent-Type: text/plain; charset=utf-8\n\n您的对账单已生成。")


@pytest.mark.parametrize("layout, body", [
    # 一段话、一张截图、又一段话:几段都留下
    (multipart("mixed", "Content-Type: text/plain; charset=utf-8\n\n导出报表时报错,截图如下:",
               "Content-Type: image/png\nContent-Disposition: inline\nContent-Transfer-Encoding: base64\n\niVBORw0KGgo=",
               "Content-Type: text/plain; charset=utf-8\n\n换了浏览器也一样。"),
     "导出报表时报错,截图如下:\n换了浏览器也一样。"),
    # 只有 HTML、附了一封转发的信:存下的是这封信自己的话,不是那封转发的信
    (multipart("mixed", "Content-Type: text/html; charset=utf-8\n\n<p>请看下面这封对账单,金额不对。</p>", FORWARDED),
     "请看下面这封对账单,金额不对。"),
    # 自己一个字没写、只转发了一封:用转发的那封
    (multipart("mixed", FORWARDED), "您的对账单已生成。"),
    # alternative 里纯文本和 HTML 是同一段话:只要一份
    (multipart("alternative", "Content-Type: text/plain; charset=utf-8\n\n发票抬头错了。",
               "Content-Type: text/html; charset=utf-8\n\n<p>发票抬头错了。</p>"), "发票抬头错了。"),
    # 没写 </head> 的 HTML(HTML5 里合法):正文不能当成 head 跳过
    ("Content-Type: text/html; charset=utf-8\n\n<html><head><title>x</title><body><p>导出报表失败</p></body></html>\n",
     "导出报表失败"),
])
def test_the_body_is_every_text_part_the_customer_wrote_and_not_a_forwarded_mail(layout, body):
    assert email_poller.parse((HEAD + layout).encode())["body"] == body


def poll_one(imap_env: dict, imap_server: ImapServer, raw: bytes, message_id: str, body: str) -> None:
    """收件箱里只有 raw 这一封:它照常成为一张工单,正文是 body,标已读,不加星标。"""
    imap_server.append(raw)
    r = cli(["email_poller.py"], imap_env)
    ticket = ticket_of(message_id)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{ticket}  UID 101\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    assert [(t[0], t[3]) for t in biz_rows(MAIL_TICKETS)] == [(ticket, body)]
    assert [e[0] for e in rows(EVENTS)] == [message_id]
    assert imap_server.flags() == {101: {"\\Seen"}}


@pytest.mark.parametrize("html, body", [
    ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>CloudLedger</title><p>发票抬头写错了,麻烦重开。</p></html>',
     "发票抬头写错了,麻烦重开。"),
    ("<head><style>p { color: red }</style><div>hello</div>", "hello"),
    ("<html><head><title>CloudLedger</title>\n  发票抬头写错了。<br>麻烦重开。</html>", "发票抬头写错了。\n麻烦重开。"),  # 文字也结束 head
], ids=["tag-ends-head", "div-after-style", "text-ends-head"])
def test_html_mail_whose_head_is_never_closed_becomes_a_ticket_with_the_customers_text(imap_env, imap_server, html,
                                                                                        body):
    """HTML5 里 </head>、<body> 都可以不写:head 碰到不属于它的标签(<p>、<div>)或者 title、style、script 以外的文字
    就结束了。防的是:一直跳到 </head> 或 <body>,客户写的话全被跳过,存下一张空工单、标了已读。"""
    raw = mail("<html-head@example.com>", "zhang.wei@example.com", "发票", html).replace(b"text/plain", b"text/html")
    poll_one(imap_env, imap_server, raw, "<html-head@example.com>", body)


@pytest.mark.parametrize("attachment", [
    "Content-Type: text/plain; charset=utf-8\nContent-Disposition: inline; filename=export.log",  # Apple Mail 这样发
    'Content-Type: text/plain; charset=utf-8; name="export.log"\nContent-Disposition: inline',
    'Content-Type: text/plain; charset=utf-8; name="export.log"',
], ids=["inline-filename", "inline-type-name", "type-name-only"])
def test_a_text_attachment_marked_inline_whose_last_character_is_cut_is_not_broken_mail_nor_part_of_the_body(
        imap_env, imap_server, attachment):
    """带文件名的段是附件,即使标的是 inline(Apple Mail 的附件都这样):附件里的日志最后一个字被截了半个,整封信
    也不会说成「无法解析:正文的最后一个字不完整」:照常建工单,正文只有客户写的话。"""
    log = base64.b64encode("2026-11-30 导出凭证失败:连接超时".encode()[:-1]).decode()
    raw = (HEAD + multipart("mixed", "Content-Type: text/plain; charset=utf-8\n\n导出报表时报错,日志附上。",
                            f"{attachment}\nContent-Transfer-Encoding: base64\n\n{log}")).encode()
    poll_one(imap_env, imap_server, raw, "<parts@example.com>", "导出报表时报错,日志附上。")


@pytest.mark.parametrize("text", ["你好", "你好啊", "发票抬头错了,麻烦重开"])
@pytest.mark.parametrize("charset", ["gb2312", "gbk"])
def test_utf8_bytes_labelled_gbk_are_read_as_utf8_not_as_garble_or_a_cut_mail(charset, text):
    """标着 gbk、字节却是 UTF-8(base64,末尾没有换行):按 UTF-8 解。防的是「你好」存成「浣犲ソ」,「你好啊」被当成
    「最后一个字不完整」拒收。真的 GBK 照旧按 GBK 解。"""
    for raw_text, encoding in ((text, "utf-8"), (text, "gbk")):
        raw = (HEAD + f"Content-Type: text/plain; charset={charset}\nContent-Transfer-Encoding: base64\n\n").encode()
        raw += base64.b64encode(raw_text.encode(encoding)) + b"\n"
        assert email_poller.parse(raw)["body"] == text, encoding


@pytest.mark.parametrize("tail, kept", [
    ("退款请打到 6222 0212 3456 7890 谢谢", "退款请打到 "),  # 卡号:不截下前 14 位
    ("请回电13812345678", "请回电"),  # 不留下「请回电1381234」
    ("请回电 138-1234-5678 谢谢", "请回电 "),
    ("邮箱 zhang.wei@example.com 谢谢", "邮箱 "),
    ("回电１３８１２３４５６７８", "回电"),  # 输入法打出的全角数字
    ("回电 138 - 1234 - 5678", "回电 "),
])
def test_a_long_mail_is_cut_before_a_phone_card_or_address_not_through_it(tail, kept):
    """正文只留前 MAX_BODY_CHARS 个字、主题只留前 MAX_SUBJECT_CHARS 个字:截断处落在卡号、手机号中间时
    退到这一串的开头:剩下的半截脱敏认不出来(整个号码才认得出),会原样进提示词和 checkpoint。"""
    def cut_inside_the_number(limit: int) -> str:
        return "好" * (limit - len(kept) - 5) + tail  # 截断处在号码的第 5 个字之后
    subject, body = cut_inside_the_number(email_poller.MAX_SUBJECT_CHARS), cut_inside_the_number(email_poller.MAX_BODY_CHARS)
    raw = mail("<long@example.com>", "zhang.wei@example.com", subject, body)
    assert email_poller.parse(raw) == {
        "message_id": "<long@example.com>", "from": "zhang.wei@example.com",
        "subject": subject[:email_poller.MAX_SUBJECT_CHARS - 5], "body": body[:email_poller.MAX_BODY_CHARS - 5]}
    assert subject[:email_poller.MAX_SUBJECT_CHARS - 5].endswith(kept) and body[:email_poller.MAX_BODY_CHARS - 5].endswith(kept)


def test_a_long_mail_that_is_not_cut_inside_a_number_keeps_exactly_the_first_max_body_chars():
    body = "导出报表失败,麻烦看看。" * 300
    raw = mail("<long@example.com>", "zhang.wei@example.com", "x" * 500, body)
    parsed = email_poller.parse(raw)
    assert (parsed["subject"], parsed["body"]) == ("x" * email_poller.MAX_SUBJECT_CHARS, body[:email_poller.MAX_BODY_CHARS])


@pytest.mark.parametrize("charset", ["iso-8859-1", "ISO-8859-1", "latin1"])
def test_a_mail_labelled_latin_1_with_windows_1252_quotes_dashes_and_euro_reads_them(charset):
    """Outlook 发的信标着 iso-8859-1,字节却是 Windows-1252:按 cp1252 解。防的是弯引号、破折号、€ 解成看不见的控制字符
    (「invoice \x80100」,模型看到的是 100),原样进了工单。cp1252 没定义的字节(0x81)照声明的 latin-1 解,不会成了中文乱码。"""
    text = "The \u201cExport\u201d button fails \u2013 caf\u00e9 invoice \u20ac100"
    head = (HEAD + f"Content-Type: text/plain; charset={charset}\nContent-Transfer-Encoding: 8bit\n\n").encode()
    assert email_poller.parse(head + text.encode("cp1252") + b"\n")["body"] == text
    assert email_poller.parse(head + b"caf\xe9 \x81 ok\n")["body"] == "caf\u00e9 \x81 ok"


@pytest.mark.parametrize("meta, encoding, text", [
    ('<meta charset="big5">', "big5", "發票抬頭錯了,麻煩重開"),
    ("<META HTTP-EQUIV='Content-Type' CONTENT='text/html; charset=gbk'>", "gbk", "发票抬头错了,麻烦重开"),
])
def test_an_html_mail_without_a_declared_charset_is_decoded_by_its_meta_charset(meta, encoding, text):
    """Content-Type 里没写字符集的 HTML 信,字符集写在 <meta> 里:按它解,Big5 的「發票抬頭錯了」不会按 GB18030 解成乱码。"""
    raw = (HEAD + "Content-Type: text/html\n\n").encode() + (
        f"<html><head>{meta}</head><body><p>{text}</p></body></html>\n").encode(encoding)
    assert email_poller.parse(raw)["body"] == text


def test_the_cells_of_an_html_table_are_kept_apart():
    """客户贴进来的订单表格:格子不能粘在一起(「订单号A1001」「金额¥99.00」),模型读不出哪个是订单号。"""
    html = ("<html><body><p>这两笔扣了两次:</p><table><tr><th>订单号</th><th>金额</th></tr>"
            "<tr><td>A1001</td><td>99.00</td></tr><tr><td>A1002</td><td>199.00</td></tr></table></body></html>")
    raw = (HEAD + "Content-Type: text/html; charset=utf-8\n\n" + html + "\n").encode()
    assert email_poller.parse(raw)["body"] == "这两笔扣了两次:\n订单号 金额\nA1001 99.00\nA1002 199.00"


def test_mail_without_a_sender_address_cannot_be_parsed():
    with pytest.raises(email_poller.BrokenMail, match=r"找不到发件人地址\(From: '客服系统'\)"):
        email_poller.parse("From: =?utf-8?B?5a6i5pyN57O757uf?=\nSubject: x\n\nbody\n".encode())


def test_a_display_name_with_an_unquoted_comma_still_finds_the_customer(lab, tmp_path):
    """「From: Zhang, Wei <Zhang.Wei@Example.com>」:显示名里的逗号没加引号(规矩上要加,有的邮件程序不加)。
    防的是:parseaddr 只看到「Zhang」,这封信成了「找不到发件人地址」的坏信,退出码 1,客户的信没建工单。
    两个不同的地址时说不清是谁发的,照旧是坏信,什么都不存。"""
    good = tmp_path / "comma.eml"
    good.write_bytes(mail("<comma@example.com>", "Zhang, Wei <Zhang.Wei@Example.com>", "发票开错了", "麻烦重开。"))
    r = cli(["email_poller.py", "--eml", str(good)], lab)
    ticket = ticket_of("<comma@example.com>")
    assert (r.returncode, r.stderr, r.stdout) == (
        0, "", f"{ticket}  {good}\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n")
    assert rows("SELECT event_id, source FROM events") == [("<comma@example.com>", "email")]
    with pytest.raises(email_poller.BrokenMail) as e:
        email_poller.parse(mail("<two@example.com>", "Zhang, Wei <zhang.wei@example.com>, Li <li.na@example.com>",
                                "x", "y"))
    assert str(e.value) == "找不到发件人地址(From: 'Zhang, Wei <z***@example.com>, Li <l***@example.com>')"  # 照旧打码


def test_the_from_header_in_a_missing_sender_reason_is_masked():
    with pytest.raises(email_poller.BrokenMail) as e:
        email_poller.parse("From: 张伟 13812345678 身份证 110101199003071234\nSubject: x\n\nbody\n".encode())
    assert str(e.value) == "找不到发件人地址(From: '张伟 138****5678 身份证 110101********1234')"


def test_body_is_cut_at_2000_characters():
    parsed = email_poller.parse(mail("<long@x>", "zhang.wei@example.com", "长信", "很" * 5000))
    assert parsed["body"] == "很" * 2000


def test_a_subject_is_cut_at_200_characters_and_a_missing_one_is_stored_as_no_subject(lab, tmp_path):
    """工单原文是「主题:正文」,整个进模型:正文只留 2000 字,主题也有上限(否则 30 万字的主题照样进模型)。
    没有主题的信,工单主题是「(无主题)」,收件箱那一条不会只剩「客户反映:」。"""
    (tmp_path / "a.eml").write_bytes(mail("<long-subject@x>", "zhang.wei@example.com", "发票" * 3000, "请重开发票。"))
    (tmp_path / "b.eml").write_bytes(mail("<no-subject@x>", "zhang.wei@example.com", "  ", "凭证导出失败。"))
    r = cli(["email_poller.py", "--eml", str(tmp_path)], lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[-1] == "本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0"
    assert sorted((subject, body) for _, _, subject, body, _ in biz_rows(MAIL_TICKETS)) == [
        ("(无主题)", "凭证导出失败。"), ("发票" * 100, "请重开发票。")]


@pytest.mark.parametrize("name", sorted(EXPECTED_SAMPLES))
@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])  # .eml 文件常是 LF,IMAP 收到的是 CRLF
def test_every_cut_inside_a_samples_header_block_is_broken_mail_and_headers_with_the_blank_line_are_not(name,
                                                                                                       newline):
    """样例邮件截在邮件头里的任何一个字节上都是坏信:还没有一个「名字:」时是「没有邮件头」,之后是「邮件头没有以空行结束」
    (截在半行上、截在值中间、正好截在一行末尾都算)。完整的样例照常解析;单段的邮件头加上空行、没有正文的也照常解析
    (正文是空的,也可能就是一封只写了主题的信,这种不拒收)。"""
    raw = sample(name).replace(b"\n", newline)
    blank_line = raw.index(newline * 2) + len(newline)  # 空行从这里开始
    for n in range(1, blank_line + 1):
        reason = "邮件头没有以空行结束(邮件被截断或损坏?)" if b":" in raw[:n] else "没有邮件头,不像一封邮件(文件被截断或损坏?)"
        with pytest.raises(email_poller.BrokenMail) as e:
            email_poller.parse(raw[:n])
        assert str(e.value) == reason, n
    head_only = raw[:blank_line + len(newline)]
    if name == "06_multipart_alternative.eml":  # multipart 却一段也没有:也是截断的
        with pytest.raises(email_poller.BrokenMail, match="^multipart 邮件里找不到分段的边界"):
            email_poller.parse(head_only)
    else:
        assert email_poller.parse(head_only)["body"] == ""
    _, _, subject, body = EXPECTED_SAMPLES[name]
    parsed = email_poller.parse(raw)
    assert (parsed["message_id"], parsed["subject"], parsed["body"]) == (sample_id(name), subject, body)


@pytest.mark.parametrize("name", sorted(EXPECTED_SAMPLES))
def test_every_cut_inside_a_samples_body_is_refused_or_keeps_a_clean_beginning_of_the_body(name):
    """正文截在任何一个字节上:要么说是截断的坏信,要么存下的正文是完整正文的开头 —— 截在一行末尾、两个字之间的
    单段正文看不出来,但存下的不会是乱码、半个转义、半个标签。防的是 quoted-printable 截在「=C」上解出一串乱码,
    HTML 截在「<di」上把「<di」当成正文。"""
    raw = sample(name)
    body = EXPECTED_SAMPLES[name][3]
    refused = 0
    for n in range(raw.index(b"\n\n") + 2, len(raw)):
        try:
            parsed = email_poller.parse(raw[:n])
        except email_poller.BrokenMail as e:
            assert str(e).endswith("(邮件被截断或损坏?)"), (n, str(e))
            refused += 1
            continue
        assert body.startswith(parsed["body"]), (n, parsed["body"][-20:])
    assert refused > 0


def test_a_forwarded_mail_whose_attached_original_is_cut_is_not_broken_mail():
    """转发、退信里附的原信(message/rfc822)本来就常被截断,信本身是完整的:只查这封信自己的 multipart,不往附件里走。"""
    original = sample("06_multipart_alternative.eml")
    raw = (b"Message-ID: <fwd@example.com>\nFrom: li.na@example.com\nSubject: fwd\nMIME-Version: 1.0\n"
           b"Content-Type: multipart/mixed; boundary=OUT\n\n--OUT\nContent-Type: text/plain; charset=utf-8\n\n"
           + "退信里附着原信。".encode() + b"\n--OUT\nContent-Type: message/rfc822\n\n"
           + original[:original.index(b"PGh0bWw+") + 8] + b"\n--OUT--\n")
    assert email_poller.parse(raw) == {"message_id": "<fwd@example.com>", "from": "li.na@example.com",
                                       "subject": "fwd", "body": "退信里附着原信。"}
    with pytest.raises(email_poller.BrokenMail, match="^multipart 邮件没有结束边界"):  # 截断的是这封信自己:坏信
        email_poller.parse(raw[:raw.index(b"\n--OUT--")])


def parses_or_is_broken_mail(raw: bytes) -> None:
    """parse() 要么说是坏信(带原因),要么交回四项都能存进两种库的结果,不会抛别的。"""
    try:
        parsed = email_poller.parse(raw)
    except email_poller.BrokenMail as e:
        assert str(e)
        return
    assert set(parsed) == {"message_id", "from", "subject", "body"}
    assert parsed["message_id"] and "@" in parsed["from"] and parsed["subject"] and len(parsed["body"]) <= 2000
    # 存得进两种库:事件 id 不超过 200 个字,哪一项都没有落单的代理项,地址里没有控制字符
    assert len(parsed["message_id"]) <= 200 and not any(mail_text.SURROGATES.search(v) for v in parsed.values())
    assert not any(unicodedata.category(c) == "Cc" for c in parsed["from"])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000) | st.text(max_size=500).map(lambda t: ("From: a@b.cn\nSubject: " + t).encode()))
def test_any_bytes_either_parse_or_raise_broken_mail_never_anything_else(raw):
    parses_or_is_broken_mail(raw)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=500))
def test_any_subject_and_body_text_either_parse_or_raise_broken_mail_never_anything_else(subject, body):
    """上一个测试的邮件头后面大多没有空行,那样的信都当截断的坏信;这里带上空行和正文,解析成功的那一支也照样查。"""
    parses_or_is_broken_mail(("From: a@b.cn\nSubject: " + subject + "\n\n" + body).encode())


# ---------------------------------------------------------------- 练习 5:投诉邮件只产生通知
def test_complaint_mail_becomes_a_notification_that_only_allows_ignore(lab):
    r = cli(["email_poller.py", "--eml", "samples/11_complaint.eml"], lab)
    ticket = ticket_of("<complaint-0915@huayang-edu.cn>")
    assert (r.returncode, r.stdout.splitlines()[0]) == (0, f"{ticket}  samples/11_complaint.eml")

    w = cli(["worker.py", "--once"], lab)
    assert (w.returncode, w.stdout) == (0, "<complaint-0915@huayang-edu.cn> → waiting_human\n")

    listing = cli(["inbox.py", "list"], lab)
    assert listing.returncode == 0
    assert listing.stdout.splitlines() == [
        f"{ticket}  【通知】[bug] 工单提到「投诉到」,Agent 没有起草回复,请主管看一下",
        "        工单:银行流水导入报错一直没人管:银行流水导入报错的问题提了一个月都没解决,再没人处理,我要投诉到消费者协会。",
        "        周婷",  # 署名另起一行:也缩进在这条待办下面(顶格的话像是下一条)
        "        只能 ignore(看过即可)",
    ]

    for command, args in (("accept", []), ("edit", ["您好,我们马上处理。"]), ("respond", ["先道歉"])):
        refused = cli(["inbox.py", command, ticket, *args], lab)
        assert (refused.returncode, refused.stdout) == (1, "")
        assert refused.stderr == f"{ticket} 是通知类待办,Agent 没有起草回复,不能 {command};只能 ignore(看过即可)\n"
    assert rows("SELECT * FROM outbox") == []
    assert rows("SELECT status FROM events") == [("waiting_human",)]

    done = cli(["inbox.py", "ignore", ticket], lab)
    assert (done.returncode, done.stdout) == (0, f"{ticket} → ignored\n")
    assert rows("SELECT * FROM outbox") == []
    assert rows("SELECT status FROM events") == [("ignored",)]


def test_when_every_candidate_ticket_id_belongs_to_other_mails_nothing_is_stored_and_the_reason_is_given(lab):
    for ticket_id, subject in (("MAAAAAA", "别人的信一"), ("MAAAAAAAA", "别人的信二")):
        assert store_biz.add_mail_ticket([ticket_id], "C002", subject, "别人的正文", "2026-11-30") == ticket_id
    before = biz_rows(MAIL_TICKETS)
    with pytest.raises(ValueError, match="^工单号全都被别的邮件占了:MAAAAAA, MAAAAAAAA$"):
        store_biz.add_mail_ticket(["MAAAAAA", "MAAAAAAAA"], "C001", "张伟的信", "张伟的正文", "2026-11-30")
    assert biz_rows(MAIL_TICKETS) == before


# ---------------------------------------------------------------- 命令行写错、服务器拒绝命令
@pytest.mark.parametrize("args, message", [
    (["--eml"], "email_poller.py:错误:--eml 后面至少要跟一个值"),
    (["--bogus"], "email_poller.py:错误:不认识的参数:--bogus"),
])
def test_bad_command_line_exits_2_with_usage_and_nothing_is_stored(imap_env, imap_server, args, message):
    imap_server.append(ZHANG)  # 邮箱设置齐全、有一封未读:参数写错时也不该去收
    r = cli(["email_poller.py", *args], imap_env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith("用法:email_poller.py") and r.stderr.endswith("\n" + message + "\n")
    nothing_stored(imap_server, [101])


def refuse(monkeypatch, command: str, uid: str | None = None):
    """让 imaplib 收到服务器对 UID <command>(只对这一封 uid,或者每一封)回的 NO(不是断线)。pymap 不会回这种 NO。
    返回真正的 IMAP4.uid,服务器「恢复」时换回去。"""
    real_uid = imaplib.IMAP4.uid

    def refusing(self, cmd, *args):
        if cmd == command and (uid is None or args[0] in (uid, uid.encode())):
            return "NO", [b"[UNAVAILABLE] try again later"]
        return real_uid(self, cmd, *args)

    monkeypatch.setattr(imaplib.IMAP4, "uid", refusing)
    return real_uid


def test_a_search_the_server_refuses_is_one_clear_line_and_no_mail_is_lost(imap_env, imap_server, monkeypatch,
                                                                            capsys):
    """服务器对 UID SEARCH 回 NO:退出码 3,说明是哪一步;信还是未读,下次再收。"""
    imap_server.append(ZHANG)
    for k, v in imap_env.items():
        monkeypatch.setenv(k, v)
    real_uid = refuse(monkeypatch, "SEARCH")
    assert email_poller.main([]) == 3
    assert capsys.readouterr() == ("", "搜索未读邮件失败:[UNAVAILABLE] try again later\n")
    nothing_stored(imap_server, [101])

    monkeypatch.setattr(imaplib.IMAP4, "uid", real_uid)  # 服务器恢复了:下次运行补上
    again = cli(["email_poller.py"], imap_env)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.splitlines()[0] == f"{ticket_of('<t1@example.com>')}  UID 101"
    assert imap_server.unseen() == [] and len(rows(EVENTS)) == len(biz_rows(MAIL_TICKETS)) == 1


def test_a_mail_the_server_will_not_mark_read_is_reported_and_the_mails_after_it_still_come_in(imap_env, imap_server,
                                                                                               monkeypatch, capsys):
    """服务器对某一封的 UID STORE 回 NO(不是断线):工单和事件已经存好,只是没能标已读。说是哪一封,其他照常,
    汇总多一项「标已读失败」,退出码 1;这封下次收到时是 duplicate,不会多一张工单。
    防的是:整轮停在这一封、退出码 3,服务器一直不让标它的话,它后面的信永远收不到。"""
    imap_server.append(ZHANG, LI)
    for k, v in imap_env.items():
        monkeypatch.setenv(k, v)
    real_uid = refuse(monkeypatch, "STORE", "101")
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    for _ in range(2):  # 一直不让标:第二轮 101 是 duplicate,102 已经收过了
        assert email_poller.main([]) == 1
    assert capsys.readouterr() == (
        f"{t1}  UID 101\n{t3}  UID 102\n本次收取 2 封:新工单 2,重复 0,跳过 0,无法解析 0,存储失败 0,标已读失败 1\n"
        f"duplicate  UID 101\n本次收取 1 封:新工单 0,重复 1,跳过 0,无法解析 0,存储失败 0,标已读失败 1\n",
        "UID 101 已处理,但标已读失败:[UNAVAILABLE] try again later;下次会再收到它,不会重复建工单\n" * 2)
    assert imap_server.unseen() == [101]
    assert ([t[0] for t in biz_rows(MAIL_TICKETS)], [e[0] for e in rows(EVENTS)]) == (
        sorted([t1, t3]), ["<t1@example.com>", "<t3@example.com>"])

    monkeypatch.setattr(imaplib.IMAP4, "uid", real_uid)  # 服务器恢复了:下次运行标上
    again = cli(["email_poller.py"], imap_env)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == "duplicate  UID 101\n本次收取 1 封:新工单 0,重复 1,跳过 0,无法解析 0,存储失败 0\n"
    assert imap_server.unseen() == [] and len(rows(EVENTS)) == len(biz_rows(MAIL_TICKETS)) == 2


def test_a_mail_the_server_refuses_to_hand_over_stays_unseen_and_the_other_mails_go_on(imap_env, imap_server,
                                                                                       monkeypatch, capsys):
    """服务器对某一封的 UID FETCH 回 NO(不是断线):不能悄悄跳过(退出码 0、「本次收取 0 封」,像是没有新信),
    要说是哪一封、服务器怎么说,这封保持未读,其他照常;汇总多一项「读取失败」,退出码 1。下次运行补上。"""
    imap_server.append(ZHANG, LI)
    for k, v in imap_env.items():
        monkeypatch.setenv(k, v)
    real_uid = imaplib.IMAP4.uid

    def uid(self, command, *args):
        if command == "FETCH" and args[0] in (b"101", "101"):
            return "NO", [b"[UNAVAILABLE] try again later"]
        return real_uid(self, command, *args)

    monkeypatch.setattr(imaplib.IMAP4, "uid", uid)
    assert email_poller.main([]) == 1
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert capsys.readouterr() == (
        f"{t3}  UID 102\n本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0,读取失败 1\n",
        "取信失败,邮件保持未读,下次再收:[UNAVAILABLE] try again later  UID 101\n")
    assert imap_server.unseen() == [101]
    assert ([t[0] for t in biz_rows(MAIL_TICKETS)], [e[0] for e in rows(EVENTS)]) == ([t3], ["<t3@example.com>"])

    monkeypatch.setattr(imaplib.IMAP4, "uid", real_uid)  # 服务器恢复了:下次运行补上
    again = cli(["email_poller.py"], imap_env)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == f"{t1}  UID 101\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n"
    assert imap_server.unseen() == []
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == sorted([t1, t3])
    assert [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]


def run_behind(front: "Front", imap_env: dict, **env: str) -> subprocess.CompletedProcess:
    try:
        return cli(["email_poller.py"], {**imap_env, "IMAP_PORT": str(front.port), **env})
    finally:
        front.close()


def test_a_fetch_refused_after_part_of_its_answer_does_not_pass_that_mail_off_as_the_next_one(imap_env, imap_server):
    """服务器已经送出了 101 的内容,最后却回 NO。imaplib 留着这半截回答,下一封 FETCH 时一起交出来。每封只认 UID 对得上的那份;
    防的是 101 的内容存在 UID 102 名下,102 标了已读、从没存过 —— 丢了一封信。"""
    imap_server.append(ZHANG, LI)
    once = []

    def answer(line: bytes, sent: bytes) -> bytes:
        if not once and re.match(rb"\w+ OK .*FETCH", line, re.I):
            once.append(line)
            return re.sub(rb" OK [^\r\n]*", b" NO [UNAVAILABLE] Internal error reading message", line)
        return line

    r = run_behind(Front(imap_server.port, answer=answer), imap_env)
    t1, t3 = ticket_of("<t1@example.com>"), ticket_of("<t3@example.com>")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, f"{t3}  UID 102\n本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0,读取失败 1\n",
        "取信失败,邮件保持未读,下次再收:[UNAVAILABLE] Internal error reading message  UID 101\n")
    assert imap_server.unseen() == [101]
    assert biz_rows("SELECT id, subject FROM tickets WHERE id LIKE 'M%'") == [(t3, "扣款")]
    assert [e[0] for e in rows(EVENTS)] == ["<t3@example.com>"]
    again = cli(["email_poller.py"], imap_env)
    assert (again.returncode, again.stdout) == (0, f"{t1}  UID 101\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n")
    assert imap_server.unseen() == [] and [e[0] for e in rows(EVENTS)] == ["<t1@example.com>", "<t3@example.com>"]


def test_a_search_answer_without_its_search_line_counts_as_no_unseen_mail(imap_env, imap_server):
    """规矩上服务器总要回一行 * SEARCH(没有结果时是空的);没回的当作没有未读邮件,不是 AttributeError 的 traceback。"""
    imap_server.append(ZHANG)
    r = run_behind(Front(imap_server.port, answer=lambda line, sent: b"" if line.startswith(b"* SEARCH") else line),
                   imap_env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "本次收取 0 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    nothing_stored(imap_server, [101])


def test_a_read_only_folder_is_named_as_such_not_as_a_dropped_connection(imap_env, imap_server):
    """imaplib 把 [READ-ONLY] 报成 readonly,它是 abort(断线)的子类:说的是只能读,不是「连接断了」。"""
    imap_server.append(ZHANG)
    r = run_behind(Front(imap_server.port, answer=lambda line, sent: line.replace(b"[READ-WRITE]", b"[READ-ONLY]")),
                   imap_env)
    assert (r.returncode, r.stdout, r.stderr) == (
        3, "", "邮箱文件夹 INBOX 只能读,不能标已读:INBOX is not writable(换一个文件夹,或者让邮箱管理员给 IMAP_USER 写权限)\n")
    nothing_stored(imap_server, [101])


def like_163(line: bytes, sent: bytes) -> bytes:
    """163、126 邮箱:客户端没报过 ID 就 SELECT,一律回 NO Unsafe Login(它们真实的回答)。"""
    if b" ID (" not in sent and re.match(rb"\w+ OK \[READ-WRITE\]", line):
        return re.sub(rb" OK [^\r\n]*", b" NO SELECT Unsafe Login. Please contact kefu@188.com for help", line)
    return line


@pytest.mark.parametrize("advertises_id", [True, False])
def test_the_poller_says_who_it_is_when_the_server_supports_id_so_163_lets_it_select(imap_env, imap_server,
                                                                                     advertises_id):
    """服务器的 CAPABILITY 里有 ID 就先发 ID(163 要这个);没有就不发(不认识的命令,别去碰)。"""
    imap_server.append(ZHANG)
    commands = []

    def answer(line: bytes, sent: bytes) -> bytes:
        commands[:] = [sent]
        if not advertises_id and b"CAPABILITY" in line:
            return re.sub(rb" ID\b", b"", line)
        return like_163(line, sent) if advertises_id else line

    r = run_behind(Front(imap_server.port, answer=answer), imap_env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == f"{ticket_of('<t1@example.com>')}  UID 101\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n"
    assert (b' ID ("name" "CloudLedger email_poller" "version" "1.0")\r\n' in commands[0]) == advertises_id
    assert imap_server.unseen() == []


def test_a_server_error_in_chinese_is_shown_as_chinese_not_as_byte_escapes(imap_env, imap_server):
    imap_server.append(ZHANG)
    said = "[AUTHENTICATIONFAILED] 授权码错误,请使用客户端授权码登录".encode()
    r = run_behind(Front(imap_server.port, answer=lambda line, sent: line.replace(
        b"[AUTHENTICATIONFAILED] Invalid authentication credentials.", said)), imap_env, IMAP_PASSWORD="wrong")
    assert (r.returncode, r.stdout, r.stderr) == (
        3, "", f"IMAP 登录失败(用户 {USER}):[AUTHENTICATIONFAILED] 授权码错误,请使用客户端授权码登录;"
               "检查 IMAP_USER 和 IMAP_PASSWORD(很多邮箱要填授权码,不是网页登录密码)\n")
    nothing_stored(imap_server, [101])


def test_a_host_name_that_does_not_resolve_is_one_clear_line(imap_env):
    """IMAP_HOST 写错(解析不出来):说是域名解析失败、该查哪一项,而不是一段 socket.gaierror。"""
    r = cli(["email_poller.py"], {**imap_env, "IMAP_HOST": "imap.no-such-host.invalid", "IMAP_PORT": "993"})
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr.startswith("连不上 IMAP 服务器 imap.no-such-host.invalid:993:域名解析失败(")
    assert r.stderr.endswith("),检查 IMAP_HOST\n") and len(r.stderr.splitlines()) == 1
    nothing_stored()


@pytest.mark.parametrize("layout", [
    "Content-Type: text/plain; charset=utf-8\nContent-Disposition: inline; filename=note.txt\n\n发票抬头写错了,麻烦重开。\n",
    'Content-Type: text/plain; charset=utf-8; name="body.txt"\n\n发票抬头写错了,麻烦重开。\n',
    multipart("mixed", "Content-Type: image/png\nContent-Disposition: attachment; filename=a.png\n"
                       "Content-Transfer-Encoding: base64\n\niVBORw0KGgo=",
              "Content-Type: text/plain; charset=utf-8\nContent-Disposition: inline; filename=note.txt\n\n"
              "发票抬头写错了,麻烦重开。"),
], ids=["inline-filename", "type-name-only", "beside-a-picture"])
def test_a_mail_whose_only_text_is_an_inline_part_with_a_file_name_keeps_that_text_as_its_body(imap_env, imap_server,
                                                                                              layout):
    """有的邮件程序把正文也写成「inline; filename=note.txt」:带文件名的一律当附件的话,整封信正文为空,
    照常建一张空工单、标已读,客户写的话悄悄丢了。别处一个字都没有时,这样的段就是正文。"""
    poll_one(imap_env, imap_server, (HEAD + layout).encode(), "<parts@example.com>", "发票抬头写错了,麻烦重开。")


def test_a_text_part_explicitly_marked_attachment_is_still_not_the_body():
    """明说是 attachment 的仍然是附件:这封信客户一个字没写,正文是空的。"""
    raw = (HEAD + "Content-Type: text/plain; charset=utf-8\nContent-Disposition: attachment; filename=export.log\n\n"
                  "2026-11-30 导出凭证失败\n").encode()
    assert email_poller.parse(raw)["body"] == ""


def test_a_multipart_mail_without_a_boundary_is_broken_mail_not_an_empty_ticket(lab, tmp_path):
    """Content-Type 是 multipart/mixed,却没写 boundary:分不出各段,是坏信;不能照常建一张空工单、退出码 0。"""
    raw = (HEAD + "Content-Type: multipart/mixed\n\n--b1\nContent-Type: text/plain; charset=utf-8\n\n"
                  "发票抬头写错了。\n--b1--\n").encode()
    t3 = broken_beside_a_good_one(lab, tmp_path, raw, "multipart 邮件没有写分段的边界(Content-Type 里没有 boundary),"
                                                      "分不出各段(邮件损坏?)")
    assert [t[0] for t in biz_rows(MAIL_TICKETS)] == [t3]
    assert [e[0] for e in rows(EVENTS)] == ["<t3@example.com>"]


def test_a_charset_name_with_a_nul_and_a_codec_that_raises_are_decoded_another_way_and_the_mail_is_stored(lab,
                                                                                                         tmp_path):
    """charset="utf-8\\0" 解码时是 ValueError(名字里有 NUL),主题里的 =?idna?…?= 是 UnicodeError:和不认识的字符集一样换着试。
    防的是:整封信成了「无法解析:ValueError: embedded null character」、标已读加星标,没建工单。"""
    (tmp_path / "a.eml").write_bytes(b"Message-ID: <nul-cs@example.com>\nFrom: zhang.wei@example.com\n"
                                     b"Subject: =?idna?Q?=E5=8F=91=E7=A5=A8?=\n"
                                     b'Content-Type: text/plain; charset="utf-8\x00"\n\n'
                                     + "发票抬头写错了。\n".encode())
    ticket = ticket_of("<nul-cs@example.com>")
    r = cli(["email_poller.py", "--eml", str(tmp_path / "a.eml")], lab)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"{ticket}  {tmp_path}/a.eml\n本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n", "")
    assert biz_rows(MAIL_TICKETS) == [(ticket, "C001", "发票", "发票抬头写错了。", "open")]
    assert [e[0] for e in rows(EVENTS)] == ["<nul-cs@example.com>"]


def body_made_nil(uid: bytes):
    """Front 的 answer:客户端 UID FETCH uid 时,回答改成「BODY[] NIL」(说取到了,却没有内容),
    原文那段 literal 和收尾的「)」一起吞掉。别的回答照旧。pymap 的 FETCH 回答里不写 UID,所以按客户端最后一条命令认。"""
    skip = {"left": 0, "closing": False}

    def answer(line: bytes, sent: bytes) -> bytes:
        if skip["left"] > 0:
            skip["left"] -= len(line)
            skip["closing"] = skip["left"] <= 0
            return b""
        if skip["closing"]:  # literal 之后那一行:「)」或者「 FLAGS (…))」
            skip["closing"] = False
            return b""
        asked = sent.rstrip(b"\r\n").rsplit(b"\r\n", 1)[-1]
        if b" UID FETCH %s " % uid in asked and (m := re.match(rb"\* (\d+) FETCH \((.*)BODY\[\] \{(\d+)\}\r\n", line)):
            skip["left"] = int(m.group(3))
            return b"* %s FETCH (%sBODY[] NIL)\r\n" % (m.group(1), m.group(2))
        return line
    return answer


def test_a_fetch_that_says_ok_but_gives_no_mail_is_reported_unreadable_and_the_mail_stays_unseen(imap_env, imap_server):
    """服务器对 UID FETCH 回 OK,这一封却是「BODY[] NIL」:报「取信失败」、保持未读,其他的照常,退出码 1。
    防的是:和「这期间被别的客户端删了」一样悄悄跳过,退出码 0,每次都跳过,这封信永远收不进来也没人知道。"""
    imap_server.append(ZHANG, LI)
    r = run_behind(Front(imap_server.port, answer=body_made_nil(b"101")), imap_env)
    t3 = ticket_of("<t3@example.com>")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, f"{t3}  UID 102\n本次收取 2 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0,读取失败 1\n",
        "取信失败,邮件保持未读,下次再收:服务器回答了这一封,却没有给出信的内容  UID 101\n")
    assert [e[0] for e in rows(EVENTS)] == ["<t3@example.com>"]
    assert imap_server.unseen() == [101]
