"""事件表和发件箱:三种触发源(webhook、邮件、定时任务)只往 events 里写一行,worker 领事件、跑图;
发给客户的回复写进 outbox(今天不真的发邮件,写进这张表就算发出去了)。

运行:uv run python store.py                建好缺的库,打印各表行数(可以反复运行,见 store_cli.py)
     uv run python store.py --from-sqlite  设了 DATABASE_URL 时,把 SQLite 里的一切搬进 PostgreSQL(见 store_move.py)
你会看到:
    已新建业务库 /…/cloudledger.db
    事件库 /…/ambient.db:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行
    业务库 /…/cloudledger.db:customers 30 行,tickets 42 行,invoices 55 行
"""
import json
import sqlite3
import sys
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import config
import store_cli
import store_errors
import store_events
import store_move
import store_pg
import store_sqlite
import store_upgrade


HERE = config.HERE


def events_db() -> Path:
    return config.path("EVENTS_DB", "ambient.db")


def biz_db() -> Path:
    return config.path("BIZ_DB", "cloudledger.db")


def checkpoints_db() -> Path:
    return config.path("CHECKPOINTS_DB", "checkpoints.db")


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
    created_at  {time} NOT NULL,
    reviewer    TEXT                        -- 谁做的决定:网页上登录的人,命令行是 INBOX_USER(没设是「登录名@主机名」)
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
    created_at  {time} NOT NULL,
    duration_ms INTEGER                     -- 这次调用用了多久(毫秒):show 一张工单时看慢在哪
);
"""
# 同一张工单同时最多一个事件在 processing:两个 worker 同时挑事件时,谁都看不见对方还没提交的领取(PostgreSQL 的
# READ COMMITTED),CLAIM_SQL 里的 NOT IN 挡不住;这个唯一索引让后到的等先到的提交,再报冲突,claim() 重新挑一次。
# 收件箱拿走待办(take_for_review)也受它约束。init() 在补完旧库缺的列之后建。
ONE_PROCESSING_PER_TICKET = """
CREATE UNIQUE INDEX IF NOT EXISTS events_one_processing_per_ticket ON events (ticket_id) WHERE status = 'processing'
"""


def now() -> str:
    """UTC、微秒、固定宽度:2026-11-30T05:03:25.123456+00:00。字符串比较和时间先后一致。"""
    return stamp(datetime.now(timezone.utc))


def stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def minutes_from_now(minutes: float) -> str:
    return stamp(datetime.now(timezone.utc) + timedelta(minutes=minutes))


def parse_time(value) -> datetime:
    """库里的时间。不带时区的(照课文的 now() 写的:本地时间)按这台机器的时区换成 UTC,和 upgrade_lesson_db 一样,
    才能和带时区的比较。"""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.astimezone(timezone.utc)


def connect(path: Path | str | None = None, *, durable: bool = True):
    """打开一个连接(默认事件库)。autocommit 模式:单条语句自己就是一个事务,多条用 transaction()。
    PostgreSQL 时返回一个接口和 sqlite3 连接一样的包装(? 占位符、按列名取值)。用完调 release():
    SQLite 的连接留给这个线程下次用(store_sqlite.KeptConnection),PostgreSQL 的还回连接池。

    durable=True(默认):每次提交都等落盘(SQLite synchronous=FULL,PostgreSQL synchronous_commit=on)。
    外面送进来的东西(webhook / 邮件 / cron 的事件)、发出去的回复、审核记录都这样写:回了 202 的事件断电也在。
    durable=False:提交不等落盘,只给 worker 自己的记账用 —— 领取、改状态、交回、记用量。
    进程被 kill -9 时它们一样一个不丢;只有数据库所在的机器断电、或者 PostgreSQL 服务器崩溃时,
    最后几百毫秒的这种提交可能没了:事件退回更早的状态(pending / processing),按平常的规则被放回队列、
    从 checkpoint 续跑,发件箱的 UNIQUE 保证回复不会发两次。和 checkpoint 是同一个取舍。
    两种提交写的是同一个 WAL,后面任何一次等落盘的提交都会把前面的一起落盘。每个事件省 3 次等盘(bench/worker.py)。"""
    if dialect(path) == "postgres":  # 练习 6
        return store_pg.PgConnection(store_pg._pg_pool(database_url(), durable))
    return store_sqlite.kept_connection(path, durable)


@contextmanager
def opened(path: Path | str | None = None, *, durable: bool = True):
    """with opened() as conn:用完就 release() 的连接。durable 见 connect()。"""
    conn = connect(path, durable=durable)
    try:
        yield conn
    finally:
        conn.release()


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
                conn.execute(f"PRAGMA busy_timeout = {int(config.value('BUSY_TIMEOUT_S') * 1000)}")


def init() -> None:
    """建事件库的表(已存在就不动),并把旧版库缺的列补上。几个进程同时 init 也没关系。"""
    if dialect() == "postgres":  # 练习 6
        store_pg.init_postgres()
        return
    try:
        with opened() as conn:
            if role := store_upgrade.not_events_db(conn):  # 在改成 WAL、建表之前:别人的库一点都不动
                raise SystemExit(role)
            store_sqlite.use_wal(conn)  # 写进库文件,之后每个连接都是 WAL;不能放在事务里
            if moved := store_move.moved_to(conn):  # 每个程序都先 init():用一个已经搬走的库,在这里说清楚,什么都还没做
                raise SystemExit(store_move.moved_away(events_db(), *moved))
            if problem := store_upgrade.foreign_table(conn):
                raise SystemExit(problem)
            conn.executescript(SCHEMA.format(**DIALECTS["sqlite"]))
            missing = store_upgrade.missing_columns(conn)
    # 每个程序都先 init():路径设错了、指到了不是数据库的文件(DatabaseError),在这里一行说清楚,什么都还没做
    except sqlite3.DatabaseError as e:
        raise SystemExit(store_errors.cannot_open("事件库", "EVENTS_DB", events_db(), e)) from None
    if not missing:
        # 表已经是最新的(平常都是):不拿写锁。别人长时间占着写锁时,只读的 report、inbox list 照样能用;
        # 索引已经有了时这条语句什么都不做,也不要写锁
        with opened() as conn:
            conn.execute(ONE_PROCESSING_PER_TICKET)
        return
    with transaction() as conn:
        store_upgrade.upgrade_tables(conn)
        conn.execute(ONE_PROCESSING_PER_TICKET)


def add_event(event_id: str, source: str, kind: str, payload: str) -> bool:
    """返回 True 表示新事件,False 表示重复投递(已经收过)。"""
    return store_events.add_events([(event_id, source, kind, payload)])[0]


def set_status(event_id: str, status: str, error: str | None = None, *, not_before: str | None = None,
               owner: str | None = None, claimed_at=None, expect: str | None = None) -> bool:
    """改状态,返回改没改成。给了 owner 时只改「还在这个进程手里」的事件:卡住被放回队列、又被别人领走的,不去覆盖;
    再给了 claimed_at(领取时 claim() 返回的 updated_at)时只改这一次领取的:同一个进程的另一个处理线程
    又领走了它时(owner 一样),慢的那个线程不去覆盖;给了 expect 时只在当前状态是它的时候才改。进收件箱(waiting_human)时记下 waiting_since,已经记过的不改:
    respond 重写、收件箱命令失败交回 worker 续跑、之后再回到收件箱,客户一直在等,日报的「等得最久」不从零算。"""
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


# ---- 练习 4:review_log,人改了什么 ----
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
        "INSERT INTO review_log (ticket_id, category, draft, final, action, feedback, created_at, reviewer) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ticket_id) DO NOTHING",
        (ticket_id, review["category"], review["draft"], review.get("final"), review["action"],
         json.dumps(review.get("feedback", []), ensure_ascii=False), now(), review.get("reviewer")),
    )


def record_ignore(ticket_id: str, review: dict) -> None:
    """review["action"] 是 ignore,或者 notify(通知类待办看过了)。"""
    with transaction() as conn:
        record_review(conn, ticket_id, {**review, "final": None})


# ---- 练习 6:PostgreSQL(设了 DATABASE_URL 时)----
def database_url() -> str:
    return config.get("DATABASE_URL")


def dialect(path: Path | str | None = None) -> str:
    """path(一个 SQLite 文件)之外的库用哪种数据库:事件库,设了 DATABASE_URL 时还有业务库(见 biz_target())。"""
    return "postgres" if path is None and database_url() else "sqlite"


def biz_target() -> Path | None:
    """业务库在哪,给 connect() / opened() / transaction():设了 DATABASE_URL 时是同一个 PostgreSQL 库(None),
    几台机器上的 worker 都读得到邮件轮询建的工单;否则是 BIZ_DB 指的 SQLite 文件(课文的 cloudledger.db)。"""
    return None if database_url() else biz_db()


# 两种数据库只在这里不一样。SQLite 是默认;设了 DATABASE_URL=postgresql://… 就换成 PostgreSQL(练习 6)。
DIALECTS = {
    "sqlite": {
        "time": "TEXT",                                          # 没有时间类型:统一格式的字符串
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "begin": "BEGIN IMMEDIATE",                              # 一开始就拿写锁
    },
    "postgres": {
        "time": "TIMESTAMPTZ",
        "serial": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "begin": "BEGIN",
    },
}


if __name__ == "__main__":
    config.run(store_cli.main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
