"""给 store.py 的 init() 用:打开一个已经有的库时,先看它是不是这里的库、结构对不对。照课文建的旧事件库补上后加的列、
把本地时间换成 UTC;EVENTS_DB 指到了业务库或 checkpoint 库、同名的表却是别人建的(做练习时自己建的 review_log、
PostgreSQL 上存时间的列是 TEXT)时一行说清楚、什么都不动;PostgreSQL 上表都建好时不执行 DDL,
只有读写权限的用户也能运行,缺权限时说缺哪张表的。课文的 init() 只会 CREATE TABLE IF NOT EXISTS,
旧库和别人的表它都不管。"""
import shlex
from datetime import datetime

import store
import store_biz
import store_errors
import store_events


# 旧库缺的列({表: {列: 类型}},类型里的 {time} 同 SCHEMA):init() 补上,已有数据不动。SQLite 的事件表缺前四列是照课文
# 建的库;review_log.reviewer(谁做的决定)和 llm_usage.duration_ms(一次模型调用多久)是收件箱网页和 show 用的
ADDED_COLUMNS = {
    "events": {"not_before": "{time}", "ticket_id": "TEXT", "claimed_by": "TEXT", "waiting_since": "{time}"},
    "review_log": {"reviewer": "TEXT"},
    "llm_usage": {"duration_ms": "INTEGER"},
}
# PostgreSQL 上的表是这里建的(练习 6),不缺课文那几列,只可能缺这几个。查到缺了才 ALTER TABLE(它拿整张表的排它锁,
# 会和正在领事件的 worker 互相等)
PG_ADDED_COLUMNS = (("events", "waiting_since"), ("review_log", "reviewer"), ("llm_usage", "duration_ms"))
# 当前 schema 里已有的表和索引(PostgreSQL 的 CREATE … IF NOT EXISTS 在 current_schema() 里建、查,这里也只看它)
PG_OBJECTS = ("SELECT relname FROM pg_class "
              "WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())")
# init() 建的表和索引(SCHEMA、ONE_PROCESSING_PER_TICKET);加一张表时这里也要加,tests/test_store.py 核对两边一致
SCHEMA_OBJECTS = frozenset({"events", "events_status", "events_one_processing_per_ticket", "outbox", "review_log",
                            "inbox_seen", "llm_usage"})
# SCHEMA 里每张表的列。事件表缺的列 init() 会补;别的表早就有、却缺列的,是别人建的(见 foreign_table)
TABLE_COLUMNS = {
    "events": frozenset({"event_id", "source", "kind", "payload", "status", "attempts", "last_error", "received_at",
                         "updated_at", "not_before", "ticket_id", "claimed_by", "waiting_since"}),
    "outbox": frozenset({"id", "ticket_id", "body", "sent_by", "sent_at"}),
    "review_log": frozenset({"ticket_id", "category", "draft", "final", "action", "feedback", "created_at", "reviewer"}),
    "inbox_seen": frozenset({"ticket_id", "viewer", "draft_sha", "seen_at"}),
    "llm_usage": frozenset({"id", "event_id", "ticket_id", "model", "input_tokens", "output_tokens", "created_at",
                            "duration_ms"}),
}
# 每张表里存时间的列(SCHEMA 里的 {time}):PostgreSQL 上它们必须是 TIMESTAMPTZ。照课文自己建、列名都对却用了 TEXT 的,
# 写进去的是字符串、比较的是字符串,领取时和 now() 一比就是 DatatypeMismatch
TIME_COLUMNS = {"events": frozenset({"received_at", "updated_at", "not_before", "waiting_since"}),
                "outbox": frozenset({"sent_at"}), "review_log": frozenset({"created_at"}),
                "inbox_seen": frozenset({"seen_at"}), "llm_usage": frozenset({"created_at"})}
PG_TIME_TYPE = "timestamp with time zone"  # format_type() 对 TIMESTAMPTZ 的叫法
# 补上 waiting_since 时,已经在收件箱里的待办从 updated_at 算起:不补的话之后有人 respond 一下,
# set_status 就把「现在」当成进收件箱的时刻,等了 50 小时的显示 0 小时
BACKFILL_WAITING_SINCE = "UPDATE events SET waiting_since = updated_at WHERE status = 'waiting_human'"


def not_events_db(conn) -> str | None:
    """EVENTS_DB 指到了这个实验的业务库或 checkpoint 库(没有事件表,却有它们的表)时给人看的一行:init() 不在别的库里
    建事件表、不把它改成 WAL。反方向(BIZ_DB 指到事件库)见 store_biz.other_lab_db。"""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "events" in tables:
        return None
    if found := sorted(tables & set(store_biz.BIZ_COLUMNS)):
        role = "业务库"
    elif found := sorted(tables & {"checkpoints", "writes"}):
        role = "checkpoint 库"
    else:
        return None
    return (f"EVENTS_DB 指的 {store.events_db()} {store_biz.being(role)}(里面有 {'、'.join(found)} 表、没有 events 表),不是事件库:没有动它。"
            "让 EVENTS_DB 指到事件库(不设就是脚本旁边的 ambient.db)")


def pg_objects(conn) -> set[str]:
    return {r[0] for r in conn.execute(PG_OBJECTS)}


def pg_nothing_to_build(conn) -> bool:
    """PostgreSQL 上 init() 要建的表、索引和后加的列是不是都在了,而且这个连接能写。
    只能读(备库、default_transaction_read_only)时照旧走建表那条路:PG_DDL_REFUSALS 一行说清楚,
    而不是等到第一次写(领事件、收信)时才出错。"""
    return (SCHEMA_OBJECTS <= pg_objects(conn) and not pg_missing_columns(conn)
            and conn.execute(PG_READ_ONLY).fetchone()[0] == "off")


def pg_missing_columns(conn) -> list[tuple[str, str]]:
    """PostgreSQL 上还没补的后加列(PG_ADDED_COLUMNS 里的 (表, 列))。"""
    have = {(r[0], r[1]) for r in conn.execute(PG_TABLE_COLUMNS, ([t for t, _ in PG_ADDED_COLUMNS],)).fetchall()}
    return [pair for pair in PG_ADDED_COLUMNS if pair not in have]


def pg_add_columns(conn) -> None:
    """补上 PostgreSQL 上缺的后加列,在调用者的事务里;新补的 waiting_since 从 updated_at 填。"""
    for table, column in pg_missing_columns(conn):
        kind = ADDED_COLUMNS[table][column].format(**store.DIALECTS["postgres"])
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        if column == "waiting_since":
            conn.execute(BACKFILL_WAITING_SINCE)


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
    ours = [*SCHEMA_OBJECTS, *store_biz.BIZ_COLUMNS, "invoices", *CHECKPOINT_TABLES]
    if missing := [r[0] for r in conn.execute(PG_MISSING_RIGHTS, (ours,))]:
        user, schema = conn.execute("SELECT quote_ident(current_user), quote_ident(current_schema())").fetchone()
        raise SystemExit(f"DATABASE_URL 的用户 {user} 对表 {'、'.join(missing)} 没有读写权限(程序要 SELECT、INSERT、UPDATE、"
                         f"DELETE):请库的所有者执行 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} "
                         f"TO {user}。什么都没做")


# PostgreSQL 上当前 schema 里这几张表(ANY(?))各有哪些列。查 pg_attribute,不查 information_schema.columns:
# 后者只列出这个用户有权限的列
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
    没有要补的:做练习 6 时照课文自己建的 events(没有 ticket_id、claimed_by……)和别的程序的业务表都算。
    PostgreSQL 上列都在、存时间的列却是 TEXT(照课文的 SQLite 建表语句搬过去的)也算:领取时和 now() 比不了。"""
    if store.dialect() == "postgres":
        tables = {**{t: columns - {c for table, c in PG_ADDED_COLUMNS if table == t} for t, columns in TABLE_COLUMNS.items()},
                  **{t: frozenset(columns) for t, columns in store_biz.BIZ_COLUMNS.items()}}
        have: dict[str, set] = {}
        typed: dict[str, dict[str, str]] = {}
        for table, column, kind in conn.execute(PG_TABLE_COLUMNS, (list(tables),)).fetchall():
            have.setdefault(table, set()).add(column)
            typed.setdefault(table, {})[column] = kind
        where, whose = f"{store_errors._safe_url(store.database_url())} 里", "多半是自己做练习时建的,或者是别的程序的"
        rename = "ALTER TABLE {table} RENAME TO my_{table}(或者换一个 schema)"
    else:
        tables = {t: columns - set(ADDED_COLUMNS.get(t, ())) for t, columns in TABLE_COLUMNS.items() if t != "events"}
        have = {t: {r["name"] for r in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
        path = shlex.quote(str(store.events_db()))
        where, whose = f"事件库 {store.events_db()} 里", "多半是自己做练习时建的"
        rename = f"比如 sqlite3 {path} 'ALTER TABLE {{table}} RENAME TO my_{{table}}'"
    for table, wanted in tables.items():
        if not have.get(table):
            continue
        if missing := wanted - have[table]:
            wrong = f"缺 {'、'.join(sorted(missing))} 列"
        elif store.dialect() == "postgres" and (off := {c: typed[table][c] for c in sorted(TIME_COLUMNS.get(table, ()))
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
    return columns_of(conn, "events")


def columns_of(conn, table: str) -> set[str]:
    return {r["name"] for r in conn.execute(f"PRAGMA table_info({table})")}


def missing_columns(conn) -> list[tuple[str, str]]:
    """SQLite 事件库里还没补的后加列(ADDED_COLUMNS 里的 (表, 列))。"""
    return [(table, column) for table, added in ADDED_COLUMNS.items()
            for column in added.keys() - columns_of(conn, table)]


def upgrade_tables(conn) -> None:
    """SQLite 事件库缺的列(ADDED_COLUMNS)补上,在调用者的事务里。照课文建的库(没有 ticket_id)再换时间格式、
    补 ticket_id;新补上的 waiting_since 最后从(换好格式的)updated_at 填。"""
    have = events_columns(conn)
    for table, column in missing_columns(conn):
        kind = ADDED_COLUMNS[table][column].format(**store.DIALECTS["sqlite"])
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    if "ticket_id" not in have:
        upgrade_lesson_db(conn)
    if "waiting_since" not in have:
        conn.execute(BACKFILL_WAITING_SINCE)


# 课文的 ambient.db 里有时间的列;它们存的是本地时间、精确到秒、不带时区
# (not_before 是课文练习 3 让加的列,照课文的 now() 写的也是本地时间:不换的话,东八区的机器上失败重试的事件要多等 8 小时)
LESSON_TIME_COLUMNS = {"events": ("received_at", "updated_at", "not_before"), "outbox": ("sent_at",)}
# 课文的库没有「同一张工单最多一个 processing」的约束,两个 worker(课文说 cron 里的 --once 可以重叠)被杀掉后,
# 同一张工单可能留下两个 processing 的事件,唯一索引就建不起来。升级时每张工单只留最早领的那个,别的放回队列
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
                             [(store.stamp(datetime.fromisoformat(r[1])), r[0]) for r in old])
    events = conn.execute("SELECT event_id, payload FROM events WHERE ticket_id IS NULL").fetchall()
    conn.executemany("UPDATE events SET ticket_id = ? WHERE event_id = ?", [(store_events.ticket_of(r[1]), r[0]) for r in events])
    conn.execute(LESSON_EXTRA_PROCESSING)
