"""agent.py 和日志在文字进模型、进 last_error 之前调用的清理:mask_pii() 给手机号、身份证号、银行卡号和账号、邮箱地址打码,
without_control_chars() 去掉模型用不上、PostgreSQL 也存不下的控制字符。课文直接把工单原文交给模型;这里客户的号码不出
这台机器、不进 checkpoint。它只用正则、不导入 openai 和 langchain,不调模型的进程(收信、收件箱)导入它不花时间。"""
import re


# 每个式子都只从一串的开头试((?<!…)):不然贴进工单的 4 万位数字、一段 base64 要从每个位置扫到串尾,打码几十秒。
# 数字之间的空白:空格、制表符、不间断空格、窄空格、全角空格,最多两个;看不见的格式字符(零宽空格、软连字符、BOM、
# 方向标记,网页和聊天软件复制来的常夹着)也算:「138\u200b1234\u200b5678」模型照样读得出号码
_INVISIBLE = "\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff"
_INVISIBLE_RUN = f"[{_INVISIBLE}]*"
_SPACE = f"[ \t\xa0\u2000-\u200a\u202f\u205f\u3000{_INVISIBLE}]"  # \u2000-\u200a:各种宽度的空格(窄空格 \u2009 也在)
# 邮箱:全角的整串(ｚｈａｎｇ＠ｑｑ．ｃｏｍ)、点打成「。」的(zhang@qq。com)、@ 前后夹着零宽字符的也算
_MAIL_CHAR = rf"[A-Za-z0-9._%+\-\uff10-\uff19\uff21-\uff3a\uff41-\uff5a\uff0e{_INVISIBLE}]"
_EMAIL = re.compile(rf"(?<!{_MAIL_CHAR})({_MAIL_CHAR}){_MAIL_CHAR}*([@\uff20]{_INVISIBLE_RUN}"
                    rf"[A-Za-z0-9\-\uff10-\uff19\uff21-\uff3a\uff41-\uff5a.\uff0e\u3002{_INVISIBLE}]+"
                    rf"[.\uff0e\u3002]{_INVISIBLE_RUN}[A-Za-z\uff21-\uff3a\uff41-\uff5a][A-Za-z\uff21-\uff3a\uff41-\uff5a{_INVISIBLE}]*"
                    r"[A-Za-z\uff21-\uff3a\uff41-\uff5a])")
_GAP = rf"(?:{_SPACE}{{1,2}}|[\-－‐‑])"  # 一串号码里两位数字之间最多隔这么一下(‐‑ 是 Word 换掉的连字符)
# 身份证号中间是生日,认错的可能很小:分段之间的点也算(110105.19900307.2345,和手机号一样)
_ID_GAP = rf"(?:{_GAP}|[.．])"
_ID_CARD = re.compile(rf"(?<!\d)(\d{{6}}){_ID_GAP}?(?:19|20)\d{{2}}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01]){_ID_GAP}?"
                      r"(\d{3}[\dXx])(?![\dXx])")
_OLD_ID_CARD = re.compile(r"(?<!\d)(\d{6})\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])(\d{3})(?!\d)")  # 15 位,年份两位
# 账号、卡号后面跟着的一串数字(8 位以上):对公账号常是 12–14 位或 20 位以上,不像银行卡那样好认
_ACCOUNT = re.compile(rf"((?:账号|帐号|账户|帐户|卡号|account(?: ?(?:no\.?|number))?)(?:{_SPACE}|[:\uff1a])*)"
                      rf"(\d(?:{_GAP}?\d){{7,}})(?!{_GAP}?\d)", re.I)
# 15 位以上、两位之间可以有一下 _GAP 的一整串(15 位是运通卡,20 位以上是对公账号;15 位的老身份证前面已经打过码),见 _card_run
_BANK_CARD = re.compile(rf"(?<!\d)\d(?:{_GAP}?\d){{14,}}")
_MAX_CARD_DIGITS = 30
_YYYYMMDD = re.compile(r"(?:19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])")
# 一条横线(- － — – ‐ ‑),两边可以各带空格:「4111 - 1111」「138—1234—5678」
_DASH = rf"{_SPACE}*[\-－—–‐‑]{_SPACE}*"
# 用横线、点、斜线、下划线连起来的一串数字:日期范围、发票号段、金额、版本号也长这样,所以只有分组正好是卡号的样子
# (4-4-4-4 后面可以再带 1–3 位、运通卡的 4-6-5)才打码,见 _card_or_not
_RUN_SEP = rf"(?:{_DASH}|[.．/／_])"
_DASHED_RUN = re.compile(rf"(?<!\d)\d+(?:{_RUN_SEP}\d+)+")
_CARD_GROUPS = ((4, 4, 4, 4), (4, 6, 5))
# 138 1234 5678、138-1234-5678、138.1234.5678、138 - 1234 - 5678、+86 13812345678、(138)1234-5678 也算;
# \d 也认全角数字(１３８…),开头两位单独写上全角;分隔符也认输入法全角模式打出的「－」「　」「．」(银行卡号同样)。
# 括号只认括住开头三位的一对:整个号码带括号的「(13812345678)」括号原样留着
_PHONE_GAP = rf"(?:{_DASH}|{_SPACE}{{1,2}}|[.．/／_])"
_MOBILE = re.compile(rf"(?<![\d+])((?:\+?86(?:{_SPACE}|[\-－])?)?)(?:[(（]([1１][3-9３-９]\d)[)）]|([1１][3-9３-９]\d))"
                     rf"{_PHONE_GAP}?\d{{4}}{_PHONE_GAP}?(\d{{4}})(?!\d)")
# 4-4-3 分组:1380 0138 000、1380-0138-000;打码后和上面一样是 138****8000
_MOBILE_443 = re.compile(rf"(?<![\d+])((?:\+?86(?:{_SPACE}|[\-－])?)?[1１][3-9３-９]\d)\d{_PHONE_GAP}\d{{3}}(\d)"
                         rf"{_PHONE_GAP}(\d{{3}})(?!\d)")


# 控制字符(换行、回车、制表符除外):模型用不上;PostgreSQL 的 text 和 JSONB 都不收 \u0000,工单里夹着一个,
# checkpoint 就写不进去。业务库里的原文不动,只清进图、进模型的副本
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def without_control_chars(text: str) -> str:
    return _CONTROL.sub("", text)


def mask_pii(text: str, keep=()) -> str:
    """手机号、身份证号(18 位和 15 位)、银行卡号和账号、邮箱地址打码。业务库里的原文不动,只改进模型和日志的副本。
    keep:原样留着的几段(None 跳过),比如错误信息里让人照着敲的 --requeue-dead 命令:邮件的事件 id 是 Message-ID,
    长得像邮箱地址(<q313a46@qinghe-trade.cn>),打成 <q***@…> 的话照着敲就不对了。"""
    for kept in keep:
        if kept and kept in text:
            return kept.join(mask_pii(part, keep) for part in text.split(kept))
    text = _EMAIL.sub(lambda m: m.group(1) + "***" + m.group(2), text)
    text = _ID_CARD.sub(lambda m: m.group(1) + "*" * 8 + m.group(2), text)
    text = _OLD_ID_CARD.sub(lambda m: m.group(1) + "*" * 6 + m.group(2), text)
    text = _ACCOUNT.sub(lambda m: m.group(1) + _masked_card(m.group(2)), text)
    text = _BANK_CARD.sub(_card_run, text)
    text = _DASHED_RUN.sub(_card_or_not, text)
    text = _MOBILE_443.sub(lambda m: m.group(1) + "****" + m.group(2) + m.group(3), text)
    return _MOBILE.sub(lambda m: m.group(1) + (m.group(2) or m.group(3)) + "****" + m.group(4), text)


def _masked_card(number: str) -> str:
    return "**** **** **** " + re.sub(r"\D", "", number)[-4:]


def _card_run(m: re.Match) -> str:
    """_BANK_CARD 认出的一串。一段没隔开的:30 位以内打码,更长的(贴进来的几万位数字、哈希)不是卡号,不动。
    隔开的、30 位以内:整串打码;只有每段都不到 4 位(299 299 299 299 299 这样的金额)或者每段都是日期
    (20240301 20240331)的不动。更长的是几个号码挨着写(「两张卡 6222…0123 6228…0018」):一段段看,
    15–30 位的一段、4-4-4-4(后面可以再带 1–3 位)和 4-6-5 的几段各自打码。"""
    run = m.group(0)
    parts = re.split(f"({_GAP})", run)
    tokens, gaps = parts[0::2], parts[1::2]
    digits = sum(map(len, tokens))
    if len(tokens) == 1:
        return _masked_card(run) if digits <= _MAX_CARD_DIGITS else run
    if digits <= _MAX_CARD_DIGITS:
        if all(len(t) < 4 for t in tokens) or all(_YYYYMMDD.fullmatch(t) for t in tokens):
            return run
        return _masked_card(run)
    out, i = [], 0
    while i < len(tokens):
        sizes = tuple(len(t) for t in tokens[i:i + 5])
        if 15 <= sizes[0] <= _MAX_CARD_DIGITS:
            end = i + 1
        elif sizes[:4] == (4, 4, 4, 4):
            end = i + 4 + (len(sizes) == 5 and sizes[4] <= 3)
        elif sizes[:3] == (4, 6, 5):
            end = i + 3
        else:
            end = None
        out.append(tokens[i] if end is None else _masked_card("".join(tokens[i:end])))
        end = end or i + 1
        if end < len(tokens):
            out.append(gaps[end - 1])
        i = end
    return "".join(out)


def _card_or_not(m: re.Match) -> str:
    groups = tuple(len(g) for g in re.split(_RUN_SEP, m.group(0)))
    is_card = groups in _CARD_GROUPS or (groups[:4] == (4, 4, 4, 4) and len(groups) == 5 and groups[4] <= 3)
    return _masked_card(m.group(0)) if is_card else m.group(0)
