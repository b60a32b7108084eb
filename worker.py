"""从 events 表领事件、跑 Agent。

运行:
    uv run python worker.py --once              # 把现在能领的事件都处理完就退出(crontab 每分钟跑这个)
    uv run python worker.py                     # 一直跑,没事件时每 2 秒看一次;Ctrl-C / SIGTERM 做完手上的再退
    uv run python worker.py --concurrency 4     # 同时处理 4 个事件(模型调用是 I/O,等的时候可以干别的)
    uv run python worker.py --requeue-dead [EVENT_ID ...]   # 修好问题后,把死信放回队列(不给 id 就是全部)

你会看到每个事件一行:
    evt_T1012_created → waiting_human
    evt_T9999_created 第 1 次失败 → dead: 工单不存在:T9999
数据库暂时用不了时,常驻模式说一行、隔 POLL_SECONDS 秒再试;--once 说一行、退出码 1,手上的事件交回队列。
"""
import contextlib
import json
import math
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import config  # 只用标准库,导入很快:在装信号处理之前导入(它记下启动时 SIGINT 是不是被忽略)
import worker_pool  # 也只用标准库和这里的模块:导入 LangGraph 之前装好停止信号的处理

if __name__ == "__main__":
    # 从脚本里用 & 放到后台跑的 worker 本来就不理 SIGINT:照旧不理,只听 SIGTERM(见 config.handle_stop_signals)
    config.handle_stop_signals(worker_pool.stop_while_importing, worker_pool.stop_while_importing)

import store  # noqa: E402 —— 上面先装好信号处理,再做慢的导入
import store_biz  # noqa: E402
import store_errors  # noqa: E402
import store_events  # noqa: E402
import store_pg  # noqa: E402
import worker_owner  # noqa: E402
from agent_run import FINISHED, finished_status, interrupted_status  # noqa: E402
from agent_run import check_settings as graph_settings  # noqa: E402
from agent_trace import traced  # noqa: E402
from agent_saver import known_new, open_saver  # noqa: E402
from llm_pii import mask_pii  # noqa: E402
# agent.py(open_graph、thread_of、PermanentError)到领到第一个事件时才导入(worker_pool.WorkerBase.graph):
# 导入 LangGraph 的图要半秒多,crontab 每分钟跑一次的 worker.py --once 多半遇上空队列,用不上它


CLAIM_TRIES = 5             # 次;撞上别人刚领了同一张工单的事件时再挑几次,之后等下一轮

# 领一个事件:挑选和标记在同一条 UPDATE 里(SQLite 一次只有一个写者,这条语句本身就是原子的)
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
)
RETURNING event_id, kind, payload, attempts, ticket_id, last_error, updated_at
"""


# ---- 练习 6:PostgreSQL 上领事件用 FOR UPDATE SKIP LOCKED ----
# 同一条语句,挑选时跳过别的 worker 正锁着的行,不排队等它们
CLAIM_SQL_POSTGRES = """
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
    FOR UPDATE SKIP LOCKED
)
RETURNING event_id, kind, payload, attempts, ticket_id, last_error, updated_at
"""


def claim_args(owner: str, stamp_: str) -> tuple:
    """CLAIM_SQL 的参数:谁领的、现在(领取时间、退避到期了没有、同一张工单还在不在退避)。"""
    return owner, stamp_, stamp_, stamp_


def claim(owner: str | None = None) -> dict | None:
    """原子地领一个到点的 pending 事件:挑选和标记在同一条语句里,两个 worker 不会领到同一个。
    同一张工单已经有事件在处理、或者有事件还在退避时,不领它的别的事件:一张工单一个 thread,
    两个 worker 不同时往里写,退避也绕不过去(见 store.ONE_PROCESSING_PER_TICKET)。"""
    for _ in range(CLAIM_TRIES):
        with store.opened(durable=False) as conn:
            query = CLAIM_SQL_POSTGRES if store.dialect() == "postgres" else CLAIM_SQL
            args = claim_args(owner or worker_owner.worker_id(), store.now())
            cur = worker_owner._unless_ticket_taken(conn, query, args)
            if cur is not None:
                row = cur.fetchone()
                return dict(row) if row else None
    return None


def requeue_stale(minutes: float) -> int:
    """把卡在 processing 的事件放回 pending(见 hand_to_worker)。
    本机的进程:已经死了的马上放回,还活着的不动(STALE_MINUTES=0 重启时也不会抢别人正在做的);
    别的机器上的进程看不到死活,只能按时间:超过 minutes 分钟没动静才放回。"""
    cutoff = store.minutes_from_now(-minutes)
    with store.transaction() as conn:
        rows = conn.execute(
            "SELECT event_id, claimed_by, updated_at FROM events WHERE status = 'processing'"
        ).fetchall()
        stale = [r for r in rows
                 if (state := worker_owner._owner_state(r["claimed_by"], conn)) == "dead"
                 or (state == "unknown" and store.parse_time(r["updated_at"]) <= store.parse_time(cutoff))]
        # 只放回刚才看过的那一次领取(同一个领的人、同一个时间):PostgreSQL 上 SELECT 不锁行,另一个 worker
        # 可能刚放回、第三个又领走了,这次新的领取不能再被放回
        return sum(worker_owner.hand_to_worker(r["event_id"], r["claimed_by"], conn=conn, updated_at=r["updated_at"])
                   for r in stale)


def handle(graph, ev: dict) -> str:
    """跑一个事件,返回它的新状态。"""
    from agent import thread_of

    ticket_id = payload_ticket(ev)
    cfg = traced(thread_of(ticket_id, ev["event_id"]))
    snap = graph.get_state(cfg)
    if snap.interrupts:
        # 等人的 thread:已经在收件箱里了。若收件箱里没有它的事件(上次收件箱命令中途崩了),这个事件接手等人
        return interrupted_status(ticket_id, ev["event_id"])
    if (outcome := snap.values.get("outcome")) in FINISHED:
        # 这张工单已经处理完了:上游换了个 event_id 又通知了一次,或者收件箱命令走完了图、没来得及改事件状态就没了。
        # 人选了不回的是 ignored,不是 done
        return finished_status(outcome)
    worker_owner.refuse_crash_loops(ev, ticket_id, snap.tasks, config.value("MAX_ATTEMPTS"))
    if snap.tasks:
        # 崩溃的 thread:不给新输入,从失败的节点接着跑。看 tasks 不看 next:节点的结果写下了、下一个 checkpoint
        # 还没写就被杀时 next 是空的,tasks 里还有它;续跑时 LangGraph 直接用写下的结果
        result = graph.invoke(None, cfg, durability=config.value("CHECKPOINT_DURABILITY"))
    else:
        empty = snap.created_at is None  # 没有任何 checkpoint:新工单(最常见的情况)
        result = graph.invoke({"ticket_id": ticket_id, "kind": ev["kind"]}, known_new(cfg) if empty else cfg,
                              durability=config.value("CHECKPOINT_DURABILITY"))
    if "__interrupt__" in result:
        return "waiting_human"
    return finished_status(result.get("outcome"))


def process(graph, ev: dict, owner: str) -> str:
    """处理一个领到的事件,改好状态,打印一行,返回新状态。"""
    from agent import PermanentError, is_permanent

    failed, not_before = None, None
    try:
        status = handle(graph, ev)
    except Exception as e:  # noqa: BLE001 —— 任何错误都要落到事件表里,不能让 worker 死掉
        if store_errors.temporary(e):
            # 数据库暂时用不了(库被锁太久、连接被掐断):不是这个事件的错,不算一次失败。
            # 交给 run() / main():说一行,事件交回队列(attempts 不变),隔一会儿再试
            raise
        failed = e
        status = "dead" if is_permanent(e) or ev["attempts"] >= config.value("MAX_ATTEMPTS") else "pending"
        not_before = store.minutes_from_now(backoff_minutes(ev["attempts"])) if status == "pending" else None
    requeue = store_events.requeue_dead_command([ev["event_id"]]) if status == "dead" else None
    if failed:
        from llm_errors import describe  # 分辨模型的错误要导入 openai:到出错时才导入

        why = describe(failed, requeue=requeue)
    else:
        why = None
    kept = store.set_status(ev["event_id"], status, why, not_before=not_before, owner=owner,
                            claimed_at=ev.get("updated_at"))
    # 慢到被放回队列、又被别人领走了:不覆盖,说一声
    moved = "" if kept else "(这期间事件被放回了队列,状态留给接手的 worker 改)"
    if failed is None:
        worker_pool.say(f"{ev['event_id']} → {status}{moved}")
    else:
        shown = str(failed) if isinstance(failed, PermanentError) else why
        kept = (requeue, *getattr(failed, "kept", ()))  # 让人照着敲的命令、事件 id 不打码
        worker_pool.say(f"{ev['event_id']} 第 {ev['attempts']} 次失败 → {status}{moved}: {mask_pii(shown, keep=kept)}")
    return status


class Worker(worker_pool.WorkerBase):
    """run() 一直循环;run_once() 把现在能领的都处理完,返回 [(event_id, 新状态)]。"""

    def __init__(self, concurrency: int | None = None):
        check_settings()  # 配置错了启动时就退出,还没领任何事件
        self.concurrency = concurrency or config.value("WORKER_CONCURRENCY")
        self.owner = worker_owner.worker_id()
        super().__init__()
        self.requeue_every_s = config.value("POLL_SECONDS")
        self._requeue_lock = threading.Lock()
        self._requeued_at = -math.inf
        store.init()
        self.saver, self.conn = open_saver()  # agent.open_graph 的前一半;图用到时才建(WorkerBase.graph)

    def requeue(self, *, unless_recent: bool = False) -> None:
        """放回卡住的事件。处理线程每领一个事件前都来问一次(unless_recent):上次查过还不到 POLL_SECONDS 就不查,
        几个线程同时来时只有一个去查。一直有新事件进来、这一轮一直不结束时,死掉的 worker 的事件也能放回。"""
        if not self._requeue_lock.acquire(blocking=not unless_recent):
            return
        try:
            if unless_recent and time.monotonic() - self._requeued_at < self.requeue_every_s:
                return
            self._requeued_at = time.monotonic()
            if n := requeue_stale(config.value("STALE_MINUTES")):
                worker_pool.say(f"放回队列 {n} 个卡住的事件")
        finally:
            self._requeue_lock.release()

    def drain(self, done: list) -> None:
        while not self.stopping and not self.round_failed:
            store_pg.same_checkpoints_or_exit(self.conn)  # 事件库在 claim 里查
            self.requeue(unless_recent=True)
            if not (ev := claim(self.owner)):
                return
            self.in_hand.add(ev["event_id"])
            if self.stopping:
                # 领的途中收到了停止信号:不做,交回。先记进 in_hand 再看:在这之前到的第二次 Ctrl-C
                # 看 in_hand 是空的、不抢着退出,那就由这里交回
                self.give_back(ev["event_id"])
                self.in_hand.discard(ev["event_id"])
                return
            done.append((ev["event_id"], process(self.graph, ev, self.owner)))
            self.in_hand.discard(ev["event_id"])

    def run_once(self) -> list[tuple[str, str]]:
        self.requeue()
        done: list[tuple[str, str]] = []
        if self.concurrency == 1:
            self.drain(done)
        else:
            pool, interrupted, self.round_failed = ThreadPoolExecutor(self.concurrency), False, False
            try:
                for f in [pool.submit(self.drain_or_end_round, done) for _ in range(self.concurrency)]:
                    f.result()
            except KeyboardInterrupt:
                interrupted = True
                raise
            finally:
                # 等线程都停下(交回事件之前不能还有线程在处理它);第二次 Ctrl-C 不等,main() 交回手上的事件、立即退出
                pool.shutdown(wait=not interrupted, cancel_futures=interrupted)
        return done

    def run(self) -> None:
        self.graph  # noqa: B018 —— 常驻的 worker 先建好图再领事件:不让领到的事件等着导入 LangGraph(被杀在这时就白算一次尝试)
        troubled = False  # 上一轮数据库出过错:可能有事件没来得及改状态,或者领到了却没收到回答
        while not self.stopping:
            try:
                if troubled:
                    self.hand_back()
                    troubled = False
                busy = self.run_once()
            except store_errors.unavailable_errors() as e:
                # 数据库重启、连接被掐断、库被锁太久:常驻的 worker 不退出,等一会儿再试;手上的事件下一轮交回队列
                say_retrying(e)
                busy, troubled = [], True
            if not busy:
                with contextlib.suppress(queue.Empty):  # 等 POLL_SECONDS 秒,收到停止信号就马上醒
                    self._wake.get(timeout=config.value("POLL_SECONDS"))
        if troubled:
            # 数据库出错之后、下一轮交回之前收到了停止信号:现在交回。数据库还是用不了,就留给 requeue_stale
            with contextlib.suppress(*store_errors.unavailable_errors()):
                self.hand_back()


def say_retrying(error: Exception) -> None:
    """常驻模式下数据库用不了(启动时、运行中)时标准错误上的那一行;接着隔 POLL_SECONDS 再试。"""
    print(f"{store_errors.unavailable(error)},{config.value('POLL_SECONDS'):g} 秒后再试", file=sys.stderr, flush=True)





def read_settings() -> None:
    """worker 要用的设置都读一遍,哪一项不对就以 SystemExit("配置错误:…") 退出。"""
    for name in ("CHECKPOINT_DURABILITY", "MAX_ATTEMPTS", "BACKOFF_BASE_MINUTES", "STALE_MINUTES", "POLL_SECONDS",
                 "WORKER_CONCURRENCY"):
        config.value(name)
    graph_settings()


def check_settings() -> None:
    read_settings()
    if problem := store_biz.biz_db_problem():  # 业务库还没建(课文假设它已经在了)
        raise SystemExit(problem)


def main(argv: list[str] | None = None) -> int:
    parser = config.ArgumentParser(description="后台 worker:领事件、跑 Agent")
    parser.add_argument("--once", action="store_true", help="把现在能领的事件处理完就退出")
    parser.add_argument("--concurrency", type=int, default=None,
                        help=f"同时处理几个事件(不给时用 WORKER_CONCURRENCY,默认 {config.SETTINGS['WORKER_CONCURRENCY'].default})")
    # extend:--requeue-dead 写了两次时 id 合在一起
    parser.add_argument("--requeue-dead", nargs="*", action="extend", metavar="EVENT_ID",
                        help="把死信放回队列,不给 id 就是全部")
    args = parser.parse_args(argv)
    if args.concurrency is not None and args.concurrency < 1:
        parser.error("--concurrency 至少是 1")
    if args.concurrency is not None and args.concurrency > config.SETTINGS['WORKER_CONCURRENCY'].maximum:
        parser.error(f"--concurrency 最多是 {config.SETTINGS['WORKER_CONCURRENCY'].maximum}")
    if any(not e.strip() for e in args.requeue_dead or ()):  # --requeue-dead "$ID",变量是空的
        parser.error("--requeue-dead 后面的事件号不能是空的(不给事件号才是全部)")
    if args.requeue_dead is not None and (args.once or args.concurrency is not None):
        parser.error("--requeue-dead 只把死信放回队列,不处理事件,不能和 --once、--concurrency 一起用;放回之后再运行 worker")
    worker = None
    # 从这里起 Ctrl-C、SIGTERM 都是 KeyboardInterrupt(见下面 except),只抛一次:uv run 会再转发一个
    config.handle_stop_signals(config.interrupt_once, config.interrupt_once)
    try:
        if args.requeue_dead is not None:
            return requeue_dead(args.requeue_dead)
        # start() 在数据库用不了时一直等着再试:这期间 SIGTERM 也能停下它(上面装好的 interrupt_once)
        worker = start(args)
        config.handle_stop_signals(worker.stop, worker.stop)
        worker.run_once() if args.once else worker.run()
    except store_errors.unavailable_errors() as e:  # --once 中途,或者一开始就用不了;常驻模式运行中自己等着再试
        print(f"{store_errors.unavailable(e)},这一轮停下,下次再跑", file=sys.stderr, flush=True)
        if worker:
            with contextlib.suppress(*store_errors.unavailable_errors()):
                worker.hand_back()
        return 1
    except KeyboardInterrupt:
        if worker is None:  # 还在等数据库(或者正在建 Worker):手上没有事件,没什么要交回的
            print("收到停止信号:还没开始领事件,退出", file=sys.stderr, flush=True)
            return 0
        try:
            worker.hand_back()
        except store_errors.unavailable_errors() as e:
            # 第二次 Ctrl-C 时数据库正好用不了:交不回去。事件留在 processing,下次启动的 worker 看这个进程没了就放回
            print(f"{store_errors.unavailable(e)}:手上的事件没能交回队列,留在处理中;下次启动 worker 时会放回队列",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
        # 立即退出:别等还卡在模型调用里的线程(它们的事件已经交回队列了)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)
    finally:
        # 要退出了:再来的停止信号(uv run 转发的那一次)不理,不然它落在解释器退出途中,退出码成了 143
        config.ignore_stop_signals()
        if worker:
            worker.close()
    return 0


def start(args) -> Worker:
    """建好 Worker。常驻模式下数据库一开始就用不了(开机时 worker 比 PostgreSQL 先起来):说一行、隔 POLL_SECONDS
    再试。--once 交给 main() 说一行、退出码 1。设置不对马上退出。"""
    while True:
        try:
            return Worker(args.concurrency)
        except store_errors.unavailable_errors() as e:
            if args.once:
                raise
            say_retrying(e)
            time.sleep(config.value("POLL_SECONDS"))


def requeue_dead(event_ids: list[str]) -> int:
    store.init()
    if event_ids:
        dead = {e["event_id"] for e in store_events.events_by_status("dead")}
        if missing := [e for e in event_ids if e not in dead]:
            print("这些事件不是死信(不存在,或者状态不是 dead),一个都没动:", " ".join(missing), file=sys.stderr)
            return 1
    n = store_events.requeue_dead(event_ids or None)
    print(f"已把 {n} 个死信放回队列")
    return 0


# ---- 练习 2:PermanentError,坏的输入直接进死信 ----
def payload_ticket(ev: dict) -> str:
    from agent import PermanentError

    try:
        payload = json.loads(ev["payload"])
    except ValueError as e:
        raise PermanentError(f"payload 不是合法的 JSON:{e}") from None
    try:
        ticket_id = payload["data"]["ticket_id"]
    except (KeyError, TypeError, IndexError) as e:  # 缺键,或者 payload / data 不是对象(列表、字符串……)
        raise PermanentError(f"payload 格式不对,缺 data.ticket_id:{e!r}") from None
    if not isinstance(ticket_id, str) or not ticket_id:
        raise PermanentError(f"payload 格式不对,ticket_id 应该是非空字符串:{ticket_id!r}")
    return ticket_id


# ---- 练习 3:退避 ----
def backoff_minutes(attempts: int) -> float:
    """第 attempts 次失败后等几分钟再试:BACKOFF_BASE_MINUTES × 2^attempts(课文:2、4 分钟)。"""
    return config.value("BACKOFF_BASE_MINUTES") * 2 ** attempts


if __name__ == "__main__":
    config.run(main)  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
