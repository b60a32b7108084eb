r"""inbox.py 往终端上打字时的两样讲究(课文直接 print):工单原文、草稿和敲错的工单号里可能带着控制字符(\x9b 是终端的
CSI,能把后面的字藏起来),visible() 把它们写成 \xNN,看得见、也不会被终端当成命令执行;草稿有好几行时(邮件工单、
真模型的草稿),indented() 让后面几行也缩进,不和下一条待办混在一起。"""
import re

# 打到终端上之前换成 \xNN 的字符:制表符和换行以外的控制字符,包括 C1(\x9b 是终端的 CSI,客户邮件里的「\x9b8m」
# 能把后面的字藏起来,主管在通知里正好看不见那句话)。工单原文、草稿、命令行上敲错的工单号都可能带着
SHOWN_ESCAPED = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """打到终端上的文字:SHOWN_ESCAPED 里的字符写成 \\xNN,看得见、也不会被终端当成命令。"""
    return SHOWN_ESCAPED.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def indented(label: str, text: str) -> str:
    """「        标签:正文」;正文有好几行(邮件工单、真模型的草稿)时,后面几行也缩进,不和下一条待办混在一起。"""
    return "\n".join(f"        {label if i == 0 else ''}{visible(line)}" for i, line in enumerate(text.splitlines() or [""]))
