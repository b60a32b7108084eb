"""inbox.py 的命令行参数检查(课文直接取 sys.argv[2]、sys.argv[3]):在碰数据库之前挡下写错的命令 —— 像选项的词
(--force)、空白或零宽字符组成的文字、夹着控制字符的回复、超过 INBOX_MAX_TEXT_CHARS 的文字、不是 UTF-8 的参数,
都说一句原因、退出码 2,什么都不动;从聊天软件复制来的工单号去掉看不见的格式字符再用。这些文字会原样发给客户,
所以宁可先拒。"""
import re
import unicodedata

import config
from llm_pii import mask_pii
NEEDS_TEXT = ("edit", "respond")
# -f、--force、--dry-run、--dry_run、--reply=…:像选项的一个词(带空格、不带「=」的就是文字);单独的 - 和 --
# 也算:不然它们会被当成回复原样发给客户
OPTION = re.compile(r"--?(?:[A-Za-z0-9][A-Za-z0-9_-]*(?:=.*)?)?", re.S)
END_OF_OPTIONS = "--"  # 后面的都是工单号和文字,不当选项看:工单号真的以 - 开头时(webhook 收得下 -A7 这样的)用它
# 除了 \t \n \r 之外的控制字符,也包括 C1 的 \x80–\x9f(用错编码解出来的 Word、Windows-1252 文字常带着,
# \x9b 还是终端的 CSI):这些字客户那边看到的是乱码
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def typed_id(arg: str) -> str:
    """命令行上敲的(多半是复制来的)工单号:去掉两头的空白和夹在里面看不见的格式字符(零宽空格、BOM、软连字符……,
    Unicode 的 Cf 类)。从聊天软件、网页、存成带 BOM 的文件里复制来的工单号常带着它们:不去掉的话 list 刚列出 T1041,
    accept 却说「T1041 不在收件箱里」,看上去一模一样。工单号本身不会有这些字符(webhook 只收字母数字 _ -)。"""
    return "".join(c for c in arg if unicodedata.category(c) != "Cf").strip()


def utf8(arg: str) -> bool:
    """命令行里的字节不是 UTF-8 时(GBK 终端里打的字),Python 把它们解码成代理字符 \\udcxx:存不进库,发出去是乱码。"""
    try:
        arg.encode()
    except UnicodeEncodeError:
        return False
    return True


def blank(text: str) -> bool:
    """没有一个看得见的字:只有空白(含全角空格)、控制字符、零宽字符(\\u200b、\\ufeff 这类格式字符)。"""
    return all(c.isspace() or unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp") for c in text)


def bad_argument(command: str, args: list[str], options_end: int) -> str | None:
    """命令行参数哪里不对(说给人听的一句);都对就返回 None。在碰数据库之前做完。
    args 里已经去掉了 --;options_end 是它所在的位置(没有 -- 时是 len(args)),之后的不当选项看。"""
    for arg in args[1:options_end]:
        if OPTION.fullmatch(arg):
            return (f"不认识的选项:{arg}(inbox.py 只有 -h / --help 一个选项;工单号或文字真的以 - 开头时,"
                    "写在 -- 后面,比如 inbox.py accept -- -A7)")
    if command == "list":
        return "list 不带参数" if len(args) > 1 else None
    if len(args) < 2 or blank(args[1]):
        return f"{args[0]} 需要工单号"
    if command == "restart":  # 可以一次给好几张(list 的提示里就是这样给的)
        return next((f"restart 的工单号不能是空的(第 {i} 个)" for i, a in enumerate(args[1:], 1) if blank(a)), None)
    if command in NEEDS_TEXT and (len(args) < 3 or blank(args[2])):
        return f"{args[0]} 需要第三个参数:{'改好的回复全文' if command == 'edit' else '给 Agent 的意见'}(不能为空)"
    if len(args) > (3 if command in NEEDS_TEXT else 2):
        return f"{args[0]} 的参数太多了;文字里有空格时请用引号括起来"
    # 数的是交给图的那份(respond 的意见先打码,卡号打码后多三四个字):图的 review 按同一个数再查一遍,
    # 这里放过、那边拒绝的话,人得到的是一句摸不着头脑的「没有处理成」
    handed = (mask_pii(args[2]) if command == "respond" else args[2]) if command in NEEDS_TEXT else ""
    if len(handed.strip()) > (limit := config.value("INBOX_MAX_TEXT_CHARS")):
        after_masking = "(手机号、卡号之类打码之后)" if handed != args[2] else ""
        return (f"{args[0]} 的文字有 {len(handed.strip())} 个字{after_masking},最多 {limit} 个(INBOX_MAX_TEXT_CHARS):"
                "多半是多粘贴了一段;什么都没有改")
    if command in NEEDS_TEXT and (bad := next((c for c in args[2] if CONTROL.fullmatch(c)), None)):
        return (f"{args[0]} 的文字里有控制字符 \\x{ord(bad):02x}(多半是复制粘贴或按错键带进来的),"
                "客户那边看到的会是乱码;删掉再试")
    return None
