"""事件表、发件箱和业务库:表结构和所有 SQL 都在这个文件里。

运行:uv run python store.py
你会看到:缺的库被建好(事件库;业务库从 cloudledger_seed.json 建,这时多一行「已新建业务库 …」;
checkpoint 库等 worker 第一次跑时由 LangGraph 自己建),然后每个库的路径和各表行数,例如
    已新建业务库 /…/cloudledger.db
    事件库 /…/ambient.db:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行
    业务库 /…/cloudledger.db:customers 30 行,tickets 41 行
已经建好的不会重建,可以反复运行。退出码:0 好了;1 数据库暂时用不了或打不开、业务库拷不进 PostgreSQL、
SQLite 事件库已经搬进了 PostgreSQL 却没设 DATABASE_URL(说明原因);
2 BIZ_DB 指着的库不是 store.py 建的、PostgreSQL 里只有半套业务表(都没有动它),或者参数不对(只收 --from-sqlite)。
设了 DATABASE_URL 时三样都在那个 PostgreSQL 库里(checkpoint 的表这时也建好),EVENTS_DB、CHECKPOINTS_DB 不用;
表都建好以后,只有读写权限(SELECT、INSERT、UPDATE、DELETE)的用户也能运行每个程序;业务表第一次建时多一行
「已在 … 新建业务表 customers、tickets(从 …/cloudledger.db 拷过来)」:BIZ_DB 指的 SQLite 业务库在就拷它,不在就是「(种子数据)」。

一直用 SQLite、现在换到 PostgreSQL:设好 DATABASE_URL,停掉用 SQLite 的 worker、webhook、邮件轮询和收件箱,运行
    uv run python store.py --from-sqlite
把 EVENTS_DB、CHECKPOINTS_DB 里的全部事件、发件箱、审核记录、用量和 LangGraph 的 checkpoint 搬进去(一个事务),
各表行数之前多两行:「已从 … 搬进 …:events 5 行,…;checkpoint 4 个 thread(17 个 checkpoint)」和「…/ambient.db 里记下了
已搬进 PostgreSQL:…」;收件箱里的待办在 PostgreSQL 上照样 accept,做了一半的图接着跑。SQLite 事件库从此不再收写入:
不设 DATABASE_URL 运行的程序一开始就说明原因、退出码不是 0(webhook 不启动),还开着的 SQLite worker 领事件时也这样停下。
搬不了(有事件正在处理、已经搬过、PostgreSQL 里已经有同样的事件或工单、事件库是课文建的旧版)时说「没有搬:…」,
退出码 1 或 2,什么都没搬。
不带 --from-sqlite 运行时,EVENTS_DB 里还有 PostgreSQL 里没有的未完事件,最后多一行提醒。

三种触发源(webhook、邮件、定时任务)只往 events 里写一行;worker 领事件、跑图;
发给客户的回复写进 outbox(今天不真的发邮件,写进这张表就算发出去了)。
"""
import functools
import json
import logging
import os
import re
import shlex
import socket
import sqlite3
import sys
import threading
import time
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import config

HERE = config.HERE
SEED_FILE = HERE / "cloudledger_seed.json"  # 业务库的种子数据:30 个客户、41 张工单
# 秒(0–3600);SQLite 库被别人写着时等锁等多久(webhook、几个 worker、收件箱同时写库是常事,等一等就好)。
# 等过这么久还没轮到(比如有人在 sqlite3 里开着没提交的事务),才报 database is locked:各个程序说一行「数据库暂时用不了」
BUSY_TIMEOUT_S = 30

STATUSES = ("pending", "processing", "waiting_human", "done", "ignored", "dead")

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    event_id     TEXT PRIMARY KEY,          -- 上游给的唯一 id,去重全靠它
    source       TEXT NOT NULL,             -- webhook / email / cron
    kind         TEXT NOT NULL,             -- ticket.created / ticket.stale
    payload      TEXT NOT NULL,             -- 原始 JSON
    status       TEXT NOT NULL DEFAULT 'pending',  -- pending / processing / waiting_human / done / ignored / dead
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    received_at  {time} NOT NULL,
    updated_at   {time} NOT NULL,
    not_before   {time},                    -- 练习 3:失败后退避,这个时间之前不领
    ticket_id    TEXT,                      -- 从 payload 里取出来,同一张工单不会被两个 worker 同时处理
    claimed_by   TEXT,                      -- 谁在处理:主机名:进程号@启动时刻，用来判断「卡住」还是「还在跑」(这一行注释里不能有半角逗号:SQLite 删掉下一列时会把它当成列之间的逗号)
    waiting_since {time}                    -- 第一次进收件箱的时刻,之后不变:日报的「等得最久」从它算起
);
CREATE INDEX IF NOT EXISTS events_status ON events (status, received_at);
CREATE TABLE IF NOT EXISTS outbox (
    id          {serial},
    ticket_id   TEXT NOT NULL UNIQUE,       -- 一张工单只发一次回复,UNIQUE 挡住重复发送
    body        TEXT NOT NULL,
    sent_by     TEXT NOT NULL,
    sent_at     {time} NOT NULL
);
CREATE TABLE IF NOT EXISTS review_log (      -- 练习 4:人改了什么,反馈闭环的原料
    ticket_id   TEXT PRIMARY KEY,           -- 每张工单一行,send 重跑也不会多
    category    TEXT NOT NULL,
    draft       TEXT NOT NULL,              -- 模型第一版草稿
    final       TEXT,                       -- 最终发出的文本(ignore 时为空)
    action      TEXT NOT NULL,              -- accept / edit / ignore;notify:通知类待办,看过了
    feedback    TEXT NOT NULL,              -- JSON 数组:每一轮 respond 的意见
    created_at  {time} NOT NULL
);
CREATE TABLE IF NOT EXISTS inbox_seen (      -- 几个人共用收件箱:每个人最后看到的是哪一版草稿,accept 前核对
    ticket_id   TEXT NOT NULL,
    viewer      TEXT NOT NULL,              -- 谁看的:INBOX_USER,没设就是「登录名@主机名」
    draft_sha   TEXT NOT NULL,              -- 看到的草稿全文的 SHA-256
    seen_at     {time} NOT NULL,
    PRIMARY KEY (ticket_id, viewer)
);
CREATE TABLE IF NOT EXISTS llm_usage (       -- 每次模型调用一行:算单事件成本
    id          {serial},
    event_id    TEXT,
    ticket_id   TEXT,
    model       TEXT NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    created_at  {time} NOT NULL
);
"""
# 同一张工单同时最多一个事件在 processing:两个 worker 同时挑事件时,谁都看不见对方还没提交的领取(PostgreSQL 的
# READ COMMITTED),CLAIM_SQL 里的 NOT IN 挡不住;这个唯一索引让后到的等先到的提交,再报冲突,claim() 重新挑一次。
# 收件箱拿走待办(take_for_review)也受它约束。init() 在补完旧库缺的列之后建。
ONE_PROCESSING_PER_TICKET = """
CREATE UNIQUE INDEX IF NOT EXISTS events_one_processing_per_ticket ON events (ticket_id) WHERE status = 'processing'
"""
# 旧版 ambient.db(照课文建的)缺这些列:init() 会补上,已有数据不动
ADDED_COLUMNS = {"not_before": "TEXT", "ticket_id": "TEXT", "claimed_by": "TEXT", "waiting_since": "TEXT"}
# PostgreSQL 上只有 waiting_since 是后加的(有 PostgreSQL 的版本之前没有它):init() 查到缺了才补,
# 不缺时不执行 ALTER TABLE(它要拿整张表的排它锁,每个程序启动都拿一次会和正在领事件的 worker 互相等)
# 查 pg_attribute,不查 information_schema.columns:后者只列出这个用户有权限的列,还没被 GRANT 的用户会以为缺了这一列
PG_HAS_WAITING_SINCE = """
SELECT 1 FROM pg_attribute WHERE attname = 'waiting_since' AND NOT attisdropped AND attrelid =
    (SELECT oid FROM pg_class WHERE relname = 'events'
                                AND relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()))
"""
# 当前 schema 里已有的表和索引(PostgreSQL 的 CREATE … IF NOT EXISTS 在 current_schema() 里建、查,这里也只看它)
PG_OBJECTS = ("SELECT relname FROM pg_class "
              "WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())")
# init() 要建的表和索引的名字,从上面的语句里读出来(加一张表不用再改这里)
SCHEMA_OBJECTS = frozenset(re.findall(r"(?:TABLE|INDEX) IF NOT EXISTS (\w+)", SCHEMA + ONE_PROCESSING_PER_TICKET))
# SCHEMA 里每张表的列(约束那几行不算)。事件表缺的列 init() 会补;别的表早就有、却缺列的,是别人建的(见 foreign_table)
TABLE_COLUMNS = {name: frozenset(re.findall(r"^ {4}(\w+) ", body, re.M)) - {"PRIMARY"}
                 for name, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\);", SCHEMA, re.S)}
# 每张表里存时间的列({time}):PostgreSQL 上它们必须是 TIMESTAMPTZ。照课文自己建、列名都对却用了 TEXT 的,
# 写进去的是字符串、比较的是字符串,领取时和 now() 一比就是 DatatypeMismatch
TIME_COLUMNS = {name: frozenset(re.findall(r"^ {4}(\w+) +\{time\}", body, re.M))
                for name, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\);", SCHEMA, re.S)}
PG_TIME_TYPE = "timestamp with time zone"  # format_type() 对 TIMESTAMPTZ 的叫法
# 补上 waiting_since 时,已经在收件箱里的待办从 updated_at 算起(上一版的收件箱放回待办时保留的就是它);
# 不补的话它们是空的,之后有人 respond 一下,set_status 就把「现在」当成进收件箱的时刻,等了 50 小时的显示 0 小时
BACKFILL_WAITING_SINCE = "UPDATE events SET waiting_since = updated_at WHERE status = 'waiting_human'"

# 两种数据库只在这里不一样。SQLite 是默认;设了 DATABASE_URL=postgresql://… 就换成 PostgreSQL(练习 6)。
DIALECTS = {
    "sqlite": {
        "time": "TEXT",                                          # 没有时间类型:统一格式的字符串
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "begin": "BEGIN IMMEDIATE",                              # 一开始就拿写锁
        "skip_locked": "",                                       # 单写者:整条 UPDATE 本来就是原子的
    },
    "postgres": {
        "time": "TIMESTAMPTZ",
        "serial": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "begin": "BEGIN",
        "skip_locked": "FOR UPDATE SKIP LOCKED",                 # 别的 worker 锁着的行跳过,不排队等
    },
}
PG_POOL_SIZE = 10  # 个(至少 1);每个连接池最多开几个连接(比 worker 的并发数小时,线程排队等连接);一个进程最多三个池:等落盘的、不等落盘的、checkpoint
PG_CONNECT_TIMEOUT_S = 10  # 秒;第一次连 PostgreSQL 最多等多久,连不上就说明原因退出(不会一直挂着)
# 秒;从连接池借一个连接最多等多久(psycopg_pool 默认 30 秒)。连接都借出去了(worker 的并发数比 PG_POOL_SIZE 大)时排队等;
# 服务器连不上时池里一个都没有,也是等到这么久才报「数据库暂时用不了」。webhook 的写库进程一次只借一个,借不到只可能是
# 连不上:它把这个数改小(webhook_writer.py),503 几秒内就回,不是让上游等半分钟
PG_POOL_WAIT_S = 30.0
# 秒(0–86400);连接上次借出去已经是这么久以前(闲着),这次借出去之前先空跑一条语句,确认它还连着。服务器重启、主备切换、防火墙或
# PgBouncer 掐掉闲连接之后,池里剩下的都是死连接,不查的话下一个事件就撞上去、白白失败一次。忙的时候连接一直在用,
# 闲不到这么久,不多一次往返(每次多一次往返约 0.05 ms,一个事件要借十几次连接)。
PG_IDLE_CHECK_S = 5

BIZ_SCHEMA = """
CREATE TABLE IF NOT EXISTS customers (
    id       TEXT PRIMARY KEY,
    name     TEXT NOT NULL,
    email    TEXT NOT NULL UNIQUE,
    company  TEXT,
    plan     TEXT
);
CREATE TABLE IF NOT EXISTS tickets (         -- 列顺序固定:邮件轮询按位置插入
    id           TEXT PRIMARY KEY,
    customer_id  TEXT NOT NULL REFERENCES customers(id),
    subject      TEXT NOT NULL,
    body         TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'open',   -- open / closed
    created_at   TEXT NOT NULL                   -- YYYY-MM-DD
);
"""


# ---------------------------------------------------------------- 时间:全库只有一种格式
def now() -> str:
    """UTC、微秒、固定宽度:2026-11-30T05:03:25.123456+00:00。字符串比较和时间先后一致。"""
    return stamp(datetime.now(timezone.utc))


def stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def minutes_from_now(minutes: float) -> str:
    return stamp(datetime.now(timezone.utc) + timedelta(minutes=minutes))


def parse_time(value) -> datetime:
    """库里的时间。不带时区的(照课文的 now() 写的:本地时间)按这台机器的时区换成 UTC,和 upgrade_lesson_db 一样;
    原来和带时区的一比就是 TypeError(日报在照课文建的库上崩掉)。"""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.astimezone(timezone.utc)


# ---------------------------------------------------------------- 连接
# SQLite 的这几种错误(主错误码)不是设置的问题,过一会儿可能就好了:磁盘出错(IOERR)、磁盘满了(FULL)、
# 别的程序占着库太久(BUSY、LOCKED)
TEMPORARY_SQLITE_ERRORS = {sqlite3.SQLITE_IOERR: "所在的磁盘满了或者出错了", sqlite3.SQLITE_FULL: "所在的磁盘满了或者出错了",
                           sqlite3.SQLITE_BUSY: "被别的程序占着太久", sqlite3.SQLITE_LOCKED: "被别的程序占着太久"}


def cannot_open(what: str, setting: str, path: Path, error: Exception) -> str:
    """SQLite 打不开一个库时给人看的一行:sqlite3 只会说 unable to open database file。
    看不出设置有什么不对、错误又是 TEMPORARY_SQLITE_ERRORS 里的(比如磁盘满了)时不返回,抛一个带上是哪个库的
    OperationalError:各个程序照「数据库暂时用不了」处理(常驻的 worker 等着再试,邮件轮询退出码 1、cron 3),
    不是「设置不对」(原来磁盘满了时邮件轮询以退出码 2 说「事件库打不开」,叫人去查 EVENTS_DB)。"""
    try:
        if not path.parent.is_dir():
            reason = f"目录 {path.parent} 不存在"
        elif path.is_dir():
            reason = "这是一个目录,不是文件"
        elif "file is not a database" in str(error):
            reason = "这个文件不是 SQLite 数据库,指错了文件?"
        elif not os.access(path.parent, os.W_OK):  # 库文件旁边还要建 -wal、-shm(新库连文件本身也要建)
            reason = f"目录 {path.parent} 不能写:没有写权限,或者在只读的文件系统上"
        elif (why := TEMPORARY_SQLITE_ERRORS.get((getattr(error, "sqlite_errorcode", None) or 0) & 0xFF)) is not None:
            temporary = sqlite3.OperationalError(f"{error}:{what} {path} {why}")
            temporary.sqlite_errorcode = error.sqlite_errorcode  # temporary() 认它
            raise temporary from error
        else:
            reason = str(error)
    except OSError as e:  # 名字太长之类:连「在不在」都问不了(原来在这里又抛一次,成了 traceback)
        reason = e.strerror or str(e)
    return f"{what}打不开:{setting}={path}({reason})"


def events_db() -> Path:
    return config.path("EVENTS_DB", "ambient.db")


def biz_db() -> Path:
    return config.path("BIZ_DB", "cloudledger.db")


def checkpoints_db() -> Path:
    return config.path("CHECKPOINTS_DB", "checkpoints.db")


def database_url() -> str:
    return config.get("DATABASE_URL")


def dialect(path: Path | str | None = None) -> str:
    """path(一个 SQLite 文件)之外的库用哪种数据库:事件库,设了 DATABASE_URL 时还有业务库(见 biz_target())。"""
    return "postgres" if path is None and database_url() else "sqlite"


def biz_target() -> Path | None:
    """业务库在哪,给 connect() / opened() / transaction():设了 DATABASE_URL 时是同一个 PostgreSQL 库(None),
    几台机器上的 worker 都读得到邮件轮询建的工单;否则是 BIZ_DB 指的 SQLite 文件(课文的 cloudledger.db)。"""
    return None if database_url() else biz_db()


def sql(name: str) -> str:
    """按当前数据库填好差异处的 SQL(SCHEMA、CLAIM_SQL)。"""
    return globals()[name].format(**DIALECTS[dialect()])


def connect(path: Path | str | None = None, *, durable: bool = True):
    """打开一个连接(默认事件库)。autocommit 模式:单条语句自己就是一个事务,多条用 transaction()。
    PostgreSQL 时返回一个接口和 sqlite3 连接一样的包装(? 占位符、按列名取值),用完 close() 还回连接池。

    durable=True(默认):每次提交都等落盘(SQLite synchronous=FULL,PostgreSQL synchronous_commit=on)。
    外面送进来的东西(webhook / 邮件 / cron 的事件)、发出去的回复、审核记录都这样写:回了 202 的事件断电也在。
    durable=False:提交不等落盘,只给 worker 自己的记账用 —— 领取、改状态、交回、记用量。
    进程被 kill -9 时它们一样一个不丢;只有数据库所在的机器断电、或者 PostgreSQL 服务器崩溃时,
    最后几百毫秒的这种提交可能没了:事件退回更早的状态(pending / processing),按平常的规则被放回队列、
    从 checkpoint 续跑,发件箱的 UNIQUE 保证回复不会发两次。和 checkpoint 是同一个取舍。
    两种提交写的是同一个 WAL,后面任何一次等落盘的提交都会把前面的一起落盘。每个事件省 3 次等盘(bench/worker.py)。"""
    if dialect(path) == "postgres":
        return PgConnection(_pg_pool(database_url(), durable))
    key = (str(path or events_db()), durable)
    kept = _kept.__dict__.setdefault("conns", {})
    if (conn := kept.get(key)) is not None:
        unchanged_or_exit(key[0], conn.identity)
    else:
        # 事件库没有就建(init 建表);给了路径的库(业务库)只打开已有的:sqlite3 默认会顺手建一个空文件,
        # 之后 store.py 以为业务库已经在了,worker 读工单只会得到 no such table
        target = key[0] if path is None else f"{Path(key[0]).absolute().as_uri()}?mode=rw"
        conn = sqlite3.connect(target, timeout=busy_timeout_s(), isolation_level=None, factory=KeptConnection,
                               uri=path is not None)
        conn.row_factory = sqlite3.Row
        # WAL 模式(init 写进库文件):读写不互相挡
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.identity = file_identity(key[0])
        kept[key] = conn
    return conn


def file_identity(path: Path | str) -> tuple[int, int] | None:
    """这个文件是哪一个(设备号、inode);不在了是 None。"""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def unchanged_or_exit(path: Path | str, identity: tuple[int, int] | None) -> None:
    """一直开着的 SQLite 连接,它的库文件还是打开时那一个吗?有人在程序运行时删掉、换掉了它(「想从头再来」删了
    ambient.db* 又运行 store.py)时,开着的连接还连着那个删掉的文件:原来 webhook 照样回 202,事件却写进了没人看得见的
    文件,就这么丢了。这时以 SystemExit 停下(webhook 的写库进程停下后,下一批由新开的写库进程写进新文件)。"""
    if file_identity(path) != identity:
        raise SystemExit(f"SQLite 库文件 {path} 在这个程序运行时被删掉或换掉了:这个程序不再用它,重新启动后用新的文件"
                         "(想从头再来时,先停掉 webhook、worker,再删库)")


_kept = threading.local()


def close_connections() -> None:
    """真的关掉这个线程留着的 SQLite 连接(测试换一套临时库之前用;进程退出时会自动关)。"""
    for conn in _kept.__dict__.pop("conns", {}).values():
        sqlite3.Connection.close(conn)


class FileConnection(sqlite3.Connection):
    """记着打开时库文件是哪一个(identity,见 file_identity):一直开着的连接用它发现文件被删掉、换掉了。"""

    identity: tuple[int, int] | None = None


class KeptConnection(FileConnection):
    """SQLite 连接每个线程、每个库文件只开一个,一直用下去:close() 只回滚没提交的事务,不真关。
    每次都重新打开的话,打开、解析表结构、关闭(最后一个连接关闭时还要做一次 WAL checkpoint)
    比语句本身还贵:实测领取一个事件从 2 ms 降到 0.4 ms。"""

    def close(self) -> None:
        if self.in_transaction:
            self.execute("ROLLBACK")


@contextmanager
def opened(path: Path | str | None = None, *, durable: bool = True):
    """with opened() as conn:用完就关的连接(PostgreSQL 时还回连接池)。durable 见 connect()。"""
    conn = connect(path, durable=durable)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def transaction(path: Path | str | None = None, *, wait_s: float | None = None):
    """唯一的事务写法:BEGIN IMMEDIATE 一开始就拿写锁,避免两个写者读完再抢锁时死锁。
    wait_s:这个事务最多等别人的锁几秒(默认等 BUSY_TIMEOUT_S),等不到就抛
    unavailable_errors() 里的错误、什么都没写。给「记不下也没关系」的写入用,别让人对着终端干等。"""
    sqlite = dialect(path) == "sqlite"
    with opened(path) as conn:
        if wait_s is not None and sqlite:
            conn.execute(f"PRAGMA busy_timeout = {int(wait_s * 1000)}")
        try:
            conn.execute(DIALECTS[dialect(path)]["begin"])
            try:
                if wait_s is not None and not sqlite:
                    conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(wait_s * 1000))}ms'")
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            if wait_s is not None and sqlite:  # 连接留着给这个线程以后用(KeptConnection):换回平常的等法
                conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s() * 1000)}")


WAL_RETRY_S = 0.01  # 秒;新库换成 WAL 撞上别人也在换时,隔多久再试(最多试到 BUSY_TIMEOUT_S)


def use_wal(conn: sqlite3.Connection) -> None:
    """PRAGMA journal_mode = WAL。两个连接同时第一次打开同一个新库文件时(两个 worker、webhook 和 worker 一起起来),
    换日志模式那一下 SQLite 不等 busy_timeout,当场说 database is locked:原来后到的那个程序就以「库打不开」退出了
    (tests/test_worker.py 两个 worker 进程一起起来,CI 上碰到过)。这里隔一会儿再试,最多等 BUSY_TIMEOUT_S 秒。"""
    deadline = time.monotonic() + busy_timeout_s()
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "database is locked" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_S)


def init() -> None:
    """建事件库的表(已存在就不动),并把旧版库缺的列补上。几个进程同时 init 也没关系。"""
    if dialect() == "postgres":
        # 都建好了(平常都是):一条 DDL 也不执行。CREATE … IF NOT EXISTS 什么都不做时也要建表的权限(schema 的 CREATE、
        # 表的所有者),所以库的所有者建好表之后,只有读写权限的用户(生产上常这样配)也能运行每个程序;
        # 也不用每次启动都为 CREATE INDEX 拿一下 events 的 SHARE 锁,和正在领事件的 worker 互相等
        with opened() as conn:
            if problem := foreign_table(conn):
                raise SystemExit(problem)
            if pg_nothing_to_build(conn):
                pg_rights_or_exit(conn)
                return
        with pg_refusing_ddl():
            with transaction() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))  # 几个 worker 同时第一次启动
                # 等锁的时候,拿着锁的那个(所有者的 store.py、另一台机器上的 worker)可能刚好建完:再看一次,
                # 不然只有读写权限的用户在这里照样执行 DDL、被拒绝,虽然表已经都在了
                built_meanwhile = pg_nothing_to_build(conn)
                if not built_meanwhile:
                    conn.executescript(sql("SCHEMA"))
                    if not conn.execute(PG_HAS_WAITING_SINCE).fetchone():
                        conn.execute(f"ALTER TABLE events ADD COLUMN waiting_since {DIALECTS['postgres']['time']}")
                        conn.execute(BACKFILL_WAITING_SINCE)
                    conn.execute(ONE_PROCESSING_PER_TICKET)
        if built_meanwhile:
            with opened() as conn:
                pg_rights_or_exit(conn)
        return
    try:
        with opened() as conn:
            if role := not_events_db(conn):  # 在改成 WAL、建表之前:别人的库一点都不动
                raise SystemExit(role)
            use_wal(conn)  # 写进库文件,之后每个连接都是 WAL;不能放在事务里
            if moved := moved_to(conn):  # 每个程序都先 init():用一个已经搬走的库,在这里说清楚,什么都还没做
                raise SystemExit(moved_away(events_db(), *moved))
            if problem := foreign_table(conn):
                raise SystemExit(problem)
            conn.executescript(sql("SCHEMA"))
            have = events_columns(conn)
    # 每个程序都先 init():路径设错了、指到了不是数据库的文件(DatabaseError),在这里一行说清楚,什么都还没做
    except sqlite3.DatabaseError as e:
        raise SystemExit(cannot_open("事件库", "EVENTS_DB", events_db(), e)) from None
    if set(ADDED_COLUMNS) <= have:
        # 表已经是最新的(平常都是):不拿写锁。别人长时间占着写锁时,只读的 report、inbox list 照样能用;
        # 索引已经有了时这条语句什么都不做,也不要写锁
        with opened() as conn:
            conn.execute(ONE_PROCESSING_PER_TICKET)
        return
    with transaction() as conn:
        upgrade_events_table(conn)
        conn.execute(ONE_PROCESSING_PER_TICKET)


def not_events_db(conn) -> str | None:
    """EVENTS_DB 指到了这个实验的业务库或 checkpoint 库(没有事件表,却有它们的表)时给人看的一行。原来 init() 悄悄在
    业务库里建起事件表、把它改成 WAL,退出码 0;反方向(BIZ_DB 指到事件库)早就会说(other_lab_db)。"""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "events" in tables:
        return None
    if found := sorted(tables & set(BIZ_COLUMNS)):
        role = "业务库"
    elif found := sorted(tables & {"checkpoints", "writes"}):
        role = "checkpoint 库"
    else:
        return None
    return (f"EVENTS_DB 指的 {events_db()} {being(role)}(里面有 {'、'.join(found)} 表、没有 events 表),不是事件库:没有动它。"
            "让 EVENTS_DB 指到事件库(不设就是脚本旁边的 ambient.db)")


def pg_objects(conn) -> set[str]:
    return {r[0] for r in conn.execute(PG_OBJECTS)}


def pg_nothing_to_build(conn) -> bool:
    """PostgreSQL 上 init() 要建的表、索引和后加的列是不是都在了,而且这个连接能写。
    只能读(备库、default_transaction_read_only)时照旧走建表那条路:PG_DDL_REFUSALS 一行说清楚,
    而不是等到第一次写(领事件、收信)时才出错。"""
    return (SCHEMA_OBJECTS <= pg_objects(conn) and conn.execute(PG_HAS_WAITING_SINCE).fetchone() is not None
            and conn.execute(PG_READ_ONLY).fetchone()[0] == "off")


PG_READ_ONLY = "SELECT current_setting('transaction_read_only')"
# 表都建好了、这个用户却缺读写权限的那几张(我们的表:事件库、业务表、LangGraph 的 checkpoint 表)。
# has_table_privilege 给一串权限时是「有其中一个就行」,所以四个分开查
PG_MISSING_RIGHTS = """
SELECT relname FROM pg_class
WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND relkind IN ('r', 'p')
  AND relname = ANY(?)
  AND NOT (has_table_privilege(oid, 'SELECT') AND has_table_privilege(oid, 'INSERT')
           AND has_table_privilege(oid, 'UPDATE') AND has_table_privilege(oid, 'DELETE'))
ORDER BY relname
"""
# PostgresSaver 建的表
CHECKPOINT_TABLES = ("checkpoint_migrations", "checkpoints", "checkpoint_blobs", "checkpoint_writes")


def pg_rights_or_exit(conn) -> None:
    """表是所有者建的、这个用户只被给了一部分权限(比如只有 SELECT):一开始就一行说清楚缺什么、怎么给,什么都还没做。
    不查的话要到第一次写(领事件、收信)时才是 InsufficientPrivilege 的 traceback。"""
    ours = [*SCHEMA_OBJECTS, *BIZ_COLUMNS, *CHECKPOINT_TABLES]
    if missing := [r[0] for r in conn.execute(PG_MISSING_RIGHTS, (ours,))]:
        user, schema = conn.execute("SELECT quote_ident(current_user), quote_ident(current_schema())").fetchone()
        raise SystemExit(f"DATABASE_URL 的用户 {user} 对表 {'、'.join(missing)} 没有读写权限(程序要 SELECT、INSERT、UPDATE、"
                         f"DELETE):请库的所有者执行 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} "
                         f"TO {user}。什么都没做")


# PostgreSQL 上当前 schema 里这几张表(ANY(?))各有哪些列
PG_TABLE_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a JOIN pg_class c ON a.attrelid = c.oid
WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND c.relname = ANY(?)
  AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
"""


def foreign_table(conn) -> str | None:
    """库里已经有同名的表、却不是这里的结构(缺列)时给人看的一行:照课文做练习 4 时自己建的 review_log 最常见
    (课文只说记哪几样,列名各人起)。不说的话,CREATE TABLE IF NOT EXISTS 不动它,到了写审核记录、出日报时才是
    「no such column」,还被当成「数据库暂时用不了,稍后再试」,等多久都不会好。
    SQLite 的事件表不算:缺的列 init() 会补(照课文建的库也是这样升级的)。PostgreSQL 上除了 waiting_since
    没有要补的:做练习 6 时照课文自己建的 events(没有 ticket_id、claimed_by……)原来是 UndefinedColumn 的 traceback;
    业务表也在这个库里,别的程序的 tickets 原来让 store.py 叫人把它 DROP 掉。
    PostgreSQL 上列都在、存时间的列却是 TEXT(照课文的 SQLite 建表语句搬过去的)也算:原来领取时是 DatatypeMismatch 的 traceback。"""
    if dialect() == "postgres":
        tables = {**TABLE_COLUMNS, "events": TABLE_COLUMNS["events"] - {"waiting_since"},
                  **{t: frozenset(columns) for t, columns in BIZ_COLUMNS.items()}}
        have: dict[str, set] = {}
        typed: dict[str, dict[str, str]] = {}
        for table, column, kind in conn.execute(PG_TABLE_COLUMNS, (list(tables),)).fetchall():
            have.setdefault(table, set()).add(column)
            typed.setdefault(table, {})[column] = kind
        where, whose = f"{_safe_url(database_url())} 里", "多半是自己做练习时建的,或者是别的程序的"
        rename = "ALTER TABLE {table} RENAME TO my_{table}(或者换一个 schema)"
    else:
        tables = {t: columns for t, columns in TABLE_COLUMNS.items() if t != "events"}
        have = {t: {r["name"] for r in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
        path = shlex.quote(str(events_db()))
        where, whose = f"事件库 {events_db()} 里", "多半是自己做练习时建的"
        rename = f"比如 sqlite3 {path} 'ALTER TABLE {{table}} RENAME TO my_{{table}}'"
    for table, wanted in tables.items():
        if not have.get(table):
            continue
        if missing := wanted - have[table]:
            wrong = f"缺 {'、'.join(sorted(missing))} 列"
        elif dialect() == "postgres" and (off := {c: typed[table][c] for c in sorted(TIME_COLUMNS.get(table, ()))
                                                  if typed[table].get(c, PG_TIME_TYPE) != PG_TIME_TYPE}):
            by_type: dict[str, list[str]] = {}
            for column, kind in off.items():
                by_type.setdefault(kind, []).append(column)
            wrong = ",".join(f"{'、'.join(cs)} 列是 {kind}" for kind, cs in by_type.items()) + ",这里要 TIMESTAMPTZ"
        else:
            continue
        return (f"{where}已经有一张 {table} 表,却不是这里用的结构({wrong};{whose}):先给它改个名,"
                f"{rename.format(table=table)},再运行,这里会新建一张。什么都没做")
    return None


def events_columns(conn) -> set[str]:
    return {r["name"] for r in conn.execute("PRAGMA table_info(events)")}


def upgrade_events_table(conn) -> None:
    """SQLite 事件表缺的列(ADDED_COLUMNS)补上,在调用者的事务里。照课文建的库(没有 ticket_id)再换时间格式、
    补 ticket_id;新补上的 waiting_since 最后从(换好格式的)updated_at 填。"""
    have = events_columns(conn)
    for column, kind in ADDED_COLUMNS.items():
        if column not in have:
            conn.execute(f"ALTER TABLE events ADD COLUMN {column} {kind}")
    if "ticket_id" not in have:
        upgrade_lesson_db(conn)
    if "waiting_since" not in have:
        conn.execute(BACKFILL_WAITING_SINCE)


# 课文的 ambient.db 里有时间的列;它们存的是本地时间、精确到秒、不带时区
# (not_before 是课文练习 3 让加的列,照课文的 now() 写的也是本地时间:原来不换,东八区的机器上失败重试的事件要多等 8 小时,
# 同一张工单的别的事件也一起等)
LESSON_TIME_COLUMNS = {"events": ("received_at", "updated_at", "not_before"), "outbox": ("sent_at",)}
# 课文的库没有「同一张工单最多一个 processing」的约束,两个 worker(课文说 cron 里的 --once 可以重叠)被杀掉后,
# 同一张工单可能留下两个 processing 的事件:原来建唯一索引时 IntegrityError 的 traceback,每个程序都先 init(),
# 一个都起不来。升级时每张工单只留最早领的那个,别的放回队列(和卡住的事件一样)
LESSON_EXTRA_PROCESSING = """
UPDATE events SET status = 'pending' WHERE status = 'processing' AND ticket_id IS NOT NULL AND EXISTS (
  SELECT 1 FROM events AS first WHERE first.ticket_id = events.ticket_id AND first.status = 'processing'
    AND (first.updated_at, first.event_id) < (events.updated_at, events.event_id))
"""


def upgrade_lesson_db(conn) -> None:
    """照课文建的事件库第一次被 init() 打开时(在同一个事务里):
    - 时间换成这里的格式(UTC、微秒、带 +00:00)。两种格式混在一起,字符串比较就不是时间先后了(课文「坑」那一节),
      卡住的事件算不出等了多久,领取的先后也乱了。本地时间按这台机器的时区换算。
    - 补上 ticket_id(从 payload 里取)。不补的话,同一张工单挡不住两个 worker,收件箱也认不出它的待办。"""
    for table, columns in LESSON_TIME_COLUMNS.items():
        for column in columns:
            old = conn.execute(f"SELECT rowid, {column} FROM {table} WHERE {column} NOT LIKE '%+00:00'").fetchall()
            conn.executemany(f"UPDATE {table} SET {column} = ? WHERE rowid = ?",
                             [(stamp(datetime.fromisoformat(r[1])), r[0]) for r in old])
    events = conn.execute("SELECT event_id, payload FROM events WHERE ticket_id IS NULL").fetchall()
    conn.executemany("UPDATE events SET ticket_id = ? WHERE event_id = ?", [(ticket_of(r[1]), r[0]) for r in events])
    conn.execute(LESSON_EXTRA_PROCESSING)


# ---------------------------------------------------------------- PostgreSQL(设了 DATABASE_URL 时)
# 建表时 PostgreSQL 不让建的几种(按 psycopg 的错误类名):是设置的问题,等多久都不会好
PG_DDL_REFUSALS = {
    # 表都建好了的话,只有读写权限的用户也能运行(init() 不执行 DDL);走到这里是表还没建,或者这一版要给表加东西
    "InsufficientPrivilege": ("DATABASE_URL 的用户不能建表或改表",
                              "表还没建好,或者这一版程序要给表加列、加表;请库的所有者(或者有 CREATE 权限的用户)用同一个库和 "
                              "schema 运行一次 uv run python store.py,再 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES "
                              "IN SCHEMA <schema> TO <用户>。PostgreSQL 15 起普通用户不能在 public 里建表"),
    "ReadOnlySqlTransaction": ("DATABASE_URL 指的 PostgreSQL 只能读",
                               "多半连到了备库,或者设了 default_transaction_read_only;换成主库的地址"),
    # schema 在、这个用户却没有它的 USAGE 权限时,PostgreSQL 也当它不在(current_schema() 是空的)
    "InvalidSchemaName": ("DATABASE_URL 的 search_path 里没有一个存在的 schema",
                          "先 CREATE SCHEMA(schema 其实在的话,是这个用户没有它的 USAGE 权限:请库的所有者 "
                          "GRANT USAGE ON SCHEMA <schema> TO <用户>),或者改掉 options 里的 search_path"),
}


@contextmanager
def pg_refusing_ddl():
    """建表时 PostgreSQL 不让建(PG_DDL_REFUSALS):每个程序都先 init(),在这里一行说清楚、什么都还没做
    (原来是 psycopg 的 traceback)。PostgreSQL 15 起普通用户不能在 public 里建表,新手最常碰上的就是第一种。"""
    try:
        yield
    except Exception as e:  # 不在这里 import psycopg:没装时由 require_psycopg() 说怎么装(连库时才用到它)
        if not type(e).__module__.startswith("psycopg") or (refusal := PG_DDL_REFUSALS.get(type(e).__name__)) is None:
            raise
        what, advice = refusal
        raise SystemExit(f"{what}({first_line(e)}):{advice}。什么都没做") from None


SCHEMA_LOCK = 20261130      # advisory lock 的编号:几个进程同时建事件表时排队
CHECKPOINT_LOCK = 20261131  # 同上,建 checkpoint 表用;和上面分开,两件事互不等待
_pools: dict = {}
_pools_lock = threading.Lock()


def pool_size() -> int:
    return config.integer("PG_POOL_SIZE", PG_POOL_SIZE, minimum=1)


def idle_check_s() -> float:
    return config.number("PG_IDLE_CHECK_S", PG_IDLE_CHECK_S, minimum=0, maximum=86400)


def busy_timeout_s() -> float:
    return config.number("BUSY_TIMEOUT_S", BUSY_TIMEOUT_S, minimum=0, maximum=3600)


def unavailable_errors() -> tuple[type[Exception], ...]:
    """数据库暂时用不了时抛的异常:SQLite 的 OperationalError(库被锁太久、磁盘出错),PostgreSQL 的连接断了、
    服务器在重启、连接池借不到连接(PoolTimeout 也是 psycopg.OperationalError)。常驻的 worker 遇到它们不退出。"""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.OperationalError,)
    # 主备切换后连到了还只能读的那台(或者有人打开了 default_transaction_read_only):也是等一会儿再试。它的类是
    # InternalError,原来常驻的 worker 带着 traceback 退出了;SQLite 的库只能读时本来就这样等
    return sqlite3.OperationalError, psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction


def temporary(error: BaseException) -> bool:
    """unavailable_errors() 里、等一会儿可能就好了的那些:PostgreSQL 的连接断了、服务器在重启、连接数满了、磁盘满了、
    只能读;SQLite 的被锁太久、磁盘满了或出错、库只能读。worker 跑图时碰上它们,事件交回队列、不算一次失败。
    同属 OperationalError、等多久都一样的不算:SQLite 的 no such table / no such column(业务库被人改了表),
    PostgreSQL 的 54 类(超出程序限制:索引行太大、语句太复杂)。它们照常算失败,到 MAX_ATTEMPTS 进死信,
    不然常驻的 worker 每隔 POLL_SECONDS 就领一次、交回一次,一直转下去。"""
    if isinstance(error, sqlite3.OperationalError):
        code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
        return code in TEMPORARY_SQLITE_ERRORS or code == sqlite3.SQLITE_READONLY
    return isinstance(error, unavailable_errors()) and not (getattr(error, "sqlstate", None) or "").startswith("54")


def unavailable(error: Exception) -> str:
    """遇上 unavailable_errors() 时给人看的那一行的开头:「数据库暂时用不了(类型名: 原文第一行)」。
    psycopg 的错误常带好几行 DETAIL / HINT,日志和终端里只留第一行。各个程序在后面接上自己接下来怎么办。
    SQLite 的库文件只能读时(READONLY)补一句查什么:等多久都不会好,要人去改(原来只有英文的 readonly database)。"""
    if (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF == sqlite3.SQLITE_READONLY:
        return f"数据库暂时用不了({first_line(error)}:{READ_ONLY_HINT})"
    return f"数据库暂时用不了({first_line(error)})"


READ_ONLY_HINT = "库文件只能读:查一下它的写权限、是不是在只读的文件系统上、有没有被 chattr +i 锁住"


def first_line(error: Exception) -> str:
    """「类型名: 原文第一行」:psycopg 的错误常带好几行 DETAIL / HINT,给人看的一行里只留第一行。"""
    return f"{type(error).__name__}: {(_safe_url(str(error)).strip().splitlines() or [''])[0]}"


def with_detail(error: Exception) -> str:
    """first_line() 再接上 PostgreSQL 的 DETAIL:约束冲突时只有它说是哪一行,比如
    Key (customer_id)=(C999) is not present in table "customers"。DETAIL 末尾的英文句号去掉:后面接的是中文标点。"""
    detail = (getattr(getattr(error, "diag", None), "message_detail", None) or "").strip().rstrip(".")
    return first_line(error) + (f";{detail}" if detail else "")


def _pg_pool(url: str, durable: bool = True):
    """每个进程、每个 URL 两个连接池(提交等不等落盘,见 connect()),第一次用到时才建(import 时不连数据库)。"""
    with _pools_lock:
        if (url, durable) not in _pools:
            _pools[url, durable] = open_pg_pool(url, durable, row_factory=_pg_rows)
        return _pools[url, durable]


def open_pg_pool(url: str, durable: bool, **kwargs):
    """开一个连 url 的连接池(事件表的、checkpoint 的都用它),等第一个连接连上。
    没装依赖、URL 不是 PostgreSQL 的或写错了(见 url_problem)、PG_CONNECT_TIMEOUT_S 秒内连不上:以 SystemExit 退出,
    一行说明原因。"""
    scheme = url.split("://", 1)[0] if "://" in url else ""  # 不带 :// 的是 libpq 的 key=value 写法,也认
    if scheme and scheme not in ("postgresql", "postgres"):
        raise SystemExit(f"配置错误:DATABASE_URL 要以 postgresql:// 开头,现在是 {scheme}://…")
    require_psycopg()
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout

    if problem := url_problem(url):
        raise SystemExit(problem)
    max_size, idle_limit = pool_size(), idle_check_s()  # 设置写错了先说它,用不着去连服务器
    # psycopg 和连接池在数据库断开后会用英文 WARNING 说它扔掉了哪个连接、重连失败了几次(没配日志时直接打到 stderr,
    # 服务器不在时每秒好几行)。这些程序自己会说一行「数据库暂时用不了(…)」,所以只留 ERROR 及以上
    logging.getLogger("psycopg").setLevel(logging.ERROR)

    def check(conn) -> None:
        """借出去之前(连接池的 check 回调):上次借出去已经是 idle_limit 秒以前,就先确认还连着;死了就抛错,
        连接池扔掉它、换一个。刚连上的不查。不用连接池的 reset 回调记「还回来的时间」:设了 reset,每次还连接
        都要交给连接池的后台线程去做,PostgreSQL 上每个事件慢 1 ms 多(bench/worker.py 量过)。"""
        now, last = time.monotonic(), getattr(conn, "_ambient_taken_at", None)
        conn._ambient_taken_at = now
        if last is not None and now - last >= idle_limit:
            ConnectionPool.check_connection(conn)

    try:  # 先自己连一次:连不上时马上说出原因。连接池只会在日志里刷屏、重试到超时,最后说一句「超时了」
        psycopg.connect(url, connect_timeout=PG_CONNECT_TIMEOUT_S).close()
    except psycopg.Error as e:
        if isinstance(e, psycopg.OperationalError) and not refused_for_good(str(e)):
            raise  # 服务器没开、还在启动、连接数满了、网络不通:和用着用着断了一样是「数据库暂时用不了」,各个程序照常处理
        reason = ";".join(line.strip() for line in _safe_url(str(e)).splitlines() if line.strip()) or type(e).__name__
        raise SystemExit(f"连不上 DATABASE_URL 指的 PostgreSQL:{reason}") from None
    # connect_timeout:接上了却一直不回话的服务器,连接池的后台线程也别一直等着(连不上时关连接池要等它)
    pool = ConnectionPool(url, connection_class=_pooled_connection_class(), min_size=1, max_size=max_size,
                          timeout=PG_POOL_WAIT_S, kwargs={"autocommit": True, "application_name": pg_application_name(),
                                  "connect_timeout": PG_CONNECT_TIMEOUT_S, **kwargs},
                          configure=_configure(durable), check=check, open=False)
    try:
        pool.open(wait=True, timeout=PG_CONNECT_TIMEOUT_S)
    except PoolTimeout:
        pool.close()
        raise SystemExit(f"连不上 DATABASE_URL 指的 PostgreSQL:连接池 {PG_CONNECT_TIMEOUT_S} 秒内没有连上"
                         "(单独连一次是通的:服务器太忙,或者连接数满了)") from None
    return pool


def found_read_only(error: BaseException | None) -> bool:
    """这个错误是不是说连接连到了只能读的服务器上(主备切换时连到了还只能读的那台、用户或库上设了
    default_transaction_read_only)。这样连上的连接整个会话都只能读:还回连接池之前关掉,连接池另连一个,能写了
    (或者 URL 里写了 target_session_attrs=read-write、换到了新的主库)就好了。原来留在池里,服务器早就能写了,
    程序还一直说「只能读」。"""
    return type(error).__name__ == "ReadOnlySqlTransaction"


@functools.cache
def _pooled_connection_class():
    """连接池里的连接用的类:psycopg 的 Connection,多一件事 —— 用 with pool.connection() 借出去的(LangGraph 的
    PostgresSaver 就这样借、这样还),在里面碰上 found_read_only() 的错误,还回去之前关掉。
    事件表的连接不走 with,由 PgConnection.close() 做同一件事。"""
    import psycopg

    class PooledConnection(psycopg.Connection):
        def __exit__(self, exc_type, exc_val, exc_tb) -> None:
            super().__exit__(exc_type, exc_val, exc_tb)
            if found_read_only(exc_val):
                self.close()

    return PooledConnection


# 主机名里能有的字符(下划线不合规矩,但 docker compose 的服务名里常见,也解析得了);IP 地址另外认
HOSTNAME = re.compile(r"[A-Za-z0-9._-]+")
EXAMPLE_URL = "postgresql://用户@主机:5432/库名"


def url_problem(url: str) -> str | None:
    """DATABASE_URL(URL 或 libpq 的 key=value 写法)写得不对时,给人看的那一行「配置错误:…」;看不出毛病时是 None。
    这些错 libpq 要到连接时才说,psycopg 报的是 OperationalError,和服务器没开分不出来:原来都算「数据库暂时用不了」,
    常驻的 worker 一直重试、cron 按退出码 3 退出。域名解析不了的合法主机名还算暂时的(DNS 也会出故障)。"""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as e:  # 少了 :// 里的冒号、不是 URL 也不是 key=value、主机名里有空格
        reason = ";".join(line.strip() for line in _safe_url(str(e)).splitlines() if line.strip()) or type(e).__name__
        return f"配置错误:DATABASE_URL 读不懂({reason}):要写成 {EXAMPLE_URL}"
    hosts = (params.get("host") or "").split(",")
    for host in hosts:
        # 空的:默认的 Unix socket;/ 开头:Unix socket 所在的目录;@ 开头:Linux 的抽象 socket
        if host and not host.startswith(("/", "@")) and not HOSTNAME.fullmatch(host) and not _is_ip(host):
            return (f"配置错误:DATABASE_URL 里的主机 {host!r} 不是合法的主机名(只能有英文字母、数字、点和减号):"
                    "换成数据库所在机器的名字或 IP 地址")
    for address in (params.get("hostaddr") or "").split(","):
        if address.strip() and not _is_ip(address.strip()):
            return f"配置错误:DATABASE_URL 里的 hostaddr={address!r} 不是 IP 地址"
    ports = (params.get("port") or "").split(",")
    for port in ports:
        number = port.strip()  # libpq 容许前后有空格
        if number and not (number.isascii() and number.isdigit() and 1 <= int(number) <= 65535):
            return f"配置错误:DATABASE_URL 里的端口 {port!r} 不对:要是 1–65535 之间的整数(PostgreSQL 默认是 5432)"
    if len(ports) > 1 and len(ports) != len(hosts):
        return (f"配置错误:DATABASE_URL 里有 {len(hosts)} 个主机、{len(ports)} 个端口:端口要么只写一个,"
                "要么每个主机一个")
    # 没写库名时 libpq 用和用户同名的库(常常就是系统库 postgres),实验的表就建到了那里。PGDATABASE、
    # pg_service.conf 里的服务也能给出库名,这时不管
    if not params.get("dbname") and not params.get("service") and not os.environ.get("PGDATABASE") \
            and not os.environ.get("PGSERVICE"):
        return (f"配置错误:DATABASE_URL 里没有库名:在最后写上,例如 {EXAMPLE_URL}(不写的话 PostgreSQL 用和用户"
                "同名的库,常常是系统库 postgres,实验的表会建到那里)")
    return None


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# 服务器回了 FATAL 却不是设置的问题:等一会儿再连就好
PG_BUSY_FATALS = ("the database system is starting up", "the database system is shutting down",
                  "the database system is in recovery mode", "the database system is not yet accepting connections",
                  "the database system is not accepting connections", "too many clients already",
                  "remaining connection slots are reserved")


# libpq 自己(不是服务器)因为 DATABASE_URL 里的参数拒绝连接:sslmode=bogus 之类的值写错了,要 SSL 而服务器不支持,
# 要 channel binding 而服务器没用。等多久都不会好;原来算「数据库暂时用不了」,常驻的 worker 一直重试
PG_CLIENT_REFUSALS = ("connection is bad: invalid ", "but SSL was required", "channel binding required")


def refused_for_good(error: str) -> bool:
    """连 PostgreSQL 时的错误是不是设置的问题(库不存在、用户不存在、密码不对、pg_hba 不让连):服务器接了、回了 FATAL;
    或者 libpq 按 URL 里的参数就不连(PG_CLIENT_REFUSALS)。
    不是(连接被拒、超时、域名解析不了,或者服务器正忙着启动、连接数满了)就是暂时的,常驻的 worker 等着再试。
    psycopg 连接时的错误没有 sqlstate,只能看服务器说的话(服务器的 lc_messages 不是英文时看不懂,一律算暂时的)。"""
    if any(refusal in error for refusal in PG_CLIENT_REFUSALS):
        return True
    return "FATAL:" in error and not any(busy in error for busy in PG_BUSY_FATALS)


def require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        raise SystemExit("设置了 DATABASE_URL,但没装 PostgreSQL 的依赖:运行 uv sync --extra postgres") from None


def drop_broken_connections() -> bool:
    """PostgreSQL:连接池里闲着的连接每个空跑一条语句,断了的扔掉(连接池在后台另连),返回 True;SQLite 没有连接池,
    返回 False。连接被掐断(服务器重启、pg_terminate_backend、主备切换)时池里的连接往往一起死了,闲得不够
    PG_IDLE_CHECK_S 的借出去之前不查:一次失败之后紧接着再借,借到的多半还是死的。worker 交回事件前用它,交回才有得重来。"""
    if dialect() != "postgres":
        return False
    with _pools_lock:
        pools = list(_pools.values())
    for pool in pools:
        pool.check()
    return True


def close_pools() -> None:
    """关掉本进程开的 PostgreSQL 连接池(测试换库时用;进程退出时会自动关)。"""
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


class Row(tuple):
    """像 sqlite3.Row:能按位置取,也能按列名取,dict(row) 得到 {列名: 值}。"""

    def __new__(cls, values, index: dict):
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key):
        return tuple.__getitem__(self, self._index[key] if isinstance(key, str) else key)

    def keys(self):
        return list(self._index)


def _pg_rows(cursor):
    index = {c.name: i for i, c in enumerate(cursor.description or [])}
    return lambda values: Row(values, index)


class PgConnection:
    """sqlite3.Connection 用到的那一小部分:execute(? 占位符)、executescript、close。
    从连接池借一个连接;或者包一个已经借好的 raw(搬家时和 checkpoint 同一个连接、同一个事务),close() 不还它。"""

    def __init__(self, pool, raw=None):
        self.pool, self.raw = (None, raw) if raw is not None else (pool, pool.getconn())
        self.read_only = False  # 这个连接连到了只能读的服务器上,见 close()

    def execute(self, query: str, args=()):
        with self.noting_read_only():
            return self.raw.execute(self.placeholders(query), tuple(args))

    def executescript(self, script: str) -> None:
        with self.noting_read_only():
            self.raw.execute(script)  # 不带参数时 psycopg 允许一次执行多条语句

    def executemany(self, query: str, rows) -> None:
        with self.noting_read_only():
            self.raw.cursor().executemany(self.placeholders(query), rows)

    @contextmanager
    def noting_read_only(self):
        try:
            yield
        except Exception as e:
            self.read_only = self.read_only or found_read_only(e)
            raise

    @staticmethod
    def placeholders(query: str) -> str:
        """? 换成 psycopg 的 %s;SQL 里本来的 %(比如 LIKE 'M%')写成 %%,不然 psycopg 当它是占位符、报错。"""
        return query.replace("%", "%%").replace("?", "%s")

    def close(self) -> None:
        if self.pool is not None:
            if self.read_only:  # 见 found_read_only():关掉再还,连接池另连一个
                self.raw.close()
            self.pool.putconn(self.raw)


def _configure(durable: bool):
    """连接池每连上一个新连接时做的设置。
    lock_timeout = BUSY_TIMEOUT_S:等别人的锁最多这么久,和 SQLite 的 busy_timeout 一样,等不到就是「数据库暂时用不了」
    (webhook 回 503、常驻 worker 说一行再试)。原来 PostgreSQL 上一直等:有人在 psql 里开着事务占着一行,webhook 的
    那一批、连同排在后面的请求都一直挂着,没有回答。
    synchronous_commit:durable 的连接明确设成 on,回了 202 的事件断电也在,不随服务器或库上的默认值(有人
    ALTER DATABASE … SET synchronous_commit = off);其余的设成 off,提交不等 WAL 落盘,和 SQLite 的
    synchronous=NORMAL 同一个取舍(见 connect()):checkpoint 连接和 worker 记账的连接用它。worker 崩溃(kill -9)
    一个不丢,只有 PostgreSQL 服务器自己崩溃或断电时可能丢最后几百毫秒的提交,那张工单从更早的节点重跑(节点幂等,
    outbox 有 UNIQUE)。checkpoint 这样写,实测每个事件省 0.7 ms 左右(bench/worker.py)。"""
    settings = (f"SET lock_timeout = '{max(1, int(busy_timeout_s() * 1000))}ms'",  # 0 在 PostgreSQL 是一直等
                f"SET synchronous_commit = {'on' if durable else 'off'}")

    def configure(conn) -> None:
        for setting in settings:
            conn.execute(setting)
    return configure


def open_checkpointer(durable: bool = False):
    """LangGraph 的 checkpointer:SQLite 文件(默认)或 PostgreSQL。返回 (saver, 用完要 close 的东西)。
    durable=False(worker):checkpoint 的提交不等落盘,丢了只是从更早的节点重跑。
    durable=True(收件箱):等落盘。人的决定写下了才会发信;SQLite 上 checkpoint 和发件箱在两个文件里,
    不等的话断电后可能发件箱里有回复、checkpoint 却退回到 interrupt,同一张工单又回到收件箱。"""
    if dialect() == "postgres":
        require_psycopg()
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        pool = open_pg_pool(database_url(), durable, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(pool)
        with opened() as conn:
            if pg_checkpoint_tables_current(conn, saver):  # 同 init():建好了就不执行 setup() 里的 DDL
                return saver, pool
            # 用 try 轮询,不用 pg_advisory_lock 排队:排队的语句一直挂着快照,而 setup() 里的
            # CREATE INDEX CONCURRENTLY 要等所有快照结束 —— 两边互等,PostgreSQL 还看不出这是死锁
            while not conn.execute("SELECT pg_try_advisory_lock(?)", (CHECKPOINT_LOCK,)).fetchone()[0]:
                time.sleep(0.05)
            try:
                with pg_refusing_ddl():
                    if not pg_checkpoint_tables_current(conn, saver):  # 等锁的时候别人可能刚建完(同 init())
                        saver.setup()
            finally:
                conn.execute("SELECT pg_advisory_unlock(?)", (CHECKPOINT_LOCK,))
        return saver, pool
    from langgraph.checkpoint.sqlite import SqliteSaver

    try:
        conn = sqlite3.connect(checkpoints_db(), check_same_thread=False, timeout=busy_timeout_s(),
                               factory=FileConnection)
        use_wal(conn)  # worker 和收件箱是不同进程,同时写 checkpoint
    except sqlite3.DatabaseError as e:  # 路径设错了、指到了不是数据库的文件
        raise SystemExit(cannot_open("checkpoint 库", "CHECKPOINTS_DB", checkpoints_db(), e)) from None
    # worker 的 checkpoint 用 NORMAL:进程崩溃(kill -9)时一个不丢,只有断电可能丢最后几个 checkpoint,
    # 那张工单就从更早的节点重跑一遍(节点幂等,outbox 有 UNIQUE)。收件箱、事件表和发件箱是 FULL。
    conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
    conn.identity = file_identity(checkpoints_db())  # 常驻的 worker 领事件前核对(same_checkpoints_or_exit)
    saver = SqliteSaver(conn)
    saver.setup()
    return saver, conn


def pg_checkpoint_tables_current(conn, saver) -> bool:
    """LangGraph 的 checkpoint 表已经升到这个版本的 PostgresSaver 要的样子了吗(setup() 里记在 checkpoint_migrations 的最后一版)。"""
    if "checkpoint_migrations" not in pg_objects(conn):
        return False
    # init() 查过权限,可那时这几张表可能还没有(所有者的 store.py 刚刚建好):读版本号之前再查一次,缺权限时一行说清楚
    pg_rights_or_exit(conn)
    return conn.execute(PG_CHECKPOINT_VERSION).fetchone()[0] >= len(saver.MIGRATIONS) - 1  # 更新的版本升过的也行


PG_CHECKPOINT_VERSION = "SELECT coalesce(max(v), -1) FROM checkpoint_migrations"


def same_checkpoints_or_exit(conn) -> None:
    """open_checkpointer 返回的 SQLite 连接:checkpoint 库文件还是打开时那一个吗(见 unchanged_or_exit)。PostgreSQL 时不用查。"""
    if isinstance(conn, FileConnection):
        unchanged_or_exit(checkpoints_db(), conn.identity)


# ---------------------------------------------------------------- 事件:入队
def ticket_of(payload: str) -> str | None:
    """payload 里的 data.ticket_id;格式不对就是 None(worker 会把这种事件直接判死信)。"""
    try:
        value = json.loads(payload)["data"]["ticket_id"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None


# 一批事件一条 INSERT:SQLite 每执行一条语句都要放开、再抢一次 GIL,webhook 的事件循环正忙时每抢一次都要排队;
# 一行一条的写法在组提交里是主要开销(bench/webhook.py)。{rows} 是若干个 (?, ?, ?, ?, ?, ?, ?)。
# RETURNING 只返回真插进去的行:哪些是新的由数据库在插入时判断,不是先查再插 —— 另一个 webhook 进程
# 正在写同一个 event_id、还没提交时,PostgreSQL 等它提交完再判断,先查的话两边都会以为自己收到的是新的。
ADD_EVENTS_SQL = (
    "INSERT INTO events (event_id, source, kind, payload, ticket_id, received_at, updated_at) "
    "VALUES {rows} ON CONFLICT (event_id) DO NOTHING RETURNING event_id"  # 即 SQLite 的 INSERT OR IGNORE
)
INSERT_CHUNK = 500  # 行;一条 INSERT 最多带这么多行(7 × 500 个参数,远低于 SQLite 的 32766、PostgreSQL 的 65535)


# 邮件(email_poller)和定时任务(cron_jobs)的事件 id 都以这几个开头:邮件是 Message-ID 的 <…>,没有或者认不出
# Message-ID 时是 no-message-id: / message-id-sha1: 加 sha1;定时任务是 cron:…。三个来源共用 event_id 这一个唯一键,
# webhook 不收以它们开头的 id,谁也占不了别的来源的事件
MAIL_ID_PREFIXES = ("<", "no-message-id:", "message-id-sha1:")
CRON_ID_PREFIX = "cron:"
OTHER_SOURCE_ID_PREFIXES = (*MAIL_ID_PREFIXES, CRON_ID_PREFIX)


def add_event(event_id: str, source: str, kind: str, payload: str) -> bool:
    """返回 True 表示新事件,False 表示重复投递(已经收过)。"""
    return add_events([(event_id, source, kind, payload)])[0]


def event_exists(event_id: str) -> bool:
    """事件表里已经有这个 id 了吗(收过了)。"""
    with opened() as conn:
        return conn.execute("SELECT 1 FROM events WHERE event_id = ?", (event_id,)).fetchone() is not None


def add_events(events: list[tuple[str, str, str, str]]) -> list[bool]:
    """一个事务写一批事件(webhook 的组提交用它):一次落盘,逐条告诉你是不是新的。
    同一批里重复的 event_id 只写第一个,也只有第一个算新的。"""
    stamp_ = now()
    rows: dict[str, tuple] = {}
    for eid, source, kind, payload in events:
        if eid not in rows:
            rows[eid] = (eid, source, kind, payload, ticket_of(payload), stamp_, stamp_)
    fresh, inserted = list(rows.values()), set()
    with transaction() as conn:
        for i in range(0, len(fresh), INSERT_CHUNK):
            chunk = fresh[i:i + INSERT_CHUNK]
            marks = ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
            cur = conn.execute(ADD_EVENTS_SQL.format(rows=marks), [value for row in chunk for value in row])
            inserted.update(r[0] for r in cur.fetchall())
    is_new = []
    for eid, *_ in events:
        is_new.append(eid in inserted)
        inserted.discard(eid)  # 同一批里再出现就是重复
    return is_new


# ---------------------------------------------------------------- 事件:领取、改状态
def worker_id(pid: int | None = None) -> str:
    """「主机名:进程号@启动时刻」:谁在处理这个事件(claimed_by)。带上启动时刻,进程号被别的进程重用了也认得出来
    (容器重启后主机名不变,进程号又从头数,新 worker 常常拿到和被杀的那个一样的号)。读不到启动时刻时只有「主机名:进程号」。"""
    pid = pid or os.getpid()
    started = process_start(pid)
    return f"{socket.gethostname()}:{pid}" + (f"@{started}" if started else "")


def process_start(pid: int) -> str:
    """进程什么时候启动的:/proc/<pid>/stat 的第 22 项(开机以来的时钟滴答数)。不是 Linux、进程已经没了时是空串。"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def pg_application_name(owner: str | None = None) -> str:
    """这个进程(或 owner)连 PostgreSQL 时用的 application_name:就是 worker_id,最长 63 字节(再长服务器会截断)。
    进程被 kill -9 之后,它发出去的最后一条语句服务器还会执行完、提交;凭这个名字能看出它的连接还在不在。"""
    return (owner or worker_id()).encode()[:63].decode(errors="ignore")


CLAIM_SQL = """
UPDATE events SET status = 'processing', attempts = attempts + 1, claimed_by = ?, updated_at = ?
WHERE event_id = (
    SELECT event_id FROM events
    WHERE status = 'pending'
      AND (not_before IS NULL OR not_before <= ?)
      AND (ticket_id IS NULL OR ticket_id NOT IN
           (SELECT ticket_id FROM events
            WHERE ticket_id IS NOT NULL AND (status = 'processing' OR (status = 'pending' AND not_before > ?))))
    ORDER BY received_at, event_id
    LIMIT 1
    {skip_locked}
)
RETURNING event_id, kind, payload, attempts, ticket_id, last_error, updated_at
"""


def claim_args(owner: str, stamp_: str) -> tuple:
    """CLAIM_SQL 的参数:谁领的、现在(领取时间、退避到期了没有、同一张工单还在不在退避)。"""
    return owner, stamp_, stamp_, stamp_


CLAIM_TRIES = 5  # 次;每撞一次,说明别人刚领了同一张工单的事件;再挑时看得见它。连撞几次就等下一轮


def claim(owner: str | None = None) -> dict | None:
    """原子地领一个到点的 pending 事件:挑选和标记在同一条语句里,两个 worker 不会领到同一个。
    同一张工单已经有事件在处理时先不领它,免得两个 worker 同时往一个 thread 里写(见 ONE_PROCESSING_PER_TICKET);
    有事件失败了、还在退避时也不领它的别的事件:一张工单一个 thread,别的事件领走了也是接着那个失败的节点再跑一遍,
    等于绕过退避(上游每通知一次就多调一次模型)。"""
    for _ in range(CLAIM_TRIES):
        with opened(durable=False) as conn:
            cur = _unless_ticket_taken(conn, sql("CLAIM_SQL"), claim_args(owner or worker_id(), now()))
            if cur is not None:
                row = cur.fetchone()
                return dict(row) if row else None
    return None


def take_for_review(event_id: str, owner: str | None = None) -> bool:
    """收件箱处理一条待办前先把它从 waiting_human 拿走。两个人同时点同一条,只有一个拿得到;
    同一张工单的另一个事件正在 processing(worker 手里)时也拿不到。"""
    with opened() as conn:
        cur = _unless_ticket_taken(
            conn, "UPDATE events SET status = 'processing', claimed_by = ?, updated_at = ? "
                  "WHERE event_id = ? AND status = 'waiting_human'", (owner or inbox_owner(), now(), event_id))
    return cur is not None and cur.rowcount == 1


def _unless_ticket_taken(conn, query: str, args: tuple):
    """执行一条把事件改成 processing 的语句;撞上 ONE_PROCESSING_PER_TICKET(这张工单刚被别人拿去处理)返回 None。"""
    try:
        return conn.execute(query, args)
    except Exception as e:
        if isinstance(e, sqlite3.IntegrityError) and str(e) == MOVED_AWAY:  # 还开着的 SQLite worker、收件箱:停下
            raise SystemExit(moved_away(events_db(), *moved_to(conn))) from None
        if isinstance(e, sqlite3.IntegrityError) or getattr(e, "sqlstate", None) == "23505":  # 23505:唯一约束冲突
            return None
        raise


def set_status(event_id: str, status: str, error: str | None = None, *, not_before: str | None = None,
               owner: str | None = None, claimed_at=None, expect: str | None = None) -> bool:
    """改状态。给了 owner 时只改「还在这个进程手里」的事件:卡住被放回队列、又被别人领走的,不去覆盖;
    再给了 claimed_at(领取时 claim() 返回的 updated_at)时只改这一次领取的:放回队列后又被同一个进程的另一个
    处理线程领走的,慢的那个线程也不去覆盖(owner 是进程,两次领取的 owner 一样;原来慢的那个把事件改成了
    waiting_human,正在跑的那个线程的结果反倒被挡住);
    给了 expect 时只在当前状态是它的时候才改。进收件箱(waiting_human)时记下 waiting_since,已经记过的不改:
    respond 重写、收件箱命令失败交回 worker 续跑、之后再回到收件箱,客户一直在等,日报的「等得最久」不从零算。
    返回改没改成。"""
    assert status in STATUSES, status
    moment = now()
    query = "UPDATE events SET status = ?, last_error = ?, not_before = ?, updated_at = ?"
    args = [status, error, not_before, moment]
    if status == "waiting_human":
        query += ", waiting_since = COALESCE(waiting_since, ?)"
        args.append(moment)
    query += ", claimed_by = NULL" if status != "processing" else ""
    query += " WHERE event_id = ?"
    args.append(event_id)
    if owner is not None:
        query += " AND status = 'processing' AND claimed_by = ?"
        args.append(owner)
    if claimed_at is not None:
        query += " AND updated_at = ?"
        args.append(claimed_at)
    if expect is not None:
        query += " AND status = ?"
        args.append(expect)
    with opened(durable=False) as conn:
        return conn.execute(query, args).rowcount == 1


def hand_back(event_id: str, owner: str) -> bool:
    """worker 被打断时交回手上的事件:回到 pending,这次尝试不算数。"""
    with opened(durable=False) as conn:
        return conn.execute(
            "UPDATE events SET status = 'pending', attempts = attempts - 1, claimed_by = NULL, updated_at = ? "
            "WHERE event_id = ? AND status = 'processing' AND claimed_by = ?",
            (now(), event_id, owner),
        ).rowcount == 1


def hand_back_all(owner: str) -> list[str]:
    """owner 名下所有 processing 的事件都交回(同 hand_back),返回交回了哪些。只在 owner 手上确实没有在做的事件时用:
    除了记着的,还有领取已经提交、回答却在路上丢了(连接恰好这时断了)的那一个 —— 它不在 worker 记着的「手上」里,
    本机的 worker 还活着,requeue_stale 也不会放回它,原来要等 worker 重启才动得了。"""
    with opened(durable=False) as conn:
        return [r[0] for r in conn.execute(
            "UPDATE events SET status = 'pending', attempts = attempts - 1, claimed_by = NULL, updated_at = ? "
            "WHERE status = 'processing' AND claimed_by = ? RETURNING event_id", (now(), owner)).fetchall()]


def _owner_state(owner: str | None, conn=None) -> str:
    """alive:本机上还活着(不算僵尸);dead:本机上已经不在了;unknown:别的机器上的,看不到,只能靠时间判断。
    PostgreSQL 时,进程死了但它的连接还在服务器上(正在执行它死前发出的最后一条语句)也算 alive:
    这时把它的事件交给别人,那条语句(比如写 checkpoint)可能在别人读完状态之后才提交,同一张工单就会被从头再跑一遍。"""
    owner = (owner or "").removeprefix(INBOX_OWNER_PREFIX)  # 收件箱命令的连接也用 worker_id 当 application_name
    host, _, rest = owner.rpartition(":")
    pid, _, started = rest.partition("@")
    if host != socket.gethostname() or not pid.isdigit():
        return "unknown"
    # 进程号还在、启动时刻也对得上才算活着;对不上,这个号已经是别的进程了,领事件的那个不在了
    if _process_alive(int(pid)) and (not started or process_start(int(pid)) == started):
        return "alive"
    if dialect() == "postgres" and _has_pg_sessions(owner, conn):
        return "alive"
    return "dead"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


PG_SESSIONS_SQL = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = ?"


def _has_pg_sessions(owner: str, conn=None) -> bool:
    if conn is None:
        with opened() as own:
            return _has_pg_sessions(owner, own)
    return conn.execute(PG_SESSIONS_SQL, (pg_application_name(owner),)).fetchone()[0] > 0


# 卡住的事件放回队列时写进 last_error 的话。worker 领到 attempts 已经超过 MAX_ATTEMPTS、last_error 又是 REQUEUED_STALE
# 的事件,就知道前一次是 worker 处理到一半进程没了(而不是普通的失败),不再跑它:每次都让 worker 崩溃的事件不能无限循环下去。
REQUEUED_STALE = "上次领它的进程中途没了(被杀、崩溃,或者卡住超过 STALE_MINUTES),放回了队列"
# 收件箱命令拿走待办时 claimed_by 是 INBOX_OWNER_PREFIX + worker_id。它中途没了(被杀、Ctrl-C、出错)、人的决定已经写下时,
# 事件交回 worker 从那里接着做:这不是 worker 的崩溃,last_error 记 REQUEUED_FROM_INBOX,attempts 从 0 重新算
# (起草用掉的次数不该算到人做了决定以后;原来起草用满了 MAX_ATTEMPTS 的事件,在这里会被当成崩溃循环送进死信,人批准的回复发不出去)
INBOX_OWNER_PREFIX = "inbox:"
REQUEUED_FROM_INBOX = "上次拿走它的收件箱命令中途没了(被杀、Ctrl-C 或出错),交回 worker 接着做"

# processing → pending,交给 worker 接着做;只改 owner 还拿着的(requeue_stale 还要求是刚才看过的那一次领取)
HAND_TO_WORKER_SQL = ("UPDATE events SET status = 'pending', claimed_by = NULL, last_error = ?, "
                      "attempts = CASE WHEN ? THEN 0 ELSE attempts END, updated_at = ? "
                      "WHERE event_id = ? AND status = 'processing'")


def inbox_owner() -> str:
    return INBOX_OWNER_PREFIX + worker_id()


def hand_to_worker(event_id: str, owner: str | None, error: str | None = None, *, conn=None, updated_at=None) -> bool:
    """owner 手里的 processing 事件交回 pending,让 worker 接着做(owner 没了,或者做不下去了)。
    owner 是收件箱命令时 attempts 清零,last_error 是 error(没给就是 REQUEUED_FROM_INBOX);是 worker 时 attempts 不动,
    last_error 是 REQUEUED_STALE。给了 updated_at 时只改这一次领取(领取时刻对得上)。返回改没改成。"""
    if conn is None:
        with opened(durable=False) as own:
            return hand_to_worker(event_id, owner, error, conn=own, updated_at=updated_at)
    from_inbox = (owner or "").startswith(INBOX_OWNER_PREFIX)
    error = (error or REQUEUED_FROM_INBOX) if from_inbox else REQUEUED_STALE
    query, args = HAND_TO_WORKER_SQL, [error, from_inbox, now(), event_id]
    if owner is None:  # 照课文建的旧库没有 claimed_by 列:补上的列里是 NULL
        query += " AND claimed_by IS NULL"
    else:
        query += " AND claimed_by = ?"
        args.append(owner)
    if updated_at is not None:
        query += " AND updated_at = ?"
        args.append(updated_at)
    return conn.execute(query, args).rowcount == 1


def requeue_stale(minutes: float) -> int:
    """把卡在 processing 的事件放回 pending(见 hand_to_worker)。
    本机的进程:已经死了的马上放回,还活着的不动(STALE_MINUTES=0 重启时也不会抢别人正在做的);
    别的机器上的进程看不到死活,只能按时间:超过 minutes 分钟没动静才放回。"""
    cutoff = minutes_from_now(-minutes)
    with transaction() as conn:
        rows = conn.execute(
            "SELECT event_id, claimed_by, updated_at FROM events WHERE status = 'processing'"
        ).fetchall()
        stale = [r for r in rows
                 if (state := _owner_state(r["claimed_by"], conn)) == "dead"
                 or (state == "unknown" and parse_time(r["updated_at"]) <= parse_time(cutoff))]
        # 只放回刚才看过的那一次领取(同一个领的人、同一个时间):PostgreSQL 上 SELECT 不锁行,两个 worker 同时来放回时,
        # 一个放回、第三个马上领走,另一个原来接着把这次新的、活着的领取也放回了,同一张工单两个 worker 同时起草
        return sum(hand_to_worker(r["event_id"], r["claimed_by"], conn=conn, updated_at=r["updated_at"])
                   for r in stale)


def orphans() -> list[dict]:
    """processing 状态、但处理它的本机进程已经不在了的事件(比如收件箱命令做到一半被杀)。"""
    return [e for e in events_by_status("processing") if _owner_state(e["claimed_by"]) == "dead"]


def requeue_dead_command(event_ids: list[str]) -> str:
    """提示里让人照着敲的放回队列命令。邮件的事件 id 是 <…@…> 形式的 Message-ID:不加引号,粘进 shell 就成了重定向。
    以「-」开头的 id(nanoid、base64url 的 id 六十几个里就有一个)跟在 --requeue-dead 后面,argparse 当它是一个
    不认识的选项:这时每个 id 写成 --requeue-dead=<id>(写几次,几个 id 合在一起)。"""
    if any(e.startswith("-") for e in event_ids):
        return "uv run python worker.py " + " ".join(shlex.quote(f"--requeue-dead={e}") for e in event_ids)
    return f"uv run python worker.py --requeue-dead {shlex.join(event_ids)}"


def requeue(status: str, event_ids: list[str] | None = None) -> list[str]:
    """status 状态的事件(只要 event_ids 里的;None 是全部)放回队列:attempts 清零,重新按 MAX_ATTEMPTS 计。
    返回真的放回去的事件 id:刚被别人改了状态的不在里面。"""
    if event_ids == []:
        return []
    sql = "UPDATE events SET status = 'pending', attempts = 0, not_before = NULL, updated_at = ? WHERE status = ?"
    args: list = [now(), status]
    if event_ids:
        sql += f" AND event_id IN ({', '.join('?' for _ in event_ids)})"
        args += event_ids
    with opened() as conn:
        return [r[0] for r in conn.execute(sql + " RETURNING event_id", args).fetchall()]


def requeue_dead(event_ids: list[str] | None = None) -> int:
    """死信放回队列(修好 API key 之后用)。返回放回了几个。"""
    return len(requeue("dead", event_ids or None))


def restart_waiting(event_ids: list[str]) -> list[str]:
    """收件箱里 checkpoint 丢了的待办放回队列(inbox.py restart):worker 领到时 thread 是空的,从头起草。"""
    return requeue("waiting_human", event_ids)


def events_by_status(status: str) -> list[dict]:
    with opened() as conn:
        rows = conn.execute(
            "SELECT event_id, kind, payload, ticket_id, attempts, claimed_by, updated_at, last_error FROM events "
            "WHERE status = ? ORDER BY received_at, event_id",
            (status,),
        ).fetchall()
    return [dict(r) for r in rows]


def dead_events_of(ticket_id: str, other_than: str) -> list[str]:
    """这张工单除了 other_than 之外进了死信的事件 id。"""
    with opened() as conn:
        rows = conn.execute(
            "SELECT event_id FROM events WHERE ticket_id = ? AND status = 'dead' AND event_id <> ? "
            "ORDER BY received_at, event_id",
            (ticket_id, other_than),
        ).fetchall()
    return [r[0] for r in rows]


# ---------------------------------------------------------------- 发件箱和审核记录
def record_reply(ticket_id: str, body: str, sent_by: str, review: dict) -> bool:
    """写 outbox 和 review_log,同一个事务。返回 True 表示这次真的「发」了,False 表示之前已经发过。"""
    with transaction() as conn:
        sent = conn.execute(
            "INSERT INTO outbox (ticket_id, body, sent_by, sent_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (ticket_id) DO NOTHING",
            (ticket_id, body, sent_by, now()),
        ).rowcount == 1
        record_review(conn, ticket_id, review)
    return sent


def record_review(conn: sqlite3.Connection, ticket_id: str, review: dict) -> None:
    """每张工单一行,写人的决定。只有执行这个决定的节点(send / ignore)会写,那时决定已经写进 checkpoint、
    不会再变;节点重跑时已有的一行不动。"""
    conn.execute(
        "INSERT INTO review_log (ticket_id, category, draft, final, action, feedback, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ticket_id) DO NOTHING",
        (ticket_id, review["category"], review["draft"], review.get("final"), review["action"],
         json.dumps(review.get("feedback", []), ensure_ascii=False), now()),
    )


def record_ignore(ticket_id: str, review: dict) -> None:
    """review["action"] 是 ignore,或者 notify(通知类待办看过了)。"""
    with transaction() as conn:
        record_review(conn, ticket_id, {**review, "final": None})


# 收件箱记下某人看到了某张工单的哪一版草稿(见 SCHEMA 里的 inbox_seen);同一个人再看,换成新的那一版
SEEN_SQL = ("INSERT INTO inbox_seen (ticket_id, viewer, draft_sha, seen_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (ticket_id, viewer) DO UPDATE SET draft_sha = excluded.draft_sha, seen_at = excluded.seen_at")


def mark_seen(viewer: str, drafts: dict[str, str], wait_s: float) -> None:
    """记下 viewer 看到的草稿({工单号: 草稿全文的 SHA-256}),一个事务。等锁超过 wait_s 秒就抛错、一行都不记。"""
    if drafts:
        with transaction(wait_s=wait_s) as conn:
            conn.executemany(SEEN_SQL, [(ticket_id, viewer, sha, now()) for ticket_id, sha in drafts.items()])


def seen_draft(ticket_id: str, viewer: str) -> str | None:
    """viewer 最后一次看到的这张工单草稿的 SHA-256;没记下过就是 None。"""
    with opened() as conn:
        row = conn.execute("SELECT draft_sha FROM inbox_seen WHERE ticket_id = ? AND viewer = ?",
                           (ticket_id, viewer)).fetchone()
    return row[0] if row else None


def record_usage(event_id: str | None, ticket_id: str | None, model: str, input_tokens: int, output_tokens: int) -> None:
    with opened(durable=False) as conn:
        conn.execute(
            "INSERT INTO llm_usage (event_id, ticket_id, model, input_tokens, output_tokens, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (event_id, ticket_id, model, input_tokens, output_tokens, now()),
        )


# ---------------------------------------------------------------- 业务库(云簿的客户和工单)
def ticket(ticket_id: str) -> dict | None:
    with opened(biz_target()) as conn:
        row = conn.execute(
            "SELECT id, customer_id, subject, body, status, created_at FROM tickets WHERE id = ?", (ticket_id,)
        ).fetchone()
    return dict(row) if row else None


BIZ_COLUMNS = {"customers": ("id", "name", "email", "company", "plan"),   # 业务表和这里用到的列(拷 SQLite 业务库时只取这些)
               "tickets": ("id", "customer_id", "subject", "body", "status", "created_at")}


def seed_rows(today: date | None = None) -> tuple[list, list]:
    """cloudledger_seed.json 里的客户和工单。工单的 created_at = 今天 - age_days,所以哪天建都有新有旧。"""
    seed = json.loads(SEED_FILE.read_text(encoding="utf-8"))
    today = today or datetime.now(timezone.utc).date()
    return ([(c["id"], c["name"], c["email"].lower(), c["company"], c["plan"]) for c in seed["customers"]],
            [(t["id"], t["customer_id"], t["subject"], t["body"], t["status"],
              (today - timedelta(days=t["age_days"])).isoformat()) for t in seed["tickets"]])


def fill_biz(conn, customers: list, tickets: list) -> None:
    """在 conn 上建业务表,填进这些客户和工单。"""
    conn.executescript(BIZ_SCHEMA)
    for (table, columns), rows in zip(BIZ_COLUMNS.items(), (customers, tickets)):
        conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", rows)


BIZ_LOCK = 20261132  # advisory lock 的编号:几台机器同时第一次运行 store.py 时,只有一个建业务表、填数据
BIZ_TABLES_SQL = "SELECT to_regclass('customers') IS NOT NULL, to_regclass('tickets') IS NOT NULL"  # 按 BIZ_COLUMNS 的顺序;按 search_path 找


def build_biz_tables(today: date | None = None) -> str | None:
    """设了 DATABASE_URL 时:业务表一张都没有,就在 PostgreSQL 里建好,返回数据从哪来;有了(哪怕只有一张)什么都不动,
    返回 None(只有一张时 biz_db_problem() 说缺哪张,不在半套上补数据)。
    BIZ_DB 指的 SQLite 业务库在的话(Day 23 的库、之前用 SQLite 时邮件建的工单)拷它的客户和工单,不在才用种子数据。
    一个事务:建到一半不会留下半套;拷不过去(列不对、工单的客户不存在)时说明原因退出,业务表一张都不建
    (事件库的表在这之前已经建好:它们和业务库无关,哪个程序第一次用到都会建)。"""
    import psycopg

    path = biz_db()
    copy = path.exists() and path.stat().st_size > 0
    try:
        with pg_refusing_ddl(), transaction() as conn:  # 不能建表的用户:一行说清楚请所有者运行 store.py
            conn.execute("SELECT pg_advisory_xact_lock(?)", (BIZ_LOCK,))
            if any(conn.execute(BIZ_TABLES_SQL).fetchone()):
                return None
            fill_biz(conn, *(sqlite_biz_rows(path) if copy else seed_rows(today)))
    except (sqlite3.Error, psycopg.IntegrityError, psycopg.DataError) as e:
        raise SystemExit(f"业务库 {path} 拷不进 PostgreSQL:{with_detail(e)}。"
                         "业务表一张都没建:修好它,或者让 BIZ_DB 指到一个不存在的文件、改用种子数据") from None
    return f"从 {path} 拷过来" if copy else "种子数据"


def sqlite_biz_rows(path: Path) -> tuple[list, list]:
    """SQLite 业务库里的客户和工单(只取这里用到的列)。NUL 去掉:PostgreSQL 的 TEXT 存不了它。"""
    with opened(path) as conn:
        return tuple([tuple(v.replace("\x00", "") if isinstance(v, str) else v for v in row)
                      for row in conn.execute(f"SELECT {', '.join(columns)} FROM {table}")]
                     for table, columns in BIZ_COLUMNS.items())


def build_biz_db(path: Path, today: date | None = None) -> bool:
    """从 cloudledger_seed.json 造业务库的 SQLite 文件(没设 DATABASE_URL 时)。返回 False:别的进程同时建好了,用的是它那份。"""
    # 建好再换上,建到一半崩了不会留下半个库。临时文件名带进程号:两个 store.py 同时第一次运行时,原来共用一个
    # 「.building」,一个删掉另一个正写着的文件,两个都报「disk I/O error」「库文件只能读」,业务库谁也没建成
    tmp = path.with_name(f"{path.name}.building-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        conn = sqlite3.connect(tmp)
    except sqlite3.OperationalError as e:  # 目录不存在、没有写权限:说清楚是哪一项设置,不要说成「数据库暂时用不了」
        raise SystemExit(cannot_open("业务库", "BIZ_DB", path, e)) from None
    try:
        try:
            with conn:
                fill_biz(conn, *seed_rows(today))
        finally:
            conn.close()
        if path.exists() and path.stat().st_size == 0:  # touch 出来的空文件:换掉它
            tmp.replace(path)
            return True
        try:
            os.link(tmp, path)  # 不覆盖:同时建好的那一份可能已经收进了邮件建的工单
        except FileExistsError:
            return False  # 别的进程同时建好了,用它的
        except OSError:  # 不支持硬链接的文件系统
            if path.exists():
                return False
            tmp.replace(path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- 从 SQLite 搬到 PostgreSQL(store.py --from-sqlite)
# 事件库里要搬的表和列。自增的 id 不搬:PostgreSQL 自己编号(别处没有引用它)
MOVED_COLUMNS = {
    "events": ("event_id", "source", "kind", "payload", "status", "attempts", "last_error", "received_at",
               "updated_at", "not_before", "ticket_id", "claimed_by", "waiting_since"),
    "outbox": ("ticket_id", "body", "sent_by", "sent_at"),
    "review_log": ("ticket_id", "category", "draft", "final", "action", "feedback", "created_at"),
    "inbox_seen": ("ticket_id", "viewer", "draft_sha", "seen_at"),
    "llm_usage": ("event_id", "ticket_id", "model", "input_tokens", "output_tokens", "created_at"),
}
MOVE_LOCK = 20261133  # advisory lock 的编号:两个人同时搬,第二个等第一个搬完,再发现事件已经在了


# 搬完以后,在 SQLite 事件库里(和搬家同一个事务)记下搬去了哪里,并让它不再收写入:还开着的 SQLite worker 领不到事件、
# 收件箱拿不走待办、webhook 写不进新事件,同一张工单不会在两边各处理一遍。触发器的报错就是这一句(sqlite3.IntegrityError)
MOVED_AWAY = "这个 SQLite 事件库已经搬进 PostgreSQL(store.py --from-sqlite),不再收写入:设好 DATABASE_URL 再运行"
RETIRE_SQL = (
    "CREATE TABLE moved_to_postgres (url TEXT NOT NULL, moved_at TEXT NOT NULL)",
    "INSERT INTO moved_to_postgres (url, moved_at) VALUES (?, ?)",
    f"CREATE TRIGGER moved_no_insert BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, '{MOVED_AWAY}'); END",
    f"CREATE TRIGGER moved_no_update BEFORE UPDATE ON events BEGIN SELECT RAISE(ABORT, '{MOVED_AWAY}'); END",
)


class MoveRefused(Exception):
    """搬不了:说明原因,什么都没搬。code 是 store.py 的退出码。"""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class AlreadyMoved(Exception):
    """要搬的东西 PostgreSQL 里已经一样不少(already_moved):什么都不再搬,只在 SQLite 里补上已搬走的记号。
    消息是给人看的「N 个事件、M 个 checkpoint」。"""


def thread_id(ticket_id: str) -> str:
    """一张工单一个 LangGraph thread,id 是 ticket-<工单号>(agent.thread_of 用它;搬家时拿它核对两个文件是不是一套)。"""
    return f"ticket-{ticket_id}"


def moved_to(conn) -> tuple[str, str] | None:
    """这个 SQLite 事件库搬进了哪个 PostgreSQL、什么时候搬的(「2026-12-02 01:23:45 UTC」,store.py --from-sqlite
    记下的);没搬过是 None。"""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'moved_to_postgres'").fetchone():
        return None
    url, moved_at = conn.execute("SELECT url, moved_at FROM moved_to_postgres").fetchone()
    return url, f"{moved_at[:19].replace('T', ' ')} UTC"


def moved_away(path: Path, url: str, moved_at: str) -> str:
    """不设 DATABASE_URL 运行、用的又是搬走了的 SQLite 事件库时,给人看的那一行。"""
    return (f"{path} 里的事件已经在 {moved_at} 搬进了 {url},这个库不再用了:"
            "设好 DATABASE_URL 再运行(写进 .env 或 export)。要从头用一套新的 SQLite 库,让 EVENTS_DB、CHECKPOINTS_DB 指到别处")


def sqlite_rows_to_move(conn, path: Path) -> dict[str, list]:
    """conn(EVENTS_DB)里要搬的行(按 MOVED_COLUMNS)。已经搬过、是旧版的库、有事件正在处理:MoveRefused。"""
    if moved := moved_to(conn):
        url, moved_at = moved
        raise MoveRefused(2, f"{path} 已经在 {moved_at} 搬进过 {url}。什么都没搬")
    have = {t: {r["name"] for r in conn.execute(f"PRAGMA table_info({t})")} for t in MOVED_COLUMNS}
    if any(set(columns) - have[t] for t, columns in MOVED_COLUMNS.items()):
        raise MoveRefused(2, f"{path} 是旧版的事件库(照课文建的,或者缺表):先在 SQLite 上运行一次 "
                             "DATABASE_URL= uv run python store.py 把它升级,再来搬")
    busy = [r[0] for r in conn.execute("SELECT event_id FROM events WHERE status = 'processing' ORDER BY event_id")]
    if busy:
        raise MoveRefused(1, f"{path} 里有 {len(busy)} 个事件正在处理({'、'.join(busy[:5])}):先停掉用 SQLite 的 "
                             "worker 和收件箱,等它们做完再搬;进程已经没了的,先在 SQLite 上把它们放回队列、做完:"
                             "DATABASE_URL= STALE_MINUTES=0 uv run python worker.py --once。什么都没搬")
    return {t: [tuple(r) for r in conn.execute(f"SELECT {', '.join(columns)} FROM {t} ORDER BY rowid")]
            for t, columns in MOVED_COLUMNS.items()}


def sqlite_checkpoints() -> list:
    """CHECKPOINTS_DB 里所有 thread 的全部 checkpoint(CheckpointTuple,带着没跑完的节点写下的 pending writes),
    同一个 thread 里旧的在前。文件不在(worker 从没跑过)就是空的。"""
    path = checkpoints_db()
    if not path.exists() or path.stat().st_size == 0:
        return []
    from langgraph.checkpoint.sqlite import SqliteSaver

    try:
        with opened(path) as conn:
            return list(reversed(list(SqliteSaver(conn).list(None))))  # list() 给的是新的在前
    except sqlite3.DatabaseError as e:
        raise MoveRefused(2, f"{path} 打不开:{first_line(e)}。什么都没搬") from None


def move_from_sqlite() -> tuple[str, str | None]:
    """把 EVENTS_DB、CHECKPOINTS_DB 里的东西搬进 DATABASE_URL 指的 PostgreSQL:全部事件(等人审的、排队的、做完的、死信)、
    发件箱、审核记录、看过的草稿、用量,和每个 thread 的全部 checkpoint —— 等人审的待办在 PostgreSQL 上照样 accept,
    做了一半的图从停下的节点接着跑,定时任务也认得哪些工单已经回过。一个事务:要么全搬过去,要么什么都没搬。
    从读到写完一直拿着 SQLite 事件库的写锁(SQLite 的 worker 这期间领不了事件、收件箱拿不走待办,搬过去的就是读到的),
    PostgreSQL 提交之后在同一个 SQLite 事务里记下已搬走(RETIRE_SQL)。搬不了时抛 MoveRefused;
    SQLite 被别人锁着太久时抛 sqlite3.OperationalError(数据库暂时用不了)。
    要搬的 PostgreSQL 里已经一样不少(上一次在两个提交之间被杀掉了,见 already_moved):什么都不再搬,只补上 SQLite 的记号。
    返回 (给人看的一行:搬了多少或者早已搬过,None);PostgreSQL 已经提交、SQLite 却没能记下时,第二项是 SQLite 的错误。"""
    path = events_db()
    if not path.exists() or path.stat().st_size == 0:
        raise MoveRefused(2, f"没有可搬的:EVENTS_DB 指的 {path} 不存在")
    done = None
    try:
        with transaction(path) as source:
            if "ticket_id" in events_columns(source):
                # 上一版的库(升级以后还没有程序用 SQLite 打开过它)只缺后加的列:顺手补上,和 init() 一样。
                # 照课文建的库仍然请人先在 SQLite 上运行一次 store.py(sqlite_rows_to_move 里说)
                upgrade_events_table(source)
            moved, checkpoints = sqlite_rows_to_move(source, path), sqlite_checkpoints()
            tickets = source.execute("SELECT DISTINCT ticket_id FROM events WHERE ticket_id IS NOT NULL").fetchall()
            threads = {t.config["configurable"]["thread_id"] for t in checkpoints}
            if strays := sorted(threads - {thread_id(r[0]) for r in tickets}):
                # 搬过去的话,这几个 thread 在 PostgreSQL 里没人认领,以后同一张工单来了新事件,反倒接着旧进度跑
                raise MoveRefused(2, f"{checkpoints_db()} 里有 {len(strays)} 个 thread 在 {path} 里没有对应的事件"
                                     f"({'、'.join(strays[:5])}):两个文件不是同一套 —— EVENTS_DB、CHECKPOINTS_DB 指错了,"
                                     "或者拷事件库时漏了旁边的 -wal 文件(拷之前先停掉所有程序,连 -wal 一起拷)。什么都没搬")
            waiting = source.execute("SELECT DISTINCT ticket_id FROM events WHERE status = 'waiting_human' "
                                     "ORDER BY ticket_id").fetchall()
            if lost := [r[0] for r in waiting if thread_id(r[0]) not in threads]:
                # 反过来也不行:收件箱里的待办靠 checkpoint 才能 accept。CHECKPOINTS_DB 写错了(文件不在就是一个 checkpoint
                # 都没有)时原来照样「搬好了」、SQLite 记成已搬走,那边这些待办只能 restart、再调一次模型重新起草
                raise MoveRefused(2, f"{path} 的收件箱里有 {len(lost)} 条待办({'、'.join(lost[:5])}),"
                                     f"{checkpoints_db()} 里却没有它们的 checkpoint:CHECKPOINTS_DB 指错了(文件不在,"
                                     "或者是另一套);把它改成 worker 起草时用的那个再搬。什么都没搬")
            url = _safe_url(database_url())
            try:
                done = f"已从 {path}、{checkpoints_db()} 搬进 {url}:{copy_to_postgres(moved, checkpoints)}"
            except AlreadyMoved as e:
                done = (f"{path} 里的 {e} 已经都在 {url} 里了(搬过一次,只是没来得及在 {path} 里记下已搬走):"
                        "这次什么都没再搬,只补上这个记号")
            source.execute(RETIRE_SQL[0])
            source.execute(RETIRE_SQL[1], (url, now()))
            for statement in RETIRE_SQL[2:]:
                source.execute(statement)
    except sqlite3.Error as e:
        if done is not None:  # PostgreSQL 那边已经提交了(或者早就有了)
            return done, first_line(e)
        if isinstance(e, sqlite3.OperationalError):  # 被别人锁着太久、磁盘出错:稍后再搬
            raise
        raise MoveRefused(2, f"{path} 打不开:{first_line(e)}。什么都没搬") from None
    return done, None


def copy_to_postgres(moved: dict[str, list], checkpoints: list) -> str:
    """在一个 PostgreSQL 事务里写进 moved(表 → 行)和 checkpoints;返回给人看的行数。冲突时抛 MoveRefused;
    要搬的那边已经一样不少时抛 AlreadyMoved,什么都不写。"""
    import psycopg

    threads = sorted({t.config["configurable"]["thread_id"] for t in checkpoints})
    saver, pool = open_checkpointer(durable=True)  # 先让 LangGraph 建好 checkpoint 的表
    try:
        with pool.connection() as conn, conn.transaction():
            target = PgConnection(None, raw=conn)
            target.execute("SELECT pg_advisory_xact_lock(?)", (MOVE_LOCK,))
            event_ids = [r[0] for r in moved["events"]]
            there = [r["event_id"] for r in target.execute(
                "SELECT event_id FROM events WHERE event_id = ANY(?) ORDER BY event_id", (event_ids,))]
            if there:
                if len(there) == len(event_ids) and already_moved(target, moved["events"], checkpoints):
                    raise AlreadyMoved(f"{len(event_ids)} 个事件、{len(checkpoints)} 个 checkpoint")
                raise MoveRefused(2, f"PostgreSQL 里已经有 {len(there)} 个同样的事件({'、'.join(there[:5])}):"
                                     "多半已经搬过了。什么都没搬")
            there = [r["thread_id"] for r in target.execute(
                "SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id = ANY(?) ORDER BY thread_id", (threads,))]
            if there:
                raise MoveRefused(2, f"PostgreSQL 里已经有这些工单的 checkpoint({'、'.join(there[:5])}):"
                                     "它们在那边已经处理过,两边的进度合不到一起。什么都没搬")
            for table, rows in moved.items():
                columns = MOVED_COLUMNS[table]
                target.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                                   f"VALUES ({', '.join('?' * len(columns))})", rows)
            tickets = copy_missing_tickets(target, {r[MOVED_COLUMNS["events"].index("ticket_id")]
                                                    for r in moved["events"]} - {None})
            copy = type(saver)(conn)  # 同一个连接、同一个事务
            for t in checkpoints:
                parent = t.parent_config or {"configurable": {
                    k: t.config["configurable"][k] for k in ("thread_id", "checkpoint_ns")}}
                copy.put(parent, t.checkpoint, t.metadata, t.checkpoint["channel_versions"])
                by_task: dict[str, list] = {}
                for task_id, channel, value in t.pending_writes or ():
                    by_task.setdefault(task_id, []).append((channel, value))
                for task_id, writes in by_task.items():
                    copy.put_writes(t.config, writes, task_id)
    except psycopg.DataError as e:  # 比如文本里有 NUL:PostgreSQL 的 TEXT 存不了
        raise MoveRefused(2, f"有一行搬不进 PostgreSQL({first_line(e)}):什么都没搬") from None
    except psycopg.IntegrityError as e:  # 发件箱、审核记录里同一张工单两边都有(PostgreSQL 上已经处理过它)
        raise MoveRefused(2, f"PostgreSQL 里已经有同样的记录({with_detail(e)}):什么都没搬") from None
    finally:
        pool.close()
    counted = ",".join(f"{t} {len(rows)} 行" for t, rows in moved.items())
    counted += f";checkpoint {len(threads)} 个 thread({len(checkpoints)} 个 checkpoint)"
    return counted + (f";从 {biz_db()} 补上 PostgreSQL 业务表里还没有的工单 {tickets} 张" if tickets else "")


def already_moved(target, events: list, checkpoints: list) -> bool:
    """SQLite 里的每个事件(同一个 id、同一个收到时间,精确到微秒)和每个 checkpoint(id 是 uuid)PostgreSQL 里都有:
    那边就是从这个库搬过去的那一套 —— 上一次搬家在 PostgreSQL 提交之后、SQLite 记下已搬走之前被杀掉了(或者磁盘满了
    没记下),或者这是搬之前拷的一份。只是事件 id 撞上了的另一套(比如两边都用 send_webhook.py 发过同样的事件)不算。"""
    at = MOVED_COLUMNS["events"].index("received_at")
    mine = {(r[0], parse_time(r[at])) for r in events}
    theirs = {(r["event_id"], parse_time(r["received_at"])) for r in target.execute(
        "SELECT event_id, received_at FROM events WHERE event_id = ANY(?)", (sorted(e for e, _ in mine),))}
    if mine != theirs:
        return False
    keys = {tuple(t.config["configurable"][k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")) for t in checkpoints}
    there = {(r["thread_id"], r["checkpoint_ns"], r["checkpoint_id"]) for r in target.execute(
        "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints WHERE thread_id = ANY(?)",
        (sorted({k[0] for k in keys}),))}
    return keys <= there


def copy_missing_tickets(target, ticket_ids: set[str]) -> int:
    """搬过去的事件要用的工单,PostgreSQL 的业务表里却没有的,从 BIZ_DB 拷过去(连同它们的客户,已有的不动);返回拷了几张。
    第一次设着 DATABASE_URL 运行 store.py 时业务表就建好了(拷的是那时的 BIZ_DB),之后到搬家之前用 SQLite 的邮件轮询
    收进来的信,工单只在 BIZ_DB 里:原来这些事件搬过去以后,worker 说「工单不存在」直接进死信,邮件早已标了已读。
    BIZ_DB 里也没有的(比如 T9999)不管,和在 SQLite 上一样由 worker 判死信。"""
    there = {r["id"] for r in target.execute("SELECT id FROM tickets WHERE id = ANY(?)", (sorted(ticket_ids),))}
    path = biz_db()
    if not (missing := ticket_ids - there) or not path.exists() or path.stat().st_size == 0:
        return 0
    try:
        customers, tickets = sqlite_biz_rows(path)
    except sqlite3.Error as e:
        raise MoveRefused(2, f"业务库 {path} 读不了({first_line(e)}),搬过去的事件要用的工单"
                             f"({'、'.join(sorted(missing)[:5])})拷不过去。什么都没搬") from None
    tickets = [t for t in tickets if t[0] in missing]
    customers = [c for c in customers if c[0] in {t[1] for t in tickets}]
    for table, rows in (("customers", customers), ("tickets", tickets)):
        columns = BIZ_COLUMNS[table]
        target.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                           "ON CONFLICT (id) DO NOTHING", rows)
    return len(tickets)


def sqlite_note() -> str:
    """设了 DATABASE_URL 时,store.py 最后关于 EVENTS_DB 那个 SQLite 库的一句提醒;没什么可说的是空串。
    - 它里面还有没做完(排队、处理中、等人审)、PostgreSQL 里又没有的事件:说有几个、怎么搬。
    - 它已经搬进了另一个 PostgreSQL 库(--from-sqlite 记下的地址和现在的 DATABASE_URL 不一样):说搬去了哪里。
      原来什么都不说:DATABASE_URL 换了个库,store.py 在新库里建出空表,看着像搬过去的事件和待办都没了。
    SQLite 库不在、打不开、搬进的就是这个库(之后清空了 PostgreSQL 的话,原来这里照样提醒去搬,搬的时候却被拒绝):空串。"""
    path = events_db()
    if not path.exists() or path.stat().st_size == 0:
        return ""
    try:
        with opened(path) as conn:
            if moved := moved_to(conn):
                url, moved_at = moved
                if same_database(url, _safe_url(database_url())):
                    return ""
                return (f"{path} 里的事件在 {moved_at} 搬进的是 {url},不是现在 DATABASE_URL 的这个库:"
                        "要接着处理搬过去的事件和待办,把 DATABASE_URL 改回那个库")
            ids = [r[0] for r in conn.execute(
                "SELECT event_id FROM events WHERE status IN ('pending', 'processing', 'waiting_human')")]
    except sqlite3.Error:
        return ""
    if not ids:
        return ""
    with opened() as conn:
        there = conn.execute("SELECT COUNT(*) FROM events WHERE event_id = ANY(?)", (ids,)).fetchone()[0]
    if not (left := len(ids) - there):
        return ""
    return (f"{path} 里还有 {left} 个没做完的事件(排队、等人审)不在 PostgreSQL 里:要在这边接着处理,"
            "停掉用 SQLite 的 worker、webhook、邮件轮询和收件箱,运行 uv run python store.py --from-sqlite")


_safe_url = config.hide_password  # 打印用:去掉连接串(或者引了它的报错)里的密码


def same_database(a: str, b: str) -> bool:
    """两个连接串是不是同一个库:服务器、库名和其余参数(options 里的 search_path)都一样,用户和密码不算。
    所有者搬的家,之后用只有读写权限的用户连同一个库,不该被说成「不是现在 DATABASE_URL 的这个库」。"""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    def key(url: str) -> dict | str:
        try:
            return {k: v for k, v in conninfo_to_dict(url).items() if k not in ("user", "password")}
        except psycopg.ProgrammingError:  # 读不懂的(不会是 store.py 记下的):只认一模一样的
            return url
    return key(a) == key(b)


def counts(path: Path | None, tables: tuple[str, ...]) -> dict[str, int]:
    with opened(path) as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}


# ---------------------------------------------------------------- 邮件和定时任务用的查询
def biz_db_problem(*, hint: bool = True) -> str | None:
    """业务库用不了时返回原因,能用返回 None。库文件不存在时不去连接(连接会顺手建一个空库)。
    只缺一部分表(不是还没建,store.py 不会替你重建)时,hint 让它接着说去运行 store.py:那里说怎么修。"""
    partly = "(运行 uv run python store.py,它说怎么修)" if hint else ""
    if dialect() == "postgres":
        with opened() as conn:
            have = conn.execute(BIZ_TABLES_SQL).fetchone()
        missing = [t for t, there in zip(BIZ_COLUMNS, have) if not there]
        if len(missing) == len(BIZ_COLUMNS):
            return f"业务库还没建:{_safe_url(database_url())} 里没有表 {'、'.join(missing)}(先运行 uv run python store.py 建库)"
        return f"业务库 {_safe_url(database_url())} 里没有表:{'、'.join(missing)}{partly}" if missing else None
    path = biz_db()
    if not path.exists():
        return f"业务库不存在:{path}(先运行 uv run python store.py 建库)"
    try:
        with opened(path) as conn:
            have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as e:
        return cannot_open("业务库", "BIZ_DB", path, e)
    missing = [t for t in BIZ_COLUMNS if t not in have]
    if len(missing) == len(BIZ_COLUMNS) and (role := other_lab_db(path, have)):
        return not_biz_db(path, role)
    return f"业务库 {path} 里没有表:{'、'.join(missing)}{partly}" if missing else None


NOT_BIZ_DB = "不是业务库"  # other_lab_db() 认出来的那种:store.py 看到它就不说「删掉它」
POINT_BACK = "。没有动它:让 BIZ_DB 指到业务库(不设就是脚本旁边的 cloudledger.db)"


def biz_advice(problem: str) -> str:
    """store.py 在 biz_db_problem() 后面接的建议。BIZ_DB 多半是指错了(别的程序的库、笔记、目录、这个实验的事件库):
    先说指回去;只有「是 SQLite 库、只是没有业务表」时才提删掉重建,而且要先确定那个文件没用了。
    原来一律说「删掉它」,照做就删掉了别人的库或笔记。"""
    if NOT_BIZ_DB in problem:  # 它自己说了怎么办
        return ""
    if problem.startswith("业务库打不开"):  # 目录、不是数据库的文件:删掉它不是办法
        return POINT_BACK
    return POINT_BACK + ";确定这个文件没用了,才删掉它再运行 uv run python store.py,就会新建一份"


def other_lab_db(path: Path, tables: set[str]) -> str | None:
    """BIZ_DB 指到了这个实验的另一个库(事件库、checkpoint 库)时,说是哪一个。原来只说「里没有表」,store.py 还叫人
    删掉它 —— 删掉的是全部事件和收件箱里的待办。路径一样也算:checkpoint 库还没建出来时(worker 还没跑过),
    原来 store.py 在 CHECKPOINTS_DB 的位置建起业务库,之后 LangGraph 的表也写进了同一个文件。"""
    here = file_identity(path)
    for role, other, table in (("事件库", events_db(), "events"), ("checkpoint 库", checkpoints_db(), "checkpoints")):
        if table in tables or path == other or (here is not None and here == file_identity(other)):
            return role
    return None


def not_biz_db(path: Path, role: str) -> str:
    """BIZ_DB 指到了 role(other_lab_db 认出来的)时给人看的一行。"""
    return f"BIZ_DB 指的 {path} {being(role)},{NOT_BIZ_DB}:让 BIZ_DB 指到业务库(不设就是脚本旁边的 cloudledger.db)"


def being(role: str) -> str:
    """「是事件库」「是 checkpoint 库」:中文和英文之间空一格。"""
    return f"是 {role}" if role[:1].isascii() else f"是{role}"


def customer_by_email(address: str) -> str | None:
    """发件地址对应的客户 id;不是已知客户返回 None。比较时不分大小写。"""
    with opened(biz_target()) as conn:
        row = conn.execute("SELECT id FROM customers WHERE lower(email) = ?", (address.lower(),)).fetchone()
    return row["id"] if row else None


MAIL_TICKET_SQL = "INSERT INTO tickets VALUES (?, ?, ?, ?, 'open', ?) ON CONFLICT (id) DO NOTHING"  # 列顺序见 BIZ_SCHEMA
SAME_MAIL_SQL = "SELECT 1 FROM tickets WHERE id = ? AND customer_id = ? AND subject = ? AND body = ?"


def add_mail_ticket(candidates: list[str], customer_id: str, subject: str, body: str, created_on: str) -> str:
    """邮件建工单,返回工单号。按顺序试 candidates:插进去了,或者已有的那张就是这封邮件(同客户、同主题、
    同正文,也就是上次存过了)→ 用它;已有的是另一封邮件(工单号撞了)→ 试下一个。重跑得到的工单号不变。
    主题和正文里的 NUL 去掉:PostgreSQL 的 TEXT 存不了它(整封信就会一直存储失败),两种库存的一样。"""
    subject, body = subject.replace("\x00", ""), body.replace("\x00", "")
    with transaction(biz_target()) as conn:
        for ticket_id in candidates:
            if conn.execute(MAIL_TICKET_SQL, (ticket_id, customer_id, subject, body, created_on)).rowcount == 1:
                return ticket_id
            if conn.execute(SAME_MAIL_SQL, (ticket_id, customer_id, subject, body)).fetchone():
                return ticket_id
    raise ValueError(f"工单号全都被别的邮件占了:{', '.join(candidates)}")


def open_tickets_created_by(last_day: str) -> tuple[list[str], list[tuple[str, str]]]:
    """业务库里 created_at 不晚于 last_day(YYYY-MM-DD)、还开着的工单,最老的在前;另外返回 created_at 不是
    YYYY-MM-DD 开头的开着的工单 (工单号, 原样的 created_at),它们没法比,不算进去。
    原来直接在 SQL 里按字符串比:BIZ_DB 指着别的系统的库时,''、'15/11/2026'、1893456000 这样的都「早于」截止日,
    悄悄当成久未回复入队;格式不对的工单一句提示都没有(课文「坑」那一节:两种时间格式按字符串比)。"""
    with opened(biz_target()) as conn:
        rows = conn.execute("SELECT id, created_at FROM tickets WHERE status = 'open' ORDER BY created_at, id").fetchall()
    old, odd = [], []
    for r in rows:
        day = ticket_day(r["created_at"])
        if day is None:
            odd.append((r["id"], str(r["created_at"])))
        elif day <= last_day:
            old.append(r["id"])
    return old, odd


def ticket_day(value) -> str | None:
    """工单 created_at 的日期(YYYY-MM-DD);认不出是哪天时是 None。PostgreSQL 里别人的表可能是 date / timestamp 类型。"""
    if isinstance(value, str) and re.match(r"\d{4}-\d{2}-\d{2}.", value):
        # 文字里带着时区的(「2026-11-15T07:30:00+08:00」,别的系统导出的):和 timestamptz 一样按 UTC 的日子,
        # 原来取前 10 个字,它是 11-15,同一时刻写成 UTC 的却是 11-14
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass  # 别的写法(「2026-11-15 上午」):下面照旧取前 10 个字
    if isinstance(value, datetime) and value.tzinfo is not None:
        # timestamptz:psycopg 按会话的时区给出(国内的服务器多半默认 Asia/Shanghai),日期一律按 UTC 算,先换过去。
        # 原来 UTC 晚上 8 点建的工单,在 +08:00 的会话里就成了第二天,同一张工单扫不扫得到要看服务器的设置
        value = value.astimezone(timezone.utc)
    if isinstance(value, (date, datetime)):
        return value.isoformat()[:10]
    if isinstance(value, str) and re.match(r"\d{4}-\d{2}-\d{2}", value):
        try:
            return date.fromisoformat(value[:10]).isoformat()
        except ValueError:
            return None
    return None


def followup_blockers() -> dict[str, set]:
    """定时扫描要避开的工单。replied:outbox 里有回复;ignored:客服在收件箱里选了不回;
    queued:(工单号, 事件 id),这张工单已经有事件在队列里、处理中或在收件箱里等人;
    dead:有事件进了死信(要人查清后 --requeue-dead,定时任务不能绕过死信每天自动再试、再调模型)。"""
    with opened() as conn:
        replied = conn.execute("SELECT ticket_id FROM outbox").fetchall()
        ignored = conn.execute(
            "SELECT ticket_id FROM events WHERE status = 'ignored' AND ticket_id IS NOT NULL "
            "UNION SELECT ticket_id FROM review_log WHERE action IN ('ignore', 'notify')"
        ).fetchall()
        queued = conn.execute(
            "SELECT ticket_id, event_id FROM events "
            "WHERE status IN ('pending', 'processing', 'waiting_human') AND ticket_id IS NOT NULL"
        ).fetchall()
        dead = conn.execute(
            "SELECT DISTINCT ticket_id FROM events WHERE status = 'dead' AND ticket_id IS NOT NULL"
        ).fetchall()
    return {"replied": {r[0] for r in replied}, "ignored": {r[0] for r in ignored},
            "queued": {(r[0], r[1]) for r in queued}, "dead": {r[0] for r in dead}}


def report_numbers(recent_since: datetime | None = None) -> dict:
    """日报要的数,都从事件库来:各状态事件数、收件箱里等得最久的、死信、按类别的处理结果、模型用量。
    处理结果另外数一份 recent_since 以来的(看 edit 率是不是突然涨了)。"""
    with opened() as conn:
        by_status = conn.execute("SELECT status, COUNT(*) FROM events GROUP BY status").fetchall()
        oldest = conn.execute(
            # waiting_since 是空的:状态是别处直接改成 waiting_human 的(sqlite3 里手改、别的工具):按 updated_at 算,
            # 日报不能因为一行手改的数据就出 traceback
            "SELECT event_id, ticket_id, COALESCE(waiting_since, updated_at) AS waiting_since FROM events "
            "WHERE status = 'waiting_human' ORDER BY COALESCE(waiting_since, updated_at), event_id LIMIT 1"
        ).fetchone()
        dead = conn.execute(
            "SELECT event_id, last_error FROM events WHERE status = 'dead' ORDER BY updated_at, event_id"
        ).fetchall()
        reviews = conn.execute("SELECT category, action, feedback, created_at FROM review_log ORDER BY category").fetchall()
        usage = conn.execute(
            "SELECT COUNT(*) AS calls, COALESCE(SUM(input_tokens), 0) AS input_tokens, "
            "COALESCE(SUM(output_tokens), 0) AS output_tokens, "
            "COUNT(DISTINCT COALESCE(event_id, 'ticket:' || ticket_id)) AS events FROM llm_usage"
        ).fetchone()
    return {"by_status": {r[0]: int(r[1]) for r in by_status}, "oldest_waiting": dict(oldest) if oldest else None,
            "dead": [dict(r) for r in dead], "outcomes": _outcomes_by_category(reviews, recent_since),
            "usage": {k: int(usage[k]) for k in ("calls", "input_tokens", "output_tokens", "events")}}


NOTIFIED = "(通知)"  # _outcomes_by_category 里通知类待办那一行的类别名;排在各个类别后面


def _outcomes_by_category(reviews, recent_since: datetime | None) -> list[dict]:
    """review_log 按类别数:accept / edit / ignore 各几张(每张工单最后是其中一种);responded 是其中提过意见重写的张数,
    response 是 feedback 里意见的总条数(重写了几轮);
    recent_tickets / recent_edit 是 recent_since 以来的张数和 edit 数。通知类待办(notify)没有草稿可批,
    不算进任何一类,只数总共几条(类别名 NOTIFIED)。
    在 Python 里数而不是用 SQL 的 JSON 函数:SQLite 和 PostgreSQL 的写法不一样。"""
    out: dict[str, dict] = {}
    for category, action, feedback, created_at in reviews:
        if action == "notify":
            category = NOTIFIED
        o = out.setdefault(category, {"category": category, "tickets": 0, "accept": 0, "edit": 0, "ignore": 0,
                                      "responded": 0, "response": 0, "recent_tickets": 0, "recent_edit": 0})
        o["tickets"] += 1
        if action in ("accept", "edit", "ignore"):
            o[action] += 1
        if recent_since and parse_time(created_at) >= recent_since:
            o["recent_tickets"] += 1
            o["recent_edit"] += action == "edit"
        try:
            rounds = len(json.loads(feedback or "[]"))
        except (ValueError, TypeError):
            rounds = 0  # feedback 不是合法 JSON:这一行的意见不算
        o["response"] += rounds
        o["responded"] += rounds > 0
    return sorted(out.values(), key=lambda o: o["category"] == NOTIFIED)


USAGE = ("用法:uv run python store.py               建好缺的库,打印各表行数\n"
         "      uv run python store.py --from-sqlite  (设了 DATABASE_URL 时)另外把 EVENTS_DB、CHECKPOINTS_DB 里的"
         "事件、发件箱、审核记录和 checkpoint 搬进 PostgreSQL")


def main(args: list[str] = ()) -> int:
    args = list(args)
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args not in ([], ["--from-sqlite"]):  # 写错的选项、多余的词:说明一下,不建库
        print(f"store.py 不认识这些参数:{' '.join(args)}\n{USAGE}", file=sys.stderr)
        return 2
    if args and dialect() != "postgres":
        print("--from-sqlite 是把 SQLite 里的东西搬进 PostgreSQL:先设好 DATABASE_URL=postgresql://…(写进 .env 或 export)"
              "再运行。什么都没做", file=sys.stderr)
        return 2
    try:
        return build_and_count(from_sqlite=bool(args))
    except unavailable_errors() as e:  # PostgreSQL 重启、连接被掐断;SQLite 被锁太久
        again = " --from-sqlite(已经建好的不会重建;这一次什么都没搬)" if args else "(已经建好的不会重建)"
        print(f"{unavailable(e)},稍后再运行 uv run python store.py{again}", file=sys.stderr)
        return 1


def build_and_count(from_sqlite: bool = False) -> int:
    """建库(已有就不动);from_sqlite 时再把 SQLite 事件库和 checkpoint 搬进 PostgreSQL;打印每张表的行数。"""
    init()
    if dialect() == "postgres":  # 业务表也在这个库里
        # checkpoint 的表也在这时建好:库的所有者运行一次 store.py,之后只有读写权限的用户也能运行 worker 和收件箱
        open_checkpointer(durable=True)[1].close()
        url = _safe_url(database_url())
        if source := build_biz_tables():
            print(f"已在 {url} 新建业务表 customers、tickets({source})")
        elif problem := biz_db_problem(hint=False):  # 只剩半套(有人删了一张):不在上面补,说清楚
            print(f"{problem}。没有动它:确定剩下的那张业务表没用了(不是别的程序的),才把它也删掉(DROP TABLE)再运行 "
                  "uv run python store.py,就会新建一套", file=sys.stderr)
            return 2
        if from_sqlite:
            try:
                done, not_marked = move_from_sqlite()
            except MoveRefused as e:
                print(f"没有搬:{e}", file=sys.stderr)
                return e.code
            print(done)
            if not_marked is None:
                print(f"{events_db()} 里记下了已搬进 PostgreSQL:以后不设 DATABASE_URL 的程序都会说明原因、不用它,"
                      "还开着的 SQLite worker 也领不到事件了,同一张工单不会在两边各处理一遍")
            else:  # PostgreSQL 已经提交了:搬家本身成功,只是 SQLite 挡不住了
                print(f"没能在 {events_db()} 里记下已搬走({not_marked}):修好以后再运行一次 uv run python store.py "
                      "--from-sqlite 补上这个记号(不会再搬一遍);在那之前一定设着 DATABASE_URL 运行,"
                      "别再不设它跑 worker 或收件箱,不然同一张工单会在两边各处理一遍", file=sys.stderr)
        where = {"事件库": (url, None), "业务库": (url, None)}
    else:
        biz = biz_db()
        if not biz.exists() or biz.stat().st_size == 0:  # 空文件(touch 出来的)里什么都没有,建在它上面不丢东西
            if role := other_lab_db(biz, set()):
                print(not_biz_db(biz, role), file=sys.stderr)
                return 2
            if build_biz_db(biz):
                print(f"已新建业务库 {biz}")
        elif problem := biz_db_problem(hint=False):
            print(problem + biz_advice(problem), file=sys.stderr)
            return 2
        where = {"事件库": (events_db(), None), "业务库": (biz, biz)}
    tables = {"事件库": ("events", "outbox", "review_log", "llm_usage"), "业务库": tuple(BIZ_COLUMNS)}
    for label, (shown, path) in where.items():
        print(f"{label} {shown}:" + ",".join(f"{t} {n} 行" for t, n in counts(path, tables[label]).items()))
    if dialect() == "postgres" and not from_sqlite and (note := sqlite_note()):
        print(note)
    return 0


if __name__ == "__main__":
    config.run(main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
