"""接收「新工单」webhook:验签、去重、落库,立刻回 202。真正的处理交给 worker。

运行:uv run uvicorn webhook:app --port 8139
你会看到 uvicorn 的启动日志;每收到一个请求,发送方拿到例如 202 {"accepted": true, "duplicate": false}。

这个文件按课文的顺序:密钥和时间窗、app、verify()、receive()。课文之外的部分在旁边:
- webhook_sign.py:换密钥期间的多个签名、Standard Webhooks 的三个请求头;
- webhook_request.py:请求体的大小和时限、坏请求回清楚的 400(什么都不存);
- webhook_commit.py + webhook_writer.py:组提交,同一时刻到达的一批事件在写库子进程里一个事务落盘,
  提交成功后才各自回 202,所以回了 202 的事件断电也还在;写不进去回 503,上游照常重试;
- webhook_startup.py:设置写错时启动失败只打一行说明。
"""
import hashlib
import hmac
import logging
import re
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

import config
import store
import store_errors
import webhook_commit
import webhook_request
import webhook_sign
import webhook_startup

# 课文的 SECRET:verify() 每个请求用 config.get 读 WEBHOOK_SECRET,没设时用这个课文里公开的默认值
DEFAULT_SECRET = "dev-secret-change-me"
DEFAULT_SECRET_WARNING = (f"没有设置 WEBHOOK_SECRET,用的是课文里公开的默认密钥 {DEFAULT_SECRET}:"
                          "谁都能照着它伪造签名,上线前一定要设置(见 .env.example)")
# 从 .env.example 抄来、值还是这个公开密钥时也提醒
DEFAULT_SECRET_SET_WARNING = (f"WEBHOOK_SECRET 还是课文里公开的默认密钥 {DEFAULT_SECRET}(多半是从 .env.example 抄来的):"
                              "谁都能照着它伪造签名,上线前一定要换掉")
TOLERANCE_S = 300             # 秒;时间戳离现在超过这么多就当重放拒掉
TICKET_ID = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
TIMESTAMP = re.compile(r"-?\d{1,18}", re.ASCII)  # 13 位的毫秒时间戳也认得出来,好说清楚


committer = webhook_commit.GroupCommitter()
# 两种 202 的响应体事先编码好(和 FastAPI 自己序列化出来的字节一样):每个请求省下一遍 dict → JSON
ACCEPTED = {is_new: JSONResponse({"accepted": True, "duplicate": not is_new}).body for is_new in (True, False)}


@asynccontextmanager
async def lifespan(_: FastAPI):
    check_secret()  # 密钥写错了就别启动
    config.value("WEBHOOK_BODY_TIMEOUT_S")
    try:
        store.init()  # 设置不对(DATABASE_URL、PG_POOL_SIZE、EVENTS_DB……)时以 SystemExit("配置错误:…") 之类退出
    except store_errors.unavailable_errors() as e:  # PostgreSQL 还没起来、在重启:也只说一行;收不下事件,不如不启动(上游会重试)
        raise SystemExit(f"{store_errors.unavailable(e)},webhook 没有启动:数据库能连上以后再启动") from None
    await committer.start()
    # 课文和这份 README 里公开的默认密钥:照着走一遍没问题,上线就是谁都能伪造签名
    if (secret := config.get("WEBHOOK_SECRET")) in ("", DEFAULT_SECRET):
        logging.getLogger("uvicorn.error").warning(DEFAULT_SECRET_SET_WARNING if secret else DEFAULT_SECRET_WARNING)
    yield
    await committer.stop()


app = FastAPI(title="CloudLedger webhook", lifespan=lifespan)
app.add_middleware(webhook_startup.StartupErrorInOneLine)


def verify(request: Request, raw: bytes) -> None:
    secret = config.value("WEBHOOK_SECRET")
    headers = request.headers
    # 签名头可能有好几行(换密钥期间上游每把密钥各写一行):和代理合成一行(RFC 9110 §5.3)一样对待,任意一个签名对上就行
    if signed := headers.getlist("x-cloudledger-signature"):
        verify_cloudledger(raw, ",".join(signed), secret)
    elif signed := headers.getlist("webhook-signature"):
        msg_id, ts = headers.get("webhook-id"), headers.get("webhook-timestamp")
        if not msg_id or ts is None:
            raise HTTPException(400, "bad signature header")
        check_timestamp(ts)
        webhook_sign.verify_standard(raw, msg_id, ts, " ".join(signed), secret)
    else:
        raise HTTPException(400, "missing signature header (X-CloudLedger-Signature or webhook-signature)")


def verify_cloudledger(raw: bytes, header: str, secret: str) -> None:
    """课文的签名:HMAC-SHA256(密钥, "{t}." + 原始请求体) 的十六进制。任意一个 t 在时间窗里、它的某个 v1 对得上就行;
    都不行时回第一个 t 的错误(只有一个 t 时就是课文的顺序:先查时间戳,再核对签名)。"""
    errors = []
    for ts, signatures in webhook_sign.signed_timestamps(header):
        try:
            check_timestamp(ts)
            expected = hmac.new(secret.encode(), f"{ts}.".encode() + raw, hashlib.sha256).hexdigest().encode()
            if any(hmac.compare_digest(expected, s) for s in signatures):
                return
            raise HTTPException(401, "bad signature")
        except HTTPException as e:
            errors.append(e)
    raise errors[0]


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


@app.post("/hooks/cloudledger", status_code=202)
async def receive(request: Request):
    raw = await webhook_request.read_body(request)
    verify(request, raw)  # 先验签,后解析:签名算的是原始字节,不能拿解析后的 JSON 去算
    event = webhook_request.parse_event(raw)
    if event["type"] != "ticket.created":
        return {"accepted": False, "reason": "ignored type"}
    data = event.get("data")
    ticket_id = data.get("ticket_id") if isinstance(data, dict) else None
    if not isinstance(ticket_id, str) or not TICKET_ID.fullmatch(ticket_id):
        raise HTTPException(400, "data.ticket_id must be a string of letters, digits, _ or - (at most 64)")
    try:
        is_new = await committer.add((event["id"], "webhook", event["type"], raw.decode("utf-8")))
    except webhook_commit.StoreUnavailable as e:  # 事件库写不进去(磁盘满、库被锁太久、写库进程没了……):让上游稍后重试
        raise HTTPException(503, f"event store unavailable ({e}), retry later") from None
    return Response(ACCEPTED[is_new], status_code=202, media_type="application/json")


def check_secret() -> None:
    """WEBHOOK_SECRET 写错了(whsec_ 后面不是 base64、或者是空的)以 SystemExit("配置错误:…") 退出。"""
    try:
        webhook_sign.standard_webhooks_key(config.value("WEBHOOK_SECRET"))
    except ValueError as e:
        raise SystemExit(str(e)) from None
