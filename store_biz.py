"""业务库(云簿的客户和工单),给 store.py、agent.py 和邮件轮询用:课文直接用 Day 23 造好的 cloudledger.db,
这里没有它时从 cloudledger_seed.json 建一份(设了 DATABASE_URL 时建在 PostgreSQL 里),认出 BIZ_DB 指错了的库、
不去动它,还有邮件轮询用的查询:按发件地址找客户、邮件建工单(重跑得到同一个工单号)。发票表(invoices)是可选的:
agent.py 的 load 读客户名下的发票,Agent 分不清客户说的是哪一张时拿它们去问人;没有这张表的业务库(课文自己的那份)
照常能用,只是没有候选。"""
import json
import os
import sqlite3
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import config
import store
import store_errors
import store_pg
import store_sqlite


SEED_FILE = config.HERE / "cloudledger_seed.json"  # 业务库的种子数据:30 个客户、42 张工单、55 张发票

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
CREATE TABLE IF NOT EXISTS invoices (        -- 可选:没有它时 Agent 没有发票可列,照常起草
    id           TEXT PRIMARY KEY,               -- INV-2026-0123
    customer_id  TEXT NOT NULL REFERENCES customers(id),
    issued_on    TEXT NOT NULL,                  -- YYYY-MM-DD
    amount       NUMERIC(12, 2) NOT NULL,        -- 元
    title        TEXT NOT NULL,                  -- 抬头
    status       TEXT NOT NULL DEFAULT 'issued'  -- issued / void
);
"""


def ticket(ticket_id: str) -> dict | None:
    with store.opened(store.biz_target()) as conn:
        row = conn.execute(
            "SELECT id, customer_id, subject, body, status, created_at FROM tickets WHERE id = ?", (ticket_id,)
        ).fetchone()
    return dict(row) if row else None


BIZ_COLUMNS = {"customers": ("id", "name", "email", "company", "plan"),   # 业务表和这里用到的列(拷 SQLite 业务库时只取这些)
               "tickets": ("id", "customer_id", "subject", "body", "status", "created_at")}
INVOICE_COLUMNS = ("id", "customer_id", "issued_on", "amount", "title", "status")  # 可选的发票表:不在 BIZ_COLUMNS 里,缺了不算坏库


def seed_rows(today: date | None = None) -> tuple[list, list, list]:
    """cloudledger_seed.json 里的客户、工单和发票。工单的 created_at、发票的 issued_on = 今天 - age_days,所以哪天建都有新有旧。"""
    seed = json.loads(SEED_FILE.read_text(encoding="utf-8"))
    today = today or datetime.now(timezone.utc).date()

    def day(row: dict) -> str:
        return (today - timedelta(days=row["age_days"])).isoformat()
    return ([(c["id"], c["name"], c["email"].lower(), c["company"], c["plan"]) for c in seed["customers"]],
            [(t["id"], t["customer_id"], t["subject"], t["body"], t["status"], day(t)) for t in seed["tickets"]],
            [(i["id"], i["customer_id"], day(i), i["amount"], i["title"], i["status"]) for i in seed["invoices"]])


def fill_biz(conn, customers: list, tickets: list, invoices: list) -> None:
    """在 conn 上建业务表(连同发票表),填进这些客户、工单和发票。"""
    conn.executescript(BIZ_SCHEMA)
    tables = {**BIZ_COLUMNS, "invoices": INVOICE_COLUMNS}
    for (table, columns), rows in zip(tables.items(), (customers, tickets, invoices)):
        conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", rows)


INVOICES_SQL = "SELECT id, issued_on, amount, title, status FROM invoices WHERE customer_id = ? ORDER BY issued_on DESC, id"


def invoices(customer_id: str) -> list[dict]:
    """客户名下的发票,最近的在前:{id, issued_on, amount(两位小数的字符串), title, status}。
    业务库里没有发票表(课文自己的那份)时是空的:Agent 没有候选可列,照常起草。"""
    with store.opened(store.biz_target()) as conn:
        if not has_invoices(conn, store.biz_target()):
            return []
        rows = conn.execute(INVOICES_SQL, (customer_id,)).fetchall()
    return [{**dict(r), "issued_on": str(r["issued_on"])[:10], "amount": f"{Decimal(str(r['amount'])):.2f}"} for r in rows]


def has_invoices(conn, path: Path | None) -> bool:
    """conn(path 的库,见 store.dialect)里有没有发票表(PostgreSQL 上按 search_path 找)。"""
    if store.dialect(path) == "postgres":
        return conn.execute("SELECT to_regclass('invoices') IS NOT NULL").fetchone()[0]
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'invoices'").fetchone() is not None


BIZ_LOCK = 20261132  # advisory lock 的编号:几台机器同时第一次运行 store.py 时,只有一个建业务表、填数据
BIZ_TABLES_SQL = "SELECT to_regclass('customers') IS NOT NULL, to_regclass('tickets') IS NOT NULL"  # 按 BIZ_COLUMNS 的顺序;按 search_path 找


def build_biz_tables(today: date | None = None) -> str | None:
    """设了 DATABASE_URL 时:业务表一张都没有,就在 PostgreSQL 里建好,返回数据从哪来;有了(哪怕只有一张)什么都不动,
    返回 None(只有一张时 biz_db_problem() 说缺哪张,不在半套上补数据)。
    BIZ_DB 指的 SQLite 业务库在的话(Day 23 的库、之前用 SQLite 时邮件建的工单)拷它的客户和工单,不在才用种子数据。
    一个事务:建到一半不会留下半套;拷不过去(列不对、工单的客户不存在)时说明原因退出,业务表一张都不建
    (事件库的表在这之前已经建好:它们和业务库无关,哪个程序第一次用到都会建)。"""
    import psycopg

    path = store.biz_db()
    copy = path.exists() and path.stat().st_size > 0
    try:
        with store_pg.pg_refusing_ddl(), store.transaction() as conn:  # 不能建表的用户:一行说清楚请所有者运行 store.py
            conn.execute("SELECT pg_advisory_xact_lock(?)", (BIZ_LOCK,))
            if any(conn.execute(BIZ_TABLES_SQL).fetchone()):
                return None
            fill_biz(conn, *(sqlite_biz_rows(path) if copy else seed_rows(today)))
    except (sqlite3.Error, psycopg.IntegrityError, psycopg.DataError) as e:
        raise SystemExit(f"业务库 {path} 拷不进 PostgreSQL:{store_errors.with_detail(e)}。"
                         "业务表一张都没建:修好它,或者让 BIZ_DB 指到一个不存在的文件、改用种子数据") from None
    return f"从 {path} 拷过来" if copy else "种子数据"


def sqlite_biz_rows(path: Path) -> tuple[list, list, list]:
    """SQLite 业务库里的客户、工单和发票(只取这里用到的列;没有发票表时发票是空的)。NUL 去掉:PostgreSQL 的 TEXT 存不了它。"""
    with store.opened(path) as conn:
        tables = {**BIZ_COLUMNS, **({"invoices": INVOICE_COLUMNS} if has_invoices(conn, path) else {})}
        found = [[tuple(v.replace("\x00", "") if isinstance(v, str) else v for v in row)
                  for row in conn.execute(f"SELECT {', '.join(columns)} FROM {table}")]
                 for table, columns in tables.items()]
    return found[0], found[1], found[2] if len(found) > 2 else []


def build_biz_db(path: Path, today: date | None = None) -> bool:
    """从 cloudledger_seed.json 造业务库的 SQLite 文件(没设 DATABASE_URL 时)。返回 False:别的进程同时建好了,用的是它那份。"""
    # 建好再换上,建到一半崩了不会留下半个库。临时文件名带进程号:两个 store.py 同时第一次运行时,
    # 不会一个删掉另一个正写着的文件
    tmp = path.with_name(f"{path.name}.building-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        conn = sqlite3.connect(tmp)
    except sqlite3.OperationalError as e:  # 目录不存在、没有写权限:说清楚是哪一项设置,不要说成「数据库暂时用不了」
        raise SystemExit(store_errors.cannot_open("业务库", "BIZ_DB", path, e)) from None
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


def biz_db_problem(*, hint: bool = True) -> str | None:
    """业务库用不了时返回原因,能用返回 None。库文件不存在时不去连接(连接会顺手建一个空库)。
    只缺一部分表(不是还没建,store.py 不会替你重建)时,hint 让它接着说去运行 store.py:那里说怎么修。"""
    partly = "(运行 uv run python store.py,它说怎么修)" if hint else ""
    if store.dialect() == "postgres":
        with store.opened() as conn:
            have = conn.execute(BIZ_TABLES_SQL).fetchone()
        missing = [t for t, there in zip(BIZ_COLUMNS, have) if not there]
        if len(missing) == len(BIZ_COLUMNS):
            return f"业务库还没建:{store_errors._safe_url(store.database_url())} 里没有表 {'、'.join(missing)}(先运行 uv run python store.py 建库)"
        return f"业务库 {store_errors._safe_url(store.database_url())} 里没有表:{'、'.join(missing)}{partly}" if missing else None
    path = store.biz_db()
    if not path.exists():
        return f"业务库不存在:{path}(先运行 uv run python store.py 建库)"
    try:
        with store.opened(path) as conn:
            have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as e:
        return store_errors.cannot_open("业务库", "BIZ_DB", path, e)
    missing = [t for t in BIZ_COLUMNS if t not in have]
    if len(missing) == len(BIZ_COLUMNS) and (role := other_lab_db(path, have)):
        return not_biz_db(path, role)
    return f"业务库 {path} 里没有表:{'、'.join(missing)}{partly}" if missing else None


NOT_BIZ_DB = "不是业务库"  # other_lab_db() 认出来的那种:store.py 看到它就不说「删掉它」
POINT_BACK = "。没有动它:让 BIZ_DB 指到业务库(不设就是脚本旁边的 cloudledger.db)"


def biz_advice(problem: str) -> str:
    """store.py 在 biz_db_problem() 后面接的建议。BIZ_DB 多半是指错了(别的程序的库、笔记、目录、这个实验的事件库):
    先说指回去;只有「是 SQLite 库、只是没有业务表」时才提删掉重建,而且要先确定那个文件没用了。"""
    if NOT_BIZ_DB in problem:  # 它自己说了怎么办
        return ""
    if problem.startswith("业务库打不开"):  # 目录、不是数据库的文件:删掉它不是办法
        return POINT_BACK
    return POINT_BACK + ";确定这个文件没用了,才删掉它再运行 uv run python store.py,就会新建一份"


def other_lab_db(path: Path, tables: set[str]) -> str | None:
    """BIZ_DB 指到了这个实验的另一个库(事件库、checkpoint 库)时,说是哪一个:删掉它就删掉了全部事件和待办。
    路径一样也算:checkpoint 库还没建出来时(worker 还没跑过),业务库不能建在 CHECKPOINTS_DB 的位置上。"""
    here = store_sqlite.file_identity(path)
    for role, other, table in (("事件库", store.events_db(), "events"), ("checkpoint 库", store.checkpoints_db(), "checkpoints")):
        if table in tables or path == other or (here is not None and here == store_sqlite.file_identity(other)):
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
    with store.opened(store.biz_target()) as conn:
        row = conn.execute("SELECT id FROM customers WHERE lower(email) = ?", (address.lower(),)).fetchone()
    return row["id"] if row else None


MAIL_TICKET_SQL = "INSERT INTO tickets VALUES (?, ?, ?, ?, 'open', ?) ON CONFLICT (id) DO NOTHING"  # 列顺序见 BIZ_SCHEMA
SAME_MAIL_SQL = "SELECT 1 FROM tickets WHERE id = ? AND customer_id = ? AND subject = ? AND body = ?"


def add_mail_ticket(candidates: list[str], customer_id: str, subject: str, body: str, created_on: str) -> str:
    """邮件建工单,返回工单号。按顺序试 candidates:插进去了,或者已有的那张就是这封邮件(同客户、同主题、
    同正文,也就是上次存过了)→ 用它;已有的是另一封邮件(工单号撞了)→ 试下一个。重跑得到的工单号不变。
    主题和正文里的 NUL 去掉:PostgreSQL 的 TEXT 存不了它(整封信就会一直存储失败),两种库存的一样。"""
    subject, body = subject.replace("\x00", ""), body.replace("\x00", "")
    with store.transaction(store.biz_target()) as conn:
        for ticket_id in candidates:
            if conn.execute(MAIL_TICKET_SQL, (ticket_id, customer_id, subject, body, created_on)).rowcount == 1:
                return ticket_id
            if conn.execute(SAME_MAIL_SQL, (ticket_id, customer_id, subject, body)).fetchone():
                return ticket_id
    raise ValueError(f"工单号全都被别的邮件占了:{', '.join(candidates)}")
