"""store.py --from-sqlite:一直用 SQLite、现在换到 PostgreSQL(练习 6)时,
把事件库和 checkpoint 库里的全部东西在一个事务里搬过去,等人审的待办在那边照样 accept、做了一半的图接着跑;
搬完在 SQLite 库里记下已搬走、不再收写入,同一张工单不会在两边各处理一遍。搬不了(有事件正在处理、已经搬过、
两个文件不是一套)时说明原因、什么都不搬。课文的练习 6 是从空库开始的,不用搬。"""
import sqlite3
from pathlib import Path

import store
import store_biz
import store_errors
import store_pg
import store_upgrade


# 事件库里要搬的表和列。自增的 id 不搬:PostgreSQL 自己编号(别处没有引用它)
MOVED_COLUMNS = {
    "events": ("event_id", "source", "kind", "payload", "status", "attempts", "last_error", "received_at",
               "updated_at", "not_before", "ticket_id", "claimed_by", "waiting_since"),
    "outbox": ("ticket_id", "body", "sent_by", "sent_at"),
    "review_log": ("ticket_id", "category", "draft", "final", "action", "feedback", "created_at", "reviewer"),
    "inbox_seen": ("ticket_id", "viewer", "draft_sha", "seen_at"),
    "llm_usage": ("event_id", "ticket_id", "model", "input_tokens", "output_tokens", "created_at", "duration_ms"),
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
    """要搬的东西 PostgreSQL 里已经一样不少(already_moved):只在 SQLite 里补上已搬走的记号。消息是「N 个事件、M 个 checkpoint」。"""


def thread_id(ticket_id: str) -> str:
    """一张工单一个 LangGraph thread,id 是 ticket-<工单号>(agent.thread_of 用它;搬家时拿它核对两个文件是不是一套)。"""
    return f"ticket-{ticket_id}"


def moved_to(conn) -> tuple[str, str] | None:
    """这个 SQLite 事件库搬进了哪个 PostgreSQL、什么时候搬的(「2026-12-02 01:23:45 UTC」);没搬过是 None。"""
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
    """CHECKPOINTS_DB 里所有 thread 的全部 checkpoint(带着 pending writes),同一个 thread 里旧的在前。"""
    path = store.checkpoints_db()
    if not path.exists() or path.stat().st_size == 0:
        return []
    from langgraph.checkpoint.sqlite import SqliteSaver

    try:
        with store.opened(path) as conn:
            return list(reversed(list(SqliteSaver(conn).list(None))))  # list() 给的是新的在前
    except sqlite3.DatabaseError as e:
        raise MoveRefused(2, f"{path} 打不开:{store_errors.first_line(e)}。什么都没搬") from None


def move_from_sqlite() -> tuple[str, str | None]:
    """把 EVENTS_DB、CHECKPOINTS_DB 里的全部事件、发件箱、审核记录、看过的草稿、用量和每个 thread 的全部 checkpoint
    搬进 DATABASE_URL 指的 PostgreSQL,一个事务:要么全搬过去,要么什么都没搬。从读到写完一直拿着 SQLite 事件库的写锁
    (搬过去的就是读到的),PostgreSQL 提交之后在同一个 SQLite 事务里记下已搬走(RETIRE_SQL)。
    搬不了时抛 MoveRefused;SQLite 被锁太久时抛 sqlite3.OperationalError。PostgreSQL 里已经一样不少(上一次在两个提交
    之间被杀掉了,见 already_moved)时只补上 SQLite 的记号。返回 (给人看的一行, None);PostgreSQL 已经提交、
    SQLite 却没能记下时,第二项是 SQLite 的错误。"""
    path = store.events_db()
    if not path.exists() or path.stat().st_size == 0:
        raise MoveRefused(2, f"没有可搬的:EVENTS_DB 指的 {path} 不存在")
    done = None
    try:
        with store.transaction(path) as source:
            if "ticket_id" in store_upgrade.events_columns(source):
                # 上一版的库(升级以后还没有程序用 SQLite 打开过它)只缺后加的列:顺手补上,和 init() 一样。
                # 照课文建的库仍然请人先在 SQLite 上运行一次 store.py(sqlite_rows_to_move 里说)
                store_upgrade.upgrade_tables(source)
            moved, checkpoints = sqlite_rows_to_move(source, path), sqlite_checkpoints()
            tickets = source.execute("SELECT DISTINCT ticket_id FROM events WHERE ticket_id IS NOT NULL").fetchall()
            threads = {t.config["configurable"]["thread_id"] for t in checkpoints}
            if strays := sorted(threads - {thread_id(r[0]) for r in tickets}):
                # 搬过去的话,这几个 thread 在 PostgreSQL 里没人认领,以后同一张工单来了新事件,反倒接着旧进度跑
                raise MoveRefused(2, f"{store.checkpoints_db()} 里有 {len(strays)} 个 thread 在 {path} 里没有对应的事件"
                                     f"({'、'.join(strays[:5])}):两个文件不是同一套 —— EVENTS_DB、CHECKPOINTS_DB 指错了,"
                                     "或者拷事件库时漏了旁边的 -wal 文件(拷之前先停掉所有程序,连 -wal 一起拷)。什么都没搬")
            waiting = source.execute("SELECT DISTINCT ticket_id FROM events WHERE status = 'waiting_human' "
                                     "ORDER BY ticket_id").fetchall()
            if lost := [r[0] for r in waiting if thread_id(r[0]) not in threads]:
                # 反过来也不行:收件箱里的待办靠 checkpoint 才能 accept。CHECKPOINTS_DB 写错了(文件不在就是一个
                # checkpoint 都没有)时搬过去的待办只能 restart、再调一次模型重新起草
                raise MoveRefused(2, f"{path} 的收件箱里有 {len(lost)} 条待办({'、'.join(lost[:5])}),"
                                     f"{store.checkpoints_db()} 里却没有它们的 checkpoint:CHECKPOINTS_DB 指错了(文件不在,"
                                     "或者是另一套);把它改成 worker 起草时用的那个再搬。什么都没搬")
            url = store_errors._safe_url(store.database_url())
            try:
                done = f"已从 {path}、{store.checkpoints_db()} 搬进 {url}:{copy_to_postgres(moved, checkpoints)}"
            except AlreadyMoved as e:
                done = (f"{path} 里的 {e} 已经都在 {url} 里了(搬过一次,只是没来得及在 {path} 里记下已搬走):"
                        "这次什么都没再搬,只补上这个记号")
            source.execute(RETIRE_SQL[0])
            source.execute(RETIRE_SQL[1], (url, store.now()))
            for statement in RETIRE_SQL[2:]:
                source.execute(statement)
    except sqlite3.Error as e:
        if done is not None:  # PostgreSQL 那边已经提交了(或者早就有了)
            return done, store_errors.first_line(e)
        if isinstance(e, sqlite3.OperationalError):  # 被别人锁着太久、磁盘出错:稍后再搬
            raise
        raise MoveRefused(2, f"{path} 打不开:{store_errors.first_line(e)}。什么都没搬") from None
    return done, None


def copy_to_postgres(moved: dict[str, list], checkpoints: list) -> str:
    """在一个 PostgreSQL 事务里写进 moved(表 → 行)和 checkpoints;返回给人看的行数。冲突时抛 MoveRefused;
    要搬的那边已经一样不少时抛 AlreadyMoved,什么都不写。"""
    import psycopg

    threads = sorted({t.config["configurable"]["thread_id"] for t in checkpoints})
    saver, pool = store_pg.open_checkpointer(durable=True)  # 先让 LangGraph 建好 checkpoint 的表
    try:
        with pool.connection() as conn, conn.transaction():
            target = store_pg.PgConnection(None, raw=conn)
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
        raise MoveRefused(2, f"有一行搬不进 PostgreSQL({store_errors.first_line(e)}):什么都没搬") from None
    except psycopg.IntegrityError as e:  # 发件箱、审核记录里同一张工单两边都有(PostgreSQL 上已经处理过它)
        raise MoveRefused(2, f"PostgreSQL 里已经有同样的记录({store_errors.with_detail(e)}):什么都没搬") from None
    finally:
        pool.close()
    counted = ",".join(f"{t} {len(rows)} 行" for t, rows in moved.items())
    counted += f";checkpoint {len(threads)} 个 thread({len(checkpoints)} 个 checkpoint)"
    return counted + (f";从 {store.biz_db()} 补上 PostgreSQL 业务表里还没有的工单 {tickets} 张" if tickets else "")


def already_moved(target, events: list, checkpoints: list) -> bool:
    """SQLite 里的每个事件(同一个 id、同一个收到时间,精确到微秒)和每个 checkpoint(id 是 uuid)PostgreSQL 里都有:
    那边就是从这个库搬过去的那一套。只是事件 id 撞上了的另一套(两边都用 send_webhook.py 发过同样的事件)不算。"""
    at = MOVED_COLUMNS["events"].index("received_at")
    mine = {(r[0], store.parse_time(r[at])) for r in events}
    theirs = {(r["event_id"], store.parse_time(r["received_at"])) for r in target.execute(
        "SELECT event_id, received_at FROM events WHERE event_id = ANY(?)", (sorted(e for e, _ in mine),))}
    if mine != theirs:
        return False
    keys = {tuple(t.config["configurable"][k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")) for t in checkpoints}
    there = {(r["thread_id"], r["checkpoint_ns"], r["checkpoint_id"]) for r in target.execute(
        "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints WHERE thread_id = ANY(?)",
        (sorted({k[0] for k in keys}),))}
    return keys <= there


def copy_missing_tickets(target, ticket_ids: set[str]) -> int:
    """搬过去的事件要用的工单,PostgreSQL 的业务表里却没有的(业务表建好以后 SQLite 的邮件轮询才收进来的),
    从 BIZ_DB 拷过去,连同它们的客户;返回拷了几张。BIZ_DB 里也没有的(比如 T9999)照旧由 worker 判死信。"""
    there = {r["id"] for r in target.execute("SELECT id FROM tickets WHERE id = ANY(?)", (sorted(ticket_ids),))}
    path = store.biz_db()
    if not (missing := ticket_ids - there) or not path.exists() or path.stat().st_size == 0:
        return 0
    try:
        customers, tickets, _ = store_biz.sqlite_biz_rows(path)  # 发票不补:Agent 没有候选时照常起草
    except sqlite3.Error as e:
        raise MoveRefused(2, f"业务库 {path} 读不了({store_errors.first_line(e)}),搬过去的事件要用的工单"
                             f"({'、'.join(sorted(missing)[:5])})拷不过去。什么都没搬") from None
    tickets = [t for t in tickets if t[0] in missing]
    customers = [c for c in customers if c[0] in {t[1] for t in tickets}]
    for table, rows in (("customers", customers), ("tickets", tickets)):
        columns = store_biz.BIZ_COLUMNS[table]
        target.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                           "ON CONFLICT (id) DO NOTHING", rows)
    return len(tickets)


def sqlite_note() -> str:
    """设了 DATABASE_URL 时,store.py 最后关于 EVENTS_DB 那个 SQLite 库的一句提醒:里面还有 PostgreSQL 里没有的
    未完事件时说怎么搬;它搬进的是另一个 PostgreSQL 库时说搬去了哪里。没什么可说的(包括搬进的就是这个库)是空串。"""
    path = store.events_db()
    if not path.exists() or path.stat().st_size == 0:
        return ""
    try:
        with store.opened(path) as conn:
            if moved := moved_to(conn):
                url, moved_at = moved
                if same_database(url, store_errors._safe_url(store.database_url())):
                    return ""
                return (f"{path} 里的事件在 {moved_at} 搬进的是 {url},不是现在 DATABASE_URL 的这个库:"
                        "要接着处理搬过去的事件和待办,把 DATABASE_URL 改回那个库")
            ids = [r[0] for r in conn.execute(
                "SELECT event_id FROM events WHERE status IN ('pending', 'processing', 'waiting_human')")]
    except sqlite3.Error:
        return ""
    if not ids:
        return ""
    with store.opened() as conn:
        there = conn.execute("SELECT COUNT(*) FROM events WHERE event_id = ANY(?)", (ids,)).fetchone()[0]
    if not (left := len(ids) - there):
        return ""
    return (f"{path} 里还有 {left} 个没做完的事件(排队、等人审)不在 PostgreSQL 里:要在这边接着处理,"
            "停掉用 SQLite 的 worker、webhook、邮件轮询和收件箱,运行 uv run python store.py --from-sqlite")


def same_database(a: str, b: str) -> bool:
    """两个连接串是不是同一个库:服务器、库名和其余参数都一样,用户和密码不算(所有者搬的家,读写用户连的是同一个库)。"""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    def key(url: str) -> dict | str:
        try:
            return {k: v for k, v in conninfo_to_dict(url).items() if k not in ("user", "password")}
        except psycopg.ProgrammingError:  # 读不懂的(不会是 store.py 记下的):只认一模一样的
            return url
    return key(a) == key(b)
