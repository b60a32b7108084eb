"""给 email_poller.py 的 parse() 处理两个邮件头:Message-ID 变成事件 id,From 变成发件人地址。课文直接用
msg["Message-ID"].strip() 和 parseaddr();真实邮件里 Message-ID 可能没有、是空的 <>、带着控制字符或 8 位字节、长到存不进
PostgreSQL 的主键索引,From 的显示名里可能有没加引号的逗号。这里给每种情况一个确定的结果:同一封信不论从 IMAP 收还是从
.eml 读,事件 id 都一样,不同的信不会撞成同一个;解析不了的原因里带着邮件头原文时,先打码再打印。"""
import hashlib
from email.message import Message
from email.utils import getaddresses, parseaddr

from mail_text import decode_bytes
import store_events

# 字;事件 id 最长这么多(和 webhook 收的 id 一样)。Message-ID 再长就用它的 sha1:PostgreSQL 主键索引的一行
# 最多 2704 字节,几 KB 的 Message-ID 存不进去,整个邮箱会卡在这封信上
MAX_EVENT_ID_CHARS = 200


def derived_message_id(raw: bytes) -> str:
    """没有 Message-ID 的邮件:用邮件字节的 sha1 当 id。先统一换行符,同一封信从 IMAP 收还是从 .eml 读,id 都一样。"""
    return store_events.MAIL_ID_PREFIXES[1] + hashlib.sha1(raw.replace(b"\r\n", b"\n")).hexdigest()  # no-message-id:


def mail_event_id(msg: Message, raw: bytes) -> str:
    """这封信的事件 id(课文:事件 id 就是 Message-ID)。Message-ID 去掉不可打印的字符(NUL 存不进 PostgreSQL),
    折行、连续空白并成一个空格;直接写 8 位字节的(<工单一@…>)和别的邮件头一样解码,非 ASCII 的字节不会一律变成
    U+FFFD,字节数一样的两封信不会撞成「重复」。不是 <…> 形式的加上尖括号:定时任务的 cron:stale:…、webhook 的 evt_…
    都不以 < 开头,一封信占不了它们的 id。没有 Message-ID(或者只有空的 <>):no-message-id: + 整封信的 sha1;
    解码后还有替换符(U+FFFD)或者超过 MAX_EVENT_ID_CHARS 个字:message-id-sha1: + 这个头原始字节的 sha1,
    不拿有损的文字当 id。"""
    header = next((value for name, value in msg.raw_items() if name.lower() == "message-id"), "")
    # 原始字节;IMAP 的 CRLF 折行和 .eml 的一样对待
    header_bytes = b" ".join(header.encode("utf-8", "surrogateescape").split())
    text = " ".join("".join(c for c in decode_bytes(header_bytes, None) if c.isprintable() or c.isspace()).split())
    if not text.strip("<>").strip():  # 没有、或者只有一对空的尖括号「<>」:不同的信都写成这样,不能当成同一封
        return derived_message_id(raw)
    if not (text.startswith("<") and text.endswith(">")):
        text = f"<{text}>"
    if "\ufffd" in text or len(text) > MAX_EVENT_ID_CHARS:
        return store_events.MAIL_ID_PREFIXES[2] + hashlib.sha1(header_bytes).hexdigest()  # message-id-sha1:
    return text


def sender_address(from_header: str) -> str:
    """From 头里的发件人地址(小写);找不到是空串。显示名里有没加引号的逗号(「Zhang, Wei <zhang.wei@…>」,
    有的邮件程序、有的网关这样写)时 parseaddr 只看到逗号前面的「Zhang」。这时按地址列表拆开,只有一个带 @ 的地址
    就是它;有两个不同的,说不清是谁,是坏信。"""
    address = parseaddr(from_header)[1].strip().lower()
    if "@" in address:
        return address
    found = {a.strip().lower() for _, a in getaddresses([from_header]) if "@" in a}
    return found.pop() if len(found) == 1 else ""


def masked(reason: str) -> str:
    """解析不了的原因里可能带着邮件原文(From 头里的手机号之类):打码后才打印、进日志,和 worker 写 last_error 一样。"""
    from llm_pii import mask_pii

    return mask_pii(reason)
