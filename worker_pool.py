"""worker.py 的并发、停止信号和交回事件:一个 worker 开几个处理线程同时等模型(WORKER_CONCURRENCY),
Ctrl-C / SIGTERM 做完手上的再退、第二次 Ctrl-C 立即退出并把手上的事件交回队列(不算一次失败),
数据库出错时这一轮停下、交回没来得及改状态的事件,以及 checkpoint 什么时候写(CHECKPOINT_DURABILITY);
还有图到领到第一个事件时才建(graph):队列空着的 worker.py --once 不导入 LangGraph 的图。
课文的 worker 是一个线程的死循环,被杀掉的事件只能等 requeue_stale 按时间放回;这里常驻的 worker 要在 systemd、
容器和终端里都能干净地停下。"""
import itertools
import os
import queue
import signal
import sys
import threading

import config
import store_errors
import store_pg
import worker_owner

# CHECKPOINT_DURABILITY:worker 跑图时 checkpoint 什么时候写(LangGraph 的 durability);收件箱恢复 thread 时总是用 sync(见 inbox.py)。
#   async(默认,和课文一样):每走完一个节点写一次(后台线程写,这次运行结束前等它写完)。
#         被 kill -9 的工单,重启后从被杀时所在的节点接着跑。
#   exit:这次运行停下时(进了收件箱、出错、做完)才写一次。出错照样从失败的节点续跑(出错退出时也写);
#         但被 kill -9 时,这次运行里走过的节点都没记下:新工单重启后 load 再读一遍工单、draft 再调一次模型
#         (被杀时模型多半还没回答,这次调用反正白费)。PostgreSQL 上一个事件少 6 次写入,见 docs/performance.md。
#   sync:每走完一个节点写一次,写完才走下一个。


_say_lock = threading.Lock()


def say(line: str) -> None:
    """几个线程同时打印时一行一行地出来:print 的几段和换行是分开写的,不加锁会拼在一起。"""
    with _say_lock:
        print(line, flush=True)


def stop_while_importing(_signum, _frame) -> None:
    """下面导入 openai、LangGraph 要几秒:这期间的 Ctrl-C / SIGTERM 说一行、退出码 0,什么都还没碰。
    uv run 转发来的第二个信号不理,这一行只说一遍。"""
    config.ignore_stop_signals()
    print("收到停止信号:还没开始领事件,退出", file=sys.stderr, flush=True)
    os._exit(0)


class WorkerBase:
    """Worker(worker.py)的停止、交回和多线程收尾。"""

    def __init__(self):
        # 停止信号只改这几样,不碰任何锁:信号处理函数在主线程上、任意两条字节码之间运行,主线程这时可能正拿着某把锁
        # (比如 threading.Event 的锁),处理函数再去拿它就是自己等自己,常驻 worker 就永远停不下来
        self.stopping = False
        self._stop_signals = itertools.count()  # next() 是一次 C 调用,中间插不进别的信号:谁拿到 0 谁是第一个
        self._wake = queue.SimpleQueue()        # 空闲时在它上面等;put() 可重入,信号处理函数里可以用
        self.in_hand: set[str] = set()
        self.round_failed = False  # 这一轮有个处理线程碰上数据库出错:别的线程做完手上的就停,不再领新的
        self._graph, self._graph_lock = None, threading.Lock()

    @property
    def graph(self):
        """agent.py 的图,第一次用到(领到第一个事件)时才导入、编译,用 Worker 开好的 saver:导入图要半秒多,
        crontab 每分钟跑一次的 worker.py --once 多半遇上空队列;几个处理线程同时来时只编一次。"""
        with self._graph_lock:
            if self._graph is None:
                from agent import builder

                self._graph = builder.compile(checkpointer=self.saver)
            return self._graph

    @graph.setter
    def graph(self, graph) -> None:  # bench/worker.py 换上装了计时的图
        self._graph = graph

    def close(self) -> None:
        self.conn.close()

    def drain_or_end_round(self, done: list) -> None:
        """几个处理线程之一:drain(),出错时让别的线程做完手上的也停下:说「这一轮停下」,这一轮就真的停下。"""
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
            handed = worker_owner.hand_back_all(self.owner)
        except store_errors.unavailable_errors():
            # 连接被掐断时池里别的连接多半也断了,交回又借到一个死的:扔掉断了的连接,再试一次。
            # SQLite 不再试:库被锁着的话,再等一个 BUSY_TIMEOUT_S 也多半一样
            if not store_pg.drop_broken_connections():
                raise
            handed = worker_owner.hand_back_all(self.owner)
        for event_id in handed:
            print(f"{event_id} 交回队列", file=sys.stderr, flush=True)
        self.in_hand.clear()

    def give_back(self, event_id: str) -> None:
        if worker_owner.hand_back(event_id, self.owner):  # 两个线程同时交回同一个:只有一个改得成、说一行
            print(f"{event_id} 交回队列", file=sys.stderr, flush=True)

    def stop(self, signum: int | None = None, _frame=None) -> None:
        if next(self._stop_signals):
            # 再来的 SIGTERM 不改主意:发给整个进程组的 SIGTERM(systemd 停服务、kill -- -PGID)uv run 还会再转发一次。
            # 手上没有事件时也不用抢:马上就退出了
            if signum == signal.SIGTERM or not self.in_hand:
                return
            raise KeyboardInterrupt  # 第二次 Ctrl-C:不等了
        # 先记下「在停了」再说出来:第二个信号可能在 print 途中就到,那时它要被当成第二次
        self.stopping = True
        self._wake.put(signum)
        # 从脚本里放到后台跑、本来就不理 Ctrl-C 的 worker(config.SIGINT_IGNORED_AT_START):「再按一次 Ctrl-C」对它没用,不说
        hint = "" if config.SIGINT_IGNORED_AT_START else "(再按一次 Ctrl-C 立即退出,手上的事件交回队列)"
        print(f"收到停止信号:做完手上的事件就退出{hint}", file=sys.stderr, flush=True)
