"""store.py --from-sqlite:一直用 SQLite 的实验换到 PostgreSQL 时,把事件、发件箱、审核记录和 checkpoint 搬过去。
搬过去的待办在 PostgreSQL 上照样处理、只发一次;做了一半的图接着跑;搬不了时说明原因,什么都没搬。"""
import json
import os
import signal
import sqlite3
from contextlib import contextmanager
from datetime import timedelta

import pytest
from conftest import (LAB, cli, cut_connections, drain, pg_schema, read_write_role, refused_startup, rows, run,
                      webhook_server, write_locked)
from openai_stub import OpenAIStub

import store
import store_biz
import store_cli
import store_errors
import store_move
import store_pg
import worker

TABLES = ("events", "outbox", "review_log", "inbox_seen", "llm_usage")  # 事件库里的全部表,都要搬


def add(ticket_id: str, event_id: str = "") -> None:
    event_id = event_id or f"evt_{ticket_id}_created"
    payload = json.dumps({"id": event_id, "type": "ticket.created", "data": {"ticket_id": ticket_id}})
    assert store.add_event(event_id, "webhook", "ticket.created", payload)


def columns_of(table: str) -> list[str]:
    """这张表在 SQLite 事件库里的列(自增的 id 除外),照 store.SCHEMA 建出来的样子,不看搬家代码里写的列表。"""
    conn = sqlite3.connect(store.events_db())
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[1] != "id"]
    finally:
        conn.close()


def snapshot() -> dict:
    """当前库(SQLite 或 PostgreSQL)里事件库各表的全部内容,不含自增 id;时间统一成 datetime 再比。"""
    conn = sqlite3.connect(store.events_db())
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} - {"sqlite_sequence"}
    conn.close()
    assert tables - {"moved_to_postgres"} == set(TABLES)  # SCHEMA 加了表,这里(和搬家)也要跟上;另一张是搬走的记号
    out = {}
    for table in TABLES:
        columns = columns_of(table)
        got = rows(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {columns[0]}, {columns[1]}")
        out[table] = [tuple(store.parse_time(v) if c.endswith(("_at", "not_before", "_since")) and v else v
                            for c, v in zip(columns, r)) for r in got]
    return out


def moved_mark(path) -> tuple[list, list]:
    """SQLite 事件库里搬走的记号:([(搬去的 URL, 什么时候)], [触发器名]);没搬过是 ([], [])。"""
    conn = sqlite3.connect(path)
    try:
        triggers = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name")]
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'moved_to_postgres'").fetchone():
            return [], triggers
        return [(url, store.parse_time(t)) for url, t in conn.execute("SELECT * FROM moved_to_postgres")], triggers
    finally:
        conn.close()


def refusal(lab: dict, url: str) -> str:
    """搬走以后,不设 DATABASE_URL 的程序说的那一行。"""
    (where, moved_at), = moved_mark(lab["EVENTS_DB"])[0]
    assert where == url
    return (f"{lab['EVENTS_DB']} 里的事件已经在 {moved_at:%Y-%m-%d %H:%M:%S} UTC 搬进了 {url},这个库不再用了:"
            "设好 DATABASE_URL 再运行(写进 .env 或 export)。要从头用一套新的 SQLite 库,让 EVENTS_DB、CHECKPOINTS_DB 指到别处")


@contextmanager
def on_postgres(monkeypatch, url: str):
    """with 里面本进程用 url 指的 PostgreSQL,出来换回 SQLite。"""
    with monkeypatch.context() as m:
        m.setenv("DATABASE_URL", url)
        yield


def history(thread_id: str) -> list[tuple[str, str, int]]:
    """这个 thread 的 checkpoint,新的在前:(checkpoint id, 怎么来的, 第几步)。怎么来的是 input 的,是一次从头开始的运行。"""
    from agent import opened_graph

    with opened_graph() as graph:
        return [(s.config["configurable"]["checkpoint_id"], s.metadata["source"], s.metadata["step"])
                for s in graph.checkpointer.list({"configurable": {"thread_id": thread_id}})]


@pytest.fixture
def sqlite_lab_in_use(lab, monkeypatch):
    """用了一阵的 SQLite 实验:T1012 已经发出,T1041、T1003 在收件箱里(甲看过),T1020 起草失败、等着重试
    (图停在 draft 之前),T1021 刚进来还没领。返回 (环境变量, 搬之前 SQLite 里的全部内容)。"""
    add("T1012"), add("T1041"), add("T1003")
    assert drain() == [("evt_T1012_created", "waiting_human"), ("evt_T1041_created", "waiting_human"),
                       ("evt_T1003_created", "waiting_human")]
    assert cli(["inbox.py", "accept", "T1012"], lab).stdout == "T1012 → sent\n"
    assert cli(["inbox.py", "list"], {**lab, "INBOX_USER": "甲"}).returncode == 0
    with OpenAIStub() as stub, monkeypatch.context() as m:
        for name, value in {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MODEL": "stub-model",
                            "LLM_MAX_RETRIES": "0"}.items():
            m.setenv(name, value)
        stub.fail["stub-model"] = (500, "server_error")
        add("T1020")
        assert drain() == [("evt_T1020_created", "pending")]
    add("T1021")
    return lab, snapshot()


def built_empty(url: str, lab: dict) -> list[str]:
    """store.py 第一次在一个空的 PostgreSQL 库里运行时打印的前三行:建业务表(拷 BIZ_DB),事件库是空的。"""
    return [f"已在 {url} 新建业务表 customers、tickets、invoices(从 {lab['BIZ_DB']} 拷过来)",
            f"事件库 {url}:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行",
            f"业务库 {url}:customers 30 行,tickets 42 行,invoices 55 行"]


def from_sqlite(env: dict):
    return cli(["store.py", "--from-sqlite"], env)


def test_a_sqlite_lab_moved_to_postgres_carries_on_there_and_sends_each_reply_once(
        pg_url, sqlite_lab_in_use, monkeypatch):
    lab, before = sqlite_lab_in_use
    sqlite_history = history("ticket-T1020")  # 开始、load 做完(第 1 步);draft 失败,没有第 2 步
    (checkpoints, threads), = rows("SELECT COUNT(*), COUNT(DISTINCT thread_id) FROM checkpoints", (),
                                   lab["CHECKPOINTS_DB"])
    with pg_schema() as url:
        env = {**lab, "DATABASE_URL": url}
        started = store.parse_time(store.now())
        first = cli(["store.py"], env)  # 照 README 换到 PostgreSQL:先建库,它提醒 SQLite 里还有没做完的
        assert (first.returncode, first.stderr) == (0, "")
        assert first.stdout.splitlines() == built_empty(url, lab) + [
            f"{lab['EVENTS_DB']} 里还有 4 个没做完的事件(排队、等人审)不在 PostgreSQL 里:要在这边接着处理,"
            "停掉用 SQLite 的 worker、webhook、邮件轮询和收件箱,运行 uv run python store.py --from-sqlite"]
        r = from_sqlite(env)
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines() == [
            f"已从 {lab['EVENTS_DB']}、{lab['CHECKPOINTS_DB']} 搬进 {url}:events 5 行,outbox 1 行,review_log 1 行,"
            f"inbox_seen 2 行,llm_usage 3 行;checkpoint {threads} 个 thread({checkpoints} 个 checkpoint)",
            f"{lab['EVENTS_DB']} 里记下了已搬进 PostgreSQL:以后不设 DATABASE_URL 的程序都会说明原因、不用它,"
            "还开着的 SQLite worker 也领不到事件了,同一张工单不会在两边各处理一遍",
            f"事件库 {url}:events 5 行,outbox 1 行,review_log 1 行,llm_usage 3 行",
            f"业务库 {url}:customers 30 行,tickets 42 行,invoices 55 行"]
        assert snapshot() == before  # SQLite 里的数据原样没动,只多了搬走的记号
        (where, moved_at), = moved_mark(lab["EVENTS_DB"])[0]
        assert (where, started <= moved_at <= store.parse_time(store.now())) == (url, True)
        assert moved_mark(lab["EVENTS_DB"])[1] == ["moved_no_insert", "moved_no_update"]
        assert rows("SELECT COUNT(*) FROM checkpoints", (), lab["CHECKPOINTS_DB"]) == [(checkpoints,)]
        assert cli(["store.py"], env).stdout.splitlines() == r.stdout.splitlines()[2:]  # 搬过了就不再提醒
        monkeypatch.setenv("DATABASE_URL", url)
        assert snapshot() == before  # PostgreSQL 里一模一样
        assert history("ticket-T1020") == sqlite_history  # 图的历史也一样,一个不少

        # 甲在 SQLite 上看过的草稿,在 PostgreSQL 上照样认得:不用再 list 一遍就能 accept
        listing = cli(["inbox.py", "list"], env)
        assert [line.split()[0] for line in listing.stdout.splitlines()[::2]] == ["T1041", "T1003"]
        accept = cli(["inbox.py", "accept", "T1041"], {**env, "INBOX_USER": "甲"})
        assert (accept.returncode, accept.stdout) == (0, "T1041 → sent\n")
        assert cli(["inbox.py", "ignore", "T1003"], env).stdout == "T1003 → ignored\n"

        with store.opened() as conn:  # 把 T1020 的重试时间拨到现在
            conn.execute("UPDATE events SET not_before = ? WHERE event_id = 'evt_T1020_created'", (store.now(),))
        assert sorted(drain()) == [("evt_T1020_created", "waiting_human"), ("evt_T1021_created", "waiting_human")]
        newest, *older = history("ticket-T1020")
        assert (newest[1:], older) == (("loop", 2), sqlite_history)  # 从 draft 接着跑:只多了第 2 步,没有从头再来
        assert cli(["inbox.py", "accept", "T1020"], env).stdout == "T1020 → sent\n"

        assert rows("SELECT ticket_id, COUNT(*) FROM outbox GROUP BY ticket_id ORDER BY ticket_id") == [
            ("T1012", 1), ("T1020", 1), ("T1041", 1)]
        assert rows("SELECT event_id, status, attempts FROM events ORDER BY event_id") == [
            ("evt_T1003_created", "ignored", 1), ("evt_T1012_created", "done", 1), ("evt_T1020_created", "done", 2),
            ("evt_T1021_created", "waiting_human", 1), ("evt_T1041_created", "done", 1)]
        # 搬过去的待办没有重新起草:每张工单只调过一次模型(T1020 失败的那次没记用量)
        assert rows("SELECT ticket_id, COUNT(*) FROM llm_usage GROUP BY ticket_id ORDER BY ticket_id") == [
            ("T1003", 1), ("T1012", 1), ("T1020", 1), ("T1021", 1), ("T1041", 1)]


def copy_of(path: str, to) -> str:
    """SQLite 库的一份完整拷贝(backup API:WAL 里还没并进主文件的也在)。"""
    src, dst = sqlite3.connect(path), sqlite3.connect(to)
    src.backup(dst)
    src.close(), dst.close()
    return str(to)


def already_there(lab: dict, path, url: str) -> list[str]:
    """sqlite_lab_in_use 要搬的 PostgreSQL 里已经一样不少时,store.py --from-sqlite 打印的全部行:什么都没再搬,
    只补上 path 里的记号。"""
    (checkpoints,), = rows("SELECT COUNT(*) FROM checkpoints", (), lab["CHECKPOINTS_DB"])
    return [f"{path} 里的 5 个事件、{checkpoints} 个 checkpoint 已经都在 {url} 里了(搬过一次,只是没来得及在 "
            f"{path} 里记下已搬走):这次什么都没再搬,只补上这个记号",
            f"{path} 里记下了已搬进 PostgreSQL:以后不设 DATABASE_URL 的程序都会说明原因、不用它,"
            "还开着的 SQLite worker 也领不到事件了,同一张工单不会在两边各处理一遍",
            f"事件库 {url}:events 5 行,outbox 1 行,review_log 1 行,llm_usage 3 行",
            f"业务库 {url}:customers 30 行,tickets 42 行,invoices 55 行"]


def test_moving_twice_is_refused_and_nothing_is_moved_again(pg_url, sqlite_lab_in_use, monkeypatch, tmp_path):
    lab, before = sqlite_lab_in_use
    copy = copy_of(lab["EVENTS_DB"], tmp_path / "copy-of-ambient.db")  # 有人在搬之前拷了一份
    # 另一份:同样的事件 id,其中一个收到的时间差 1 微秒 —— 不是搬过去的那一套(比如另一套实验发过同样的事件)
    lookalike = copy_of(lab["EVENTS_DB"], tmp_path / "lookalike.db")
    conn = sqlite3.connect(lookalike)
    with conn:
        (received_at,), = conn.execute("SELECT received_at FROM events WHERE event_id = 'evt_T1021_created'")
        conn.execute("UPDATE events SET received_at = ? WHERE event_id = 'evt_T1021_created'",
                     ((store.parse_time(received_at) + timedelta(microseconds=1)).isoformat(),))
    conn.close()
    with pg_schema() as url:
        env = {**lab, "DATABASE_URL": url}
        assert from_sqlite(env).returncode == 0
        again = from_sqlite(env)
        (_, moved_at), = moved_mark(lab["EVENTS_DB"])[0]
        assert (again.returncode, again.stdout.count("\n"), again.stderr) == (
            2, 0, f"没有搬:{lab['EVENTS_DB']} 已经在 {moved_at:%Y-%m-%d %H:%M:%S} UTC 搬进过 {url}。什么都没搬\n")
        again = from_sqlite({**env, "EVENTS_DB": lookalike})
        assert (again.returncode, again.stderr) == (
            2, "没有搬:PostgreSQL 里已经有 5 个同样的事件(evt_T1003_created、evt_T1012_created、evt_T1020_created、"
               "evt_T1021_created、evt_T1041_created):多半已经搬过了。什么都没搬\n")
        assert moved_mark(lookalike) == ([], [])
        # 事件一样,checkpoint 却多一个那边没有的(这份拷贝后来又被 SQLite 的 worker 用过):也不是搬过去的那一套
        more_checkpoints = copy_of(lab["CHECKPOINTS_DB"], tmp_path / "more-checkpoints.db")
        conn = sqlite3.connect(more_checkpoints)
        with conn:
            conn.execute("INSERT INTO checkpoints SELECT thread_id, checkpoint_ns, 'ffffffff-ffff-6fff-8fff-ffffffffffff', "
                         "checkpoint_id, type, checkpoint, metadata FROM checkpoints "
                         "WHERE thread_id = 'ticket-T1020' ORDER BY checkpoint_id DESC LIMIT 1")
        conn.close()
        again = from_sqlite({**env, "EVENTS_DB": copy, "CHECKPOINTS_DB": more_checkpoints})
        assert (again.returncode, again.stderr) == (
            2, "没有搬:PostgreSQL 里已经有 5 个同样的事件(evt_T1003_created、evt_T1012_created、evt_T1020_created、"
               "evt_T1021_created、evt_T1041_created):多半已经搬过了。什么都没搬\n")
        assert moved_mark(copy) == ([], [])
        # 真的拷贝里没有搬走的记号,东西却一样不少都在 PostgreSQL 里:不再搬,只补上记号,拷贝也就不会再被拿去用
        again = from_sqlite({**env, "EVENTS_DB": copy})
        assert (again.returncode, again.stderr, again.stdout.splitlines()) == (0, "", already_there(lab, copy, url))
        r = cli(["worker.py", "--once"], {**lab, "EVENTS_DB": copy})
        assert (r.returncode, r.stdout, r.stderr) == (1, "", refusal({**lab, "EVENTS_DB": copy}, url) + "\n")
        monkeypatch.setenv("DATABASE_URL", url)
        assert snapshot() == before
        # README 里 PostgreSQL 的「从头再来」:清空事件表再运行 store.py。SQLite 里还有没做完的事件,它也不提醒
        # 去运行 --from-sqlite:那个库已经搬过,运行了只会被上面那样拒绝
        with store.opened() as conn:
            conn.execute("TRUNCATE events, outbox, review_log, llm_usage, inbox_seen")
        r = cli(["store.py"], env)
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines() == [f"事件库 {url}:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行",
                                         f"业务库 {url}:customers 30 行,tickets 42 行,invoices 55 行"]


def test_store_py_on_another_postgres_database_says_where_the_sqlite_lab_was_moved(
        pg_url, sqlite_lab_in_use, monkeypatch):
    """搬过以后 DATABASE_URL 换成了另一个库(写错了库名、换了 schema):store.py 在新库里建出空表、打印 0 行之后,
    最后一行说 SQLite 里的东西搬去了哪里,不让人以为搬过去的事件和待办都没了;两个库、SQLite 都不少一行。"""
    lab, before = sqlite_lab_in_use
    with pg_schema() as moved_here, pg_schema() as other:
        assert from_sqlite({**lab, "DATABASE_URL": moved_here}).returncode == 0
        (_, moved_at), = moved_mark(lab["EVENTS_DB"])[0]
        r = cli(["store.py"], {**lab, "DATABASE_URL": other})
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines() == built_empty(other, lab) + [
            f"{lab['EVENTS_DB']} 里的事件在 {moved_at:%Y-%m-%d %H:%M:%S} UTC 搬进的是 {moved_here},"
            "不是现在 DATABASE_URL 的这个库:要接着处理搬过去的事件和待办,把 DATABASE_URL 改回那个库"]
        back = cli(["store.py"], {**lab, "DATABASE_URL": moved_here})  # 改回去:不再提醒
        assert (back.returncode, back.stderr, back.stdout.splitlines()) == (0, "", [
            f"事件库 {moved_here}:events 5 行,outbox 1 行,review_log 1 行,llm_usage 3 行",
            f"业务库 {moved_here}:customers 30 行,tickets 42 行,invoices 55 行"])
        # 同一个库,换成只有读写权限的用户连(所有者搬的家):也是「改回去了」,不因为 URL 里的用户不同就提醒
        with read_write_role(moved_here) as (as_user, grant_read_write):
            grant_read_write()
            back = cli(["store.py"], {**lab, "DATABASE_URL": as_user})
            assert (back.returncode, back.stderr, back.stdout.splitlines()) == (0, "", [
                f"事件库 {as_user}:events 5 行,outbox 1 行,review_log 1 行,llm_usage 3 行",
                f"业务库 {as_user}:customers 30 行,tickets 42 行,invoices 55 行"])
        with on_postgres(monkeypatch, moved_here):
            assert snapshot() == before
    assert snapshot() == before


def nothing_moved(url: str, monkeypatch, before: dict) -> None:
    """PostgreSQL 里事件表和 checkpoint 都是空的(表可能已经建好),SQLite 里的和搬之前一模一样。"""
    with on_postgres(monkeypatch, url):
        assert snapshot() == {t: [] for t in TABLES}
        if rows("SELECT to_regclass('checkpoints') IS NOT NULL") == [(True,)]:  # 搬之前就拒绝时还没建
            assert rows("SELECT COUNT(*) FROM checkpoints") == [(0,)]
    assert snapshot() == before


def test_without_database_url_it_says_what_to_set_and_does_nothing(sqlite_lab_in_use):
    lab, before = sqlite_lab_in_use
    r = from_sqlite(lab)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", "--from-sqlite 是把 SQLite 里的东西搬进 PostgreSQL:先设好 DATABASE_URL=postgresql://…(写进 .env 或 export)"
               "再运行。什么都没做\n")
    assert snapshot() == before


def test_an_event_still_being_processed_in_sqlite_stops_the_move_and_nothing_is_moved(
        pg_url, sqlite_lab_in_use, monkeypatch):
    lab, _ = sqlite_lab_in_use
    assert worker.claim("somebody")["event_id"] == "evt_T1021_created"  # 还有一个用 SQLite 的 worker 在做 T1021
    before = snapshot()
    with pg_schema() as url:
        r = from_sqlite({**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stderr) == (
            1, f"没有搬:{lab['EVENTS_DB']} 里有 1 个事件正在处理(evt_T1021_created):先停掉用 SQLite 的 worker 和收件箱,"
               "等它们做完再搬;进程已经没了的,先在 SQLite 上把它们放回队列、做完:"
               "DATABASE_URL= STALE_MINUTES=0 uv run python worker.py --once。什么都没搬\n")
        nothing_moved(url, monkeypatch, before)


def test_checkpoints_without_their_events_stop_the_move_and_nothing_is_moved(
        pg_url, sqlite_lab_in_use, monkeypatch, tmp_path):
    """EVENTS_DB 指着另一个库(或者拷事件库时漏了 -wal,拷出来的库里没有这些事件),CHECKPOINTS_DB 还是这一套的:
    不搬、退出码 2,说哪几个 thread 没有对应的事件。照样「搬好了」、退出码 0 的话,四个没人认领的 thread 进了
    PostgreSQL,那个库还被记成已搬走。"""
    lab, before = sqlite_lab_in_use
    other = tmp_path / "other.db"
    assert cli(["store.py"], {**lab, "EVENTS_DB": str(other)}).returncode == 0  # 一个新建的、空的事件库
    with pg_schema() as url:
        r = from_sqlite({**lab, "EVENTS_DB": str(other), "DATABASE_URL": url})
        built = f"已在 {store_errors._safe_url(url)} 新建业务表 customers、tickets、invoices(从 {lab['BIZ_DB']} 拷过来)\n"  # 搬之前的一步
        assert (r.returncode, r.stdout, r.stderr) == (
            2, built, f"没有搬:{lab['CHECKPOINTS_DB']} 里有 4 个 thread 在 {other} 里没有对应的事件"
                   "(ticket-T1003、ticket-T1012、ticket-T1020、ticket-T1041):两个文件不是同一套 —— EVENTS_DB、"
                   "CHECKPOINTS_DB 指错了,或者拷事件库时漏了旁边的 -wal 文件(拷之前先停掉所有程序,连 -wal 一起拷)。"
                   "什么都没搬\n")
        nothing_moved(url, monkeypatch, before)
    assert moved_mark(other) == ([], [])


def test_inbox_items_whose_checkpoints_are_not_in_checkpoints_db_stop_the_move_and_nothing_is_moved(
        pg_url, sqlite_lab_in_use, monkeypatch, tmp_path):
    """CHECKPOINTS_DB 写错了(这里指到一个不存在的文件):不搬、退出码 2,说哪几条待办没有 checkpoint。照样「搬好了」
    (checkpoint 0 个 thread)的话,SQLite 记成已搬走,PostgreSQL 上收件箱的两条待办 accept 不了,设置改回来再搬又说
    「已经搬过」,只能 restart、再调模型重新起草。"""
    lab, before = sqlite_lab_in_use
    typo = tmp_path / "checkpoint.db"
    with pg_schema() as url:
        r = from_sqlite({**lab, "CHECKPOINTS_DB": str(typo), "DATABASE_URL": url})
        built = f"已在 {store_errors._safe_url(url)} 新建业务表 customers、tickets、invoices(从 {lab['BIZ_DB']} 拷过来)\n"  # 搬之前的一步
        assert (r.returncode, r.stdout, r.stderr) == (
            2, built, f"没有搬:{lab['EVENTS_DB']} 的收件箱里有 2 条待办(T1003、T1041),{typo} 里却没有它们的 checkpoint:"
                      "CHECKPOINTS_DB 指错了(文件不在,或者是另一套);把它改成 worker 起草时用的那个再搬。什么都没搬\n")
        nothing_moved(url, monkeypatch, before)
        assert not typo.exists()
        again = from_sqlite({**lab, "DATABASE_URL": url})  # 改回来再搬:照常搬好
        assert again.returncode == 0, again.stderr
    assert moved_mark(lab["EVENTS_DB"])[0] != []


def test_a_reply_postgres_already_sent_for_the_same_ticket_stops_the_move_and_nothing_is_moved(
        pg_url, sqlite_lab_in_use, monkeypatch):
    """PostgreSQL 这边已经给 T1012 发过回复(没有 checkpoint,比如有人手工补的):两边的发件箱合不到一起,一行说清楚哪一条。"""
    lab, before = sqlite_lab_in_use
    with pg_schema() as url:
        with on_postgres(monkeypatch, url):
            store.init()
            with store.opened() as conn:
                conn.execute("INSERT INTO outbox (ticket_id, body, sent_by, sent_at) VALUES ('T1012', '您好', 'human', ?)",
                             (store.now(),))
        r = from_sqlite({**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stderr) == (
            2, "没有搬:PostgreSQL 里已经有同样的记录(UniqueViolation: duplicate key value violates unique constraint "
               "\"outbox_ticket_id_key\";Key (ticket_id)=(T1012) already exists):什么都没搬\n")
        with on_postgres(monkeypatch, url):
            assert rows("SELECT ticket_id, sent_by FROM outbox") == [("T1012", "human")]
            assert [rows(f"SELECT COUNT(*) FROM {t}") for t in ("events", "review_log", "checkpoints")] == [[(0,)]] * 3
        assert snapshot() == before


def test_a_ticket_postgres_already_worked_on_stops_the_move_and_nothing_is_moved(
        pg_url, sqlite_lab_in_use, monkeypatch):
    lab, before = sqlite_lab_in_use
    with pg_schema() as url:
        with on_postgres(monkeypatch, url):
            store.init()
            store_biz.build_biz_tables()
            add("T1041", "evt_T1041_again")
            assert drain() == [("evt_T1041_again", "waiting_human")]
        r = from_sqlite({**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stderr) == (
            2, "没有搬:PostgreSQL 里已经有这些工单的 checkpoint(ticket-T1041):它们在那边已经处理过,两边的进度合不到一起。"
               "什么都没搬\n")
        with on_postgres(monkeypatch, url):
            assert rows("SELECT event_id, status FROM events") == [("evt_T1041_again", "waiting_human")]
            assert rows("SELECT COUNT(DISTINCT thread_id) FROM checkpoints") == [(1,)]
        assert snapshot() == before


def test_a_missing_or_lesson_built_events_database_is_named_and_left_alone(lab, pg_url, monkeypatch, tmp_path):
    from test_worker import LESSON_SCHEMA

    missing = tmp_path / "nowhere.db"
    lesson = tmp_path / "lesson.db"
    with sqlite3.connect(lesson) as conn:
        conn.executescript(LESSON_SCHEMA)
    conn.close()
    built = lesson.read_bytes()
    with pg_schema() as url:
        r = from_sqlite({**lab, "DATABASE_URL": url, "EVENTS_DB": str(missing)})
        assert (r.returncode, r.stderr) == (2, f"没有搬:没有可搬的:EVENTS_DB 指的 {missing} 不存在\n")
        assert not missing.exists()
        r = from_sqlite({**lab, "DATABASE_URL": url, "EVENTS_DB": str(lesson)})
        assert (r.returncode, r.stderr) == (
            2, f"没有搬:{lesson} 是旧版的事件库(照课文建的,或者缺表):先在 SQLite 上运行一次 "
               "DATABASE_URL= uv run python store.py 把它升级,再来搬\n")
        assert lesson.read_bytes() == built
        nothing_moved(url, monkeypatch, snapshot())


NOT_SQLITE = b"this is not a SQLite database, just text that somebody saved under the name\n" * 20


def test_a_checkpoint_file_that_is_not_sqlite_stops_the_move_and_nothing_is_moved(
        pg_url, sqlite_lab_in_use, monkeypatch, tmp_path):
    """CHECKPOINTS_DB 指到一个不是 SQLite 的文件(指错了,或者拷坏了):一行说是哪个文件、什么都没搬,退出码 2;
    那个文件不动,SQLite 事件库也没记下搬走。"""
    lab, before = sqlite_lab_in_use
    bad = tmp_path / "checkpoints-copy.db"
    bad.write_bytes(NOT_SQLITE)
    with pg_schema() as url:
        r = from_sqlite({**lab, "DATABASE_URL": url, "CHECKPOINTS_DB": str(bad)})
        assert (r.returncode, r.stderr) == (2, f"没有搬:{bad} 打不开:DatabaseError: file is not a database。什么都没搬\n")
        nothing_moved(url, monkeypatch, before)
    assert bad.read_bytes() == NOT_SQLITE
    assert moved_mark(lab["EVENTS_DB"]) == ([], [])


def test_an_events_file_that_is_not_sqlite_stops_the_move_and_is_left_as_it_was(lab, pg_url, monkeypatch, tmp_path):
    bad = tmp_path / "ambient-copy.db"
    bad.write_bytes(NOT_SQLITE)
    with pg_schema() as url:
        r = from_sqlite({**lab, "DATABASE_URL": url, "EVENTS_DB": str(bad)})
        assert (r.returncode, r.stderr) == (2, f"没有搬:{bad} 打不开:DatabaseError: file is not a database。什么都没搬\n")
        nothing_moved(url, monkeypatch, snapshot())
    assert bad.read_bytes() == NOT_SQLITE


def test_a_row_postgres_cannot_store_stops_the_move_and_nothing_is_moved(pg_url, sqlite_lab_in_use, monkeypatch):
    """SQLite 的 TEXT 里可以有 NUL 字符,PostgreSQL 的不行:说是哪种错,什么都没搬(不是搬了一半)。"""
    lab, _ = sqlite_lab_in_use
    with store.opened() as conn:
        conn.execute("INSERT INTO outbox (ticket_id, body, sent_by, sent_at) VALUES ('T1041', ?, 'human', ?)",
                     ("您好\x00", store.now()))
    before = snapshot()
    with pg_schema() as url:
        r = from_sqlite({**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stderr) == (
            2, "没有搬:有一行搬不进 PostgreSQL(DataError: PostgreSQL text fields cannot contain NUL (0x00) bytes):"
               "什么都没搬\n")
        nothing_moved(url, monkeypatch, before)
    assert moved_mark(lab["EVENTS_DB"]) == ([], [])


def test_an_unreadable_business_database_stops_the_move_when_a_ticket_must_be_copied(lab, pg_url, monkeypatch):
    """PostgreSQL 的业务表已经建好(设着 DATABASE_URL 运行过 store.py),之后 BIZ_DB 坏了;要搬的事件里有一张工单
    PostgreSQL 那边没有,得从 BIZ_DB 拷:读不了就说清楚,什么都没搬。"""
    add("T1012"), add("T9999")
    before = snapshot()
    with pg_schema() as url:
        assert cli(["store.py"], {**lab, "DATABASE_URL": url}).returncode == 0
        with open(lab["BIZ_DB"], "wb") as f:
            f.write(NOT_SQLITE)
        r = from_sqlite({**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stderr) == (
            2, f"没有搬:业务库 {lab['BIZ_DB']} 读不了(DatabaseError: file is not a database),搬过去的事件要用的工单(T9999)"
               "拷不过去。什么都没搬\n")
        nothing_moved(url, monkeypatch, before)
    assert moved_mark(lab["EVENTS_DB"]) == ([], [])
    with open(lab["BIZ_DB"], "rb") as f:
        assert f.read() == NOT_SQLITE


def test_a_sqlite_lab_from_before_waiting_since_is_upgraded_by_the_move_and_keeps_the_waiting_times(
        pg_url, sqlite_lab_in_use, monkeypatch):
    """上一版的 SQLite 库(没有 waiting_since,升级以后还没有程序用 SQLite 打开过):--from-sqlite 搬的时候顺手补上
    这一列(收件箱里的待办从 updated_at 算起),PostgreSQL 里一样;不把它当成「旧版的事件库」、拒绝不搬。"""
    lab, _ = sqlite_lab_in_use
    with store.opened() as conn:
        conn.execute("ALTER TABLE events DROP COLUMN waiting_since")
    inbox_since = rows("SELECT event_id, updated_at FROM events WHERE status = 'waiting_human' ORDER BY event_id")
    assert [e for e, _ in inbox_since] == ["evt_T1003_created", "evt_T1041_created"]
    with pg_schema() as url:
        r = from_sqlite({**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines()[1].startswith(f"已从 {lab['EVENTS_DB']}、{lab['CHECKPOINTS_DB']} 搬进 {url}:events 5 行")
        expected = [(e, store.parse_time(u)) for e, u in inbox_since]
        for database in ("sqlite", "postgres"):
            with on_postgres(monkeypatch, url) if database == "postgres" else monkeypatch.context():
                got = rows("SELECT event_id, waiting_since FROM events WHERE waiting_since IS NOT NULL ORDER BY event_id")
                assert [(e, store.parse_time(w)) for e, w in got] == expected, database


def test_connections_cut_in_the_middle_of_the_move_leave_nothing_moved_and_the_rerun_moves_it_all(
        pg_url, sqlite_lab_in_use, monkeypatch, capsys):
    """搬到一半(第 5 个 checkpoint)PostgreSQL 断了:一行说明、退出码 1,那边什么都没留下;再运行一次全部搬过去。"""
    from langgraph.checkpoint.postgres import PostgresSaver

    lab, before = sqlite_lab_in_use
    real_put, puts = PostgresSaver.put, []

    def put(self, *args):
        puts.append(args)
        if len(puts) == 5:
            assert cut_connections(os.getpid()) >= 1
        return real_put(self, *args)

    with pg_schema() as url:
        with on_postgres(monkeypatch, url), monkeypatch.context() as m:
            m.setattr(PostgresSaver, "put", put)
            assert store_cli.main(["--from-sqlite"]) == 1
        out, err = capsys.readouterr()
        assert (len(puts), out, err) == (
            5, f"已在 {url} 新建业务表 customers、tickets、invoices(从 {lab['BIZ_DB']} 拷过来)\n",
            "数据库暂时用不了(OperationalError: consuming input failed: server closed the connection unexpectedly),"
            "稍后再运行 uv run python store.py --from-sqlite(已经建好的不会重建;这一次什么都没搬)\n")
        store_pg.close_pools()  # 池里的连接都被断了
        nothing_moved(url, monkeypatch, before)
        with on_postgres(monkeypatch, url):
            assert store_cli.main(["--from-sqlite"]) == 0
            assert snapshot() == before


def test_events_that_no_worker_has_touched_yet_move_without_a_checkpoint_file_and_are_worked_on_there(
        lab, pg_url, monkeypatch):
    add("T1012"), add("T1041")
    assert not store.checkpoints_db().exists()  # worker 从没跑过
    before = snapshot()
    with pg_schema() as url:
        r = from_sqlite({**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines()[1] == (
            f"已从 {lab['EVENTS_DB']}、{lab['CHECKPOINTS_DB']} 搬进 {url}:events 2 行,outbox 0 行,review_log 0 行,"
            "inbox_seen 0 行,llm_usage 0 行;checkpoint 0 个 thread(0 个 checkpoint)")
        with on_postgres(monkeypatch, url):
            assert snapshot() == before
            assert drain() == [("evt_T1012_created", "waiting_human"), ("evt_T1041_created", "waiting_human")]
    assert not store.checkpoints_db().exists() and snapshot() == before


def test_mail_that_arrived_after_postgres_got_its_business_tables_moves_with_its_ticket(lab, pg_url, monkeypatch):
    """照 README:先设着 DATABASE_URL 运行 store.py(业务表建好,拷的是那时的 BIZ_DB),再停掉 SQLite 那边、搬家。
    中间用 SQLite 的邮件轮询(crontab 每分钟一次)又收了一封信:它的工单只在 BIZ_DB 里。搬家时把这样的工单(和它的客户)
    一起拷过去:不然事件搬过去以后 worker 说「工单不存在」直接进死信,而邮件早已标了已读。"""
    mail = str(LAB / "samples" / "02_gbk_base64.eml")
    assert cli(["email_poller.py", "--eml", str(LAB / "samples" / "01_utf8_plain.eml")], lab).returncode == 0
    with pg_schema() as url:
        env = {**lab, "DATABASE_URL": url}
        assert cli(["store.py"], env).returncode == 0  # 业务表建好了,里面有第一封信的工单
        late = cli(["email_poller.py", "--eml", mail], lab)  # 还用 SQLite 的邮件轮询收的第二封
        assert late.returncode == 0
        ticket = late.stdout.split()[0]
        r = from_sqlite(env)
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines()[0] == (
            f"已从 {lab['EVENTS_DB']}、{lab['CHECKPOINTS_DB']} 搬进 {url}:events 2 行,outbox 0 行,review_log 0 行,"
            "inbox_seen 0 行,llm_usage 0 行;checkpoint 0 个 thread(0 个 checkpoint);"
            f"从 {lab['BIZ_DB']} 补上 PostgreSQL 业务表里还没有的工单 1 张")
        with on_postgres(monkeypatch, url):
            assert rows("SELECT id, customer_id, subject FROM tickets WHERE id = ?", (ticket,)) == [
                (ticket, "C002", "关闭自动续费后又被扣款")]
            assert [status for _, status in drain()] == ["waiting_human", "waiting_human"]
            assert rows("SELECT COUNT(*) FROM tickets") == [(44,)]  # 种子的 42 张、第一封信的(建业务表时拷的)、这一张


def test_after_the_move_every_program_without_database_url_refuses_the_sqlite_files_even_ones_already_running(
        pg_url, sqlite_lab_in_use, monkeypatch):
    """搬完以后 SQLite 那边一样都不接:搬之前就开着、没停的 worker 领事件时停下,开着的 webhook 回 503;
    新启动的程序一开始就说明原因。SQLite 里什么都没变,PostgreSQL 里也没有多出什么。"""
    import worker

    lab, before = sqlite_lab_in_use
    running = worker.Worker()  # 搬之前就在跑的 SQLite worker(没按说明停掉)
    try:
        with webhook_server(lab) as (_, base), pg_schema() as url:
            assert from_sqlite({**lab, "DATABASE_URL": url}).returncode == 0
            refused = refusal(lab, url)
            with pytest.raises(SystemExit) as stopped:  # T1021 在 SQLite 里还是 pending:这个 worker 本来会再起草一遍
                running.run_once()
            assert stopped.value.code == refused
            sent = cli(["send_webhook.py", "T1030"], {**lab, "WEBHOOK_URL": f"{base}/hooks/cloudledger"})
            assert (sent.returncode, sent.stdout, sent.stderr) == (
                1, f"503 {{'detail': 'event store unavailable (IntegrityError: {store_move.MOVED_AWAY}), retry later'}}\n", "")
            eml = str(LAB / "samples" / "01_utf8_plain.eml")
            for args, code in ((["worker.py", "--once"], 1), (["inbox.py", "list"], 1), (["inbox.py", "accept", "T1041"], 1),
                               (["cron_jobs.py", "scan"], 2), (["cron_jobs.py", "report"], 2),
                               (["email_poller.py", "--eml", eml], 2), (["store.py"], 1),
                               (["worker.py", "--requeue-dead"], 1)):
                r = run(args, lab)
                assert (args, r.returncode, r.stdout, r.stderr) == (args, code, "", refused + "\n")
            r = run(["-m", "uvicorn", "webhook:app", "--port", "0"], lab, timeout=60)
            assert (r.returncode, r.stdout, r.stderr) == refused_startup(r, refused)
            assert snapshot() == before
            monkeypatch.setenv("DATABASE_URL", url)
            assert snapshot() == before
    finally:
        running.close()


def test_a_sqlite_writer_holding_the_lock_makes_the_move_wait_then_stop_with_nothing_moved(
        pg_url, sqlite_lab_in_use, monkeypatch):
    """搬家从读到写完拿着 SQLite 事件库的写锁:有人正在写(这里一直不提交),就等 BUSY_TIMEOUT_S,等不到就什么都不搬;
    锁放开以后再运行就搬过去了。反过来,搬家途中 SQLite 的 worker、收件箱也动不了事件,搬过去的就是读到的。"""
    lab, before = sqlite_lab_in_use
    with pg_schema() as url:
        env = {**lab, "DATABASE_URL": url, "BUSY_TIMEOUT_S": "1"}
        with write_locked(lab["EVENTS_DB"]):
            r = from_sqlite(env)
        assert (r.returncode, r.stdout.count("\n"), r.stderr) == (
            1, 1, "数据库暂时用不了(OperationalError: database is locked),稍后再运行 uv run python store.py --from-sqlite"
                  "(已经建好的不会重建;这一次什么都没搬)\n")
        nothing_moved(url, monkeypatch, before)
        assert moved_mark(lab["EVENTS_DB"]) == ([], [])
        assert from_sqlite(env).returncode == 0
        monkeypatch.setenv("DATABASE_URL", url)
        assert snapshot() == before


def test_when_sqlite_cannot_record_the_move_it_says_so_and_postgres_keeps_everything(
        pg_url, sqlite_lab_in_use, monkeypatch, capsys):
    """PostgreSQL 已经提交、SQLite 却记不下(这里让建记号表的语句撞上已有的表,和磁盘满时一样是真的 SQLite 错误):
    搬家算成功(退出码 0),标准错误上说清楚 SQLite 没挡住、以后要怎么做;修好以后再运行一次,不再搬,只补上记号。"""
    lab, before = sqlite_lab_in_use
    with pg_schema() as url:
        with on_postgres(monkeypatch, url), monkeypatch.context() as m:
            m.setattr(store_move, "RETIRE_SQL", ("CREATE TABLE events (x)", *store_move.RETIRE_SQL[1:]))
            assert store_cli.main(["--from-sqlite"]) == 0
            assert snapshot() == before
        out, err = capsys.readouterr()
        assert out.splitlines()[1].startswith(f"已从 {lab['EVENTS_DB']}、{lab['CHECKPOINTS_DB']} 搬进 {url}:events 5 行,")
        assert len(out.splitlines()) == 4
        assert err == (f"没能在 {lab['EVENTS_DB']} 里记下已搬走(OperationalError: table events already exists):"
                       "修好以后再运行一次 uv run python store.py --from-sqlite 补上这个记号(不会再搬一遍);"
                       "在那之前一定设着 DATABASE_URL 运行,"
                       "别再不设它跑 worker 或收件箱,不然同一张工单会在两边各处理一遍\n")
        assert moved_mark(lab["EVENTS_DB"]) == ([], [])
        assert snapshot() == before
        again = from_sqlite({**lab, "DATABASE_URL": url})
        assert (again.returncode, again.stderr, again.stdout.splitlines()) == (
            0, "", already_there(lab, lab["EVENTS_DB"], url))
        r = cli(["worker.py", "--once"], lab)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", refusal(lab, url) + "\n")
        assert snapshot() == before
        with on_postgres(monkeypatch, url):
            assert snapshot() == before


# store.py --from-sqlite,只是 PostgreSQL 那边一提交(copy_to_postgres 返回),进程就被 kill -9:SQLite 还没记下已搬走
KILLED_AFTER_COPY = """
import os, signal, sys
import store_cli
import store_move
copy = store_move.copy_to_postgres
def copy_then_die(*args):
    counted = copy(*args)
    os.kill(os.getpid(), signal.SIGKILL)
store_move.copy_to_postgres = copy_then_die
sys.exit(store_cli.main(["--from-sqlite"]))
"""


def test_a_move_killed_between_the_postgres_commit_and_the_sqlite_mark_is_finished_by_the_rerun_without_moving_twice(
        pg_url, sqlite_lab_in_use, monkeypatch):
    """kill -9 正好落在 PostgreSQL 提交之后、SQLite 记下已搬走之前(几毫秒的空子):再运行认出 PostgreSQL 里一样不少
    (每个事件连收到时间、每个 checkpoint 的 id),不再搬,只补上记号。只说「多半已经搬过了」、退出码 2 的话,SQLite
    一直没记号 —— 不设 DATABASE_URL 的 worker 照样在 SQLite 上起草、发送,同一张工单两边各处理一遍。"""
    lab, before = sqlite_lab_in_use
    with pg_schema() as url:
        env = {**lab, "DATABASE_URL": url}
        assert cli(["store.py"], env).returncode == 0  # 先建好库:被杀的那一次只剩搬家本身
        killed = run(["-c", KILLED_AFTER_COPY], env)
        assert (killed.returncode, killed.stdout, killed.stderr) == (-signal.SIGKILL, "", "")
        assert moved_mark(lab["EVENTS_DB"]) == ([], [])
        with on_postgres(monkeypatch, url):
            assert snapshot() == before  # PostgreSQL 那边已经提交了
        again = from_sqlite(env)
        assert (again.returncode, again.stderr, again.stdout.splitlines()) == (
            0, "", already_there(lab, lab["EVENTS_DB"], url))
        r = cli(["worker.py", "--once"], lab)  # T1021 在 SQLite 里还是 pending:有了记号,不会在 SQLite 上再起草一遍
        assert (r.returncode, r.stdout, r.stderr) == (1, "", refusal(lab, url) + "\n")
        assert snapshot() == before
        with on_postgres(monkeypatch, url):
            assert snapshot() == before
            assert rows("SELECT COUNT(*) FROM checkpoints") == rows("SELECT COUNT(*) FROM checkpoints", (),
                                                                      lab["CHECKPOINTS_DB"])
