"""send_webhook.py 的参数检查(课文直接 sys.argv[1]、int(sys.argv[2])):工单号空的、以 - 开头、带字母数字 _ - 以外的
字符,重复次数不是正整数或超过 MAX_TIMES 时,用中文说清楚、退出码 2,一个请求都不发;-h / --help 写在哪都算。
这样写错的命令不会变成一串 400,也不会因为多打了几个 0 一直发下去。"""
import sys

from webhook import TICKET_ID
USAGE = "用法:uv run python send_webhook.py 工单号 [重复次数,正整数]"
MAX_TIMES = 100  # 次;模拟上游超时重试,几次就够了;多打了几个 0 也不会一直发下去


def check_args(argv: list[str]) -> tuple[str, int] | int:
    """(工单号, 重复次数);参数不对时说明原因,返回退出码(--help 是 0,写错是 2)。"""
    if "-h" in argv or "--help" in argv:  # 写在哪个位置都算(T1012 -h 也是求助,不是重复次数)
        print(USAGE)
        return 0
    if argv[:1] == ["--"]:  # 「后面都不是选项」的写法:-- T1012 的工单号是 T1012
        argv = argv[1:]
    if not 1 <= len(argv) <= 2:
        print(f"{'缺少工单号' if not argv else '参数太多了'}\n{USAGE}", file=sys.stderr)
        return 2
    # isascii:「²」「٣」之类也算 isdigit(),int() 却不认。超过 4300 位的数字串 int() 不肯转(ValueError 的 traceback),
    # 所以先去掉开头的 0 看位数:比 MAX_TIMES 还长的,下面说「最多 MAX_TIMES」
    if len(argv) == 2 and not (argv[1].isascii() and argv[1].isdigit() and argv[1].strip("0")):
        print(f"重复次数要是正整数,现在是 {argv[1]!r}\n{USAGE}", file=sys.stderr)
        return 2
    if argv[0].startswith("-") or not argv[0].strip():  # 写错的选项(--halp)、空工单号:不能当工单号发出去
        print(f"工单号不能是 {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    if not TICKET_ID.fullmatch(argv[0]):  # 「T 1」、全角的「T１２」:webhook 会回一句英文的 400,这里先用中文说
        print(f"工单号只能由英文字母、数字、_ 和 - 组成(最多 64 个),现在是 {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    ticket_id, digits = argv[0], argv[1].lstrip("0") if len(argv) == 2 else "1"
    if len(digits) > len(str(MAX_TIMES)) or (times := int(digits)) > MAX_TIMES:
        print(f"重复次数最多 {MAX_TIMES}(模拟上游重试,几次就够了)\n{USAGE}", file=sys.stderr)
        return 2
    return ticket_id, times
