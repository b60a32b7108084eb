"""模拟上游系统发 webhook:按课文的签名格式签好,POST 给 webhook.py。

运行:uv run python send_webhook.py T1012 [重复次数]
你会看到每次投递一行「状态码 响应 JSON」,例如
    202 {'accepted': True, 'duplicate': False}
    202 {'accepted': True, 'duplicate': True}      ← 同一个事件第二次到,被认出是重复投递

发到 WEBHOOK_URL(默认 http://127.0.0.1:8139/hooks/cloudledger),密钥是 WEBHOOK_SECRET。对方回了非 2xx、
发不出去或者没等到回答时退出码 1,参数或 WEBHOOK_URL 写错时退出码 2,Ctrl-C 退出码 130。
课文之外的部分在旁边:send_webhook_args.py(参数检查)、send_webhook_errors.py(发不出去时说清原因和下一步)。
"""
import hashlib
import hmac
import json
import sys
import time

import httpx

import config
import send_webhook_args
import send_webhook_errors

TIMEOUT_S = 10  # 秒;上游一般也就等这么久


def sign(body: bytes, secret: str, ts: int | None = None) -> str:
    """X-CloudLedger-Signature 的值:t=<unix 秒>,v1=<hex>。"""
    ts = int(time.time()) if ts is None else ts
    digest = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


def event_body(ticket_id: str) -> bytes:
    return json.dumps({"id": f"evt_{ticket_id}_created", "type": "ticket.created",
                       "data": {"ticket_id": ticket_id}}).encode()


def shown(r: httpx.Response):
    """响应体:JSON 就打印解析后的(课文的 r.json()),不是 JSON 就原文。"""
    try:
        return r.json()
    except ValueError:
        return r.text


def main(argv: list[str]) -> int:
    checked = send_webhook_args.check_args(argv)
    if isinstance(checked, int):
        return checked
    ticket_id, times = checked
    try:
        url = config.value("WEBHOOK_URL")
    except SystemExit as e:
        print(e.code, file=sys.stderr)
        return 2
    secret, body = config.value("WEBHOOK_SECRET"), event_body(ticket_id)
    failed = False
    for _ in range(times):  # 上游超时重试时,同一个事件会原样再发一次
        headers = {"content-type": "application/json", "x-cloudledger-signature": sign(body, secret)}
        try:
            # 发给本机的 webhook 不走代理:终端里设着 http_proxy / all_proxy(Clash 之类「复制终端代理命令」)时,
            # 本机的请求绕到代理上,代理没开就会说「webhook 服务起来了吗?」,其实 webhook 好好的
            r = httpx.post(url, content=body, headers=headers, timeout=TIMEOUT_S,
                           trust_env=not config.on_this_machine(url))
        # 连不上:请求根本没发出去。InvalidURL:urlsplit 放过了、httpx 不认的少见写法
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.InvalidURL) as e:
            print(send_webhook_errors.cannot_connect(url, e), file=sys.stderr)
            return 1
        except httpx.HTTPError as e:  # 连上了、请求发出去了,却没等到回答:对方可能已经收下了
            print(send_webhook_errors.no_answer(config.hide_password(url), e, ticket_id, TIMEOUT_S), file=sys.stderr)
            return 1
        print(r.status_code, shown(r))
        if r.is_redirect:  # 比如 WEBHOOK_URL 末尾多了一个 /:光一个「307 」看不出哪里不对。不跟着跳(POST 跳过去要重发)
            print(f"对方让改发到 {config.hide_password(r.headers.get('location', '?'))}:"
                  "把 WEBHOOK_URL 改成这个地址再发", file=sys.stderr)
        failed |= not r.is_success
    return 1 if failed else 0


if __name__ == "__main__":
    config.run(main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
