"""inbox.py 每次运行前先收拾的残局(课文假设命令不会做到一半就崩):事件状态和 checkpoint 对不上时(上次收件箱命令
或 worker 中途被杀),tidy() 按 checkpoint 把事件改回该在的地方并说一行;收件箱里的待办在 checkpoint 库里根本找不到
(多半是 CHECKPOINTS_DB / DATABASE_URL 指错了库)时一条都不动,说清楚;库确实丢了的,restart 命令把它们交回 worker
从头起草。"""
import sys

import store
import store_errors
import store_events
import worker_owner
from agent import thread_of
from agent_run import interrupted_status
from inbox_take import Refused, not_in_inbox, status_of


def restart_command(tickets) -> str:
    """提示里让人照着敲的 restart 命令;有以 - 开头的工单号时写在 -- 后面。"""
    ids = sorted(tickets)
    return f"uv run python inbox.py restart {'-- ' if any(t.startswith('-') for t in ids) else ''}{' '.join(ids)}"


def reconcile(graph, ev: dict) -> str | None:
    """事件状态和 checkpoint 对不上时(上次收件箱命令做到一半崩了),按 checkpoint 改正事件状态。
    返回改成的状态;对得上就返回 None。"""
    status = status_of(graph.get_state(thread_of(ev["ticket_id"])))
    if status == ev["status"]:
        return None
    if status == "waiting_human":
        # 同一张工单的另一个事件已经在收件箱里(这个是上游又通知的一次,领它的 worker 中途没了):它算 done,和 worker
        # 处理它时一样;改成 waiting_human 的话,同一张工单在收件箱里列两遍,日报也多算一条
        status = interrupted_status(ev["ticket_id"], ev["event_id"])
    if ev["status"] == "processing" and status == "pending":
        # 交回 worker 续跑,和 worker 放回卡住的事件一样:死掉的是 worker 时记上崩溃的标记(每次都让 worker 崩溃的
        # 事件不会每 list 一次就多跑一圈、多调一次模型),是收件箱命令时 worker 的尝试次数从头算
        return status if worker_owner.hand_to_worker(ev["event_id"], ev["claimed_by"]) else None
    guard = {"owner": ev["claimed_by"]} if ev["status"] == "processing" else {"expect": ev["status"]}
    return status if store.set_status(ev["event_id"], status, **guard) else None


def tidy(graph, say_missing: bool = True) -> set[str]:
    """list 和各个动作之前先做:把上次崩掉留下的不一致改正过来,并告诉人。
    返回在 checkpoint 库里根本找不到的待办(工单号):它们不动、不列出、不能处理(见 missing_checkpoints)。"""
    waiting = store_events.events_by_status("waiting_human")
    missing = missing_checkpoints(graph, waiting, say_missing)
    broken = [{**e, "status": "processing"} for e in worker_owner.orphans()]
    broken += [{**e, "status": "waiting_human"} for e in waiting if e["ticket_id"] not in missing]
    for ev in broken:
        if (status := reconcile(graph, ev)) is not None:
            print(f"(更正:{ev['ticket_id']} 上次处理中途中断,事件 {ev['event_id']} 改为 {status})", file=sys.stderr)
    return missing


def missing_checkpoints(graph, waiting: list[dict], say: bool = True) -> set[str]:
    """在收件箱里、checkpoint 库里却一个 checkpoint 都没有的工单。待办是 interrupt 写下之后才进收件箱的,
    找不到只能是 CHECKPOINTS_DB(或 DATABASE_URL)指的不是 worker 起草时用的那个库。当成「上次中途中断」改成 pending
    的话,worker 会在错的库里把每一条重新起草一遍;所以一条都不动,说一行。"""
    missing = {e["ticket_id"] for e in waiting if graph.get_state(thread_of(e["ticket_id"])).created_at is None}
    if missing and say:  # restart 不说:人正是看了这一行才来 restart 的
        where = store_errors._safe_url(store.database_url()) if store.dialect() == "postgres" else \
            f"CHECKPOINTS_DB={store.checkpoints_db()}"
        print(f"(收件箱里的 {'、'.join(sorted(missing))} 在 checkpoint 库里找不到({where}):多半指错了库,"
              "worker 起草时用的是另一个;把设置改回来,这几条没有动。库确实丢了(删掉了)的话,运行 "
              f"{restart_command(missing)} 让 worker 从头重新起草)", file=sys.stderr)
    return missing


def restart(tickets: list[str], missing: set[str]) -> None:
    """checkpoint 库丢了的待办交回 worker:事件改回 pending、尝试次数从 0 算,worker 领到时 thread 是空的,
    就像新工单一样从 load 跑起(再调一次模型)。checkpoint 还在的、不在收件箱里的都不给做:一张不对,一张都不动。
    没有 restart 的话,这样的待办只能一直留在事件表里,哪个命令都处理不了。"""
    waiting = store_events.events_by_status("waiting_human")
    for ticket_id in tickets:
        if ticket_id in missing:
            continue
        if any(e["ticket_id"] == ticket_id for e in waiting):
            raise Refused(f"{ticket_id} 的 checkpoint 还在,不用 restart:直接 accept / edit / respond / ignore;"
                          "这次什么都没有动")
        raise not_in_inbox(ticket_id, waiting)
    moved = set(store_events.restart_waiting([e["event_id"] for e in waiting if e["ticket_id"] in tickets]))
    gone = []
    for ticket_id in tickets:
        if any(e["event_id"] in moved for e in waiting if e["ticket_id"] == ticket_id):
            print(f"{ticket_id} 已交回 worker 从头起草(checkpoint 库里找不到它,worker 会再调一次模型)")
        else:
            gone.append(ticket_id)
    if gone:  # tidy() 之后、改状态之前,另一个 restart 先放回去了
        raise Refused(f"{'、'.join(gone)} 刚被另一个收件箱命令交回 worker 了,这次没有再动")
