"""store.py 自己的几条出错路径:业务库建不了、PostgreSQL 单独连得上但连接池连不上;设了 DATABASE_URL 时业务表建在哪。"""
import os
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import LAB, cli, pg_schema, rows, run, someone_holds_the_events_table, tcp_proxy

import store
import store_biz
import store_errors
import store_pg
import store_sqlite
import store_upgrade


def test_a_business_database_in_a_missing_directory_names_the_setting_and_creates_nothing(lab, tmp_path):
    """说的是 BIZ_DB 指的目录不存在,不是「数据库暂时用不了(OperationalError: unable to open database file),
    稍后再运行…」:稍后再运行也没用,要改的是 BIZ_DB。(设了 DATABASE_URL 时不用 BIZ_DB,见下面几个测试。)"""
    path = (tmp_path / "missing" / "cloudledger.db").resolve()
    r = cli(["store.py"], {**lab, "BIZ_DB": str(path)})
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"业务库打不开:BIZ_DB={path}(目录 {path.parent} 不存在)\n")
    assert not path.parent.exists()
    assert list(tmp_path.rglob("*.building*")) == []


def test_store_py_started_four_times_at_once_on_a_new_directory_builds_the_business_db_once_and_all_succeed(tmp_path):
    """几个终端(或 cron 里几个程序)同时第一次运行 store.py:每一个都成功;只有一个说
    「已新建业务库」,别的用它建好的那份。它们不共用一个临时文件:共用的话一个删掉另一个正写着的,多半个个都报
    「disk I/O error」「库文件只能读」退出 1,业务库谁也没建成,还留下那个临时文件。一共 5 轮,每轮一个新目录。"""
    base = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "DATABASE_URL")}
    for i in range(5):
        folder = tmp_path / f"lab{i}"
        folder.mkdir()
        env = {**base, "EVENTS_DB": str(folder / "ambient.db"), "BIZ_DB": str(folder / "cloudledger.db"),
               "CHECKPOINTS_DB": str(folder / "checkpoints.db"), "AMBIENT_NO_DOTENV": "1"}
        procs = [subprocess.Popen([sys.executable, "store.py"], cwd=LAB, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
        results = [(p.wait(60), *p.communicate()) for p in procs]
        counts = [f"事件库 {folder / 'ambient.db'}:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行",
                  f"业务库 {folder / 'cloudledger.db'}:customers 30 行,tickets 42 行,invoices 55 行"]
        built = f"已新建业务库 {folder / 'cloudledger.db'}"
        assert sorted(results) == sorted([(0, "\n".join([built, *counts]) + "\n", "")]
                                         + [(0, "\n".join(counts) + "\n", "")] * 3), results
        # 没留下临时文件(建业务库用的 .building)。ambient.db-wal / -shm 是 SQLite 自己的:两个进程同一刻关掉最后的连接时,
        # 谁都拿不到删它们要的排它锁,就留着,下次打开照常用
        left = sorted(p.name for p in folder.iterdir() if not p.name.endswith(("-wal", "-shm")))
        assert left == ["ambient.db", "cloudledger.db"]


@pytest.mark.parametrize("other, tables, role", [("BIZ_DB", "customers、tickets", "是业务库"),
                                                 ("CHECKPOINTS_DB", "checkpoints、writes", "是 checkpoint 库")])
def test_events_db_pointing_at_the_business_or_checkpoint_db_is_named_and_that_file_is_left_alone(lab, other, tables,
                                                                                                   role):
    """EVENTS_DB 写成了业务库(或 checkpoint 库)的路径:每个程序一开始就说清楚,文件一点不动(和 BIZ_DB
    指到事件库时一样)。不然 store.py 会在里面建起事件表、把它改成 WAL,worker、收件箱接着就在别人的库里记事件。"""
    if other == "CHECKPOINTS_DB":
        store_pg.open_checkpointer()[1].close()  # 建出 checkpoint 库(worker 第一次运行时也是这样)
    path = Path(lab[other])
    before = path.read_bytes()
    for command, code in ((["store.py"], 1), (["worker.py", "--once"], 1), (["inbox.py", "list"], 1)):
        r = cli(command, {**lab, "EVENTS_DB": str(path)})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", (
            f"EVENTS_DB 指的 {path} {role}(里面有 {tables} 表、没有 events 表),不是事件库:没有动它。"
            "让 EVENTS_DB 指到事件库(不设就是脚本旁边的 ambient.db)\n")), command
    assert path.read_bytes() == before


def first_connection_only(seen: dict) -> bool:
    return seen["relayed"] == 0


@pytest.mark.parametrize("then", ["close", "silent"])
def test_a_pool_that_cannot_connect_after_the_probe_did_stops_in_time_and_says_why(pg_lab, monkeypatch, then):
    """单独连一次是通的,连接池的连接却一个都连不上(服务器太忙、连接数满了,或者接上了却不回话):
    PG_CONNECT_TIMEOUT_S 秒后一行说明原因退出,连接池关掉、后台线程都停了,不会在后台接着重连。"""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(pg_lab["DATABASE_URL"])
    monkeypatch.setattr(store_pg, "PG_CONNECT_TIMEOUT_S", 1)
    with tcp_proxy(params.get("host") or "127.0.0.1", int(params.get("port") or 5432), first_connection_only, then) \
            as (port, seen):
        url = make_conninfo("", **{**params, "host": "127.0.0.1", "port": str(port)})
        before = set(threading.enumerate())
        started = time.monotonic()
        try:
            store_pg.open_pg_pool(url, True)
        except SystemExit as e:
            stopped, message = time.monotonic() - started, e.code
        else:
            raise AssertionError("连接池一个连接都没连上,open_pg_pool 却没有退出")
        left = [t.name for t in threading.enumerate() if t not in before and not t.name.startswith("proxy-")]
    assert message == ("连不上 DATABASE_URL 指的 PostgreSQL:连接池 1 秒内没有连上"
                       "(单独连一次是通的:服务器太忙,或者连接数满了)")
    assert stopped < 4, f"{stopped:.1f} 秒才退出"
    assert left == []  # 连接池的调度线程和 worker 线程都停了
    assert seen["relayed"] == 1 and seen["refused"] >= 1, seen  # 单独连的那次通了,连接池真的去连过、被拒了


def drop_business_tables() -> None:
    """像一个刚建好的 PostgreSQL 库(或者旧版只在这里建了事件表的库):没有业务表。"""
    with store.transaction() as conn:
        conn.execute("DROP TABLE invoices, tickets, customers")


EVENT_COUNTS = "events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行"


def test_store_builds_the_business_tables_in_postgres_once_and_no_sqlite_file(pg_lab, tmp_path):
    """设了 DATABASE_URL 时,业务表和事件表在同一个 PostgreSQL 库里,不是每台机器各一份 SQLite 文件(那样邮件工单
    只在收信的那台机器上,别的机器上的 worker 说「工单不存在」、进死信);BIZ_DB 指的
    SQLite 库不在时用种子数据,也不会建出这个文件。"""
    drop_business_tables()
    biz = tmp_path / "nowhere" / "cloudledger.db"
    env = {**pg_lab, "BIZ_DB": str(biz)}
    url = store_errors._safe_url(pg_lab["DATABASE_URL"])
    first = cli(["store.py"], env)
    assert (first.returncode, first.stderr) == (0, "")
    assert first.stdout.splitlines() == [f"已在 {url} 新建业务表 customers、tickets、invoices(种子数据)",
                                         f"事件库 {url}:{EVENT_COUNTS}",
                                         f"业务库 {url}:customers 30 行,tickets 42 行,invoices 55 行"]
    store_biz.add_mail_ticket(["M1"], "C001", "发票", "麻烦重开", "2026-12-01")
    again = cli(["store.py"], env)  # 已经有了:不重建,邮件建的工单还在
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.splitlines() == [f"事件库 {url}:{EVENT_COUNTS}", f"业务库 {url}:customers 30 行,tickets 43 行,invoices 55 行"]
    assert not biz.parent.exists()


def test_the_first_build_in_postgres_copies_the_sqlite_business_db_that_biz_db_names(pg_lab):
    """已经有的业务库(Day 23 的库、之前用 SQLite 时邮件建的工单)不被种子数据顶替:客户和工单原样拷过去,
    NUL 去掉(PostgreSQL 的 TEXT 存不了);之后 SQLite 那份不再被用到。"""
    drop_business_tables()
    path = pg_lab["BIZ_DB"]
    with store.transaction(path) as conn:
        conn.execute("INSERT INTO tickets VALUES ('M1a2b3c', 'C001', ?, '抬头写错了', 'open', '2026-11-30')", ("发票\x00开错了",))
    r = cli(["store.py"], pg_lab)
    url = store_errors._safe_url(pg_lab["DATABASE_URL"])
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [f"已在 {url} 新建业务表 customers、tickets、invoices(从 {path} 拷过来)",
                                     f"事件库 {url}:{EVENT_COUNTS}",
                                     f"业务库 {url}:customers 30 行,tickets 43 行,invoices 55 行"]
    assert store_biz.ticket("M1a2b3c") == {"id": "M1a2b3c", "customer_id": "C001", "subject": "发票开错了",
                                       "body": "抬头写错了", "status": "open", "created_at": "2026-11-30"}
    for table in ("customers", "tickets"):
        there = [tuple(v.replace("\x00", "") if isinstance(v, str) else v for v in r)
                 for r in rows(f"SELECT * FROM {table}", path=path)]
        assert sorted(rows(f"SELECT * FROM {table}"), key=repr) == sorted(there, key=repr)


@pytest.mark.parametrize("broken, error", [
    ("ALTER TABLE tickets DROP COLUMN body", "OperationalError: no such column: body"),
    ("UPDATE tickets SET customer_id = 'C999' WHERE id = 'T1012'",
     'ForeignKeyViolation: insert or update on table "tickets" violates foreign key constraint "tickets_customer_id_fkey";'
     'Key (customer_id)=(C999) is not present in table "customers"'),  # DETAIL 说是哪一行
])
def test_a_sqlite_business_db_that_cannot_be_copied_is_named_and_nothing_is_built(pg_lab, broken, error):
    """Day 23 的库列不一样,或者工单的客户不存在(SQLite 默认不查外键,PostgreSQL 查):说清楚、退出码 1,
    PostgreSQL 里一张业务表都不留,SQLite 那份不动。"""
    drop_business_tables()
    path = pg_lab["BIZ_DB"]
    with store.transaction(path) as conn:
        conn.execute(broken)
    before = rows("SELECT * FROM customers ORDER BY id", path=path)
    r = cli(["store.py"], pg_lab)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"业务库 {path} 拷不进 PostgreSQL:{error}。业务表一张都没建:修好它,或者让 BIZ_DB 指到一个不存在的文件、"
                        "改用种子数据\n")
    assert rows("SELECT to_regclass('customers') IS NULL, to_regclass('tickets') IS NULL") == [(True, True)]
    assert rows("SELECT * FROM customers ORDER BY id", path=path) == before


def test_several_machines_building_the_business_tables_at_once_seed_them_once(pg_lab):
    drop_business_tables()
    start, built = threading.Barrier(4), []

    def build():
        start.wait()
        built.append(store_biz.build_biz_tables())

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(built, key=str) == [None, None, None, f"从 {store.biz_db()} 拷过来"]  # lab 建了 SQLite 的业务库
    assert rows("SELECT (SELECT COUNT(*) FROM customers), (SELECT COUNT(*) FROM tickets)") == [(30, 42)]


def test_without_business_tables_in_postgres_every_command_says_run_store_and_touches_nothing(pg_lab):
    drop_business_tables()
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    problem = (f"业务库还没建:{store_errors._safe_url(pg_lab['DATABASE_URL'])} 里没有表 customers、tickets"
               "(先运行 uv run python store.py 建库)")
    for command, code in ((["worker.py", "--once"], 1), (["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], 2),
                          (["cron_jobs.py", "scan"], 2)):
        r = cli(command, pg_lab)
        assert (r.returncode, r.stdout, r.stderr) == (code, "", problem + "\n"), command
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]
    assert rows("SELECT to_regclass('tickets') IS NULL") == [(True,)]


def test_half_of_the_business_tables_in_postgres_is_named_and_left_alone(pg_lab):
    """有人删了一张业务表:store.py 不在剩下的那张上补数据(拷过来的客户会撞上已有的),说缺哪张、怎么办,退出码 2;
    别的命令也说缺哪张(这时再运行 store.py 是没用的,不能叫人去运行它)。"""
    with store.transaction() as conn:
        conn.execute("DROP TABLE tickets")
    url = store_errors._safe_url(pg_lab["DATABASE_URL"])
    r = cli(["store.py"], pg_lab)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", f"业务库 {url} 里没有表:tickets。没有动它:确定剩下的那张业务表没用了(不是别的程序的),才把它也删掉"
               "(DROP TABLE)再运行 uv run python store.py,就会新建一套\n")
    worker = cli(["worker.py", "--once"], pg_lab)
    assert (worker.returncode, worker.stdout, worker.stderr) == (
        1, "", f"业务库 {url} 里没有表:tickets(运行 uv run python store.py,它说怎么修)\n")
    assert rows("SELECT COUNT(*), to_regclass('tickets') IS NULL FROM customers") == [(30, True)]


LESSON_PG_EVENTS = ("CREATE TABLE events (event_id TEXT PRIMARY KEY, source TEXT NOT NULL, kind TEXT NOT NULL, "
                    "payload TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, "
                    "last_error TEXT, received_at TEXT NOT NULL, updated_at TEXT NOT NULL)")


FOREIGN_PG_TABLES = {
    # 练习 6 照课文的表结构在 PostgreSQL 里自己建的事件表:说缺哪几列,不是 UndefinedColumn 的 traceback
    "events": ("CREATE TABLE events (event_id TEXT PRIMARY KEY, source TEXT NOT NULL, kind TEXT NOT NULL, "
               "payload TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, "
               "last_error TEXT, received_at TEXT NOT NULL, updated_at TEXT NOT NULL)", "claimed_by、not_before、ticket_id"),
    # 练习 4 自己起的列名:一开始就说,不然 store.py 说一切正常,之后 inbox accept 失败、日报是 traceback
    "review_log": ("CREATE TABLE review_log (id SERIAL PRIMARY KEY, ticket_id TEXT, original TEXT, edited TEXT, "
                   "decision TEXT)", "action、category、created_at、draft、feedback、final"),
    # 同一个 schema 里别的程序的 tickets:叫人改名或换 schema,不叫人把它 DROP 掉
    "tickets": ("CREATE TABLE tickets (id SERIAL PRIMARY KEY, title TEXT, opened_by TEXT)",
                "body、created_at、customer_id、status、subject"),
}


def foreign_pg_table(url: str, table: str) -> list[tuple]:
    """在 url 的 schema 里建一张 FOREIGN_PG_TABLES 里的表、写一行;返回它的全部行。"""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FOREIGN_PG_TABLES[table][0])
        conn.execute("INSERT INTO events VALUES ('evt_1', 'webhook', 'ticket.created', '{}', 'pending', 0, NULL, "
                     "'2026-12-05T09:00:00', '2026-12-05T09:00:00')" if table == "events" else
                     f"INSERT INTO {table} DEFAULT VALUES")
        return conn.execute(f"SELECT * FROM {table}").fetchall()


def pg_tables(url: str) -> dict[str, list[tuple]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = "
                                            "(SELECT oid FROM pg_namespace WHERE nspname = current_schema()) ORDER BY 1")]
        return {name: conn.execute(f"SELECT * FROM {name}").fetchall() for name in names}


def named_foreign(url: str, table: str) -> str:
    return (f"{store_errors._safe_url(url)} 里已经有一张 {table} 表,却不是这里用的结构(缺 {FOREIGN_PG_TABLES[table][1]} 列;"
            f"多半是自己做练习时建的,或者是别的程序的):先给它改个名,ALTER TABLE {table} RENAME TO my_{table}"
            "(或者换一个 schema),再运行,这里会新建一张。什么都没做\n")


@pytest.mark.parametrize("table", FOREIGN_PG_TABLES)
def test_a_table_of_another_shape_in_postgres_is_named_by_store_py_and_nothing_is_built(lab, pg_url, table):
    """PostgreSQL 里已经有一张同名、却不是这里结构的表:store.py 一开始就说是哪张、缺哪几列、怎么办,什么都不建、不动。"""
    with pg_schema() as url:
        before = {table: foreign_pg_table(url, table)}
        r = cli(["store.py"], {**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stdout, r.stderr) == (1, "", named_foreign(url, table))
        assert pg_tables(url) == before


@pytest.mark.parametrize("table", ["events", "review_log"])
@pytest.mark.parametrize("command, code", [(["worker.py", "--once"], 1), (["inbox.py", "list"], 1),
                                           (["cron_jobs.py", "report"], 2)])
def test_every_program_names_a_table_of_another_shape_in_postgres_and_touches_nothing(lab, pg_url, monkeypatch, table,
                                                                                     command, code):
    """业务表已经建好(store.py 之前运行过),事件库的一张表是自己做练习时建的:每个程序都一样说清楚,什么都不动。"""
    with pg_schema() as url:
        monkeypatch.setenv("DATABASE_URL", url)
        store_biz.build_biz_tables()
        store_pg.close_pools()
        foreign_pg_table(url, table)
        before = pg_tables(url)
        r = cli(command, {**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", named_foreign(url, table))
        assert pg_tables(url) == before


# 列名和这里的一样(练习 6 把课文的 SQLite 建表语句连同后来补的列一起搬到 PostgreSQL),存时间的列却是 TEXT
TEXT_TIME_PG_EVENTS = ("CREATE TABLE events (event_id TEXT PRIMARY KEY, source TEXT NOT NULL, kind TEXT NOT NULL, "
                       "payload TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, "
                       "last_error TEXT, received_at TEXT NOT NULL, updated_at TEXT NOT NULL, not_before TEXT, "
                       "ticket_id TEXT, claimed_by TEXT, waiting_since TIMESTAMP)")


@pytest.mark.parametrize("command, code", [(["store.py"], 1), (["worker.py", "--once"], 1),
                                           (["inbox.py", "list"], 1), (["cron_jobs.py", "report"], 2)])
def test_an_events_table_with_text_time_columns_in_postgres_is_named_and_nothing_is_touched(lab, pg_url, monkeypatch,
                                                                                           command, code):
    """列都对、存时间的列却不是 TIMESTAMPTZ:每个程序一开始就说是哪几列、是什么类型、要什么类型、怎么办;表里的事件
    一个不动。不然 store.py 说建好了,worker 领取时是 DatatypeMismatch 的 traceback。"""
    import psycopg

    with pg_schema() as url:
        monkeypatch.setenv("DATABASE_URL", url)
        store_biz.build_biz_tables()
        store_pg.close_pools()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(TEXT_TIME_PG_EVENTS)
            conn.execute("INSERT INTO events (event_id, source, kind, payload, received_at, updated_at, ticket_id) "
                         "VALUES ('evt_1', 'webhook', 'ticket.created', '{\"data\": {\"ticket_id\": \"T1001\"}}', "
                         "'2026-12-05T09:00:00+00:00', '2026-12-05T09:00:00+00:00', 'T1001')")
        before = pg_tables(url)
        r = cli(command, {**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", (
            f"{store_errors._safe_url(url)} 里已经有一张 events 表,却不是这里用的结构(not_before、received_at、updated_at 列是 "
            "text,waiting_since 列是 timestamp without time zone,这里要 TIMESTAMPTZ;多半是自己做练习时建的,"
            "或者是别的程序的):先给它改个名,ALTER TABLE events RENAME TO my_events(或者换一个 schema),"
            "再运行,这里会新建一张。什么都没做\n"))
        assert pg_tables(url) == before


def test_programs_opening_a_new_lab_at_the_same_moment_all_get_it(tmp_path, monkeypatch):
    """两个 worker(或者 webhook 和 worker)同时第一次打开一套新库:换成 WAL 的那一下 SQLite 不等 busy_timeout,
    当场说 database is locked:隔一会儿再试,后到的那个不会以「库打不开」退出(CI 上两个 worker 进程一起起来时碰到过)。
    这里每一轮 4 个线程、各自的连接,同时打开一个新的事件库(init),再同时打开一个新的 checkpoint 库,
    一共 200 轮:每一个都打开了、都是 WAL。"""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("AMBIENT_NO_DOTENV", "1")
    failures: list[str] = []

    def at_once(opening) -> None:
        together = threading.Barrier(4)

        def one():
            try:
                together.wait()
                opening()
            except BaseException as e:  # noqa: BLE001 —— 撞锁没再试时是 SystemExit(库打不开)
                failures.append(f"{type(e).__name__}: {e}")
            finally:
                store_sqlite.close_connections()

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for i in range(200):
        monkeypatch.setenv("EVENTS_DB", str(tmp_path / f"ambient{i}.db"))
        monkeypatch.setenv("CHECKPOINTS_DB", str(tmp_path / f"checkpoints{i}.db"))
        at_once(store.init)
        at_once(lambda: store_pg.open_checkpointer()[1].close())
    assert failures == []
    modes = {rows("PRAGMA journal_mode", path=tmp_path / f"{name}{i}.db")[0][0]
             for name in ("ambient", "checkpoints") for i in range(200)}
    assert modes == {"wal"}


# 在 lab 的环境里:写一个事件,说结果(数据库用不了时说 store_errors.unavailable() 那一行)和用了几秒
ADD_ONE_EVENT = """
import time, store, store_errors
with store.opened() as conn:  # 先连上(PostgreSQL 第一次建连接池在慢的机器上要半秒以上):只给 add_event 计时
    conn.execute("SELECT 1")
started = time.monotonic()
try:
    print(store.add_event("evt_T1041_created", "webhook", "ticket.created", '{"data": {"ticket_id": "T1041"}}'))
except store_errors.unavailable_errors() as e:
    print(store_errors.unavailable(e))
print(round(time.monotonic() - started))
"""


def test_a_write_blocked_by_someone_elses_transaction_gives_up_after_busy_timeout_on_both_databases(any_lab):
    """SQLite 上等别人的写锁最多 BUSY_TIMEOUT_S 秒,之后就是「数据库暂时用不了」(webhook 回 503、上游重试)。
    PostgreSQL 上也一样(lock_timeout),等 BUSY_TIMEOUT_S 秒就放弃,什么都没写;锁放开以后照常写进去。一直等的话,
    有人在 psql 里开着事务没提交,webhook 那一批、连同后面排队的请求都一直挂着没有回答。"""
    env = {**any_lab, "BUSY_TIMEOUT_S": "2"}
    with someone_holds_the_events_table():
        r = run(["-c", ADD_ONE_EVENT], env, timeout=60)
    locked = ("OperationalError: database is locked" if store.dialect() == "sqlite"
              else "LockNotAvailable: canceling statement due to lock timeout")
    assert (r.returncode, r.stderr) == (0, "")
    said, seconds = r.stdout.splitlines()
    assert said == f"数据库暂时用不了({locked})" and 2 <= int(seconds) <= 4, r.stdout
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]
    r = run(["-c", ADD_ONE_EVENT], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "True\n0\n", "")
    assert rows("SELECT event_id, status FROM events") == [("evt_T1041_created", "pending")]


SHOW_PG_SETTINGS = """
import store
for durable in (True, False):
    conn = store.connect(durable=durable)
    print(durable, *(conn.execute(f"SHOW {name}").fetchone()[0] for name in ("synchronous_commit", "lock_timeout")))
    conn.close()
"""


def test_postgres_connections_set_their_own_commit_durability_and_lock_wait(pg_lab, monkeypatch, capsys):
    """回了 202 的事件断电也在,靠的是等 WAL 落盘的提交:不能随服务器、库或用户上的默认值(有人
    ALTER DATABASE … SET synchronous_commit = off,或者连接参数里这样写)。等锁的时限是 BUSY_TIMEOUT_S。"""
    # 这里的 DATABASE_URL 已经用 options 指定了 search_path:接着写上两个别的默认值(%20 是空格,%3D 是 =)
    url = pg_lab["DATABASE_URL"] + "%20-csynchronous_commit%3Doff%20-clock_timeout%3D0"
    monkeypatch.setenv("BUSY_TIMEOUT_S", "2")
    monkeypatch.setenv("DATABASE_URL", url)  # 新的 URL:新的连接池,按这里的设置建连接
    exec(SHOW_PG_SETTINGS, {})
    assert capsys.readouterr() == ("True on 2s\nFalse off 2s\n", "")


def test_a_program_whose_sqlite_files_were_deleted_while_it_ran_stops_instead_of_writing_into_them(lab):
    """「想从头再来」删了 ambient.db*、checkpoints.db*,又运行了 store.py,可 worker、webhook 还开着:它们开着的连接
    还连着删掉的文件。下一次用到时说清楚、停下(SystemExit),新文件里什么都没被写进去;不然 webhook 照样回 202,
    事件却写进了没人看得见的文件,worker 的草稿也一样。"""
    import worker as worker_mod

    def delete(path: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)

    def replaced(path: str) -> str:
        return (f"SQLite 库文件 {path} 在这个程序运行时被删掉或换掉了:这个程序不再用它,重新启动后用新的文件"
                "(想从头再来时,先停掉 webhook、worker,再删库)")

    w = worker_mod.Worker(1)
    try:
        assert w.run_once() == []
        delete(lab["CHECKPOINTS_DB"])
        with pytest.raises(SystemExit) as stop:
            w.run_once()
        assert str(stop.value) == replaced(lab["CHECKPOINTS_DB"])
        delete(lab["EVENTS_DB"])
        assert run(["store.py"], lab).returncode == 0  # 另一个程序(新进程)建了新的一套库
        with pytest.raises(SystemExit) as stop:
            store.add_event("evt_T1012_created", "webhook", "ticket.created", '{"data": {"ticket_id": "T1012"}}')
        assert str(stop.value) == replaced(lab["EVENTS_DB"])
        with pytest.raises(SystemExit) as stop:
            w.run_once()
        assert str(stop.value) == replaced(lab["EVENTS_DB"])
    finally:
        w.close()
        store_sqlite.close_connections()
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_an_events_table_from_before_waiting_since_gets_the_column_and_keeps_the_waiting_time(any_lab):
    """上一版的事件库(SQLite 或 PostgreSQL)没有 waiting_since:哪个程序先运行,init() 就把列补上,已有的数据不动;
    升级前就在收件箱里的待办从 updated_at 算起(那一版的收件箱就是这样保留它的)。之后有人 respond 一下,日报照样说
    它等了 50 小时(不补的话列是空的,respond 放回收件箱时就把「现在」当成了进收件箱的时刻)。"""
    from test_inbox import queue

    queue("T1041")
    entered = store.minutes_from_now(-50 * 60)
    rows("UPDATE events SET updated_at = ? WHERE event_id = ? RETURNING event_id", (entered, "evt_T1041_created"))
    with store.opened() as conn:
        conn.execute("ALTER TABLE events DROP COLUMN waiting_since")
    first = cli(["cron_jobs.py", "report"], any_lab)
    assert (first.returncode, first.stderr) == (0, "")
    waiting = rows("SELECT event_id, status, waiting_since FROM events")
    assert [(e, s, store.parse_time(w)) for e, s, w in waiting] == [
        ("evt_T1041_created", "waiting_human", store.parse_time(entered))]
    respond = cli(["inbox.py", "respond", "T1041", "先道歉"], any_lab)
    assert respond.returncode == 0 and respond.stdout.startswith("已按意见重写,新草稿:"), respond.stderr
    for r in (first, cli(["cron_jobs.py", "report"], any_lab)):
        assert ("收件箱里等得最久的:evt_T1041_created,已等 50.0 小时(超过 24 小时,该提醒值班的人了)(收件箱共 1 条)"
                in r.stdout.splitlines())


def test_review_log_and_llm_usage_from_before_reviewer_and_duration_get_the_columns_and_keep_their_rows(any_lab):
    """上一版的事件库(SQLite 或 PostgreSQL)的 review_log 没有 reviewer、llm_usage 没有 duration_ms:不当成别人建的表,
    init() 补上这两列,已有的行原样留着(新列是空的,show 说「没有记下是谁」);之后的决定和模型调用都记上。"""
    from test_inbox import queue

    queue("T1012", "T1041")
    assert cli(["inbox.py", "accept", "T1012"], {**any_lab, "INBOX_USER": "alice"}).returncode == 0
    with store.opened() as conn:
        conn.execute("ALTER TABLE review_log DROP COLUMN reviewer")
        conn.execute("ALTER TABLE llm_usage DROP COLUMN duration_ms")
    old = cli(["inbox.py", "show", "T1012"], any_lab)
    assert (old.returncode, old.stderr) == (0, "")
    assert "        accept  (没有记下是谁)  " in old.stdout and "用时" not in old.stdout
    assert rows("SELECT ticket_id, action, reviewer FROM review_log") == [("T1012", "accept", None)]
    assert cli(["inbox.py", "accept", "T1041"], {**any_lab, "INBOX_USER": "bob"}).returncode == 0
    assert rows("SELECT ticket_id, action, reviewer FROM review_log ORDER BY ticket_id") == [
        ("T1012", "accept", None), ("T1041", "accept", "bob")]
    assert [(t, d is None) for t, d in rows("SELECT ticket_id, duration_ms FROM llm_usage ORDER BY ticket_id")] == [
        ("T1012", True), ("T1041", True)]  # 两次起草都在补列之前


@contextmanager
def pooled_writer(pool: str):
    """往 pool 这个连接池里写一次的函数 write(n):事件表的(store.opened)或者 checkpoint 的(LangGraph 的 PostgresSaver
    自己用 with pool.connection() 借、自己还)。"""
    if pool == "events":
        def touch(n: int) -> None:
            with store.opened() as conn:
                conn.execute("UPDATE events SET attempts = attempts WHERE event_id = ?", (f"nothing-{n}",))
        yield touch
        return
    from langgraph.checkpoint.base import empty_checkpoint

    saver, checkpoint_pool = store_pg.open_checkpointer()
    try:
        yield lambda n: saver.put({"configurable": {"thread_id": f"ticket-T{n}", "checkpoint_ns": ""}},
                                  empty_checkpoint(), {"source": "input", "step": -1}, {})
    finally:
        checkpoint_pool.close()


@pytest.mark.parametrize("pool", ["events", "checkpoints"])
def test_a_pooled_connection_that_finds_the_server_read_only_is_dropped_so_the_pool_reconnects(pg_lab, monkeypatch,
                                                                                               pool):
    """主备切换时连到了只能读的那台:这个连接整个会话都只能读。碰上 ReadOnlySqlTransaction 的连接还回去之前
    关掉,连接池另连一个:不然它回到连接池里接着用,服务器早就能写了,程序还一直说「只能读」。checkpoint 的连接池
    也这样:不然服务器能写了,每个事件起草完存 checkpoint 还是失败,一次次退避、最后全进死信。
    这里用给用户设 default_transaction_read_only 来造「只能读的会话」:设回去以后不再断连接,全靠扔掉坏的。"""
    import psycopg
    from conftest import read_write_role
    from psycopg.conninfo import conninfo_to_dict

    owner_url = pg_lab["DATABASE_URL"]
    store_pg.open_checkpointer()[1].close()  # 表都由库的所有者建好
    with read_write_role(owner_url) as (url, grant_read_write):
        grant_read_write()
        user = conninfo_to_dict(url)["user"]
        monkeypatch.setenv("DATABASE_URL", url)
        monkeypatch.setenv("PG_POOL_SIZE", "2")
        store_pg.close_pools()
        with pooled_writer(pool) as write:
            def outcome(n: int) -> str:
                try:
                    write(n)
                    return "ok"
                except Exception as e:  # noqa: BLE001
                    return type(e).__name__

            assert outcome(0) == "ok"
            with psycopg.connect(owner_url, autocommit=True) as conn:
                conn.execute(f"ALTER ROLE {user} SET default_transaction_read_only = on")
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (user,))
            seen = [outcome(n) for n in range(1, 7)]
            assert "ReadOnlySqlTransaction" in seen and "ok" not in seen, seen
            with psycopg.connect(owner_url, autocommit=True) as conn:
                conn.execute(f"ALTER ROLE {user} RESET default_transaction_read_only")
            after = [outcome(n) for n in range(7, 15)]
            # 池里最多两个只能读的连接:各失败一次就被换掉,之后一直能写
            assert set(after[:2]) <= {"ok", "ReadOnlySqlTransaction"} and after[2:] == ["ok"] * 6, after


def test_the_column_lists_in_store_upgrade_match_the_schema():
    """store_upgrade 认「结构对不对」用的表名、列名和时间列是手写的:和 store.SCHEMA 真建出来的库逐一核对。"""
    conn = sqlite3.connect(":memory:")
    conn.executescript(store.SCHEMA.format(time="STAMP", serial="INTEGER PRIMARY KEY AUTOINCREMENT"))
    conn.execute(store.ONE_PROCESSING_PER_TICKET)
    objects = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index') "
                                          "AND name NOT LIKE 'sqlite_%'")}
    assert objects == store_upgrade.SCHEMA_OBJECTS
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                         "AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]
    assert tables == list(store_upgrade.TABLE_COLUMNS) == list(store_upgrade.TIME_COLUMNS)
    for table in tables:
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()
        assert {r[1] for r in info} == store_upgrade.TABLE_COLUMNS[table], table
        assert {r[1] for r in info if r[2] == "STAMP"} == store_upgrade.TIME_COLUMNS[table], table
