"""给 email_poller.py 的 parse() 加上「这封信是不是被截断了」的检查:邮件头没有以空行结束、multipart 缺边界、正文停在半个
base64 / quoted-printable 转义、半个汉字或没写完的 HTML 标签上,都说明传输或存盘时丢了后半截。截断的信和完整的那封
Message-ID 相同:先存下截断的,完整的那封再来时只会是 duplicate,客户真正写的内容就丢了;所以 parse() 把它当成解析不了的
坏信报给人看,不入库。课文的 parse() 没有这一步。"""
import codecs
import re
from email.errors import (CloseBoundaryNotFoundDefect, InvalidBase64LengthDefect, InvalidBase64PaddingDefect,
                          MissingHeaderBodySeparatorDefect, NoBoundaryInMultipartDefect, StartBoundaryNotFoundDefect)
from email.message import Message

from mail_text import decode_bytes, effective_charset, is_attachment

HALF_ESCAPE = re.compile(r"=[0-9A-Fa-f]\s*\Z")  # quoted-printable 截在「=C4」的中间
UNCLOSED_TAG = re.compile(r"(<([!/?A-Za-z][^<>]*)?|&#?[A-Za-z0-9]*)\Z")  # HTML 截在「<div cla」「&nbs」上


def cut_short(msg: Message, raw: bytes) -> str:
    """看得出这封信被截断了:返回原因,否则返回空串。看得出的痕迹(发信程序不会写出这样的信):
    - 邮件头没有以空行结束:有一行不是「名字: 值」(截在「Content-T」这样的半行上),或者整封信没有空行。规矩上只有
      邮件头的信可以不要空行,可常用的邮件程序都会写;拒收只是加星标给人看,存下它却会悄悄丢掉之后完整的那封。
    - multipart 没有结束边界、找不到第一段的边界或者没写 boundary。只查这封信自己的各部分:转发、退信里附的原信
      常被截断,信本身是完整的。等完整副本来了再替换也不行:工单可能已经被 worker 处理、起草了回复。
    - 正文(不是附件的 text/* 段):base64 长度不是 4 的倍数;quoted-printable 最后只剩「=C」;解码后最后一个字只剩
      前一两个字节(中文正文随便截在哪个字节上,三回里约有两回这样);HTML 停在「<di」「&nbs」这样没写完的地方。
    截在一行末尾、两个字之间的单段正文看不出来(短信和截短的信长得一样),照常入库。"""
    # 没有这个缺陷时,邮件头一直连到第一个空行或者信的末尾:整封信里一个空行都没有,就是没有分隔行(只有邮件头)
    if (any(isinstance(d, MissingHeaderBodySeparatorDefect) for d in msg.defects)
            or b"\n\n" not in raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")):
        return "邮件头没有以空行结束(邮件被截断或损坏?)"
    for part in own_parts(msg):
        if any(isinstance(d, CloseBoundaryNotFoundDefect) for d in part.defects):
            return "multipart 邮件没有结束边界(邮件被截断或损坏?)"
        if any(isinstance(d, StartBoundaryNotFoundDefect) for d in part.defects):
            return "multipart 邮件里找不到分段的边界(邮件被截断或损坏?)"
        if any(isinstance(d, NoBoundaryInMultipartDefect) for d in part.defects):  # 分不出段,正文会是空的
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
