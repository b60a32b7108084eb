"""谁手里拿着一个 processing 的事件,给 worker.py 的 claim() / requeue_stale() 和收件箱用:worker 的 id 是「主机名:
进程号@启动时刻」,本机的进程死没死看得出来(死了的马上放回,活着的不动),别的机器上的只能按 STALE_MINUTES;
worker 被打断时把手上的事件交回队列、不算一次失败;收件箱命令中途没了时,人已经做了决定的事件交给 worker 接着做。
课文只按时间放回卡住的事件,重启 worker 时会抢走还活着的 worker 正在做的事件。"""
import os
import socket
import sqlite3
from pathlib import Path

import store
import store_events
import store_move


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


def _unless_ticket_taken(conn, query: str, args: tuple):
    """执行一条把事件改成 processing 的语句;撞上 ONE_PROCESSING_PER_TICKET(这张工单刚被别人拿去处理)返回 None。"""
    try:
        return conn.execute(query, args)
    except Exception as e:
        if isinstance(e, sqlite3.IntegrityError) and str(e) == store_move.MOVED_AWAY:  # 还开着的 SQLite worker、收件箱:停下
            raise SystemExit(store_move.moved_away(store.events_db(), *store_move.moved_to(conn))) from None
        if isinstance(e, sqlite3.IntegrityError) or getattr(e, "sqlstate", None) == "23505":  # 23505:唯一约束冲突
            return None
        raise


def hand_back(event_id: str, owner: str) -> bool:
    """worker 被打断时交回手上的事件:回到 pending,这次尝试不算数。"""
    with store.opened(durable=False) as conn:
        return conn.execute(
            "UPDATE events SET status = 'pending', attempts = attempts - 1, claimed_by = NULL, updated_at = ? "
            "WHERE event_id = ? AND status = 'processing' AND claimed_by = ?",
            (store.now(), event_id, owner),
        ).rowcount == 1


def hand_back_all(owner: str) -> list[str]:
    """owner 名下所有 processing 的事件都交回(同 hand_back),返回交回了哪些。只在 owner 手上确实没有在做的事件时用:
    除了记着的,还有领取已经提交、回答却在路上丢了(连接恰好这时断了)的那一个 —— 它不在 worker 记着的「手上」里,
    本机的 worker 还活着,requeue_stale 也不会放回它。"""
    with store.opened(durable=False) as conn:
        return [r[0] for r in conn.execute(
            "UPDATE events SET status = 'pending', attempts = attempts - 1, claimed_by = NULL, updated_at = ? "
            "WHERE status = 'processing' AND claimed_by = ? RETURNING event_id", (store.now(), owner)).fetchall()]


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
    if store.dialect() == "postgres" and _has_pg_sessions(owner, conn):
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
        with store.opened() as own:
            return _has_pg_sessions(owner, own)
    return conn.execute(PG_SESSIONS_SQL, (pg_application_name(owner),)).fetchone()[0] > 0


# 卡住的事件放回队列时写进 last_error 的话。worker 领到 attempts 已经超过 MAX_ATTEMPTS、last_error 又是 REQUEUED_STALE
# 的事件,就知道前一次是 worker 处理到一半进程没了(而不是普通的失败),不再跑它:每次都让 worker 崩溃的事件不能无限循环下去。
REQUEUED_STALE = "上次领它的进程中途没了(被杀、崩溃,或者卡住超过 STALE_MINUTES),放回了队列"
# 收件箱命令拿走待办时 claimed_by 是 INBOX_OWNER_PREFIX + worker_id。它中途没了(被杀、Ctrl-C、出错)、人的决定已经写下时,
# 事件交回 worker 从那里接着做:这不是 worker 的崩溃,last_error 记 REQUEUED_FROM_INBOX,attempts 从 0 重新算
# (起草用掉的次数不算到人做了决定以后:不然起草用满了 MAX_ATTEMPTS 的事件会被当成崩溃循环,人批准的回复发不出去)
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
        with store.opened(durable=False) as own:
            return hand_to_worker(event_id, owner, error, conn=own, updated_at=updated_at)
    from_inbox = (owner or "").startswith(INBOX_OWNER_PREFIX)
    error = (error or REQUEUED_FROM_INBOX) if from_inbox else REQUEUED_STALE
    query, args = HAND_TO_WORKER_SQL, [error, from_inbox, store.now(), event_id]
    if owner is None:  # 照课文建的旧库没有 claimed_by 列:补上的列里是 NULL
        query += " AND claimed_by IS NULL"
    else:
        query += " AND claimed_by = ?"
        args.append(owner)
    if updated_at is not None:
        query += " AND updated_at = ?"
        args.append(updated_at)
    return conn.execute(query, args).rowcount == 1


def refuse_crash_loops(ev: dict, ticket_id: str, tasks, limit: int) -> None:
    """worker.handle() 跑图之前的两道闸,碰上了抛 PermanentError(直接进死信,不再调模型)。limit 是 MAX_ATTEMPTS。"""
    from agent import PermanentError  # agent 要导入 LangGraph:只有 worker 用到这里,不让 webhook 也去导入它
    if ev["attempts"] > limit and ev.get("last_error") == REQUEUED_STALE:
        # 普通的失败到了 MAX_ATTEMPTS 就进死信,领的次数超过它,只能是上一次处理到一半进程没了。
        # 每次都让 worker 崩溃的事件(太大、触发了 bug)不能无限循环、每圈都调一次模型
        command = store_events.requeue_dead_command([ev["event_id"]])
        raise PermanentError(f"领了 {ev['attempts']} 次都没做完,超过 MAX_ATTEMPTS={limit}:最后一次处理到一半"
                             f"进程没了(被杀、崩溃或卡住),多半是这个事件让 worker 崩溃;查清原因后运行 {command}", command)
    if any(t.name == "draft" for t in tasks) and (dead := store_events.dead_events_of(ticket_id, ev["event_id"])):
        # 同一张工单的事件在起草时进了死信:续跑就是接着那里再来一遍(新事件不带新输入),只会再失败、再调模型。
        # MAX_ATTEMPTS 按事件算,上游每换一个 event_id 再通知一次,就又多 MAX_ATTEMPTS 次模型调用;这里按工单挡住。
        # 停在 load 的(工单当时还不存在)照常续跑:不调模型,工单现在可能已经有了
        command = store_events.requeue_dead_command([*dead, ev["event_id"]])
        raise PermanentError(f"同一张工单的 {' '.join(dead)} 在死信里,这个事件不再接着跑;查清原因后运行 {command}",
                             command, *dead)


def orphans() -> list[dict]:
    """processing 状态、但处理它的本机进程已经不在了的事件(比如收件箱命令做到一半被杀)。"""
    return [e for e in store_events.events_by_status("processing") if _owner_state(e["claimed_by"]) == "dead"]
