"""模拟上游系统发 webhook:按课文的签名格式签好,POST 给 webhook.py。

运行:uv run python send_webhook.py T1012 [重复次数]
你会看到每次投递一行「状态码 响应 JSON」,例如
    202 {'accepted': True, 'duplicate': False}
    202 {'accepted': True, 'duplicate': True}      ← 同一个事件第二次到,被认出是重复投递

发到 WEBHOOK_URL(默认 http://127.0.0.1:8139/hooks/cloudledger),密钥是 WEBHOOK_SECRET。
服务没起来时说明原因,退出码 1;对方回了非 2xx 时照样打印,退出码 1;请求发出去了、却超时或者连接断了时说
webhook 可能已经存下了这个事件、再发一次是安全的(会回 duplicate: true),退出码 1;
Ctrl-C:一行「已中断(Ctrl-C)」,退出码 130(正在等回答的那一次 webhook 可能已经存下了,再发一次是安全的);
参数不对(工单号是空的、以 - 开头、有字母数字 _ - 以外的字符,重复次数不是正整数)或 WEBHOOK_URL 写错时说明原因,退出码 2;--help 打印用法。
"""
import hashlib
import hmac
import json
import shlex
import sys
import time
from urllib.parse import urlsplit

import httpx

import config
from webhook import DEFAULT_SECRET, TICKET_ID

DEFAULT_URL = "http://127.0.0.1:8139/hooks/cloudledger"
TIMEOUT_S = 10  # 秒;上游一般也就等这么久


def sign(body: bytes, secret: str, ts: int | None = None) -> str:
    """X-CloudLedger-Signature 的值:t=<unix 秒>,v1=<hex>。"""
    ts = int(time.time()) if ts is None else ts
    digest = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


def event_body(ticket_id: str) -> bytes:
    return json.dumps({"id": f"evt_{ticket_id}_created", "type": "ticket.created",
                       "data": {"ticket_id": ticket_id}}).encode()


USAGE = "用法:uv run python send_webhook.py 工单号 [重复次数,正整数]"
MAX_TIMES = 100  # 次;模拟上游超时重试,几次就够了。原来多写几个 0 就一直发下去(试过发了两万多次才按住)


def port_of(url: str) -> int:
    """WEBHOOK_URL 的端口:提示起 webhook 时说对端口(没写就是 http 80、https 443)。"""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def no_answer(url: str, e: httpx.HTTPError, ticket_id: str, timeout_s: float) -> str:
    """请求发出去以后超时、连接断了:不是「服务没起来」。webhook 可能已经把事件存下了,只是回答没送到;
    同一个事件再发一次是安全的 —— 事件 id 一样,存下了的只会回 duplicate: true,不会存两份。"""
    timed_out = isinstance(e, httpx.TimeoutException)
    what = f"但 {timeout_s} 秒内没有回答" if timed_out else "但还没回答,连接就断了"
    # 连上的不是 webhook、是别的服务(端口写成了数据库、Redis 的)时也是连接被断开:光看错误分不出来,说一句
    other = "" if timed_out else ";要是 WEBHOOK_URL 的端口指到了别的服务(数据库、Redis……),它们不说 HTTP,也是这样断开,先核对 WEBHOOK_URL"
    return (f"没等到回答:请求已经发给 {url},{what}({type(e).__name__}: {e})。webhook 可能已经存下了这个事件,"
            f"再发一次同一个事件是安全的(事件 id 不变,已经存下了只会回 duplicate: true):"
            f"uv run python send_webhook.py {shlex.quote(ticket_id)}{other}")


def cannot_connect(url: str, e: httpx.HTTPError) -> str:
    """连不上(请求根本没发出去)时说给人听的一句:多半是 webhook 没起来;https 对着 http 的服务、走了没开的代理也说清楚。"""
    if urlsplit(url).scheme == "https" and "SSL" in str(e):  # 服务起来了,只是 uvicorn 默认说的是 http
        hint = "WEBHOOK_URL 是 https://,可 uv run uvicorn webhook:app 起的服务是 http 的:把 WEBHOOK_URL 改成 http://…"
    else:
        hint = f"webhook 服务起来了吗?先在另一个终端运行 uv run uvicorn webhook:app --port {port_of(url)}"
    hint += config.proxy_note(url)
    return f"发不出去:{config.hide_password(url)} 连不上({type(e).__name__}: {e})。{hint}"


def shown(r: httpx.Response):
    """响应体:JSON 就打印解析后的(课文的 r.json()),不是 JSON 就原文。"""
    try:
        return r.json()
    except ValueError:
        return r.text


def check_args(argv: list[str]) -> tuple[str, int] | int:
    """(工单号, 重复次数);参数不对时说明原因,返回退出码(--help 是 0,写错是 2)。"""
    if "-h" in argv or "--help" in argv:  # 写在哪个位置都算(原来 T1012 -h 说「重复次数要是正整数,现在是 '-h'」)
        print(USAGE)
        return 0
    if argv[:1] == ["--"]:  # 「后面都不是选项」的老写法:原来 -- T1012 把 T1012 当成了重复次数
        argv = argv[1:]
    if not 1 <= len(argv) <= 2:
        print(f"{'缺少工单号' if not argv else '参数太多了'}\n{USAGE}", file=sys.stderr)
        return 2
    # isascii:「²」「٣」之类也算 isdigit(),int() 却不认。超过 4300 位的数字串 int() 不肯转(ValueError 的 traceback),
    # 所以先去掉开头的 0 看位数:比 MAX_TIMES 还长的,下面说「最多 MAX_TIMES」
    if len(argv) == 2 and not (argv[1].isascii() and argv[1].isdigit() and argv[1].strip("0")):
        print(f"重复次数要是正整数,现在是 {argv[1]!r}\n{USAGE}", file=sys.stderr)
        return 2
    if argv[0].startswith("-") or not argv[0].strip():  # 写错的选项(--halp)、空工单号:不能当工单号发出去
        print(f"工单号不能是 {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    if not TICKET_ID.fullmatch(argv[0]):  # 「T 1」、全角的「T１２」:webhook 会回一句英文的 400,这里先用中文说
        print(f"工单号只能由英文字母、数字、_ 和 - 组成(最多 64 个),现在是 {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    ticket_id, digits = argv[0], argv[1].lstrip("0") if len(argv) == 2 else "1"
    if len(digits) > len(str(MAX_TIMES)) or (times := int(digits)) > MAX_TIMES:
        print(f"重复次数最多 {MAX_TIMES}(模拟上游重试,几次就够了)\n{USAGE}", file=sys.stderr)
        return 2
    return ticket_id, times


def main(argv: list[str]) -> int:
    checked = check_args(argv)
    if isinstance(checked, int):
        return checked
    ticket_id, times = checked
    try:
        url = config.url("WEBHOOK_URL", DEFAULT_URL)
    except SystemExit as e:
        print(e.code, file=sys.stderr)
        return 2
    secret, body = config.get("WEBHOOK_SECRET", DEFAULT_SECRET), event_body(ticket_id)
    failed = False
    for _ in range(times):  # 上游超时重试时,同一个事件会原样再发一次
        headers = {"content-type": "application/json", "x-cloudledger-signature": sign(body, secret)}
        try:
            # 发给本机的 webhook 不走代理:终端里设着 http_proxy / all_proxy(Clash 之类「复制终端代理命令」)时,原来
            # 本机的请求也绕到代理上,代理没开就说「webhook 服务起来了吗?」,其实 webhook 好好的
            r = httpx.post(url, content=body, headers=headers, timeout=TIMEOUT_S,
                           trust_env=not config.on_this_machine(url))
        # 连不上:请求根本没发出去。InvalidURL:urlsplit 放过了、httpx 不认的少见写法
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.InvalidURL) as e:
            print(cannot_connect(url, e), file=sys.stderr)
            return 1
        except httpx.HTTPError as e:  # 连上了、请求发出去了,却没等到回答:对方可能已经收下了
            print(no_answer(config.hide_password(url), e, ticket_id, TIMEOUT_S), file=sys.stderr)
            return 1
        print(r.status_code, shown(r))
        if r.is_redirect:  # 比如 WEBHOOK_URL 末尾多了一个 /:原来只打印「307 」,看不出哪里不对。不跟着跳(POST 跳过去要重发)
            print(f"对方让改发到 {config.hide_password(r.headers.get('location', '?'))}:"
                  "把 WEBHOOK_URL 改成这个地址再发", file=sys.stderr)
        failed |= not r.is_success
    return 1 if failed else 0


if __name__ == "__main__":
    config.run(main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
