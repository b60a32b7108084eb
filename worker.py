"""从 events 表领事件、跑 Agent。

运行:
    uv run python worker.py --once              # 把现在能领的事件都处理完就退出(crontab 每分钟跑这个)
    uv run python worker.py                     # 一直跑,没事件时每 2 秒看一次;Ctrl-C / SIGTERM 做完手上的再退
    uv run python worker.py --concurrency 4     # 同时处理 4 个事件(模型调用是 I/O,等的时候可以干别的)
    uv run python worker.py --requeue-dead [EVENT_ID ...]   # 修好问题后,把死信放回队列(不给 id 就是全部)

你会看到每个事件一行:
    evt_T1012_created → waiting_human
    evt_T9999_created 第 1 次失败 → dead: 工单不存在:T9999
数据库暂时用不了(PostgreSQL 重启、连接被掐断、启动时服务器还没起来)时,常驻模式在标准错误上说一行、隔 POLL_SECONDS 秒再试,不退出;
--once 说一行、退出码 1,手上的事件交回队列。
"""
import contextlib
import json
import itertools
import math
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import config  # 只用标准库,导入很快:要在装信号处理之前导入(它记下 SIGINT 原来是不是被忽略)


def stop_while_importing(_signum, _frame) -> None:
    """下面导入 openai、LangGraph 要几秒(慢的机器上五六秒):这期间的 Ctrl-C / SIGTERM 也说一行、退出码 0。
    原来 SIGTERM 是退出码 143、一句话没有,Ctrl-C 是从 openai 的导入里冒出来的一段 traceback。什么都还没碰。
    uv run 转发来的第二个信号不理:不然这一行可能说两遍。"""
    config.ignore_stop_signals()
    print("收到停止信号:还没开始领事件,退出", file=sys.stderr, flush=True)
    os._exit(0)


if __name__ == "__main__":
    # 从脚本里用 & 放到后台跑的 worker 本来就不理 SIGINT:照旧不理,只听 SIGTERM(见 config.handle_stop_signals)
    config.handle_stop_signals(stop_while_importing, stop_while_importing)

import store  # noqa: E402 —— 上面先装好信号处理,再做慢的导入
from agent import PermanentError, is_permanent, open_graph, thread_of  # noqa: E402
from agent_run import FINISHED, finished_status, interrupted_status  # noqa: E402
from agent_run import check_settings as graph_settings  # noqa: E402
from agent_saver import known_new  # noqa: E402
from llm_errors import describe  # noqa: E402
from llm_pii import mask_pii  # noqa: E402

MAX_ATTEMPTS = 3            # 次(1–20);暂时性失败最多试几次,之后进死信
STALE_MINUTES = 10          # 分钟(0–525600);processing 超过这么久、处理它的进程也不在了,就放回队列(可以是 0 或小数)
BACKOFF_BASE_MINUTES = 1    # 分钟(0–1440);第 n 次失败后等 BASE × 2^n 分钟再试(练习 3);测试里调小
POLL_SECONDS = 2            # 秒(0.01–3600);常驻模式下没事件时隔多久再看;一直有事件时,也隔这么久查一次卡住的事件
CONCURRENCY = 1             # 个(1–256);一个 worker 同时处理几个事件
MAX_CONCURRENCY = 256       # 个;每个都是一个线程,再多也只是一起等模型,内存和数据库连接先不够了
# worker 跑图时 checkpoint 什么时候写(LangGraph 的 durability);收件箱恢复 thread 时总是用 sync(见 inbox.py)。
#   async(默认,和课文一样):每走完一个节点写一次(后台线程写,这次运行结束前等它写完)。
#         被 kill -9 的工单,重启后从被杀时所在的节点接着跑。
#   exit:这次运行停下时(进了收件箱、出错、做完)才写一次。出错照样从失败的节点续跑(出错退出时也写);
#         但被 kill -9 时,这次运行里走过的节点都没记下:新工单重启后 load 再读一遍工单、draft 再调一次模型
#         (被杀时模型多半还没回答,这次调用反正白费)。PostgreSQL 上一个事件少 6 次写入,见 README「性能与可靠性」。
#   sync:每走完一个节点写一次,写完才走下一个。
CHECKPOINT_DURABILITY = "async"
DURABILITIES = ("async", "exit", "sync")


def payload_ticket(ev: dict) -> str:
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


def durability() -> str:
    """CHECKPOINT_DURABILITY 的值;不认识的值是配置错误,worker 启动时就退出(还没领任何事件)。"""
    value = config.get("CHECKPOINT_DURABILITY", CHECKPOINT_DURABILITY)
    if value not in DURABILITIES:
        raise SystemExit(f"配置错误:CHECKPOINT_DURABILITY={value!r},只能是 {'、'.join(DURABILITIES)} 之一")
    return value


def max_attempts() -> int:
    return config.integer("MAX_ATTEMPTS", MAX_ATTEMPTS, minimum=1, maximum=20)


def backoff_minutes(attempts: int) -> float:
    # 上限让 BASE × 2^20 仍是一个 datetime 算得出的时间
    return config.number("BACKOFF_BASE_MINUTES", BACKOFF_BASE_MINUTES, minimum=0, maximum=1440) * 2 ** attempts


def stale_minutes() -> float:
    return config.number("STALE_MINUTES", STALE_MINUTES, minimum=0, maximum=525600)


def poll_seconds() -> float:
    return config.number("POLL_SECONDS", POLL_SECONDS, minimum=0.01, maximum=3600)


def default_concurrency() -> int:
    return config.integer("WORKER_CONCURRENCY", CONCURRENCY, minimum=1, maximum=MAX_CONCURRENCY)


def read_settings() -> None:
    """worker 要用的设置都读一遍,哪一项不对就以 SystemExit("配置错误:…") 退出。"""
    for read in (durability, max_attempts, lambda: backoff_minutes(0), stale_minutes, poll_seconds, default_concurrency,
                 graph_settings):
        read()


def check_settings() -> None:
    """配置错了启动时就退出(还没领任何事件),别等领到事件、用掉一次尝试才发现。"""
    read_settings()
    if problem := store.biz_db_problem():  # 业务库还没建(课文假设它已经在了)
        raise SystemExit(problem)


def handle(graph, ev: dict) -> str:
    """跑一个事件,返回它的新状态。"""
    ticket_id = payload_ticket(ev)
    cfg = thread_of(ticket_id, ev["event_id"])
    snap = graph.get_state(cfg)
    if snap.interrupts:
        # 等人的 thread:已经在收件箱里了。若收件箱里没有它的事件(上次收件箱命令中途崩了),这个事件接手等人
        return interrupted_status(ticket_id, ev["event_id"])
    if (outcome := snap.values.get("outcome")) in FINISHED:
        # 这张工单已经处理完了:上游换了个 event_id 又通知了一次,或者收件箱命令走完了图、没来得及改事件状态就没了
        # (交回来的是它)。人选了不回的照样是 ignored:原来一律 done,日报和事件表里这张工单就成了处理过
        return finished_status(outcome)
    if ev["attempts"] > max_attempts() and ev.get("last_error") == store.REQUEUED_STALE:
        # 普通的失败到了 MAX_ATTEMPTS 就进死信,领的次数超过它,只能是上一次处理到一半进程没了。
        # 每次都让 worker 崩溃的事件(太大、触发了 bug)不能无限循环、每圈都调一次模型
        command = store.requeue_dead_command([ev["event_id"]])
        raise PermanentError(f"领了 {ev['attempts']} 次都没做完,超过 MAX_ATTEMPTS={max_attempts()}:最后一次处理到一半"
                             f"进程没了(被杀、崩溃或卡住),多半是这个事件让 worker 崩溃;查清原因后运行 {command}", command)
    if any(t.name == "draft" for t in snap.tasks) and (dead := store.dead_events_of(ticket_id, ev["event_id"])):
        # 同一张工单的事件在起草时进了死信:续跑就是接着那里再来一遍(新事件不带新输入),只会再失败、再调模型。
        # MAX_ATTEMPTS 按事件算,上游每换一个 event_id 再通知一次,就又多 MAX_ATTEMPTS 次模型调用;这里按工单挡住。
        # 停在 load 的(工单当时还不存在)照常续跑:不调模型,工单现在可能已经有了
        command = store.requeue_dead_command([*dead, ev["event_id"]])
        raise PermanentError(f"同一张工单的 {' '.join(dead)} 在死信里,这个事件不再接着跑;查清原因后运行 {command}",
                             command, *dead)
    if snap.tasks:
        # 崩溃的 thread:checkpoint 停在失败的节点前面。不给新输入,从那里接着跑。
        # 看 tasks 不看 next:节点的结果写下了、下一个 checkpoint 还没写就被杀时,next 是空的(那个任务已经有结果),
        # tasks 里还有它;续跑时 LangGraph 直接用写下的结果,不重跑这个节点
        result = graph.invoke(None, cfg, durability=durability())
    else:
        empty = snap.created_at is None  # 没有任何 checkpoint:新工单(最常见的情况)
        result = graph.invoke({"ticket_id": ticket_id, "kind": ev["kind"]}, known_new(cfg) if empty else cfg,
                              durability=durability())
    if "__interrupt__" in result:
        return "waiting_human"
    return finished_status(result.get("outcome"))


_say_lock = threading.Lock()


def say(line: str) -> None:
    """几个线程同时打印时一行一行地出来:print 的几段和换行是分开写的,不加锁会拼在一起。"""
    with _say_lock:
        print(line, flush=True)


def process(graph, ev: dict, owner: str) -> str:
    """处理一个领到的事件,改好状态,打印一行,返回新状态。"""
    failed, not_before = None, None
    try:
        status = handle(graph, ev)
    except Exception as e:  # noqa: BLE001 —— 任何错误都要落到事件表里,不能让 worker 死掉
        if store.temporary(e):
            # 数据库暂时用不了(图里写 checkpoint 时库被别人锁着超过 BUSY_TIMEOUT_S、PostgreSQL 的连接被掐断……):不是这个
            # 事件的错,不算它的一次失败。原来和模型出错一样记一次、退避,三次就进了死信;现在交给 run() / main():
            # 说一行,这个事件交回队列(attempts 不变),隔一会儿再试
            raise
        failed = e
        status = "dead" if is_permanent(e) or ev["attempts"] >= max_attempts() else "pending"
        not_before = store.minutes_from_now(backoff_minutes(ev["attempts"])) if status == "pending" else None
    requeue = store.requeue_dead_command([ev["event_id"]]) if status == "dead" else None
    why = failed and describe(failed, requeue=requeue)
    kept = store.set_status(ev["event_id"], status, why, not_before=not_before, owner=owner,
                            claimed_at=ev.get("updated_at"))
    # 慢到被放回队列、又被别人领走了:不覆盖,说一声(成功、失败都一样;原来失败时照样说「→ dead」,表里却没改)
    moved = "" if kept else "(这期间事件被放回了队列,状态留给接手的 worker 改)"
    if failed is None:
        say(f"{ev['event_id']} → {status}{moved}")
    else:
        shown = str(failed) if isinstance(failed, PermanentError) else why
        kept = (requeue, *getattr(failed, "kept", ()))  # 让人照着敲的命令、事件 id 不打码
        say(f"{ev['event_id']} 第 {ev['attempts']} 次失败 → {status}{moved}: {mask_pii(shown, keep=kept)}")
    return status


def say_retrying(error: Exception) -> None:
    """常驻模式下数据库用不了(启动时、运行中)时标准错误上的那一行;接着隔 POLL_SECONDS 再试。"""
    print(f"{store.unavailable(error)},{poll_seconds():g} 秒后再试", file=sys.stderr, flush=True)


class Worker:
    """run() 一直循环;run_once() 把现在能领的都处理完,返回 [(event_id, 新状态)]。"""

    def __init__(self, concurrency: int | None = None):
        check_settings()
        self.concurrency = concurrency or default_concurrency()
        self.owner = store.worker_id()
        # 停止信号只改这几样,不碰任何锁:信号处理函数在主线程上、任意两条字节码之间运行,主线程这时可能正拿着某把锁
        # (threading.Event 的锁:Event.wait 里,或者上一个信号的 Event.set() 里),处理函数再去拿它就是自己等自己。
        # 原来用 Event,发给整个进程组的 SIGTERM(worker 收到两次)偶尔让常驻 worker 永远停不下来
        self.stopping = False
        self._stop_signals = itertools.count()  # next() 是一次 C 调用,中间插不进别的信号:谁拿到 0 谁是第一个
        self._wake = queue.SimpleQueue()        # 空闲时在它上面等;put() 可重入,信号处理函数里可以用
        self.in_hand: set[str] = set()
        self.round_failed = False  # 这一轮有个处理线程碰上数据库出错:别的线程做完手上的就停,不再领新的
        self.requeue_every_s = poll_seconds()
        self._requeue_lock = threading.Lock()
        self._requeued_at = -math.inf
        store.init()
        self.graph, self.conn = open_graph()

    def close(self) -> None:
        self.conn.close()

    def requeue(self, *, unless_recent: bool = False) -> None:
        """放回卡住的事件。unless_recent:上次查过还不到 POLL_SECONDS 就不查(处理线程每领一个事件前都来问一次;
        几个线程同时来时只有一个去查)。只在一轮开始时查的话,一直有新事件进来,这一轮就一直不结束,
        同一台机器上死掉的 worker 手里的事件(按说马上放回)会一直卡在 processing。"""
        if not self._requeue_lock.acquire(blocking=not unless_recent):
            return
        try:
            if unless_recent and time.monotonic() - self._requeued_at < self.requeue_every_s:
                return
            self._requeued_at = time.monotonic()
            if n := store.requeue_stale(stale_minutes()):
                say(f"放回队列 {n} 个卡住的事件")
        finally:
            self._requeue_lock.release()

    def drain(self, done: list) -> None:
        while not self.stopping and not self.round_failed:
            store.same_checkpoints_or_exit(self.conn)  # 事件库在 claim 里查
            self.requeue(unless_recent=True)
            if not (ev := store.claim(self.owner)):
                return
            self.in_hand.add(ev["event_id"])
            if self.stopping:
                # 领的途中收到了停止信号:这个事件不算「手上的」,不做,交回。先记进 in_hand 再看:在这之前到的
                # 第二次 Ctrl-C 看 in_hand 是空的,不抢着退出(说好了马上就退),那就得在这里交回,不能再去等模型
                self.give_back(ev["event_id"])
                self.in_hand.discard(ev["event_id"])
                return
            done.append((ev["event_id"], process(self.graph, ev, self.owner)))
            self.in_hand.discard(ev["event_id"])

    def drain_or_end_round(self, done: list) -> None:
        """几个处理线程之一:drain(),出错时让别的线程也停下。原来一个线程碰上数据库出错(「这一轮停下」),
        别的线程照样把队列领完、起草完,说停下的这一轮其实一直做到了底(常驻模式也要等到这时才隔一会儿再试)。"""
        try:
            self.drain(done)
        except BaseException:
            self.round_failed = True
            raise

    def hand_back(self) -> None:
        """把这个进程名下还在 processing 的事件交回队列(这次不算一次失败):立即退出时手上还没做完的、数据库出错时
        没来得及改状态的,还有领取提交了、回答却因为断线没收到的(它不在 in_hand 里)。只在没有线程还在处理时调用,
        或者(立即退出时)那些线程的事件反正也要交回。"""
        try:
            handed = store.hand_back_all(self.owner)
        except store.unavailable_errors():
            # 连接被掐断时池里别的连接多半也断了,交回又借到一个死的(原来事件就这么留在 processing,要等按卡住的放回、
            # 还算一次失败):扔掉断了的连接,再试一次。SQLite 不再试:库被锁着的话,再等一个 BUSY_TIMEOUT_S 也多半一样
            if not store.drop_broken_connections():
                raise
            handed = store.hand_back_all(self.owner)
        for event_id in handed:
            print(f"{event_id} 交回队列", file=sys.stderr, flush=True)
        self.in_hand.clear()

    def give_back(self, event_id: str) -> None:
        if store.hand_back(event_id, self.owner):  # 两个线程同时交回同一个:只有一个改得成、说一行
            print(f"{event_id} 交回队列", file=sys.stderr, flush=True)

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
                # 和 with 一样等线程都停下(数据库出错时,交回事件之前不能还有线程在处理它),只有第二次 Ctrl-C 不等:
                # 用 with 的话,「立即退出」要等到每个模型调用都回来;main() 随后交回手上的事件、立即退出
                pool.shutdown(wait=not interrupted, cancel_futures=interrupted)
        return done

    def run(self) -> None:
        troubled = False  # 上一轮数据库出过错:可能有事件没来得及改状态,或者领到了却没收到回答
        while not self.stopping:
            try:
                if troubled:
                    self.hand_back()
                    troubled = False
                busy = self.run_once()
            except store.unavailable_errors() as e:
                # 数据库重启、连接被掐断、库被锁太久:常驻的 worker 不退出,等一会儿再试;手上的事件下一轮交回队列
                say_retrying(e)
                busy, troubled = [], True
            if not busy:
                with contextlib.suppress(queue.Empty):  # 等 POLL_SECONDS 秒,收到停止信号就马上醒
                    self._wake.get(timeout=poll_seconds())
        if troubled:
            # 数据库出错之后、下一轮交回之前收到了停止信号:原来直接退出,事件留在 processing,要等别人按卡住的放回、
            # 还算一次失败。数据库还是用不了就算了:那样的事件照旧按卡住的放回
            with contextlib.suppress(*store.unavailable_errors()):
                self.hand_back()

    def stop(self, signum: int | None = None, _frame=None) -> None:
        if next(self._stop_signals):
            # 再来的 SIGTERM 不改主意:发给整个进程组的 SIGTERM(systemd 停服务、kill -- -PGID),uv run 还会再转发一次,
            # worker 收到两次,原来第二次就被当成「立即退出」。手上没有事件时也不用抢:马上就退出了(原来正在收尾时
            # 收到第二个信号会带着 traceback 退出)
            if signum == signal.SIGTERM or not self.in_hand:
                return
            raise KeyboardInterrupt  # 第二次 Ctrl-C:不等了
        # 先记下「在停了」再说出来:第二个信号可能在 print 途中就到(Python 在这个函数的字节码之间就会再调它)。
        # 原来先 print 后 set,看到这一行马上再按一次 Ctrl-C,第二次被当成第一次,这一行说了两遍,worker 不退出
        self.stopping = True
        self._wake.put(signum)
        # 从脚本里放到后台跑、本来就不理 Ctrl-C 的 worker(config.SIGINT_IGNORED_AT_START):「再按一次 Ctrl-C」对它没用,不说
        hint = "" if config.SIGINT_IGNORED_AT_START else "(再按一次 Ctrl-C 立即退出,手上的事件交回队列)"
        print(f"收到停止信号:做完手上的事件就退出{hint}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = config.ArgumentParser(description="后台 worker:领事件、跑 Agent")
    parser.add_argument("--once", action="store_true", help="把现在能领的事件处理完就退出")
    parser.add_argument("--concurrency", type=int, default=None,
                        help=f"同时处理几个事件(不给时用 WORKER_CONCURRENCY,默认 {CONCURRENCY})")
    # extend:--requeue-dead 写了两次时 id 合在一起(原来只留最后一次的:前面的 id 不查也不放,最后一个不带 id 的还成了「全部」)
    parser.add_argument("--requeue-dead", nargs="*", action="extend", metavar="EVENT_ID",
                        help="把死信放回队列,不给 id 就是全部")
    args = parser.parse_args(argv)
    if args.concurrency is not None and args.concurrency < 1:
        parser.error("--concurrency 至少是 1")
    if args.concurrency is not None and args.concurrency > MAX_CONCURRENCY:
        parser.error(f"--concurrency 最多是 {MAX_CONCURRENCY}")
    if any(not e.strip() for e in args.requeue_dead or ()):  # --requeue-dead "$ID",变量是空的
        parser.error("--requeue-dead 后面的事件号不能是空的(不给事件号才是全部)")
    if args.requeue_dead is not None and (args.once or args.concurrency is not None):
        # 原来 --once 被悄悄忽略:以为放回去之后会接着处理,其实只放回了队列
        parser.error("--requeue-dead 只把死信放回队列,不处理事件,不能和 --once、--concurrency 一起用;放回之后再运行 worker")
    worker = None
    # 导入时装的 stop_while_importing 换掉:从这里起 Ctrl-C、SIGTERM 都是 KeyboardInterrupt(见下面 except),
    # 只抛一次:uv run 转发来的第二个信号原来落在 except 里(「Exception ignored … KeyboardInterrupt」)或者退出途中(退出码 143)
    config.handle_stop_signals(config.interrupt_once, config.interrupt_once)
    try:
        if args.requeue_dead is not None:
            return requeue_dead(args.requeue_dead)
        # start() 在数据库用不了时一直等着再试:这期间 SIGTERM 也能停下它(上面装好的 interrupt_once)
        worker = start(args)
        config.handle_stop_signals(worker.stop, worker.stop)
        worker.run_once() if args.once else worker.run()
    except store.unavailable_errors() as e:  # --once 中途,或者一开始就用不了;常驻模式运行中自己等着再试
        print(f"{store.unavailable(e)},这一轮停下,下次再跑", file=sys.stderr, flush=True)
        if worker:
            with contextlib.suppress(*store.unavailable_errors()):
                worker.hand_back()
        return 1
    except KeyboardInterrupt:
        if worker is None:  # 还在等数据库(或者正在建 Worker):手上没有事件,没什么要交回的
            print("收到停止信号:还没开始领事件,退出", file=sys.stderr, flush=True)
            return 0
        try:
            worker.hand_back()
        except store.unavailable_errors() as e:
            # 第二次 Ctrl-C 时数据库正好用不了(被别人锁着超过 BUSY_TIMEOUT_S、PostgreSQL 在重启):交不回去。
            # 原来是一整段 traceback;事件留在 processing,下次启动的 worker 看这个进程没了就放回队列(算一次尝试)
            print(f"{store.unavailable(e)}:手上的事件没能交回队列,留在处理中;下次启动 worker 时会放回队列",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
        # 立即退出:别等还卡在模型调用里的线程(它们的事件已经交回队列了)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)
    finally:
        # 要退出了:再来的停止信号(uv run 转发的那一次)不理。原来空闲的 worker 收到发给整个进程组的 SIGTERM,
        # 第二个信号常落在解释器退出的途中,Python 这时已把处理函数换回默认:退出码 143,而不是说好的 0
        config.ignore_stop_signals()
        if worker:
            worker.close()
    return 0


def start(args) -> Worker:
    """建好 Worker。常驻模式下数据库一开始就用不了(开机时 worker 比 PostgreSQL 先起来、服务器在重启):
    和运行中断了一样说一行、隔 POLL_SECONDS 再试,不退出。--once 交给 main() 说一行、退出码 1。设置不对照样马上退出。"""
    while True:
        try:
            return Worker(args.concurrency)
        except store.unavailable_errors() as e:
            if args.once:
                raise
            say_retrying(e)
            time.sleep(poll_seconds())


def requeue_dead(event_ids: list[str]) -> int:
    store.init()
    if event_ids:
        dead = {e["event_id"] for e in store.events_by_status("dead")}
        if missing := [e for e in event_ids if e not in dead]:
            print("这些事件不是死信(不存在,或者状态不是 dead),一个都没动:", " ".join(missing), file=sys.stderr)
            return 1
    n = store.requeue_dead(event_ids or None)
    print(f"已把 {n} 个死信放回队列")
    return 0


if __name__ == "__main__":
    config.run(main)  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
