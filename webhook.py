"""接收「新工单」webhook:验签、去重、落库,立刻回 202。真正的处理交给 worker。

运行:uv run uvicorn webhook:app --port 8139
你会看到 uvicorn 的启动日志;每收到一个请求,发送方拿到例如 202 {"accepted": true, "duplicate": false}。

两种签名都认:
- 课文的格式(照 Stripe):X-CloudLedger-Signature: t=<unix 秒>,v1=<hex>,HMAC-SHA256(密钥, "{t}." + 原始请求体)。
  一个头里可以有几个 v1=(换密钥期间上游用新旧密钥各签一份),任意一个对上就行;v0= 之类别的方案忽略。
- Standard Webhooks:webhook-id / webhook-timestamp / webhook-signature: v1,<base64> …,
  签的是 "{id}.{timestamp}." + 原始请求体;密钥以 whsec_ 开头时按规范先 base64 解码,否则按原样的字节用。

坏请求一律回清楚的 JSON 错误,什么都不存:签名头缺失或格式不对 400,时间戳超出 ±300 秒 400,
签名不对 401,请求体不是带 id/type/data.ticket_id 的 JSON 对象 400(里面的整数超过 4300 位也是 400),
请求体超过 1 MiB 413,WEBHOOK_BODY_TIMEOUT_S(30 秒)里没收完 408;
签名对、但 type 不是 ticket.created(上游订阅了别的事件)时回 202 {"accepted": false, "reason": "ignored type"},
也什么都不存:回 4xx 的话上游会一直重试;这种事件只检查 id 和 type,不看 data。
事件库写不进去时 503(什么都没存,上游照常重试即可)。

写库不在这个进程里做:启动时拉起一个写库子进程(webhook_writer.py),同一时刻到达的一批事件交给它放进一个事务、
一次落盘(组提交),提交成功后这一批请求才各自回 202。所以回了 202 的事件,断电也还在。
写库进程被杀了,它读走了、没来得及回话的那一批回 503(可能已经提交了),下一批到来时重新拉起一个;它在两批之间
没了的话,交过去它没读到的那一批直接交给新拉起的一个,照常回 202。webhook 退出(哪怕被 kill -9)时它也跟着退出。
"""
import array
import asyncio
import base64
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import sys
import termios
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

import config
import webhook_writer
import store

DEFAULT_SECRET = "dev-secret-change-me"
DEFAULT_SECRET_WARNING = (f"没有设置 WEBHOOK_SECRET,用的是课文里公开的默认密钥 {DEFAULT_SECRET}:"
                          "谁都能照着它伪造签名,上线前一定要设置(见 .env.example)")
# cp .env.example .env 之后 WEBHOOK_SECRET 设了,值却还是这个公开的密钥:照样要提醒(原来只在没设时提醒)
DEFAULT_SECRET_SET_WARNING = (f"WEBHOOK_SECRET 还是课文里公开的默认密钥 {DEFAULT_SECRET}(多半是从 .env.example 抄来的):"
                              "谁都能照着它伪造签名,上线前一定要换掉")
TOLERANCE_S = 300             # 秒;时间戳离现在超过这么多就当重放拒掉
MAX_BODY_BYTES = 1024 * 1024  # 字节;正常的工单通知不到 1 KB,超过 1 MiB 的不读完就拒
# 秒(环境变量 WEBHOOK_BODY_TIMEOUT_S);请求体要在这么久里收完,不然回 408。上游发了请求头、请求体一个字节一个字节地挤
# (或者它那台机器半路没了、连接没关),原来这个请求一直挂着,关服务(SIGTERM)时 uvicorn 等它,服务停不下来。
# 一个工单通知不到 1 KB,1 MiB 在慢网络上也用不了这么久
BODY_TIMEOUT_S = 30
MAX_BATCH = 500               # 个;一次组提交最多写多少个事件
MAX_BATCH_CHARS = 8 * 1024 * 1024  # 字符;一批的请求体加起来最多这么长(一个 1 MiB 的请求体也能自己成一批)
WRITER_EXIT_TIMEOUT_S = 10    # 秒;关服务时等写库进程写完最后一批、退出,超时就杀掉
WRITER = Path(__file__).with_name("webhook_writer.py")
TICKET_ID = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
TIMESTAMP = re.compile(r"-?\d{1,18}", re.ASCII)  # 13 位的毫秒时间戳也认得出来,好说清楚


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
        # (可能已经提交,上游重发时得到 duplicate),下一批拉起新的。原来一直等:这一批和后面排着的请求都没有回答,
        # 连关服务都卡在等它
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


committer = GroupCommitter()
# 两种 202 的响应体事先编码好(和 FastAPI 自己序列化出来的字节一样):每个请求省下一遍 dict → JSON
ACCEPTED = {is_new: JSONResponse({"accepted": True, "duplicate": not is_new}).body for is_new in (True, False)}


@asynccontextmanager
async def lifespan(_: FastAPI):
    check_secret()  # 密钥写错了就别启动
    body_timeout_s()
    try:
        store.init()  # 设置不对(DATABASE_URL、PG_POOL_SIZE、EVENTS_DB……)时以 SystemExit("配置错误:…") 之类退出
    except store.unavailable_errors() as e:  # PostgreSQL 还没起来、在重启:也只说一行;收不下事件,不如不启动(上游会重试)
        raise SystemExit(f"{store.unavailable(e)},webhook 没有启动:数据库能连上以后再启动") from None
    await committer.start()
    # 课文和这份 README 里公开的默认密钥:照着走一遍没问题,上线就是谁都能伪造签名
    if (secret := config.get("WEBHOOK_SECRET")) in ("", DEFAULT_SECRET):
        logging.getLogger("uvicorn.error").warning(DEFAULT_SECRET_SET_WARNING if secret else DEFAULT_SECRET_WARNING)
    yield
    await committer.stop()


class StartupErrorInOneLine:
    """启动失败是因为设置不对(带说明的 SystemExit)时,uvicorn 的日志里只有那句说明,而不是一整段 traceback:
        ERROR:    配置错误:WEBHOOK_SECRET 是 whsec_,后面没有密钥
        ERROR:    Application startup failed. Exiting.
    Starlette 把 lifespan 里的异常连同 traceback 写进 lifespan.startup.failed 消息,uvicorn 照原样打印;这里只换掉
    这种消息的内容。别的异常是程序的错,照旧带 traceback。"""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def send_reason(message) -> None:
            error = sys.exc_info()[1]  # Starlette 在 except 块里发这条消息,正在处理的就是 lifespan 抛出的异常
            if message["type"] == "lifespan.startup.failed" and isinstance(error, SystemExit) \
                    and isinstance(error.code, str):
                message = {**message, "message": error.code}
            await send(message)

        await self.app(scope, receive, send_reason)


app = FastAPI(title="CloudLedger webhook", lifespan=lifespan)
app.add_middleware(StartupErrorInOneLine)


def check_timestamp(ts: str) -> None:
    if not TIMESTAMP.fullmatch(ts):
        raise HTTPException(400, "bad signature header")
    age = time.time() - int(ts)
    if age > TOLERANCE_S:
        raise HTTPException(400, "timestamp too old")
    if age < -TOLERANCE_S:
        if abs(time.time() - int(ts) / 1000) <= TOLERANCE_S:  # 上游用的是毫秒(JavaScript 的 Date.now()):常见的接错
            raise HTTPException(400, "timestamp is in milliseconds: send unix seconds")
        raise HTTPException(400, "timestamp too far in the future")


def signed_timestamps(header: str) -> list[tuple[str, list[bytes]]]:
    """签名头里的 (t, 它的那几个 v1)。换密钥期间上游每把密钥各签一行,两行的 t 可能差一秒(正好跨过一秒),
    代理合成一行后是「t=…,v1=…, t=…,v1=…」:每个 v1 归它前面那个 t(一行里 v1 写在 t 前面的,归这一行的 t)。
    原来只留最后一个 t,拿它核对所有签名:新密钥那行在前时,它自己明明对,却回 401。"""
    groups: list[tuple[str, list[bytes]]] = []
    before_any_t: list[bytes] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise HTTPException(400, "bad signature header")
        if key == "t":
            groups.append((value, before_any_t))
            before_any_t = []
        elif key == "v1":  # 十六进制不分大小写:上游用大写字母写的是同一个签名(原来回 401)
            (groups[-1][1] if groups else before_any_t).append(value.lower().encode())
    groups = [(ts, signatures) for ts, signatures in groups if signatures]
    if not groups:
        raise HTTPException(400, "bad signature header")
    return groups


def verify_cloudledger(raw: bytes, header: str, secret: str) -> None:
    """任意一个 t 在时间窗里、它的某个 v1 对得上就行;都不行时回第一个 t 的错误(只有一个 t 时和原来一样:先查时间戳)。"""
    errors = []
    for ts, signatures in signed_timestamps(header):
        try:
            check_timestamp(ts)
            expected = hmac.new(secret.encode(), f"{ts}.".encode() + raw, hashlib.sha256).hexdigest().encode()
            if any(hmac.compare_digest(expected, s) for s in signatures):
                return
            raise HTTPException(401, "bad signature")
        except HTTPException as e:
            errors.append(e)
    raise errors[0]


def standard_webhooks_key(secret: str) -> bytes:
    """Standard Webhooks 的密钥字节:whsec_ 开头按规范 base64 解码,否则就是字符串本身的字节。"""
    if secret.startswith("whsec_"):
        try:
            key = base64.b64decode(secret[len("whsec_"):], validate=True)
        except ValueError:
            raise ValueError("配置错误:WEBHOOK_SECRET 以 whsec_ 开头,但后面不是合法的 base64") from None
        if not key:  # 空密钥算出来的签名谁都能伪造
            raise ValueError("配置错误:WEBHOOK_SECRET 是 whsec_,后面没有密钥")
        return key
    return secret.encode()


def check_secret() -> None:
    """WEBHOOK_SECRET 写错了(whsec_ 后面不是 base64、或者是空的)以 SystemExit("配置错误:…") 退出。"""
    try:
        standard_webhooks_key(config.get("WEBHOOK_SECRET", DEFAULT_SECRET))
    except ValueError as e:
        raise SystemExit(str(e)) from None


def verify_standard(raw: bytes, msg_id: str, ts: str, header: str, secret: str) -> None:
    """Standard Webhooks 的签名;webhook-id / webhook-timestamp 已经由 verify() 查过。"""
    signed = f"{msg_id}.{ts}.".encode() + raw
    try:
        key = standard_webhooks_key(secret)
    except ValueError as e:  # 启动后才改坏了环境变量:不会发生在正常部署里,但也别崩
        raise HTTPException(500, str(e)) from None
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    candidates = [value.encode() for version, _, value in (e.partition(",") for e in header.split()) if version == "v1"]
    if not candidates:
        raise HTTPException(400, "bad signature header")
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise HTTPException(401, "bad signature")


def verify(request: Request, raw: bytes) -> None:
    secret = config.get("WEBHOOK_SECRET", DEFAULT_SECRET)
    headers = request.headers
    # 签名头可能有好几行(换密钥期间上游每把密钥各写一行):和代理合成一行(RFC 9110 §5.3)一样对待,任意一个签名对上就行。
    # 原来只看第一行:新密钥的签名在第二行时回 401,合成一行时却回 202
    if signed := headers.getlist("x-cloudledger-signature"):
        verify_cloudledger(raw, ",".join(signed), secret)
    elif signed := headers.getlist("webhook-signature"):
        msg_id, ts = headers.get("webhook-id"), headers.get("webhook-timestamp")
        if not msg_id or ts is None:
            raise HTTPException(400, "bad signature header")
        check_timestamp(ts)
        verify_standard(raw, msg_id, ts, " ".join(signed), secret)
    else:
        raise HTTPException(400, "missing signature header (X-CloudLedger-Signature or webhook-signature)")


def body_timeout_s() -> float:
    return config.number("WEBHOOK_BODY_TIMEOUT_S", BODY_TIMEOUT_S, minimum=0.1, maximum=3600)


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HTTPException(413, f"body larger than {MAX_BODY_BYTES} bytes")
    chunks, size, limit = [], 0, body_timeout_s()
    try:
        async with asyncio.timeout(limit):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise HTTPException(413, f"body larger than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPException(408, f"body not received within {limit:g} seconds") from None
    except ClientDisconnect:
        # 上游发到一半断开(它那边超时了,稍后会重发):没人收这个回答,日志里一行 400 就够,什么都没存。
        # 原来一整段 traceback(Exception in ASGI application),盯着日志报警的会以为服务出了错
        raise HTTPException(400, "client disconnected before the whole body arrived") from None
    return b"".join(chunks)


def parse_event(raw: bytes) -> dict:
    if raw.startswith(b"\xef\xbb\xbf"):  # JSON 不许带 BOM(RFC 8259 §8.1);原来说「不是 UTF-8」,可它是
        raise HTTPException(400, "body starts with a byte order mark: send UTF-8 JSON without it")
    try:
        event = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HTTPException(400, "body is not UTF-8 JSON") from None
    except RecursionError:  # 合法的 JSON,只是嵌套了上千层([[[[…]]]]):原来也说「不是 JSON」
        raise HTTPException(400, "body is nested too deeply") from None
    except ValueError:  # 是合法的 JSON,但里面的整数超过了 Python 肯转换的位数(int 和 str 互转的上限,默认 4300)
        raise HTTPException(400, f"body has an integer longer than {sys.get_int_max_str_digits()} digits") from None
    if not isinstance(event, dict):
        raise HTTPException(400, "body must be a JSON object with id, type and data.ticket_id")
    if not isinstance(event.get("id"), str) or not 0 < len(event["id"]) <= 200:
        raise HTTPException(400, "id must be a non-empty string (at most 200 characters)")
    if not event["id"].isprintable():
        # JSON 的 \ud800、\u0000 解出来是落不了库的字符(SQLite 编不成 UTF-8,PostgreSQL 的 text 不收 NUL):
        # 放过去的话同一批组提交整批失败,和它一起到的好事件也都回 503
        # 不间断空格、零宽字符这类看不见的也不收(isprintable 为假):事件 id 要在终端、日志里认得出来
        raise HTTPException(400, "id must be printable: no control, invisible or non-ASCII space characters, no unpaired surrogates")
    if event["id"] != event["id"].strip():
        # 空格这类看得见的空白(isprintable 为真):只有空格的 id 在日志里是空的,前后带空格的和不带的成了两个事件
        raise HTTPException(400, "id must not start or end with whitespace")
    if event["id"].startswith(store.OTHER_SOURCE_ID_PREFIXES):
        # 三个来源共用一个 event_id 唯一键:原来一个签名对的请求用一封信的 Message-ID 或 cron:stale:… 当 id,
        # 就让那封信成了 duplicate(标了已读、不建工单)、那天的提醒不再入队
        raise HTTPException(400, "id must not start with " + ", ".join(store.OTHER_SOURCE_ID_PREFIXES)
                   + " (those are the ids of mail and cron events)")
    if not isinstance(event.get("type"), str):
        raise HTTPException(400, "type must be a string")
    return event


@app.post("/hooks/cloudledger", status_code=202)
async def receive(request: Request):
    raw = await read_body(request)
    verify(request, raw)  # 先验签,后解析:签名算的是原始字节,不能拿解析后的 JSON 去算
    event = parse_event(raw)
    if event["type"] != "ticket.created":
        return {"accepted": False, "reason": "ignored type"}
    data = event.get("data")
    ticket_id = data.get("ticket_id") if isinstance(data, dict) else None
    if not isinstance(ticket_id, str) or not TICKET_ID.fullmatch(ticket_id):
        raise HTTPException(400, "data.ticket_id must be a string of letters, digits, _ or - (at most 64)")
    try:
        is_new = await committer.add((event["id"], "webhook", event["type"], raw.decode("utf-8")))
    except StoreUnavailable as e:  # 事件库写不进去(磁盘满、库被锁太久、写库进程没了……):让上游稍后重试
        raise HTTPException(503, f"event store unavailable ({e}), retry later") from None
    return Response(ACCEPTED[is_new], status_code=202, media_type="application/json")
