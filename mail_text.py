"""给 email_poller.py 的 text_of() 和 parse() 补上真实邮件要的文字处理:声明的字符集不对时(标 gb2312 却有 GBK 才有的字、
标 iso-8859-1 其实是 cp1252、标 gbk 其实是 UTF-8)换用解得通的字符集;邮件头里 RFC 2047 编码和直接写的 8 位字节都解成
文字;只有 HTML 的信转成纯文本;multipart 里按顺序挑出客户自己写的几段、跳过附件;截断正文和主题时不把号码截成两半。
课文的 text_of() 只取第一段 text/plain、按声明的字符集解码;这几种情况在真实邮件里都常见,处理不好,工单里就是乱码、
空正文或半个手机号(脱敏认不出半个号码)。"""
import re
from email.errors import HeaderParseError
from email.header import decode_header
from email.message import Message
from html.parser import HTMLParser

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
# 半个手机号、卡号(「请回电1381234」)脱敏认不出来,会原样进提示词和 checkpoint
# (全角数字、全角 @、输入法打出的全角横线和空格,网页复制来的不间断空格也算,和 llm_pii.mask_pii 认的一样)
_RUN_CHARS = r"0-9０-９A-Za-zＡ-Ｚａ-ｚ._%+@＠\-－"
PII_RUN = re.compile(rf"[{_RUN_CHARS}]+(?:[ \t\u00a0\u3000\-－‐‑—]+[0-9０-９][{_RUN_CHARS}]*)*")
PII_RUN_MAX_CHARS = 100   # 字;再长的一串(网址、日志)不会是手机号、卡号、邮箱,照原样截
SURROGATES = re.compile("[\ud800-\udfff]")  # 落单的代理项:utf-8 编不出来,两种库都存不进去


def decode_bytes(raw: bytes, charset: str | None) -> str:
    """按声明的字符集解码;没声明、声明了不认识的名字或者解不通时,依次试 utf-8、gb18030,最后带替换符硬解。
    解出落单代理项的也算解不通(utf-7 的 +2AA-、unicode_escape 的 \\ud800 会这样):带着它存不进库,
    这封信会每次都「存储失败」、永远收不进来。"""
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
    CELLS = {"td", "th"}  # 表格的格子之间空一格:「订单号」「A1001」两格不粘成「订单号A1001」

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.in_head = False

    def handle_starttag(self, tag, attrs) -> None:
        # head 不一定写 </head>、<body>(HTML5 里合法):和浏览器一样,碰到不属于 head 的标签(<p>、<div>)head 就结束,
        # 只写了 <head> 的信正文照样收下
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


def texts(part: Message, inner: bool, named: bool = False) -> list[str]:
    """part 里按顺序的各段文字(已经整理过、非空)。inner:附着的整封邮件也往里走。
    named:带文件名、但 Content-Disposition 不是 attachment 的文字段也算(见 email_poller.text_of)。"""
    if part.get_content_maintype() == "message":  # message/rfc822 这类:附着的一整封邮件
        if not inner:
            return []
        payload = part.get_payload()
        return [t for sub in (payload if isinstance(payload, list) else [payload])
                if isinstance(sub, Message) for t in texts(sub, inner, named)]
    if part.is_multipart():
        children = [c for c in part.get_payload() if isinstance(c, Message)]
        if part.get_content_subtype() != "alternative":
            return [t for c in children for t in texts(c, inner, named)]
        versions = [(c, "\n".join(texts(c, inner, named))) for c in children]  # 同一段话的几种写法:只要一种
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
    filename、Content-Type 的 name)。Apple Mail 把附件标成「inline; filename=export.log」:当成正文的话,日志混进工单,
    日志最后一个字被截断时整封信还会被当成截断的坏信。"""
    return part.get_content_disposition() == "attachment" or part.get_filename() is not None


def _decoded(part: Message) -> str:
    raw = part.get_payload(decode=True) or b""  # base64 / quoted-printable 在这里解开
    charset = part.get_content_charset()
    if charset is None and part.get_content_type() == "text/html" and \
            (m := META_CHARSET.search(raw[:META_SCAN_BYTES])):
        charset = m.group(1).decode("ascii")  # 没声明字符集的 Big5 网页按 GB18030 解会是乱码
    return decode_bytes(raw, charset)


def cut(text: str, limit: int) -> str:
    """text 的前 limit 个字;截断处在一串字母数字(号码、邮箱地址、英文单词,见 PII_RUN)中间时退到这一串的开头。"""
    if len(text) <= limit:
        return text
    for m in PII_RUN.finditer(text, max(0, limit - PII_RUN_MAX_CHARS), limit + PII_RUN_MAX_CHARS):
        if m.start() < limit < m.end() and limit - PII_RUN_MAX_CHARS < m.start():
            return text[:m.start()]
    return text[:limit]
