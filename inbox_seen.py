"""inbox.py 在几个人共用收件箱时的一道保险(课文只有一个人):list 和 respond 记下这个人(INBOX_USER,没设就是
「登录名@主机名」)看到的是哪一版草稿,accept 只发他看过的那一版 —— 别人在这之间 respond、草稿被改写了,就请他先再
list 一遍,不会发出一版谁都没看过的回复。没 list 过就 accept(课文的用法)照常发。"""
import getpass
import hashlib
import json
import socket

import config
import store_errors
import store_inbox
SEEN_WAIT_S = 0.5  # 秒;list 记「你看到的是哪一版」时最多等别人的写锁这么久,等不到就不记(accept 时会请你再 list),list 照常显示


def viewer() -> str:
    """谁在用收件箱:INBOX_USER;没设就是「登录名@主机名」。"""
    if name := config.value("INBOX_USER"):
        return name
    try:
        login = getpass.getuser()
    except (OSError, KeyError):  # 容器里没有这个 uid 的账号、也没设 USER 之类的变量
        login = "?"
    return f"{login}@{socket.gethostname()}"


def fingerprint(draft: str) -> str:
    return hashlib.sha256(draft.encode()).hexdigest()


def item_fingerprint(item: dict) -> str:
    """一条待办(HumanInterrupt)整个的指纹:网页的每个表单带着它,回答时核对人看到的还是不是这一版。"""
    return fingerprint(json.dumps(item, sort_keys=True, ensure_ascii=False))


def remember(drafts: dict[str, str]) -> None:
    """记下这个人刚看到的草稿({工单号: 草稿全文})。记不下(库被别人锁着、连不上)就算了:accept 时按上一次记下的
    那一版核对,对不上就请人再 list —— 只会多问一次,不会发出这个人没看过的版本。"""
    try:
        store_inbox.mark_seen(viewer(), {t: fingerprint(d) for t, d in drafts.items()}, SEEN_WAIT_S)
    except store_errors.unavailable_errors():
        pass
