"""webhook.py 验签的两样补充(课文只认一行 t=…,v1=…):换密钥期间上游用新旧密钥各签一份,签名头里可能有几个 t 和
v1,signed_timestamps 把每个 v1 归到它自己的 t 上,任意一个对上就收;另外也认 Standard Webhooks 规范的三个请求头
(webhook-id / webhook-timestamp / webhook-signature),密钥以 whsec_ 开头时按规范先 base64 解码。时间戳窗口和课文格式的
HMAC 核对留在 webhook.py 里。"""
import base64
import hashlib
import hmac

from fastapi import HTTPException


def signed_timestamps(header: str) -> list[tuple[str, list[bytes]]]:
    """签名头里的 (t, 它的那几个 v1)。换密钥期间上游每把密钥各签一行,两行的 t 可能差一秒(正好跨过一秒),
    代理合成一行后是「t=…,v1=…, t=…,v1=…」:每个 v1 归它前面那个 t(一行里 v1 写在 t 前面的,归这一行的 t),
    所以哪一行在前都能核对。"""
    groups: list[tuple[str, list[bytes]]] = []
    before_any_t: list[bytes] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise HTTPException(400, "bad signature header")
        if key == "t":
            groups.append((value, before_any_t))
            before_any_t = []
        elif key == "v1":  # 十六进制不分大小写:上游用大写字母写的是同一个签名
            (groups[-1][1] if groups else before_any_t).append(value.lower().encode())
    groups = [(ts, signatures) for ts, signatures in groups if signatures]
    if not groups:
        raise HTTPException(400, "bad signature header")
    return groups


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
