"""给 email_poller.py 的收信循环补上真实 IMAP 服务器要的东西:读 IMAP_* 设置,连接之前就查出写错的主机名、非 ASCII 的账号和
授权码;SSL 直连时校验证书(可以再信一个私有 CA);连接和每条命令都有超时;连不上、证书不对、登录失败、文件夹打不开时各说
一句人看得懂的话;先向 163 这类服务器报客户端 ID;中文文件夹名按修改版 UTF-7 写;FETCH 的回答按 UID 认领。课文的 main()
只有 IMAP4_SSL、login、select、search、fetch 五步,碰到这些情况时要么是一段 traceback,要么悄悄丢信;这里每一项都对应
一种真实服务器的行为。"""
import ast
import base64
import imaplib
import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import config
from mail_text import decode_bytes

IMAP_SSL_PORT = 993          # IMAPS 的标准端口
IMAP_PLAIN_PORT = 143        # 明文 IMAP 的标准端口(IMAP_SSL=0 时的默认)


class MailboxError(Exception):
    """邮箱连不上、登录失败、中途断开。"""


class SetupError(Exception):
    """设置或参数不对。"""


@dataclass
class ImapSettings:
    host: str
    port: int
    user: str
    password: str
    use_ssl: bool
    cafile: str
    mailbox: str
    timeout: float


def imap_settings() -> ImapSettings:
    missing = [n for n in ("IMAP_HOST", "IMAP_USER", "IMAP_PASSWORD") if not config.get(n)]
    if missing:
        raise SetupError(f"缺少邮箱设置:{'、'.join(missing)}(写进环境变量或 .env;IMAP_PASSWORD 填邮箱的授权码)")
    host = config.get("IMAP_HOST")
    if problem := host_problem(host):
        raise SetupError(f"IMAP_HOST={host!r} {problem}")
    # imaplib 的 LOGIN 只能发 ASCII;不在这里拦下,登录时只会报一句看不懂的 UnicodeEncodeError
    user = config.get("IMAP_USER")
    if at := first_non_ascii(user):
        raise SetupError(f"IMAP_USER 里有非 ASCII 的字符(第 {at} 个 {user[at - 1]!r}):{user!r},IMAP 登录只认 ASCII:"
                         "多半是复制邮箱地址时带进了全角字符或中文")
    if at := first_non_ascii(config.get("IMAP_PASSWORD")):  # 授权码本身和它的字符都不打印
        raise SetupError(f"IMAP_PASSWORD 里有非 ASCII 的字符(第 {at} 个),IMAP 登录只认 ASCII:"
                         "多半是复制授权码时带进了全角字符或中文")
    use_ssl = config.get("IMAP_SSL", "1")
    if use_ssl not in ("0", "1"):
        raise SetupError(f"IMAP_SSL 只能是 1(SSL 直连,默认)或 0(明文),现在是 {use_ssl!r}")
    cafile = config.get("IMAP_CAFILE")
    if cafile and use_ssl == "0":  # 多半是以为设了 CA 就是加密连接:其实密码会明文发出去
        raise SetupError("IMAP_CAFILE 只在 IMAP_SSL=1(SSL 直连)时用得上;IMAP_SSL=0 是明文连接,"
                         "密码不加密、也不校验证书。用自建邮箱的私有 CA 时把 IMAP_SSL 设成 1")
    if cafile and not Path(cafile).expanduser().is_file():
        raise SetupError(f"IMAP_CAFILE 指的 CA 证书文件不存在:{cafile}")
    default_port = IMAP_SSL_PORT if use_ssl == "1" else IMAP_PLAIN_PORT
    port = config.integer("IMAP_PORT", default_port, minimum=1, maximum=65535)
    return ImapSettings(config.get("IMAP_HOST"), port, config.get("IMAP_USER"),
                        config.get("IMAP_PASSWORD"), use_ssl == "1", cafile, config.value("IMAP_MAILBOX"),
                        config.value("IMAP_TIMEOUT_S"))


def host_problem(host: str) -> str | None:
    """IMAP_HOST 只能是主机名或 IP 地址。照着邮箱帮助页抄来的 imap://imap.qq.com、imap.qq.com:993 是设置写错了
    (退出码 2),不是暂时连不上(退出码 3):等多久都不会好。"""
    if m := re.match(r"[A-Za-z][A-Za-z0-9+.-]*://([^/:]*)", host):
        return f"只写主机名,不带 {host[:m.start(1)]} 前缀:写成 IMAP_HOST={m.group(1)},端口写进 IMAP_PORT"
    if host.startswith("[") or host.endswith("]"):
        return "的 IPv6 地址不加方括号(写成 IMAP_HOST=::1 这样),端口写进 IMAP_PORT"
    if host.count(":") == 1:
        name, port = host.split(":")
        return f"里带了端口:写成 IMAP_HOST={name} 和 IMAP_PORT={port}"
    if any(ch.isspace() or ch == "/" for ch in host):
        return "不是合法的主机名:里面不能有空格或 /"
    if problem := config.hostname_problem(host):  # imap..qq.com、.imap.qq.com
        return "不是合法的主机名:" + problem
    return None


def first_non_ascii(text: str) -> int:
    """第一个非 ASCII 字符是第几个(从 1 数);全是 ASCII 时是 0。"""
    return next((i for i, ch in enumerate(text, 1) if not ch.isascii()), 0)


def ssl_context(cafile: str = "") -> ssl.SSLContext:
    """校验服务器证书和主机名的 TLS 设置。imaplib.IMAP4_SSL 不给 context 时不校验证书,所以一定要传这个。
    信系统自带的 CA;给了 cafile 就再多信它(自建邮箱的私有 CA)。"""
    context = ssl.create_default_context()
    if cafile:
        context.load_verify_locations(cafile=str(Path(cafile).expanduser()))
    return context


def server_words(error: Exception) -> str:
    """imaplib 的错误里服务器原话常是 bytes 的 repr,转成人能读的。断线这类 socket 错误说原因(Connection reset by peer),
    不说 args[0] 里的错误号;什么都没说的说是哪种错误。"""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    said = error.args[0] if error.args else type(error).__name__
    text = str(said)
    if isinstance(said, str) and re.fullmatch(r"b(['\"]).*\1", text, re.S):  # bytes 的 repr
        try:
            said = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text[2:-1]
    if isinstance(said, bytes):  # 中文的服务器原话(授权码错误……)解成文字,不显示成 \xe6\x8e\x88
        text = decode_bytes(said, None)
    return text


def open_mailbox(s: ImapSettings) -> imaplib.IMAP4:
    where = f"{s.host}:{s.port}"
    try:
        context = ssl_context(s.cafile) if s.use_ssl else None
    except ssl.SSLError as e:
        raise SetupError(f"IMAP_CAFILE 不是能用的 CA 证书文件:{s.cafile}({e.reason or e})") from e
    except OSError as e:  # 没有读权限、读的时候 I/O 出错
        raise SetupError(f"IMAP_CAFILE 读不了:{s.cafile}({e.strerror or e})") from e
    try:
        if context:
            imap = imaplib.IMAP4_SSL(s.host, s.port, ssl_context=context, timeout=s.timeout)
        else:
            imap = imaplib.IMAP4(s.host, s.port, timeout=s.timeout)
    except ssl.SSLCertVerificationError as e:
        raise MailboxError(f"IMAP 服务器 {where} 的证书校验失败:{e.verify_message}"
                           "(自建邮箱用私有 CA 的,把 CA 证书路径写进 IMAP_CAFILE)") from e
    except ssl.SSLError as e:
        raise MailboxError(f"和 IMAP 服务器 {where} 的 TLS 握手失败:{e}(这个端口是不是不支持 SSL 直连?)") from e
    except socket.gaierror as e:
        raise MailboxError(f"连不上 IMAP 服务器 {where}:域名解析失败({e.strerror}),检查 IMAP_HOST") from e
    except TimeoutError as e:
        # IMAP_SSL=0 连上了要 SSL 直连的端口:服务器等着 TLS 握手,这边等着它打招呼,两边都不说话,也是超时
        hint = "" if s.use_ssl else ";IMAP_SSL=0 连上 SSL 直连的端口(一般是 993)也是这样,那就设 IMAP_SSL=1"
        raise MailboxError(f"连接 IMAP 服务器 {where} 超时({s.timeout:g} 秒没有回应{hint})") from e
    except (OSError, imaplib.IMAP4.error) as e:
        raise MailboxError(f"连不上 IMAP 服务器 {where}:{getattr(e, 'strerror', None) or e}") from e
    # imaplib 把「连接断了」报成 IMAP4.abort,它是 IMAP4.error 的子类:先接住,别说成密码错了、文件夹不对
    try:
        imap.login(s.user, s.password)
    except (imaplib.IMAP4.abort, OSError) as e:
        close_quietly(imap)
        raise MailboxError(f"登录 IMAP 服务器 {where} 时连接断了:{server_words(e)}") from e
    except imaplib.IMAP4.error as e:
        close_quietly(imap)
        raise MailboxError(f"IMAP 登录失败(用户 {s.user}):{server_words(e)};检查 IMAP_USER 和 IMAP_PASSWORD"
                           "(很多邮箱要填授权码,不是网页登录密码)") from e
    say_who_we_are(imap)
    try:
        typ, data = imap.select(mailbox_name(s.mailbox))
    except imaplib.IMAP4.readonly as e:  # 它是 abort 的子类,不是断线:文件夹只给读,收下的信标不了已读
        close_quietly(imap)
        raise MailboxError(f"邮箱文件夹 {s.mailbox} 只能读,不能标已读:{server_words(e)}"
                           "(换一个文件夹,或者让邮箱管理员给 IMAP_USER 写权限)") from e
    except (imaplib.IMAP4.abort, OSError) as e:
        close_quietly(imap)
        raise MailboxError(f"打开邮箱文件夹 {s.mailbox} 时和 IMAP 服务器 {where} 的连接断了:{server_words(e)}") from e
    except imaplib.IMAP4.error as e:
        typ, data = "NO", [str(e).encode()]
    if typ != "OK":
        close_quietly(imap)
        raise MailboxError(f"打不开邮箱文件夹 {s.mailbox}:{server_words(Exception(data[0]))}(检查 IMAP_MAILBOX)")
    return imap


CLIENT_ID = '("name" "CloudLedger email_poller" "version" "1.0")'


def say_who_we_are(imap: imaplib.IMAP4) -> None:
    """服务器支持 ID(RFC 2971)就先报一下客户端的名字:163、126 邮箱不报的话,SELECT 一律回「Unsafe Login」,
    看起来像文件夹名写错了。报不成不要紧:接着 SELECT,真有问题那里会说。"""
    if "ID" not in imap.capabilities:
        return
    try:
        imap.xatom("ID", CLIENT_ID)
    except (imaplib.IMAP4.error, OSError):
        pass


def mailbox_name(name: str) -> str:
    """文件夹名按 IMAP 的规矩写:中文名用「修改版 UTF-7」(RFC 3501 5.1.3,QQ、163 邮箱的中文文件夹就是这样),
    有空格或引号的加引号。例:客服 收件箱 → "&W6JnDQ- &ZTZO9nux-"。"""
    out, pending = [], []

    def flush() -> None:
        if pending:
            b64 = base64.b64encode("".join(pending).encode("utf-16-be")).decode().rstrip("=").replace("/", ",")
            out.append(f"&{b64}-")
            pending.clear()

    for ch in name:
        if " " <= ch <= "~":
            flush()
            out.append("&-" if ch == "&" else ch)
        else:
            pending.append(ch)
    flush()
    encoded = "".join(out)
    if re.fullmatch(r"[A-Za-z0-9_./&,+-]+", encoded):
        return encoded
    return '"' + encoded.replace("\\", "\\\\").replace('"', '\\"') + '"'


def close_quietly(imap: imaplib.IMAP4) -> None:
    try:
        imap.logout()
    except (imaplib.IMAP4.error, OSError):
        pass


def fetched_bytes(data: list, uid: bytes) -> bytes | None:
    """FETCH 的回答里 UID 是 uid 的那一封的原文。不认 UID 的话,上一封 FETCH 回 NO 时服务器已经送来的半截回答
    (imaplib 留着它)会被当成这一封:上一封的内容存在这一封的 UID 下,这一封标了已读,却从没存过(丢信)。
    回答里都没写 UID 的(不守规矩的服务器)取第一封。"""
    bodies = [item for item in data if isinstance(item, tuple)]
    with_uid = [(m.group(1), item[1]) for item in bodies if (m := re.search(rb"\bUID (\d+)", item[0]))]
    if not with_uid:
        return bodies[0][1] if bodies else None
    return next((raw for got, raw in with_uid if got == uid), None)


def answered_without_body(data: list, uid: bytes) -> bool:
    """FETCH 的回答里有这一封(带着它的 UID,或者没写 UID 却提到了 BODY[]),只是没有信的原文(「BODY[] NIL」)。
    别的信的 FLAGS 变化(别的客户端标了已读)也会夹在回答里,它们不算。"""
    return any(isinstance(item, bytes) and (re.search(rb"\bUID %s\b" % uid, item) or
                                            (b"UID" not in item and b"BODY[" in item)) for item in data)
