r"""收一次客服邮箱:已知客户的新邮件变成业务库里的一张工单 + 事件表里的一行,由 worker 接着处理。

运行:
    uv run python email_poller.py                          # 收一遍 IMAP 邮箱里的未读邮件(crontab 每分钟跑这个)
    uv run python email_poller.py --eml samples/           # 离线:把 .eml 文件(或目录里所有 .eml,扩展名不分大小写)
                                                           # 走同一条解析、入库的路
    uv run python email_poller.py --eml samples/11_complaint.eml

邮箱设置(环境变量或 .env):IMAP_HOST、IMAP_USER、IMAP_PASSWORD(邮箱的授权码,不是登录密码),
可选 IMAP_PORT(默认 993;IMAP_SSL=0 时默认 143)、IMAP_SSL(默认 1:SSL 直连并校验服务器证书;
0 = 明文,只用于本机测试服务器)、IMAP_CAFILE(自建邮箱用私有 CA 时,额外信任的 CA 证书文件)、
IMAP_MAILBOX(默认 INBOX)、IMAP_TIMEOUT_S(默认 30 秒)。

你会看到每封邮件一行,先是结果,后面是哪封邮件(IMAP 的 UID 或文件名):
    M3f9a1c  UID 101                      # 新工单的工单号
    skip: 不是已知客户  UID 102
    duplicate  UID 103                    # 这封邮件之前已经收过了
最后一行是汇总:本次收取 3 封:新工单 1,重复 1,跳过 1,无法解析 0,存储失败 0
有邮件没读到(服务器拒绝交出这封信、.eml 文件读不了)时,汇总末尾再加一项「,读取失败 N」;没有就不加。

不丢邮件:取信用 BODY.PEEK(不会顺手标成已读),工单和事件都提交了(或者确定跳过、重复)之后才标 \Seen。
存储失败的邮件保持未读,下次运行再收;两个库之间崩了也没关系:工单是 INSERT OR IGNORE、事件 id 就是
Message-ID(见 mail_event_id()),重跑时补上缺的那一半。解析不了的邮件在 stderr 上说明原因,在邮箱里标已读并加星标(\Flagged)
留给人看,其他邮件照常处理。看得出被截断的邮件(邮件头没有以空行结束、multipart 没有结束边界)也算解析不了、不入库:
它和完整的那封 Message-ID 一样,存了它,完整的那封再来时只会是 duplicate(见 cut_short())。
服务器拒绝交出某一封信(FETCH 回 NO)时,那封保持未读,下次再收,其他邮件照常处理;
离线模式读不了某个 .eml 文件(没有权限、磁盘 I/O 错误、目录里断了的符号链接)也一样:说是哪个文件,其余照常,修好后重跑这条命令。
解析不了的原因里带着邮件原文的(比如找不到发件人地址时的 From 头),先打码(手机号、身份证号、银行卡号、邮箱地址)
再打印,stderr 和日志里不留客户的个人信息。

退出码:0 全部处理好;1 有邮件无法解析、存储失败、读取失败或者标不了已读(其余照常处理了),或者数据库暂时用不了(这时后面的邮件这一轮
不收,保持未读);2 设置或参数不对;3 连不上邮箱、登录失败或收信中途断线(已经处理好的邮件照常算数,没处理的保持未读)。
"""
import ast
import base64
import codecs
import email
import hashlib
import imaplib
import json
import os
import re
import socket
import ssl
import sys
import unicodedata
from dataclasses import dataclass
from email.errors import (CloseBoundaryNotFoundDefect, HeaderParseError, InvalidBase64LengthDefect,
                          InvalidBase64PaddingDefect, MissingHeaderBodySeparatorDefect, NoBoundaryInMultipartDefect,
                          StartBoundaryNotFoundDefect)
from email.header import decode_header
from email.message import Message
from email.utils import getaddresses, parseaddr
from html.parser import HTMLParser
from pathlib import Path

import config
import store

IMAP_SSL_PORT = 993          # IMAPS 的标准端口
IMAP_PLAIN_PORT = 143        # 明文 IMAP 的标准端口(IMAP_SSL=0 时的默认)
IMAP_TIMEOUT_S = 30          # 秒(0.1–3600);连接和每条 IMAP 命令最多等多久。crontab 每分钟跑一次,卡住的进程不能越积越多
MAILBOX = "INBOX"            # 收哪个文件夹
MAX_BODY_CHARS = 2000        # 字;正文只留前这么多(课文的做法),转发链、签名再长也不进模型
MAX_SUBJECT_CHARS = 200      # 字;主题也进模型(工单原文是「主题:正文」),只留前这么多,别让超长主题绕过上一项
TICKET_HASH_LENGTHS = range(6, 41, 2)  # 工单号 M + sha1(Message-ID) 的前 6 位;和别的邮件撞了再加长,直到不撞
# 邮件里常见的「声明的字符集比实际用的小」:标 gb2312 的信里常有 GBK 才有的字,标 big5 的信里常有香港增补字。
# 用它们的超集解码,能多认出字,原本就合规的信结果不变。
# 标着 iso-8859-1 的信多半是 Windows-1252(Outlook 这样发):0x80–0x9F 在 latin-1 里是看不见的控制字符,在 cp1252 里是
# 弯引号、破折号、€(浏览器也这样认,WHATWG 编码标准)。cp1252 没定义的 5 个字节解不通时,decode_bytes 再按声明的 latin-1 解
LATIN1_NAMES = ("iso-8859-1", "iso8859-1", "iso_8859-1", "latin1", "latin-1", "l1", "cp819")
CHARSET_SUPERSETS = {"gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "big5": "big5hkscs",
                     "us-ascii": "utf-8", "ascii": "utf-8", **dict.fromkeys(LATIN1_NAMES, "cp1252")}
# 没在 Content-Type 里声明字符集的 HTML:看它开头的 <meta charset="big5"> / <meta http-equiv=… content="…; charset=gbk">
META_CHARSET = re.compile(rb"<meta[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]+)", re.IGNORECASE)
META_SCAN_BYTES = 2048    # 字节;<meta> 按规矩在前 1024 字节里,多看一点
# 截断正文、主题时,截断处落在一串字母数字里(号码可以用空格、横线分组;邮箱地址带着 . 和 @)就退到这一串的开头:
# 原来截下半个手机号、卡号(「请回电1381234」),脱敏认不出来,原样进了提示词和 checkpoint
# (全角数字、全角 @、输入法打出的全角横线和空格,网页复制来的不间断空格也算,和 llm_pii.mask_pii 认的一样)
_RUN_CHARS = r"0-9０-９A-Za-zＡ-Ｚａ-ｚ._%+@＠\-－"
PII_RUN = re.compile(rf"[{_RUN_CHARS}]+(?:[ \t\u00a0\u3000\-－‐‑—]+[0-9０-９][{_RUN_CHARS}]*)*")
PII_RUN_MAX_CHARS = 100   # 字;再长的一串(网址、日志)不会是手机号、卡号、邮箱,照原样截
# 字;事件 id 最长这么多(和 webhook 收的 id 一样)。Message-ID 再长就用它的 sha1:PostgreSQL 主键索引的一行
# 最多 2704 字节,原来几 KB 的 Message-ID 每次都存不进去,还被当成「数据库用不了」,整个邮箱就卡在这封信上
MAX_EVENT_ID_CHARS = 200
HALF_ESCAPE = re.compile(r"=[0-9A-Fa-f]\s*\Z")  # quoted-printable 截在「=C4」的中间
UNCLOSED_TAG = re.compile(r"(<([!/?A-Za-z][^<>]*)?|&#?[A-Za-z0-9]*)\Z")  # HTML 截在「<div cla」「&nbs」上
SURROGATES = re.compile("[\ud800-\udfff]")  # 落单的代理项:utf-8 编不出来,两种库都存不进去
EXIT_OK, EXIT_SOME_FAILED, EXIT_CONFIG, EXIT_MAILBOX = 0, 1, 2, 3


class BrokenMail(Exception):
    """这封邮件解析不了(原因说给人听)。重试也不会好。"""


class MailboxError(Exception):
    """邮箱连不上、登录失败、中途断开。"""


class SetupError(Exception):
    """设置或参数不对。"""


@dataclass
class Outcome:
    source: str   # 哪封邮件:「UID 101」或文件路径
    kind: str     # ticket / skip / duplicate / broken / failed / unreadable(没读到这封信:服务器拒绝、文件读不了)
    text: str     # 打印出来的结果:工单号、skip: 不是已知客户、duplicate,或者出错原因
    database_down: bool = False  # 存储失败是因为数据库暂时用不了:后面的邮件这一轮不收了(每封都会白等一遍)
    unmarked: bool = False  # 处理好了,服务器却不让标已读(STORE 回 NO):下次再收到时是 duplicate

    @property
    def handled(self) -> bool:
        """处理完了(可以在邮箱里标已读)。failed、unreadable 的要保持未读,下次再收。"""
        return self.kind not in ("failed", "unreadable")

    @property
    def problem(self) -> bool:
        """要人知道的结果:退出码 1。除了 unmarked(那一行另外说),结果那一行打到 stderr。"""
        return self.kind in ("broken", "failed", "unreadable") or self.unmarked


# ---------------------------------------------------------------- 解析:字节 → {message_id, from, subject, body}
def decode_bytes(raw: bytes, charset: str | None) -> str:
    """按声明的字符集解码;没声明、声明了不认识的名字或者解不通时,依次试 utf-8、gb18030,最后带替换符硬解。
    解出落单代理项的也算解不通(utf-7 的 +2AA-、unicode_escape 的 \\ud800 会这样):带着它存不进库,
    原来这封信每次都「存储失败」、保持未读,永远收不进来。"""
    declared = effective_charset(raw, charset)
    for name in (declared, charset, "utf-8", "gb18030"):  # 超集解不通时再按声明的字符集本身(cp1252 → latin-1)
        if not name:
            continue
        try:
            text = raw.decode(name)
        except (LookupError, ValueError):  # ValueError:解码出错(UnicodeError)、名字里有 NUL(charset="utf-8\0")
            continue
        if not SURROGATES.search(text):
            return text
    return raw.decode("utf-8", errors="replace")  # utf-8 解码器不会解出代理项


GB_CHARSETS = {"gb2312", "gbk", "x-gbk", "gb18030"}


def effective_charset(raw: bytes, charset: str | None) -> str | None:
    """真正该用哪个字符集解码。声明的字符集换成它的超集(CHARSET_SUPERSETS);另外,标着 gb2312 / gbk、
    字节却是完整 UTF-8 的信(网页表单、转发时只改了正文没改头)按 UTF-8:GB18030 几乎什么字节都解得通,
    「你好」会解成「浣犲ソ」,以 3 字节的字结尾的还会被当成「最后一个字不完整」拒收。真的 GBK 中文几乎不可能
    恰好是合法的 UTF-8(常用汉字的第一个字节 B0–F7 在 UTF-8 里不能开头)。"""
    name = (charset or "").lower()
    if name in GB_CHARSETS and not raw.isascii():
        try:
            raw.decode("utf-8")
            return "utf-8"
        except UnicodeDecodeError:
            pass
    return CHARSET_SUPERSETS.get(name, charset)


def header_text(value) -> str:
    """RFC 2047 编码的邮件头(=?gbk?B?...?=)和直接写 8 位字节的邮件头都解成文字,折行合并成一行。"""
    if value is None:
        return ""
    try:
        chunks = decode_header(value)
    except HeaderParseError:
        return " ".join(str(value).split())
    text = "".join(data if isinstance(data, str) else decode_bytes(data, None if cs == "unknown-8bit" else cs)
                   for data, cs in chunks)
    return " ".join(text.split())


class _HTMLText(HTMLParser):
    """HTML 邮件转纯文本:去掉标签、样式和脚本,块级标签换行,&amp; 之类的实体还原。"""

    SKIP = {"script", "style", "title"}
    HEAD = {"meta", "title", "link", "style", "script", "base", "noscript", "template"}  # 能待在 <head> 里的标签
    BLOCKS = {"br", "p", "div", "li", "tr", "table", "ul", "ol", "blockquote", "h1", "h2", "h3", "h4", "h5", "h6"}
    CELLS = {"td", "th"}  # 表格的格子之间空一格:原来「订单号」「A1001」两格粘成「订单号A1001」

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.in_head = False

    def handle_starttag(self, tag, attrs) -> None:
        # head 不一定写 </head>、<body>(HTML5 里合法):和浏览器一样,碰到不属于 head 的标签(<p>、<div>)head 就结束了。
        # 原来一直跳到 </head> 或 <body>,只写了 <head> 的信整封正文都被跳过,存下一张空工单
        if self.in_head and tag not in self.HEAD:
            self.in_head = False
        if tag == "head":
            self.in_head = True
        elif tag == "body":  # 没关上的 <title> 到 <body> 为止,正文不跟着被跳过
            self.skipping = 0
        elif tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        elif tag in self.CELLS:
            self.parts.append(" ")

    def handle_endtag(self, tag) -> None:
        if tag == "head":
            self.in_head = False
        elif tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data) -> None:
        if self.skipping or (self.in_head and not data.strip()):
            return
        self.in_head = False  # head 里出现了 title、style、script 以外的文字:head 也到这里结束(HTML5 的规矩)
        self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


def tidy_text(text: str) -> str:
    """每行去掉首尾空白、连续空格并成一个,丢掉空行。"""
    lines = (" ".join(line.replace("\xa0", " ").split()) for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def body_of(msg: Message) -> str:
    """正文:客户自己写的文字。multipart/alternative 里优先纯文本那份,没有或是空的就用 HTML 转成纯文本;
    multipart/mixed 里的几段文字(一段话、一张截图、又一段话)按顺序接起来;附件不算。附着的整封邮件(转发的、
    退信里的原信,message/rfc822)只在这封信自己一个字都没写时才用。原来只取第一段纯文本,还会钻进附着的邮件:
    截图后面的话丢了;只有 HTML、附了一封转发的信,存下的是那封转发的信。
    这些都没有字,才用带文件名却没标成 attachment 的文字段(「inline; filename=note.txt」):有的邮件程序把正文
    也这样写,原来整封信的正文是空的,还照常建了工单、标了已读,客户写的话悄悄丢了。"""
    return ("\n".join(_texts(msg, inner=False)) or "\n".join(_texts(msg, inner=True))
            or "\n".join(_texts(msg, inner=False, named=True)))


def _texts(part: Message, inner: bool, named: bool = False) -> list[str]:
    """part 里按顺序的各段文字(已经整理过、非空)。inner:附着的整封邮件也往里走。
    named:带文件名、但 Content-Disposition 不是 attachment 的文字段也算(见 body_of)。"""
    if part.get_content_maintype() == "message":  # message/rfc822 这类:附着的一整封邮件
        if not inner:
            return []
        payload = part.get_payload()
        return [t for sub in (payload if isinstance(payload, list) else [payload])
                if isinstance(sub, Message) for t in _texts(sub, inner, named)]
    if part.is_multipart():
        children = [c for c in part.get_payload() if isinstance(c, Message)]
        if part.get_content_subtype() != "alternative":
            return [t for c in children for t in _texts(c, inner, named)]
        versions = [(c, "\n".join(_texts(c, inner, named))) for c in children]  # 同一段话的几种写法:只要一种
        plain = [t for c, t in versions if c.get_content_type() == "text/plain" and t]
        rest = [t for _, t in versions if t]
        return plain[:1] or rest[-1:]  # 没有纯文本时取最后一种(按规矩最后一种最接近原样)
    if is_attachment(part) and not (named and part.get_content_disposition() != "attachment"):
        return []
    if part.get_content_type() == "text/plain":
        text = tidy_text(_decoded(part))
    elif part.get_content_type() == "text/html":
        text = tidy_text(html_to_text(_decoded(part)))
    else:
        return []
    return [text] if text else []


def is_attachment(part: Message) -> bool:
    """这一段是附件,不是客户写的正文:Content-Disposition 是 attachment,或者带着文件名(Content-Disposition 的
    filename、Content-Type 的 name)。Apple Mail 把附件标成「inline; filename=export.log」:原来当成正文,
    日志文件最后一个字被截断时整封信成了「无法解析」,永远建不了工单;没截断的,日志又混进了工单正文。"""
    return part.get_content_disposition() == "attachment" or part.get_filename() is not None


def _decoded(part: Message) -> str:
    raw = part.get_payload(decode=True) or b""  # base64 / quoted-printable 在这里解开
    charset = part.get_content_charset()
    if charset is None and part.get_content_type() == "text/html" and (m := META_CHARSET.search(raw[:META_SCAN_BYTES])):
        charset = m.group(1).decode("ascii")  # 原来没声明字符集的 Big5 网页按 GB18030 解成了乱码
    return decode_bytes(raw, charset)


def cut(text: str, limit: int) -> str:
    """text 的前 limit 个字;截断处在一串字母数字(号码、邮箱地址、英文单词,见 PII_RUN)中间时退到这一串的开头。"""
    if len(text) <= limit:
        return text
    for m in PII_RUN.finditer(text, max(0, limit - PII_RUN_MAX_CHARS), limit + PII_RUN_MAX_CHARS):
        if m.start() < limit < m.end() and limit - PII_RUN_MAX_CHARS < m.start():
            return text[:m.start()]
    return text[:limit]


def derived_message_id(raw: bytes) -> str:
    """没有 Message-ID 的邮件:用邮件字节的 sha1 当 id。先统一换行符,同一封信从 IMAP 收还是从 .eml 读,id 都一样。"""
    return store.MAIL_ID_PREFIXES[1] + hashlib.sha1(raw.replace(b"\r\n", b"\n")).hexdigest()  # no-message-id:


def mail_event_id(msg: Message, raw: bytes) -> str:
    """这封信的事件 id(课文:事件 id 就是 Message-ID)。Message-ID 去掉不可打印的字符(NUL 落不了 PostgreSQL,
    原来这封信每次都「存储失败」、永远收不进来),折行、连续空白并成一个空格;直接写 8 位字节的(<工单一@…>)
    和别的邮件头一样解码,原来非 ASCII 的字节一律变成 U+FFFD,字节数一样的两封信成了「重复」,第二封标了已读就丢了。
    不是 <…> 形式的加上尖括号:定时任务的 cron:stale:…、课文 webhook 的 evt_… 都不以 < 开头,一封信占不了它们的 id。
    没有 Message-ID(或者只有空的 <>):no-message-id: + 整封信的 sha1;解码后还有替换符(U+FFFD)或者超过 MAX_EVENT_ID_CHARS 个字:
    message-id-sha1: + 这个头原始字节的 sha1,不拿有损的文字当 id。"""
    header = next((value for name, value in msg.raw_items() if name.lower() == "message-id"), "")
    header_bytes = b" ".join(header.encode("utf-8", "surrogateescape").split())  # 原始字节;IMAP 的 CRLF 折行和 .eml 一样
    text = " ".join("".join(c for c in decode_bytes(header_bytes, None) if c.isprintable() or c.isspace()).split())
    if not text.strip("<>").strip():  # 没有、或者只有一对空的尖括号「<>」:不同的信都写成这样,不能当成同一封
        return derived_message_id(raw)
    if not (text.startswith("<") and text.endswith(">")):
        text = f"<{text}>"
    if "\ufffd" in text or len(text) > MAX_EVENT_ID_CHARS:
        return store.MAIL_ID_PREFIXES[2] + hashlib.sha1(header_bytes).hexdigest()  # message-id-sha1:
    return text


def parse(raw: bytes) -> dict:
    """解析一封邮件。解析不了时抛 BrokenMail,说明原因。"""
    try:
        msg = email.message_from_bytes(raw)
        if not msg.keys():
            raise BrokenMail("没有邮件头,不像一封邮件(文件被截断或损坏?)")
        if reason := cut_short(msg, raw):
            raise BrokenMail(reason)
        address = sender_address(str(msg.get("From") or ""))
        if "@" not in address:
            raise BrokenMail(masked(f"找不到发件人地址(From: {header_text(msg.get('From'))!r})"))
        # NUL 之类:PostgreSQL 上查客户时就报错,这封信每次都「存储失败」;SQLite 上却说不是已知客户。两种库都当坏信
        if any(unicodedata.category(c) == "Cc" for c in address):
            raise BrokenMail(masked(f"发件人地址里有控制字符(From: {header_text(msg.get('From'))!r})"))
        return {
            "message_id": mail_event_id(msg, raw),
            "from": address,
            "subject": cut(header_text(msg.get("Subject")), MAX_SUBJECT_CHARS) or "(无主题)",
            "body": cut(body_of(msg), MAX_BODY_CHARS),
        }
    except BrokenMail:
        raise
    except Exception as e:  # noqa: BLE001 —— email 库在怪邮件上抛什么都有可能;一封坏信不能拖垮其余的
        raise BrokenMail(masked(f"{type(e).__name__}: {e}")) from e


def sender_address(from_header: str) -> str:
    """From 头里的发件人地址(小写);找不到是空串。显示名里有没加引号的逗号(「Zhang, Wei <zhang.wei@…>」,
    有的邮件程序、有的网关这样写)时 parseaddr 只看到逗号前面的「Zhang」:原来这封信成了「找不到发件人地址」的坏信,
    标已读加星标,客户的信没建工单。这时按地址列表拆开,只有一个带 @ 的地址就是它;有两个不同的,说不清是谁,照旧是坏信。"""
    address = parseaddr(from_header)[1].strip().lower()
    if "@" in address:
        return address
    found = {a.strip().lower() for _, a in getaddresses([from_header]) if "@" in a}
    return found.pop() if len(found) == 1 else ""


def cut_short(msg: Message, raw: bytes) -> str:
    """看得出这封信被截断了(传输中断、磁盘写满、只存下了前几百字节):返回原因,否则返回空串。
    截断的信不能入库:它和完整的那封 Message-ID 一样,先存了截断的(原来正文就是「Content-T」这样的半行邮件头),
    完整的那封再来时只会说 duplicate,客户真正写的内容就丢了。当坏信报出来、不入库,完整的那封来时照常建工单。

    - 邮件头没有以空行结束:邮件头里出现了不是「名字: 值」的一行(email 库记下 MissingHeaderBodySeparatorDefect,
      截在「Content-T」这样的半行上就是这样),或者整封信只有邮件头、没有空行也没有正文(截在某个头的值中间、
      或者正好截在一行末尾)。规矩上只有邮件头的信可以不要空行,可常用的邮件程序都会写;拒收是报出来、加星标给人看,
      当成好信存下却是悄悄丢掉之后完整的那封,所以宁可拒收。
    - multipart 的正文截在中间:没有结束边界(CloseBoundaryNotFoundDefect),或者连第一段的边界都没有
      (StartBoundaryNotFoundDefect)。不规范的发信程序偶尔也会漏写结束边界,拒收它也是报出来给人看;
      而存下它,完整的那封就成了 duplicate、悄悄丢了。后来的完整副本替换已存的截断版也不行:工单可能已经
      被 worker 处理、起草了回复,替换既不简单也不安全。所以一律拒收。
      只查这封信自己的各部分,不进附件里的整封邮件(message/rfc822):转发、退信里附的原信本来就常被截断,信本身是完整的。
    - 正文(不是附件的 text/* 段)截在中间,留下了看得出的痕迹(发信程序都不会写出这样的正文):base64 的长度不是 4 的
      倍数;quoted-printable 最后是只有一位十六进制数的「=C」(原来解出一串乱码存进工单);解码后的最后一个字只剩
      前一两个字节(按声明的字符集,没声明按 UTF-8;中文正文随便截在哪个字节上,大约三回里有两回是这样);HTML 正文
      停在没写完的标签「<di」或实体「&nbs」上(原来「<di」当成正文存下)。
    截在一行末尾、截在两个字之间的单段正文看不出来(一封短信和一封被截短的信长得一样),这种照常入库。"""
    # 没有这个缺陷时,邮件头一直连到第一个空行或者信的末尾:整封信里一个空行都没有,就是没有分隔行(只有邮件头)
    if (any(isinstance(d, MissingHeaderBodySeparatorDefect) for d in msg.defects)
            or b"\n\n" not in raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")):
        return "邮件头没有以空行结束(邮件被截断或损坏?)"
    for part in own_parts(msg):
        if any(isinstance(d, CloseBoundaryNotFoundDefect) for d in part.defects):
            return "multipart 邮件没有结束边界(邮件被截断或损坏?)"
        if any(isinstance(d, StartBoundaryNotFoundDefect) for d in part.defects):
            return "multipart 邮件里找不到分段的边界(邮件被截断或损坏?)"
        if any(isinstance(d, NoBoundaryInMultipartDefect) for d in part.defects):  # 原来整封信正文为空,照常建了工单
            return "multipart 邮件没有写分段的边界(Content-Type 里没有 boundary),分不出各段(邮件损坏?)"
        if part.is_multipart() or part.get_content_maintype() != "text" or is_attachment(part):
            continue
        data = part.get_payload(decode=True) or b""  # base64 的缺陷在解码时才记到 part.defects 上
        if any(isinstance(d, (InvalidBase64PaddingDefect, InvalidBase64LengthDefect)) for d in part.defects):
            return "正文的 base64 长度不对,后面缺了一截(邮件被截断或损坏?)"
        if part.get("Content-Transfer-Encoding", "").strip().lower() == "quoted-printable" and \
                HALF_ESCAPE.search(str(part.get_payload())):
            return "正文的 quoted-printable 转义只剩半个,后面缺了一截(邮件被截断或损坏?)"
        if ends_mid_character(data, part.get_content_charset()):
            return "正文的最后一个字不完整,后面缺了一截(邮件被截断或损坏?)"
        if part.get_content_subtype() == "html" and UNCLOSED_TAG.search(decode_bytes(data, part.get_content_charset())):
            return "HTML 正文截在一个标签或 & 实体的中间,后面缺了一截(邮件被截断或损坏?)"
    return ""


def ends_mid_character(data: bytes, charset: str | None) -> bool:
    """按这个字符集解码,前面都解得通、最后却剩下半个字。字符集不认识、中间就有解不通的字节时不算
    (那是别的毛病,decode_bytes 会换着字符集试):只认截断的样子。"""
    name = effective_charset(data, charset) or "utf-8"
    try:
        b"a".decode(name)  # 不认识的名字、rot13 / base64 这类不是文字编码的:LookupError,和 decode_bytes 一样不用它
    except LookupError:
        return False
    except ValueError:  # utf-16 这类一个字节解不出字的:名字是好的
        pass
    try:
        decoder = codecs.getincrementaldecoder(name)()
        decoder.decode(data, final=False)
    except ValueError:  # UnicodeDecodeError、utf-16 没有 BOM 的 UnicodeError
        return False
    return bool(decoder.getstate()[0])


def own_parts(msg: Message):
    """这封信自己的各部分:multipart 一层层往下,附件里的整封邮件(message/rfc822 等)只算它自己这一段,不往里走。"""
    yield msg
    if msg.is_multipart() and msg.get_content_maintype() != "message":
        for part in msg.get_payload():
            yield from own_parts(part)


def masked(reason: str) -> str:
    """解析不了的原因里可能带着邮件原文(From 头里的手机号之类):打码后才打印、进日志,和 worker 写 last_error 一样。"""
    from llm_pii import mask_pii

    return mask_pii(reason)


# ---------------------------------------------------------------- 入库:工单(业务库)+ 事件(事件库)
def ticket_candidates(message_id: str) -> list[str]:
    digest = hashlib.sha1(message_id.encode()).hexdigest()
    return ["M" + digest[:n] for n in TICKET_HASH_LENGTHS]


def to_event(mail: dict) -> str:
    """已知客户的邮件:建工单、写事件,返回工单号(这封之前收过就返回 duplicate)。
    先写工单再写事件;两步之间崩了,重跑时工单 INSERT OR IGNORE 得到同一个工单号,事件这次补上。
    事件已经有了就不建工单:同一个 Message-ID、内容却不一样的信,原来会多出一张没有事件的工单,定时扫描过些天把它当成
    「久未回复」入队。"""
    customer_id = store.customer_by_email(mail["from"])
    if customer_id is None:
        return "skip: 不是已知客户"
    if store.event_exists(mail["message_id"]):
        return "duplicate"
    ticket_id = store.add_mail_ticket(ticket_candidates(mail["message_id"]), customer_id,
                                      mail["subject"], mail["body"], store.now()[:10])
    payload = json.dumps({"id": mail["message_id"], "type": "ticket.created", "data": {"ticket_id": ticket_id}})
    return ticket_id if store.add_event(mail["message_id"], "email", "ticket.created", payload) else "duplicate"


def report(outcome: Outcome) -> Outcome:
    """打印一封邮件的结果那一行:「结果  哪封邮件」。出了问题的打到 stderr。"""
    print(f"{outcome.text}  {outcome.source}", file=sys.stderr if outcome.problem else sys.stdout, flush=True)
    return outcome


def handle(raw: bytes, source: str, retry: str = "邮件保持未读,下次再收") -> Outcome:
    """一封邮件走完解析和入库,打印一行,返回结果。retry:存储失败时告诉人这封信接下来会怎样。"""
    try:
        mail = parse(raw)
    except BrokenMail as e:
        outcome = Outcome(source, "broken", f"无法解析:{e}")
    else:
        try:
            result = to_event(mail)
        except store.unavailable_errors() as e:  # PostgreSQL 重启、连接被掐断、SQLite 被锁太久
            outcome = Outcome(source, "failed", f"存储失败,{retry}:{store.unavailable(e)}", database_down=True)
        except Exception as e:  # noqa: BLE001 —— 存不进去(磁盘满、表不对):邮件留着下次再收
            outcome = Outcome(source, "failed", f"存储失败,{retry}:{type(e).__name__}: {e}")
        else:
            kind = "skip" if result.startswith("skip") else "duplicate" if result == "duplicate" else "ticket"
            outcome = Outcome(source, kind, result)
    return report(outcome)


# ---------------------------------------------------------------- 离线:.eml 文件
def eml_files(paths: list[str]) -> list[Path]:
    """展开命令行给的文件和目录;有一个不存在就整个不做(SetupError),免得做了一半。"""
    files: list[Path] = []
    for given in paths:
        if not given.strip():  # --eml "$DIR",变量是空的:Path("") 是当前目录,原来会把这里的 .eml 全收进来
            raise SetupError("--eml 给的路径是空的(要读当前目录,写 --eml .)")
        p = Path(given)
        try:
            if p.is_dir():
                # 扩展名不分大小写(x.EML、x.Eml 也算,和直接给文件时一样);名字像 x.eml 的子目录不算。
                # 指向不存在的文件的符号链接算进来:读的时候说一声(原来不声不响地跳过,那封信就没了下文)
                found = sorted(f for f in p.iterdir() if f.name.lower().endswith(".eml")
                               and (f.is_file() or dangling(f)))
                if not found:
                    raise SetupError(f"目录里没有 .eml 文件:{shown(given)}")
                files += found
            elif p.is_file():
                files.append(p)
            elif p.exists():  # 管道、设备文件:在,只是不是文件(原来说「找不到」)
                raise SetupError(f"不是普通文件或目录:{shown(given)}")
            elif dangling(p):
                raise SetupError(f"找不到文件或目录:{shown(given)}{link_note(p)}")
            else:
                raise SetupError(f"找不到文件或目录:{shown(given)}")
        except OSError as e:  # 目录没有读或进入的权限、名字太长:原来是 traceback
            raise SetupError(f"读不了 {shown(given)}:{e.strerror or e}") from e
    return files


def dangling(p: Path) -> bool:
    """p 是符号链接,指向的东西却不在了(文件被移走、链接写错)。"""
    return p.is_symlink() and not p.exists()


def link_note(p: Path) -> str:
    """说明这是一个断了的符号链接、指向哪里;读不到链接本身时不多说。"""
    try:
        return f"(它是符号链接,指向的 {shown(os.readlink(p))} 不存在)"
    except OSError:
        return ""


def shown(path: str | Path) -> str:
    """打印出来的文件名:不是 UTF-8 的字节(Windows 压缩包解出来的 GBK 文件名常这样)写成 \\xNN。
    原来原样打印,标准输出是严格的 UTF-8 时(PYTHONIOENCODING=utf-8:strict)报 UnicodeEncodeError 崩掉,
    每次重跑都崩在这个文件上,它后面的文件永远存不进去。"""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def store_files(files: list[Path]) -> list[Outcome]:
    """离线模式的 run_once:每个 .eml 走和 IMAP 邮件一样的 handle()。读不了的文件说一声,其余照常。"""
    done: list[Outcome] = []
    for i, f in enumerate(files):
        try:
            raw = f.read_bytes()
        except OSError as e:  # 存在但读不了:没有权限、磁盘 I/O 错误
            why = f"{e.strerror or e}{link_note(f) if dangling(f) else ''}"
            done.append(report(Outcome(shown(f), "unreadable", f"读不了这个文件,修好后重跑这条命令:{why}")))
            continue
        done.append(handle(raw, shown(f), retry="修好后重跑这条命令,已经存好的会显示 duplicate"))
        if stops_here(done[-1], len(files) - i - 1, "个文件没有处理,修好后重跑这条命令"):
            break
    return done


def stops_here(outcome: Outcome, left: int, rest: str) -> bool:
    """这封是因为数据库暂时用不了才没存进去的:这一轮到此为止(后面的每封都会白等一遍),说一声剩下的 left 封怎么办。"""
    if outcome.database_down and left:
        print(f"数据库暂时用不了,这一轮停下:剩下的 {left} {rest}", file=sys.stderr, flush=True)
    return outcome.database_down


# ---------------------------------------------------------------- IMAP
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
                        config.get("IMAP_PASSWORD"), use_ssl == "1", cafile, config.get("IMAP_MAILBOX", MAILBOX),
                        config.number("IMAP_TIMEOUT_S", IMAP_TIMEOUT_S, minimum=0.1, maximum=3600))


def host_problem(host: str) -> str | None:
    """IMAP_HOST 只能是主机名或 IP 地址。照着邮箱帮助页抄来的 imap://imap.qq.com、imap.qq.com:993 原来被当成
    「连不上」(退出码 3,像是暂时的),其实是设置写错了,等多久都不会好。"""
    if m := re.match(r"[A-Za-z][A-Za-z0-9+.-]*://([^/:]*)", host):
        return f"只写主机名,不带 {host[:m.start(1)]} 前缀:写成 IMAP_HOST={m.group(1)},端口写进 IMAP_PORT"
    if host.startswith("[") or host.endswith("]"):
        return "的 IPv6 地址不加方括号(写成 IMAP_HOST=::1 这样),端口写进 IMAP_PORT"
    if host.count(":") == 1:
        name, port = host.split(":")
        return f"里带了端口:写成 IMAP_HOST={name} 和 IMAP_PORT={port}"
    if any(ch.isspace() or ch == "/" for ch in host):
        return "不是合法的主机名:里面不能有空格或 /"
    if problem := config.hostname_problem(host):  # imap..qq.com、.imap.qq.com:原来是 traceback
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
    """imaplib 的错误里服务器原话常是 bytes 的 repr,转成人能读的。断线这类 socket 错误说原因(Connection reset by peer):
    它的 args[0] 只是错误号,原来说成「收信中途出错:104」;什么都没说的说是哪种错误。"""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    said = error.args[0] if error.args else type(error).__name__
    text = str(said)
    if isinstance(said, str) and re.fullmatch(r"b(['\"]).*\1", text, re.S):  # bytes 的 repr
        try:
            said = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text[2:-1]
    if isinstance(said, bytes):  # 中文的服务器原话(授权码错误……)原来显示成 \xe6\x8e\x88 这样
        text = decode_bytes(said, None)
    return text


def open_mailbox(s: ImapSettings) -> imaplib.IMAP4:
    where = f"{s.host}:{s.port}"
    try:
        context = ssl_context(s.cafile) if s.use_ssl else None
    except ssl.SSLError as e:
        raise SetupError(f"IMAP_CAFILE 不是能用的 CA 证书文件:{s.cafile}({e.reason or e})") from e
    except OSError as e:  # 没有读权限、读的时候 I/O 出错:原来是 traceback
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
        _close(imap)
        raise MailboxError(f"登录 IMAP 服务器 {where} 时连接断了:{server_words(e)}") from e
    except imaplib.IMAP4.error as e:
        _close(imap)
        raise MailboxError(f"IMAP 登录失败(用户 {s.user}):{server_words(e)};检查 IMAP_USER 和 IMAP_PASSWORD"
                           "(很多邮箱要填授权码,不是网页登录密码)") from e
    say_who_we_are(imap)
    try:
        typ, data = imap.select(mailbox_name(s.mailbox))
    except imaplib.IMAP4.readonly as e:  # 它是 abort 的子类,不是断线:文件夹只给读,收下的信标不了已读
        _close(imap)
        raise MailboxError(f"邮箱文件夹 {s.mailbox} 只能读,不能标已读:{server_words(e)}"
                           "(换一个文件夹,或者让邮箱管理员给 IMAP_USER 写权限)") from e
    except (imaplib.IMAP4.abort, OSError) as e:
        _close(imap)
        raise MailboxError(f"打开邮箱文件夹 {s.mailbox} 时和 IMAP 服务器 {where} 的连接断了:{server_words(e)}") from e
    except imaplib.IMAP4.error as e:
        typ, data = "NO", [str(e).encode()]
    if typ != "OK":
        _close(imap)
        raise MailboxError(f"打不开邮箱文件夹 {s.mailbox}:{server_words(Exception(data[0]))}(检查 IMAP_MAILBOX)")
    return imap


CLIENT_ID = '("name" "CloudLedger email_poller" "version" "1.0")'


def say_who_we_are(imap: imaplib.IMAP4) -> None:
    """服务器支持 ID(RFC 2971)就先报一下客户端的名字。163、126 邮箱不报的话,SELECT 一律回「Unsafe Login」,
    原来说成「打不开邮箱文件夹…(检查 IMAP_MAILBOX)」,怎么查文件夹名都不会好。报不成不要紧:接着 SELECT,
    真有问题那里会说。"""
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


def _close(imap: imaplib.IMAP4) -> None:
    try:
        imap.logout()
    except (imaplib.IMAP4.error, OSError):
        pass


def _fetched_bytes(data: list, uid: bytes) -> bytes | None:
    """FETCH 的回答里 UID 是 uid 的那一封的原文。不认 UID 的话,上一封 FETCH 回 NO 时服务器已经送来的半截回答
    (imaplib 留着它)会被当成这一封:上一封的内容存在这一封的 UID 下,这一封标了已读,却从没存过(丢信)。
    回答里都没写 UID 的(不守规矩的服务器)取第一封。"""
    bodies = [item for item in data if isinstance(item, tuple)]
    with_uid = [(m.group(1), item[1]) for item in bodies if (m := re.search(rb"\bUID (\d+)", item[0]))]
    if not with_uid:
        return bodies[0][1] if bodies else None
    return next((raw for got, raw in with_uid if got == uid), None)


def _answered_without_body(data: list, uid: bytes) -> bool:
    """FETCH 的回答里有这一封(带着它的 UID,或者没写 UID 却提到了 BODY[]),只是没有信的原文(「BODY[] NIL」)。
    别的信的 FLAGS 变化(别的客户端标了已读)也会夹在回答里,它们不算。"""
    return any(isinstance(item, bytes) and (re.search(rb"\bUID %s\b" % uid, item) or
                                            (b"UID" not in item and b"BODY[" in item)) for item in data)


def poll_mailbox(s: ImapSettings | None = None) -> list[Outcome]:
    """IMAP 模式的 run_once:收一遍未读邮件,返回每封的结果。连不上、登录失败、中途断开抛 MailboxError。"""
    imap = open_mailbox(s or imap_settings())
    done: list[Outcome] = []
    try:
        typ, data = imap.uid("SEARCH", None, "UNSEEN")
        if typ != "OK":
            raise MailboxError(f"搜索未读邮件失败:{server_words(Exception(data[0]))}")
        uids = (data[0] or b"").split()  # 服务器没回 * SEARCH 这一行时 imaplib 给 [None]:当作没有未读邮件
        for i, uid in enumerate(uids):
            source = f"UID {uid.decode()}"
            imap.untagged_responses.pop("FETCH", None)  # 上一封回 NO 时留下的半截回答,别算到这一封头上
            typ, fetched = imap.uid("FETCH", uid, "(BODY.PEEK[])")  # PEEK:取信不改已读状态
            if typ != "OK":  # 服务器拒绝交出这一封(不是断线):不标已读,下次再收,其他的照常
                done.append(report(Outcome(source, "unreadable", "取信失败,邮件保持未读,下次再收:"
                                                                 f"{server_words(Exception(fetched[0]))}")))
                continue
            raw = _fetched_bytes(fetched, uid)
            if raw is None:
                if _answered_without_body(fetched, uid):  # 原来和「被删了」一样悄悄跳过:每次都跳过,永远收不进来
                    done.append(report(Outcome(source, "unreadable", "取信失败,邮件保持未读,下次再收:"
                                                                     "服务器回答了这一封,却没有给出信的内容")))
                continue  # 回答里根本没有这一封:这期间被别的客户端删了
            outcome = handle(raw, source)
            done.append(outcome)
            if stops_here(outcome, len(uids) - i - 1, "封这次不收,保持未读,下次再收"):
                break
            if outcome.handled:  # 工单和事件都提交了(或确定跳过、重复、坏信)才标已读
                flags = r"(\Seen \Flagged)" if outcome.kind == "broken" else r"(\Seen)"
                typ, answer = imap.uid("STORE", uid, "+FLAGS", flags)
                if typ != "OK":  # 这一封标不上(不是断线):说一声,其他照常。原来整轮停在这里,服务器一直不让标
                    # 这一封的话,它后面的信永远收不到
                    outcome.unmarked = True
                    print(f"{source} 已处理,但标已读失败:{server_words(Exception(answer[0]))};"
                          "下次会再收到它,不会重复建工单", file=sys.stderr, flush=True)
    except BrokenPipeError:  # 是标准输出的读端关了(… | head),不是邮箱的事(imaplib 发命令时断线报的是 IMAP4.abort):
        raise  # 交给 config.run(),和 --eml 一样退出码 141。原来说成「收信中途出错:32」、退出码 3
    except (imaplib.IMAP4.error, OSError) as e:
        raise MailboxError(f"收信中途出错:{server_words(e)};已处理 {len(done)} 封,没标已读的下次再收") from e
    finally:
        _close(imap)
    return done


# ---------------------------------------------------------------- 命令行
def summary(outcomes: list[Outcome]) -> str:
    n = {k: sum(o.kind == k for o in outcomes)
         for k in ("ticket", "duplicate", "skip", "broken", "failed", "unreadable")}
    line = (f"本次收取 {len(outcomes)} 封:新工单 {n['ticket']},重复 {n['duplicate']},跳过 {n['skip']},"
            f"无法解析 {n['broken']},存储失败 {n['failed']}")
    if n["unreadable"]:  # 这两项少见,没有时不占地方
        line += f",读取失败 {n['unreadable']}"
    if unmarked := sum(o.unmarked for o in outcomes):
        line += f",标已读失败 {unmarked}"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = config.ArgumentParser(description="收一次客服邮箱(或离线读 .eml),新邮件变成工单 + 事件")
    # extend:--eml 写了两次时两次给的都读(原来只读最后一次的,前面的不声不响地没了)
    parser.add_argument("--eml", nargs="+", action="extend", metavar="FILE|DIR",
                        help="离线模式:读这些 .eml 文件或目录,不连邮箱")
    args = parser.parse_args(argv)
    try:
        files = eml_files(args.eml) if args.eml else None
        settings = None if files else imap_settings()
        if problem := store.biz_db_problem():
            raise SetupError(problem)
        store.init()
        outcomes = store_files(files) if files else poll_mailbox(settings)
    except SetupError as e:
        print(e, file=sys.stderr)
        return EXIT_CONFIG
    except SystemExit as e:  # config.number / integer 读到不是数字的设置
        if not isinstance(e.code, str):
            raise
        print(e.code, file=sys.stderr)
        return EXIT_CONFIG
    except MailboxError as e:
        print(e, file=sys.stderr)
        return EXIT_MAILBOX
    except store.unavailable_errors() as e:  # 还没开始收信(建表时)就用不了;收信途中的在 handle() 里
        print(f"{store.unavailable(e)},这一轮一封都没有处理,稍后再跑", file=sys.stderr)
        return EXIT_SOME_FAILED
    print(summary(outcomes), flush=True)
    return EXIT_SOME_FAILED if any(o.problem for o in outcomes) else EXIT_OK


if __name__ == "__main__":
    config.run(main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
