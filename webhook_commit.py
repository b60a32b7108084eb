"""webhook.py 的组提交(课文里 receive() 直接调 store.add_event,一个请求一次提交):GroupCommitter 把同一时刻到达的请求
攒成一批,经管道交给写库子进程 webhook_writer.py,放进一个事务一次落盘,提交成功后这一批请求才各自回 202;写库进程
被杀、卡住或回了看不懂的话时,这一批回 503,下一批重新拉起一个。这样事件循环只管收发请求,写库在另一个核上做,
吞吐接近空端点(bench/webhook.py),回了 202 的事件断电也还在。"""
import array
import asyncio
import fcntl
import json
import os
import sys
import termios
from pathlib import Path

import webhook_writer

MAX_BATCH = 500               # 个;一次组提交最多写多少个事件
MAX_BATCH_CHARS = 8 * 1024 * 1024  # 字符;一批的请求体加起来最多这么长(一个 1 MiB 的请求体也能自己成一批)
WRITER_EXIT_TIMEOUT_S = 10    # 秒;关服务时等写库进程写完最后一批、退出,超时就杀掉
WRITER = Path(__file__).with_name("webhook_writer.py")


class StoreUnavailable(Exception):
    """这一批没写进去(写库进程报错,或者它退出了):这一批的请求都回 503。"""


class GroupCommitter:
    """把事件交给写库进程(webhook_writer.py)成批写。同一时刻只有一批在写,写的时候到达的请求排队,
    等这一批提交完,排着的一起成为下一批。所有的活都在事件循环里做,不另开线程。"""

    def __init__(self) -> None:
        self.pending: list[tuple[tuple, asyncio.Future]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.wake: asyncio.Event | None = None
        self.pump: asyncio.Task | None = None
        self.stopping = False
        self.stdin_copy: int | None = None  # 写库进程输入管道写端的副本,见 _spawn
        # 秒;交给写库进程的一批,等它回话最多等这么久(webhook_writer.batch_time_limit_s(),start() 时按 BUSY_TIMEOUT_S 算)。
        # 过了还没回话(多半是和 PostgreSQL 之间的网络不通了、服务器不回话,它卡在读 socket 上):杀掉它,这一批回 503
        # (可能已经提交,上游重发时得到 duplicate),下一批拉起新的。不设上限的话,这一批、排在后面的请求和关服务都卡住
        self.answer_timeout_s = 0.0

    async def start(self) -> None:
        self.answer_timeout_s = webhook_writer.batch_time_limit_s()
        self.pending, self.stopping, self.wake = [], False, asyncio.Event()
        await self._spawn()
        self.pump = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """写完排着的,关掉写库进程的输入,它读到结尾就退出。"""
        self.stopping = True
        self.wake.set()
        await self.pump
        self._close_stdin_copy()  # 副本先关掉:下面关了 stdin,写库进程才读得到输入结束
        if self.proc.returncode is None:
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), WRITER_EXIT_TIMEOUT_S)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def add(self, event: tuple[str, str, str, str]) -> bool:
        if self.stopping:
            raise StoreUnavailable("shutting down")
        future = asyncio.get_running_loop().create_future()
        self.pending.append((event, future))
        self.wake.set()
        return await future

    async def _run(self) -> None:
        while not (self.stopping and not self.pending):
            await self.wake.wait()
            self.wake.clear()
            while self.pending:
                batch = self._take()
                try:
                    results, error = await self._write([event for event, _ in batch]), None
                except Exception as e:  # noqa: BLE001 —— 不管出了什么错,这一批的请求都要有个回答,这个循环不能停
                    error = e if isinstance(e, StoreUnavailable) else StoreUnavailable(f"{type(e).__name__}: {e}")
                    results = [None] * len(batch)
                for (_, future), is_new in zip(batch, results):
                    if future.done():  # 客户端已经断开,请求被取消了;事件照样已经落库
                        continue
                    future.set_exception(error) if error else future.set_result(is_new)

    def _take(self) -> list:
        """从排队的请求里取一批:最多 MAX_BATCH 个,请求体加起来最多 MAX_BATCH_CHARS 个字符(至少取一个)。"""
        size, n = 0, 0
        for event, _ in self.pending[:MAX_BATCH]:
            size += len(event[3])
            if n and size > MAX_BATCH_CHARS:
                break
            n += 1
        batch, self.pending = self.pending[:n], self.pending[n:]
        return batch

    async def _spawn(self) -> None:
        """拉起一个新的写库进程。另外留一个它输入管道写端的副本(self.stdin_copy):它没了以后,asyncio 会关掉自己那个,
        靠这个副本还能看管道里剩没剩下它没读走的字节(_unread)。副本不传给子进程;关输入时两个都关,它才读到结尾。"""
        self._close_stdin_copy()
        self.proc = await asyncio.create_subprocess_exec(sys.executable, str(WRITER), stdin=asyncio.subprocess.PIPE,
                                                         stdout=asyncio.subprocess.PIPE)
        self.stdin_copy = os.dup(self.proc.stdin.transport.get_extra_info("pipe").fileno())

    def _close_stdin_copy(self) -> None:
        if self.stdin_copy is not None:
            os.close(self.stdin_copy)
            self.stdin_copy = None

    def _unread(self) -> int:
        """写库进程的输入管道里还有多少字节没被读走(读不出来就当 0)。"""
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self.stdin_copy, termios.FIONREAD, count, True)
        except (OSError, TypeError):
            return 0
        return count[0]

    async def _write(self, events: list[tuple]) -> list[bool]:
        """把一批交给写库进程,等它提交完回话。它不在了(被杀、崩了)就先重新拉起一个。

        交过去时它已经没了、或者正在退出(刚被 kill -9,asyncio 还没收到它退出的消息),这一行它没读完,这一批不可能
        提交过:拉起新的再交一次,回答(新的 / 重复)照样是对的。它读走了这一行才没的,这一批可能已经提交,也可能没有:
        这时不再交第二次 —— 已经提交了的话,新的写库进程会说「已经在库里」,这次投递明明是第一次到,却回
        duplicate: true。回 503,上游重发时已提交的才得到 duplicate。"""
        line = json.dumps(events).encode() + b"\n"
        while True:
            fresh = self.proc.returncode is not None  # 这一个是刚为这一批拉起的
            if fresh:
                try:
                    await self._spawn()
                except OSError as e:
                    raise StoreUnavailable(f"cannot start writer process: {e}") from None
            try:
                self.proc.stdin.write(line)
                await self.proc.stdin.drain()
            except OSError:  # 管道断了:它在这一行交完之前就没了,没读到完整的一行
                reply, unread = b"", True
            else:
                try:
                    reply = await asyncio.wait_for(self.proc.stdout.readline(), self.answer_timeout_s)
                except asyncio.TimeoutError:  # 要写在 OSError 前面:Python 3.11 起它就是内置的 TimeoutError,OSError 的子类
                    self.proc.kill()
                    await self.proc.wait()
                    raise StoreUnavailable(f"writer process did not answer within {self.answer_timeout_s:g} s") from None
                except OSError:
                    reply = b""
                unread = False
            if reply:
                break
            code = await self.proc.wait()  # 它没回话就退出了;等它真的退出了,管道里剩下的就不会再有人读
            if fresh or not (unread or self._unread()):  # 刚拉起的也没读就退出了(起不来):再拉一个也一样
                raise StoreUnavailable(f"writer process exited with code {code}")
        try:
            answer = json.loads(reply)
            error, is_new = answer.get("error"), answer.get("new")
        except (ValueError, AttributeError):
            error, is_new = None, None
        if error is not None:
            raise StoreUnavailable(error)
        if not isinstance(is_new, list) or len(is_new) != len(events):
            raise StoreUnavailable(f"writer process answered {reply[:200]!r}")
        return is_new
