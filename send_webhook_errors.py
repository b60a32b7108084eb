"""send_webhook.py 发不出去时说给人听的话(课文遇到错误就是一段 httpx 的 traceback):连不上时多半是 webhook 没起来,
给出起服务的命令和端口,https 对着 http 的服务、走了没开的代理也点明;请求发出去了却没等到回答时,说清 webhook
可能已经存下了这个事件、再发一次是安全的(事件 id 不变,只会回 duplicate: true)。"""
import shlex
from urllib.parse import urlsplit

import httpx

import config


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
