"""事件表上课文之外的读写,给 webhook、邮件轮询、定时任务、worker 和收件箱用:一个事务写一批事件(webhook 的组提交)、
三种来源的事件 id 约定、按状态查事件、把死信或收件箱里丢了 checkpoint 的待办放回队列(连同让人照着敲的命令),
以及每次模型调用的用量。课文只有一次写一个事件的 add_event() 和 set_status();这些是运维时要的。"""
import json
import shlex

import store


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


def event_exists(event_id: str) -> bool:
    """事件表里已经有这个 id 了吗(收过了)。"""
    with store.opened() as conn:
        return conn.execute("SELECT 1 FROM events WHERE event_id = ?", (event_id,)).fetchone() is not None


def add_events(events: list[tuple[str, str, str, str]]) -> list[bool]:
    """一个事务写一批事件(webhook 的组提交用它):一次落盘,逐条告诉你是不是新的。
    同一批里重复的 event_id 只写第一个,也只有第一个算新的。"""
    stamp_ = store.now()
    rows: dict[str, tuple] = {}
    for eid, source, kind, payload in events:
        if eid not in rows:
            rows[eid] = (eid, source, kind, payload, ticket_of(payload), stamp_, stamp_)
    fresh, inserted = list(rows.values()), set()
    with store.transaction() as conn:
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
    args: list = [store.now(), status]
    if event_ids:
        sql += f" AND event_id IN ({', '.join('?' for _ in event_ids)})"
        args += event_ids
    with store.opened() as conn:
        return [r[0] for r in conn.execute(sql + " RETURNING event_id", args).fetchall()]


def requeue_dead(event_ids: list[str] | None = None) -> int:
    """死信放回队列(修好 API key 之后用)。返回放回了几个。"""
    return len(requeue("dead", event_ids or None))


def restart_waiting(event_ids: list[str]) -> list[str]:
    """收件箱里 checkpoint 丢了的待办放回队列(inbox.py restart):worker 领到时 thread 是空的,从头起草。"""
    return requeue("waiting_human", event_ids)


def events_by_status(status: str) -> list[dict]:
    with store.opened() as conn:
        rows = conn.execute(
            "SELECT event_id, kind, payload, ticket_id, attempts, claimed_by, updated_at, waiting_since, last_error FROM events "
            "WHERE status = ? ORDER BY received_at, event_id",
            (status,),
        ).fetchall()
    return [dict(r) for r in rows]


def dead_events_of(ticket_id: str, other_than: str) -> list[str]:
    """这张工单除了 other_than 之外进了死信的事件 id。"""
    with store.opened() as conn:
        rows = conn.execute(
            "SELECT event_id FROM events WHERE ticket_id = ? AND status = 'dead' AND event_id <> ? "
            "ORDER BY received_at, event_id",
            (ticket_id, other_than),
        ).fetchall()
    return [r[0] for r in rows]


def record_usage(event_id: str | None, ticket_id: str | None, model: str, input_tokens: int, output_tokens: int,
                 duration_ms: int | None = None) -> None:
    with store.opened(durable=False) as conn:
        conn.execute(
            "INSERT INTO llm_usage (event_id, ticket_id, model, input_tokens, output_tokens, created_at, duration_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (event_id, ticket_id, model, input_tokens, output_tokens, store.now(), duration_ms),
        )
