"""接收「新工单」webhook:验签、去重、落库,立刻回 202。真正的处理交给 worker。

运行:uv run uvicorn webhook:app --port 8139
你会看到 uvicorn 的启动日志;每收到一个请求,发送方拿到例如 202 {"accepted": true, "duplicate": false}。

两种签名都认:
- 课文的格式(照 Stripe):X-CloudLedger-Signature: t=<unix 秒>,v1=<hex>,HMAC-SHA256(密钥, "{t}." + 原始请求体)。
  一个头里可以有几个 v1=(换密钥期间上游用新旧密钥各签一份),任意一个对上就行;v0= 之类别的方案忽略。
- Standard Webhooks:webhook-id / webhook-timestamp / webhook-signature: v1,<base64> …,
  签的是 "{id}.{timestamp}." + 原始请求体;密钥以 whsec_ 开头时按规范先 base64 解码,否则按原样的字节用。

坏请求一律回清楚的 JSON 错误,什么都不存:签名头缺失或格式不对 400,时间戳超出 ±300 秒 400,
签名不对 401,请求体不是带 id/type/data.ticket_id 的 JSON 对象 400,请求体超过 1 MiB 413;
事件库写不进去时 503(什么都没存,上游照常重试即可)。

SQLite 写入不在事件循环里做:请求把事件交给一个写库线程,它把同一时刻到达的一批事件放进一个事务、
一次落盘(组提交),提交成功后这一批请求才各自回 202。所以回了 202 的事件,断电也还在。
"""
import asyncio
import base64
import hashlib
import hmac
import json
import queue
import re
import threading
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

import config
import store

DEFAULT_SECRET = "dev-secret-change-me"
TOLERANCE_S = 300             # 秒;时间戳离现在超过这么多就当重放拒掉
MAX_BODY_BYTES = 1024 * 1024  # 字节;正常的工单通知不到 1 KB,超过 1 MiB 的不读完就拒
MAX_BATCH = 500               # 个;一次组提交最多写多少个事件
TICKET_ID = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
TIMESTAMP = re.compile(r"-?\d{1,12}", re.ASCII)


class GroupCommitter:
    """一个写库线程:把排队的事件成批写进一个事务,再把每个事件「是不是新的」交回给各自的请求。"""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join()

    async def add(self, event: tuple[str, str, str, str]) -> bool:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((event, future, loop))
        return await future

    def _run(self) -> None:
        while (first := self.queue.get()) is not None:
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.queue.put(None)  # 先把这一批写完,下一圈再退出
                    break
                batch.append(item)
            try:
                results, error = store.add_events([event for event, _, _ in batch]), None
            except Exception as e:  # noqa: BLE001 —— 写库失败:这一批请求都回 503,上游会重试
                results, error = [None] * len(batch), e
            # 一批只叫醒事件循环一次(每个请求叫一次的话,光是跨线程唤醒就让吞吐掉三成,见 bench/webhook.py)
            by_loop: dict = {}
            for (_, future, loop), is_new in zip(batch, results):
                by_loop.setdefault(loop, []).append((future, is_new))
            for loop, outcomes in by_loop.items():
                loop.call_soon_threadsafe(_settle, outcomes, error)


def _settle(outcomes: list[tuple[asyncio.Future, bool | None]], error: Exception | None) -> None:
    """在事件循环里把一批结果交给各自的请求。"""
    for future, is_new in outcomes:
        if future.done():  # 客户端已经断开,请求被取消了;事件照样已经落库
            continue
        future.set_exception(error) if error else future.set_result(is_new)


committer = GroupCommitter()
# 两种 202 的响应体事先编码好(和 FastAPI 自己序列化出来的字节一样):每个请求省下一遍 dict → JSON
ACCEPTED = {is_new: JSONResponse({"accepted": True, "duplicate": not is_new}).body for is_new in (True, False)}


@asynccontextmanager
async def lifespan(_: FastAPI):
    standard_webhooks_key(config.get("WEBHOOK_SECRET", DEFAULT_SECRET))  # 密钥写错了就别启动,启动日志里说清楚
    store.init()
    committer.start()
    yield
    committer.stop()


app = FastAPI(title="CloudLedger webhook", lifespan=lifespan)


def fail(status: int, detail: str) -> HTTPException:
    return HTTPException(status_code=status, detail=detail)


def check_timestamp(ts: str) -> None:
    if not TIMESTAMP.fullmatch(ts):
        raise fail(400, "bad signature header")
    age = time.time() - int(ts)
    if age > TOLERANCE_S:
        raise fail(400, "timestamp too old")
    if age < -TOLERANCE_S:
        raise fail(400, "timestamp too far in the future")


def verify_cloudledger(raw: bytes, header: str, secret: str) -> None:
    ts, signatures = None, []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise fail(400, "bad signature header")
        if key == "t":
            ts = value
        elif key == "v1":
            signatures.append(value.encode())
    if ts is None or not signatures:
        raise fail(400, "bad signature header")
    check_timestamp(ts)
    expected = hmac.new(secret.encode(), f"{ts}.".encode() + raw, hashlib.sha256).hexdigest().encode()
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise fail(401, "bad signature")


def standard_webhooks_key(secret: str) -> bytes:
    """Standard Webhooks 的密钥字节:whsec_ 开头按规范 base64 解码,否则就是字符串本身的字节。"""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_"):], validate=True)
        except ValueError:
            raise ValueError("配置错误:WEBHOOK_SECRET 以 whsec_ 开头,但后面不是合法的 base64") from None
    return secret.encode()


def verify_standard(raw: bytes, msg_id: str | None, ts: str | None, header: str, secret: str) -> None:
    if not msg_id or ts is None:
        raise fail(400, "bad signature header")
    check_timestamp(ts)
    signed = f"{msg_id}.{ts}.".encode() + raw
    try:
        key = standard_webhooks_key(secret)
    except ValueError as e:  # 启动后才改坏了环境变量:不会发生在正常部署里,但也别崩
        raise fail(500, str(e)) from None
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    candidates = [value.encode() for version, _, value in (e.partition(",") for e in header.split()) if version == "v1"]
    if not candidates:
        raise fail(400, "bad signature header")
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise fail(401, "bad signature")


def verify(request: Request, raw: bytes) -> None:
    secret = config.get("WEBHOOK_SECRET", DEFAULT_SECRET)
    headers = request.headers
    if (header := headers.get("x-cloudledger-signature")) is not None:
        verify_cloudledger(raw, header, secret)
    elif (header := headers.get("webhook-signature")) is not None:
        verify_standard(raw, headers.get("webhook-id"), headers.get("webhook-timestamp"), header, secret)
    else:
        raise fail(400, "missing signature header (X-CloudLedger-Signature or webhook-signature)")


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise fail(413, f"body larger than {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise fail(413, f"body larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_event(raw: bytes) -> dict:
    try:
        event = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise fail(400, "body is not UTF-8 JSON") from None
    if not isinstance(event, dict):
        raise fail(400, "body must be a JSON object with id, type and data.ticket_id")
    if not isinstance(event.get("id"), str) or not 0 < len(event["id"]) <= 200:
        raise fail(400, "id must be a non-empty string (at most 200 characters)")
    if not isinstance(event.get("type"), str):
        raise fail(400, "type must be a string")
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
        raise fail(400, "data.ticket_id must be a string of letters, digits, _ or - (at most 64)")
    try:
        is_new = await committer.add((event["id"], "webhook", event["type"], raw.decode("utf-8")))
    except Exception as e:  # noqa: BLE001 —— 事件库写不进去(磁盘满、库被锁太久……):没存,让上游稍后重试
        raise fail(503, f"event store unavailable ({type(e).__name__}: {e}), retry later") from None
    return Response(ACCEPTED[is_new], status_code=202, media_type="application/json")
