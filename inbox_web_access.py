"""inbox_web.py 的门:谁能打开收件箱网页、谁能点按钮、记成谁做的决定。命令行收件箱只有坐在终端前的人用;网页在网络上,
一个客服团队共用,点一下就给客户发信,所以要管三件事:设了 INBOX_WEB_USERS 时每个请求都要 HTTP Basic 登录(密码按常数
时间比较),没设时只回答本机来的请求;改东西的请求(POST)来自别的网站(Origin 不是本站,或者浏览器说 Sec-Fetch-Site:
cross-site)时一律拒绝,防的是别的网页让登录着的浏览器替它点 accept;不带 Origin 的脚本(curl、Agent Inbox 的服务端)不因此被拒。"""
import base64
import binascii
import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

import config
import inbox_seen

REALM = "CloudLedger inbox"
CHANGING = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Denied:
    """不让进:状态码、给人看的一句、要带的响应头(401 的 WWW-Authenticate)。"""
    status: int
    message: str
    headers: dict | None = None


def users() -> dict[str, str]:
    """INBOX_WEB_USERS="alice:pw1,bob:pw2" → {"alice": "pw1", "bob": "pw2"};没设是空的(只回答本机)。
    写错了(少冒号、名字或密码是空的、名字重复)以 SystemExit 退出,说哪一段不对:服务起不来好过悄悄少一个人。"""
    table: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in config.value("INBOX_WEB_USERS").split(","))):
        name, colon, password = part.partition(":")
        if not (colon and name.strip() and password):
            raise SystemExit(f"配置错误:INBOX_WEB_USERS 的「{name.strip() or '…'}:…」这一段要写成 名字:密码(逗号隔开几个人)")
        if name.strip() in table:
            raise SystemExit(f"配置错误:INBOX_WEB_USERS 里 {name.strip()} 出现了两次")
        table[name.strip()] = password
    return table


def mode_line(table: dict[str, str]) -> str:
    """服务起来时说一行:现在是哪种门。"""
    if table:
        return f"收件箱网页:要登录(HTTP Basic,INBOX_WEB_USERS 里 {len(table)} 个账号:{'、'.join(table)})"
    return "收件箱网页:没设 INBOX_WEB_USERS,只回答本机(127.0.0.1 / ::1)来的请求,决定记在 " + inbox_seen.viewer() + " 名下"


def admit(method: str, headers, client_host: str | None, own_origin: str, table: dict[str, str]) -> str | Denied:
    """这个请求能不能进;能进时返回做决定的人(登录名,或者本机模式下的 INBOX_USER / 登录名@主机名)。"""
    if method in CHANGING and (cross := cross_site(headers, own_origin)):
        return Denied(403, cross)
    if not table:
        if not loopback(client_host):
            return Denied(403, f"这个收件箱只回答本机的请求(你来自 {client_host});要给同事用,设 INBOX_WEB_USERS 开登录")
        return inbox_seen.viewer()
    name = signed_in(headers.get("authorization", ""), table)
    if name is None:
        return Denied(401, "要先登录(用户名和密码见 INBOX_WEB_USERS)", {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})
    return name


def signed_in(authorization: str, table: dict[str, str]) -> str | None:
    """Basic 登录对了就是登录名。不管名字在不在表里都比一次密码,比的是两边的 SHA-256:用时不随名字、密码长度变。"""
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        name, _, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    expected = table.get(name, "\0")  # 表里没有的名字也比一次,比不上
    same = hmac.compare_digest(hashlib.sha256(password.encode()).digest(), hashlib.sha256(expected.encode()).digest())
    return name if same and name in table else None


def cross_site(headers, own_origin: str) -> str | None:
    """改东西的请求来自别的网站时的拒绝理由;同站的表单、不带 Origin 的脚本是 None。"""
    if headers.get("sec-fetch-site", "").lower() == "cross-site":
        return "别的网站发来的请求(Sec-Fetch-Site: cross-site)不能改收件箱,什么都没有动"
    origin = headers.get("origin")
    if origin is not None and origin.rstrip("/") != own_origin:
        return f"别的网站({origin})发来的请求不能改收件箱,什么都没有动"
    return None


def loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
