"""inbox.py 处理一条待办时要防的几种意外(课文一个人、一个命令,不会撞车):两个收件箱命令(或者收件箱和 worker)同时
处理同一条待办时,只有拿到它的那个能续跑图,另一个说清楚是谁拿走了;拿之前和拿到之后各核对一次这种处理还行不行;
续跑图时出错或被 Ctrl-C,按 checkpoint 把事件放回收件箱、交回 worker 或者进死信,而不是留在 processing;
工单号不在收件箱里时说它在哪(正在处理、死信)或者是不是大小写写错了。"""
import unicodedata
from dataclasses import dataclass

import inbox_seen
import store
import store_events
import store_inbox
import worker_owner
from agent import is_permanent
from agent_run import FINISHED, finished_status


class Refused(Exception):
    """这次处理做不了,原因说给人听;退出码 1(网页上是 400)。"""


class Conflict(Refused):
    """别人抢先了:待办正被别人处理,或者回答的不是这个人看到的那一版草稿。网页上是 409。"""


class Gone(Refused):
    """这张工单不在收件箱里(处理完了、在死信里、工单号写错了)。网页上是 404。"""


@dataclass
class Result:
    """处理完一条待办的结果(resume() 返回,不打印):outcome 是图走完的结果(sent / ignored);respond 之后图又停在
    review 上时 new_draft 是新草稿,待办留在收件箱里(answered:这次 respond 回答的是 Agent 的提问);
    note 是途中出过错、但工单已经处理完时的说明。"""
    ticket_id: str
    outcome: str | None = None
    new_draft: str | None = None
    note: str | None = None
    answered: bool = False


def busy(ticket_id: str) -> Refused:
    return Conflict(f"{ticket_id} 正在被处理(另一个收件箱命令或 worker),稍后再 list 看看")


def taken_meanwhile(ticket_id: str) -> Refused:
    return Conflict(f"{ticket_id} 刚被另一个收件箱命令拿走处理了,稍后再 list 看看")


def not_in_inbox(ticket_id: str, waiting: list[dict]) -> Refused:
    """这张工单没有等人处理的事件:说清楚它在哪(正在处理、死信),或者工单号是不是写错了大小写。"""
    if any(e["ticket_id"] == ticket_id for e in store_events.events_by_status("processing")):
        return busy(ticket_id)
    if dead := [e for e in store_events.events_by_status("dead") if e["ticket_id"] == ticket_id]:
        ids = [e["event_id"] for e in dead]
        why = (dead[-1]["last_error"] or "没有记下原因").splitlines()[0]
        return Gone(f"{ticket_id} 的事件 {' '.join(ids)} 在死信队列里({why}),没有进收件箱;"
                       f"查清原因后运行 {store_events.requeue_dead_command(ids)} 放回队列")
    hint = next((f";是不是 {e['ticket_id']}?" for e in waiting if loose(e["ticket_id"]) == loose(ticket_id)), "")
    return Gone(f"{ticket_id} 不在收件箱里(已经处理过,或者还没轮到 worker){hint}")


def changed(ticket_id: str) -> Conflict:
    """网页上回答的不是现在这一版:页面打开之后有人 respond 过、或者别的回答被退回再问了一次。"""
    return Conflict(f"{ticket_id} 在你打开页面之后被别人改过(重写了草稿或换了说明),这次没有处理;刷新页面看看现在的版本")


def loose(ticket_id: str) -> str:
    """比「是不是写错了」时用:不分大小写、不分全角半角(中文输入法全角模式下敲的 Ｔ１０４１ 也认得出是 T1041)。"""
    return unicodedata.normalize("NFKC", ticket_id).casefold()


def status_of(snap) -> str:
    """按 checkpoint,事件该是什么状态:停在收件箱 / 做完了 / 跑到一半停了(交回 worker 从停下的节点续跑)。"""
    if snap.interrupts:
        return "waiting_human"
    if snap.values.get("outcome") in FINISHED:
        return finished_status(snap.values["outcome"])
    return "pending"


def take(graph, ev: dict, cfg: dict, command: str, check, shown: str | None = None) -> object:
    """拿到这条待办(事件 waiting_human → processing,别的收件箱命令和 worker 就动不了它),返回拿到后的 checkpoint。
    拿之前、拿到之后各用 check(snapshot) 核对一次这种处理还行不行(它返回 Refused 或 None):拿到之前别人可能刚 respond
    过 —— 草稿换了,重写次数也可能刚好到了上限。shown 是网页上那一版待办的指纹(inbox_seen.item_fingerprint):
    给了就核对待办还是那一版,什么处理都一样;没给(命令行)时 accept 核对这个人 list 过的正是这一版草稿。
    做不了时放回收件箱,抛 Refused。"""
    ticket_id = ev["ticket_id"]
    snap = graph.get_state(cfg)
    if not snap.interrupts:  # 上面查完收件箱之后,另一个收件箱命令刚把它处理完
        raise taken_meanwhile(ticket_id)
    if shown is not None and inbox_seen.item_fingerprint(snap.interrupts[0].value) != shown:
        raise changed(ticket_id)
    if refused := check(snap):
        raise refused
    if not store_inbox.take_for_review(ev["event_id"]):
        if any(e["event_id"] == ev["event_id"] for e in store_events.events_by_status("waiting_human")):
            raise busy(ticket_id)  # 待办还在,是同一张工单的另一个事件在 worker 手里
        raise taken_meanwhile(ticket_id)
    try:
        snap = graph.get_state(cfg)
        refused = check(snap)
        # 没 list 过(seen 是 None)就照课文发;通知类待办没有草稿;网页核对的是 shown
        accepting = command == "accept" and shown is None
        draft = snap.interrupts[0].value["action_request"]["args"].get("reply") if accepting else None
        seen = None if draft is None else store_inbox.seen_draft(ticket_id, inbox_seen.viewer())
    except KeyboardInterrupt:  # 拿走了、还没开始处理:原样放回收件箱
        store.set_status(ev["event_id"], "waiting_human", owner=worker_owner.inbox_owner())
        raise Refused(f"{ticket_id} 这次被中断(Ctrl-C),仍在收件箱里") from None
    if refused is None and seen is not None and seen != inbox_seen.fingerprint(draft):
        refused = Conflict(f"{ticket_id} 的草稿在你上次看过之后被改写了(有人 respond 过),这次没有发;"
                           "先 uv run python inbox.py list 看看新草稿,再决定")
    if refused is None and shown is not None and inbox_seen.item_fingerprint(snap.interrupts[0].value) != shown:
        refused = changed(ticket_id)
    if refused:
        store.set_status(ev["event_id"], "waiting_human", owner=worker_owner.inbox_owner())
        raise refused
    return snap


def after_failure(graph, ev: dict, cfg: dict, e: BaseException) -> Result:
    """续跑图时出错,或者人等不及按了 Ctrl-C(respond 正在等模型重写):按 checkpoint 把事件放到该在的地方 ——
    还停在 review 就留在收件箱,跑到一半就交回 worker 续跑,模型说请求不对(400/413……)就直接进死信。
    节点都走完了(回复已进发件箱 / ignore 已记下)、报错的只是途中某一次 checkpoint 写入时,照实返回结果;
    别的情况抛 Refused。"""
    ticket_id = ev["ticket_id"]
    snap = graph.get_state(cfg)
    status = status_of(snap)
    interrupted = isinstance(e, KeyboardInterrupt)
    # 模型说请求不对:交回 worker 也只是原样再错一次就进死信,还让人等它「自动再试」。直接进死信,说清修好后怎么放回来;
    # 意见已经记在 checkpoint 里,--requeue-dead 之后从 draft 带着意见接着跑
    dead = not interrupted and status == "pending" and is_permanent(e)
    requeue = store_events.requeue_dead_command([ev["event_id"]]) if dead else None
    from llm_errors import describe  # 分辨模型的错误要导入 openai:到出错时才导入

    owner, what = worker_owner.inbox_owner(), "被中断(Ctrl-C)" if interrupted else describe(e, requeue=requeue)
    if dead:
        store.set_status(ev["event_id"], "dead", what, owner=owner)
    elif status == "pending":
        worker_owner.hand_to_worker(ev["event_id"], owner, what)
    elif status == "waiting_human":
        store.set_status(ev["event_id"], status, what, owner=owner)
    else:
        store.set_status(ev["event_id"], status, owner=owner)
        return Result(ticket_id, outcome=snap.values["outcome"], note=what)
    where = "仍在收件箱里" if status == "waiting_human" else "进了死信" if dead else "已交回 worker 续跑"
    raise Refused(f"{ticket_id} {f'这次{what}' if interrupted else f'处理失败({what})'},{where}") from e
