"""命令行收件箱:列出等人处理的工单,对其中一条给出处理结果。

运行:
    uv run python inbox.py list
    uv run python inbox.py accept  T1012                      # 原样发出(别名 approve)
    uv run python inbox.py edit    T1012 "改过的回复全文"        # 改完再发
    uv run python inbox.py respond T1012 "语气再软一点,先道歉"   # 提意见,让 Agent 重写(会再调一次模型)
    uv run python inbox.py ignore  T1012                      # 不回(别名 reject)
    uv run python inbox.py restart T1012 [T1041 ...]          # checkpoint 库丢了的待办:交回 worker 从头起草(会再调一次模型)

你会看到:list 每条待办两行(工单号 + [类别] 概括,下一行是草稿;草稿有几行就缩进着接几行);重写到上限的多一行
说明只能做什么;通知类待办下一行是工单原文,再一行「只能 ignore(看过即可)」;没有待办时一行「收件箱是空的」。
处理后一行结果,例如 T1012 → sent;respond 之后是「已按意见重写,新草稿: …」,待办留在收件箱里;
restart 之后每张工单一行「T1012 已交回 worker 从头起草(…)」,worker 再跑一次它就又回到收件箱。
-h / --help 打印用法(写在哪个位置都算)。出错时:工单不在收件箱里(事件进了死信队列的,说出原因和放回队列的命令;
工单号大小写不对的,问「是不是 T1012?」)、这条待办不允许这种处理、要 restart 的待办 checkpoint 还在、数据库暂时用不了、要 accept 的草稿在你上次
看过之后被别人 respond 改写了 → 说明原因,退出码 1;命令写错 → 用法,退出码 2,什么都不动。命令写错也包括:
--force 这样的选项(只有 -h / --help)、只有空白 / 零宽字符 / 控制字符的文字、文字里夹着制表符和换行以外的控制字符、
超过 INBOX_MAX_TEXT_CHARS(默认 2000)个字的文字、
不是 UTF-8 的参数(终端的编码是 GBK 之类)。以「-」开头、后面还有别的字的回复(「- 第一步:…」)照常是文字;
以 - 开头的工单号(-A7)或者像选项的文字(--reply=…)写在 -- 后面:inbox.py accept -- -A7。
工单原文、草稿、敲错的工单号里的控制字符(\x9b 这类终端命令)显示成 \x9b,不交给终端执行。
输出被提前关掉(list | head)时不打 traceback,退出码 141(和被 SIGPIPE 结束的命令一样),这次不记你看到了哪一版。
只是列表不长、整个都写进了管道时,list 看不出 head 只显示了前几行:整个列表都算你看过(要看全部,别接 head)。
启动时(导入要三四秒)按 Ctrl-C:一行「已中断(Ctrl-C):什么都还没动」,退出码 130。

几个人共用收件箱时(INBOX_USER 区分是谁,见 .env.example):list 和 respond 记下你看到的是哪一版草稿,accept 只发
你看到的那一版;没 list 过就 accept(课文的用法)照常发。
"""
import getpass
import hashlib
import os
import re
import socket
import sys
import unicodedata

import config  # 只用标准库,导入很快:先装好 Ctrl-C 的处理,再做下面慢的导入

if __name__ == "__main__":
    config.quit_quietly_while_importing(f"{config.INTERRUPTED}:什么都还没动")

from langgraph.types import Command  # noqa: E402

import store  # noqa: E402
from agent import is_permanent, opened_graph, thread_of  # noqa: E402
from agent_run import FINISHED, check_settings, finished_status, interrupted_status  # noqa: E402
from agent_review import allowed, max_text_chars  # noqa: E402
from llm_errors import describe  # noqa: E402
from llm_pii import mask_pii  # noqa: E402

INBOX_USER = ""  # 谁在用收件箱(几个人共用时区分);空 = 「登录名@主机名」
SEEN_WAIT_S = 0.5  # 秒;list 记「你看到的是哪一版」时最多等别人的写锁这么久,等不到就不记(accept 时会请你再 list),list 照常显示

USAGE = __doc__.split("运行:")[1].split("你会看到")[0].rstrip()
ALIASES = {"approve": "accept", "reject": "ignore"}  # LangChain 1.x HumanInTheLoopMiddleware 的叫法
ANSWER_TYPE = {"accept": "accept", "edit": "edit", "respond": "response", "ignore": "ignore"}
COMMAND_OF = {v: k for k, v in ANSWER_TYPE.items()}
NEEDS_TEXT = ("edit", "respond")
# -f、--force、--dry-run、--dry_run、--reply=…:像选项的一个词(带空格、不带「=」的就是文字);单独的 - 和 --
# (原来当成回复原样发给了客户;--reply=… 和 --dry_run 也是,直到这一版)
OPTION = re.compile(r"--?(?:[A-Za-z0-9][A-Za-z0-9_-]*(?:=.*)?)?", re.S)
END_OF_OPTIONS = "--"  # 后面的都是工单号和文字,不当选项看:工单号真的以 - 开头时(webhook 收得下 -A7 这样的)用它
# 打到终端上之前换成 \xNN 的字符:制表符和换行以外的控制字符,包括 C1(\x9b 是终端的 CSI,客户邮件里的「\x9b8m」
# 能把后面的字藏起来,主管在通知里正好看不见那句话)。工单原文、草稿、命令行上敲错的工单号都可能带着
SHOWN_ESCAPED = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# 除了 \t \n \r 之外的控制字符,也包括 C1 的 \x80–\x9f(用错编码解出来的 Word、Windows-1252 文字常带着,
# \x9b 还是终端的 CSI):原来只拦 \x00–\x1f 和 \x7f,C1 的原样发给了客户
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class Refused(Exception):
    """这次处理做不了,原因说给人听;退出码 1。"""


def usage(problem: str) -> int:
    print(f"{visible(problem)}\n用法:{USAGE}", file=sys.stderr)
    return 2


def visible(text: str) -> str:
    """打到终端上的文字:SHOWN_ESCAPED 里的字符写成 \\xNN,看得见、也不会被终端当成命令。"""
    return SHOWN_ESCAPED.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def restart_command(tickets) -> str:
    """提示里让人照着敲的 restart 命令;有以 - 开头的工单号时写在 -- 后面。"""
    ids = sorted(tickets)
    return f"uv run python inbox.py restart {'-- ' if any(t.startswith('-') for t in ids) else ''}{' '.join(ids)}"


def viewer() -> str:
    """谁在用收件箱:INBOX_USER;没设就是「登录名@主机名」。"""
    if name := config.get("INBOX_USER", INBOX_USER):
        return name
    try:
        login = getpass.getuser()
    except (OSError, KeyError):  # 容器里没有这个 uid 的账号、也没设 USER 之类的变量
        login = "?"
    return f"{login}@{socket.gethostname()}"


def fingerprint(draft: str) -> str:
    return hashlib.sha256(draft.encode()).hexdigest()


def remember(drafts: dict[str, str]) -> None:
    """记下这个人刚看到的草稿({工单号: 草稿全文})。记不下(库被别人锁着、连不上)就算了:accept 时按上一次记下的
    那一版核对,对不上就请人再 list —— 只会多问一次,不会发出这个人没看过的版本。"""
    try:
        store.mark_seen(viewer(), {t: fingerprint(d) for t, d in drafts.items()}, SEEN_WAIT_S)
    except store.unavailable_errors():
        pass


def status_of(snap) -> str:
    """按 checkpoint,事件该是什么状态:停在收件箱 / 做完了 / 跑到一半停了(交回 worker 从停下的节点续跑)。"""
    if snap.interrupts:
        return "waiting_human"
    if snap.values.get("outcome") in FINISHED:
        return finished_status(snap.values["outcome"])
    return "pending"


def reconcile(graph, ev: dict) -> str | None:
    """事件状态和 checkpoint 对不上时(上次收件箱命令做到一半崩了),按 checkpoint 改正事件状态。
    返回改成的状态;对得上就返回 None。"""
    status = status_of(graph.get_state(thread_of(ev["ticket_id"])))
    if status == ev["status"]:
        return None
    if status == "waiting_human":
        # 同一张工单的另一个事件已经在收件箱里(这个是上游又通知的一次,领它的 worker 中途没了):它算 done,和 worker
        # 处理它时一样。原来也改成 waiting_human,同一张工单在收件箱里列两遍,日报也多算一条
        status = interrupted_status(ev["ticket_id"], ev["event_id"])
    if ev["status"] == "processing" and status == "pending":
        # 交回 worker 续跑,和 worker 放回卡住的事件一样:死掉的是 worker 时记上崩溃的标记(原来清空了 last_error,
        # 每次都让 worker 崩溃的事件,每 list 一次就多跑一圈、多调一次模型),是收件箱命令时 worker 的尝试次数从头算
        return status if store.hand_to_worker(ev["event_id"], ev["claimed_by"]) else None
    guard = {"owner": ev["claimed_by"]} if ev["status"] == "processing" else {"expect": ev["status"]}
    return status if store.set_status(ev["event_id"], status, **guard) else None


def tidy(graph, say_missing: bool = True) -> set[str]:
    """list 和各个动作之前先做:把上次崩掉留下的不一致改正过来,并告诉人。
    返回在 checkpoint 库里根本找不到的待办(工单号):它们不动、不列出、不能处理(见 missing_checkpoints)。"""
    waiting = store.events_by_status("waiting_human")
    missing = missing_checkpoints(graph, waiting, say_missing)
    broken = [{**e, "status": "processing"} for e in store.orphans()]
    broken += [{**e, "status": "waiting_human"} for e in waiting if e["ticket_id"] not in missing]
    for ev in broken:
        if (status := reconcile(graph, ev)) is not None:
            print(f"(更正:{ev['ticket_id']} 上次处理中途中断,事件 {ev['event_id']} 改为 {status})", file=sys.stderr)
    return missing


def missing_checkpoints(graph, waiting: list[dict], say: bool = True) -> set[str]:
    """在收件箱里、checkpoint 库里却一个 checkpoint 都没有的工单。待办是 interrupt 写下之后才进收件箱的,
    找不到只能是 CHECKPOINTS_DB(或 DATABASE_URL)指的不是 worker 起草时用的那个库。原来按「上次中途中断」把它们
    全改成 pending,worker 在错的库里把每一条重新起草一遍;现在一条都不动,说一行。"""
    missing = {e["ticket_id"] for e in waiting if graph.get_state(thread_of(e["ticket_id"])).created_at is None}
    if missing and say:  # restart 不说:人正是看了这一行才来 restart 的
        where = store._safe_url(store.database_url()) if store.dialect() == "postgres" else \
            f"CHECKPOINTS_DB={store.checkpoints_db()}"
        print(f"(收件箱里的 {'、'.join(sorted(missing))} 在 checkpoint 库里找不到({where}):多半指错了库,"
              "worker 起草时用的是另一个;把设置改回来,这几条没有动。库确实丢了(删掉了)的话,运行 "
              f"{restart_command(missing)} 让 worker 从头重新起草)", file=sys.stderr)
    return missing


def restart(tickets: list[str], missing: set[str]) -> None:
    """checkpoint 库丢了的待办交回 worker:事件改回 pending、尝试次数从 0 算,worker 领到时 thread 是空的,
    就像新工单一样从 load 跑起(再调一次模型)。checkpoint 还在的、不在收件箱里的都不给做:一张不对,一张都不动。
    原来这样的待办只能一直留在事件表里,list 每次都说一遍,哪个命令都处理不了。"""
    waiting = store.events_by_status("waiting_human")
    for ticket_id in tickets:
        if ticket_id in missing:
            continue
        if any(e["ticket_id"] == ticket_id for e in waiting):
            raise Refused(f"{ticket_id} 的 checkpoint 还在,不用 restart:直接 accept / edit / respond / ignore;"
                          "这次什么都没有动")
        raise not_in_inbox(ticket_id, waiting)
    moved = set(store.restart_waiting([e["event_id"] for e in waiting if e["ticket_id"] in tickets]))
    gone = []
    for ticket_id in tickets:
        if any(e["event_id"] in moved for e in waiting if e["ticket_id"] == ticket_id):
            print(f"{ticket_id} 已交回 worker 从头起草(checkpoint 库里找不到它,worker 会再调一次模型)")
        else:
            gone.append(ticket_id)
    if gone:  # tidy() 之后、改状态之前,另一个 restart 先放回去了
        raise Refused(f"{'、'.join(gone)} 刚被另一个收件箱命令交回 worker 了,这次没有再动")


def indented(label: str, text: str) -> str:
    """「        标签:正文」;正文有好几行(邮件工单、真模型的草稿)时,后面几行也缩进,不和下一条待办混在一起。"""
    return "\n".join(f"        {label if i == 0 else ''}{visible(line)}" for i, line in enumerate(text.splitlines() or [""]))


def show_list(graph, missing: set[str]) -> None:
    waiting = [e for e in store.events_by_status("waiting_human") if e["ticket_id"] not in missing]
    # 上面查完收件箱之后,另一个收件箱命令可能刚把其中一条处理完:checkpoint 里已经没有 interrupt,不列它
    # (原来是 IndexError 的 traceback)
    snaps = [(ev, snap) for ev in waiting if (snap := graph.get_state(thread_of(ev["ticket_id"]))).interrupts]
    if not snaps and not missing:
        print("收件箱是空的")
    shown = {}
    for ev, snap in snaps:
        item = snap.interrupts[0].value
        args = item["action_request"]["args"]
        print(visible(f"{ev['ticket_id']}  {item['description']}"))
        if item["action_request"]["action"] == "notify_supervisor":
            print(indented("工单:", args["ticket_text"]))
            print("        只能 ignore(看过即可)")
            continue
        print(indented("草稿:", args["reply"]))
        shown[ev["ticket_id"]] = args["reply"]
        if not item["config"]["allow_respond"]:
            rounds = len(snap.values.get("feedback", []))
            why = f"已按意见重写 {rounds} 次,到上限了" if rounds else REDRAFTS_OFF
            print(f"        {why}:只能 {' / '.join(COMMAND_OF[k] for k in allowed(item))}")
    # 先让人看到;记下看到了哪一版可能要等一会儿锁。输出被提前关掉(list | head)时这里抛 BrokenPipeError,
    # 就不记了:没送到人眼前的草稿不能算看过(见文件末尾)。写进了管道、对面读没读完,这里不知道(head 一次读走
    # 一整块再丢掉后面的,管道里也看不出剩下多少):这时整个列表都算看过,文件开头的说明里写了
    sys.stdout.flush()
    remember(shown)


def answer_for(command: str, ticket_id: str, text: str) -> dict:
    """HumanResponse。respond 的意见在这里就打码:交给 LangGraph 的回答会原样存进 checkpoint(writes 里的 __resume__),
    review 节点里再打码就晚了。edit 的回复是要发给客户的原文,不动。"""
    if command == "edit":
        return {"type": "edit", "args": {"action": "send_reply", "args": {"ticket_id": ticket_id, "reply": text}}}
    if command == "respond":
        return {"type": "response", "args": mask_pii(text)}
    return {"type": ANSWER_TYPE[command], "args": None}


def busy(ticket_id: str) -> Refused:
    return Refused(f"{ticket_id} 正在被处理(另一个收件箱命令或 worker),稍后再 list 看看")


def taken_meanwhile(ticket_id: str) -> Refused:
    return Refused(f"{ticket_id} 刚被另一个收件箱命令拿走处理了,稍后再 list 看看")


def not_in_inbox(ticket_id: str, waiting: list[dict]) -> Refused:
    """这张工单没有等人处理的事件:说清楚它在哪(正在处理、死信),或者工单号是不是写错了大小写。"""
    if any(e["ticket_id"] == ticket_id for e in store.events_by_status("processing")):
        return busy(ticket_id)
    if dead := [e for e in store.events_by_status("dead") if e["ticket_id"] == ticket_id]:
        ids = [e["event_id"] for e in dead]
        why = (dead[-1]["last_error"] or "没有记下原因").splitlines()[0]
        return Refused(f"{ticket_id} 的事件 {' '.join(ids)} 在死信队列里({why}),没有进收件箱;"
                       f"查清原因后运行 {store.requeue_dead_command(ids)} 放回队列")
    hint = next((f";是不是 {e['ticket_id']}?" for e in waiting if loose(e["ticket_id"]) == loose(ticket_id)), "")
    return Refused(f"{ticket_id} 不在收件箱里(已经处理过,或者还没轮到 worker){hint}")


def typed_id(arg: str) -> str:
    """命令行上敲的(多半是复制来的)工单号:去掉两头的空白和夹在里面看不见的格式字符(零宽空格、BOM、软连字符……,
    Unicode 的 Cf 类)。从聊天软件、网页、存成带 BOM 的文件里复制来的工单号常带着它们:原来 list 刚列出 T1041,
    accept 却说「T1041 不在收件箱里」,看上去一模一样。工单号本身不会有这些字符(webhook 只收字母数字 _ -)。"""
    return "".join(c for c in arg if unicodedata.category(c) != "Cf").strip()


def loose(ticket_id: str) -> str:
    """比「是不是写错了」时用:不分大小写、不分全角半角(中文输入法全角模式下敲的 Ｔ１０４１ 也认得出是 T1041)。"""
    return unicodedata.normalize("NFKC", ticket_id).casefold()


REDRAFTS_OFF = "起草时 MAX_REDRAFTS=0,没有按意见重写这一项"


def refusal(command: str, ticket_id: str, snap) -> Refused | None:
    """这条待办(snap 停在它的 interrupt 上)现在不接受 command 时的拒绝:通知类待办、重写到了上限;接受时是 None。"""
    item = snap.interrupts[0].value
    kinds = allowed(item)
    if ANSWER_TYPE[command] in kinds:
        return None
    ok = " / ".join(COMMAND_OF[k] for k in kinds)
    if item["action_request"]["action"] == "notify_supervisor":
        return Refused(f"{ticket_id} 是通知类待办,Agent 没有起草回复,不能 {command};只能 {ok}(看过即可)")
    if not (rounds := len(snap.values.get("feedback", []))):  # 原来说「已经按意见重写了 0 次,到上限了」
        return Refused(f"{ticket_id} {REDRAFTS_OFF},不能 respond;现在可以:{ok}")
    return Refused(f"{ticket_id} 已经按意见重写了 {rounds} 次,到上限了,不能再 respond;现在可以:{ok}")


def act(graph, command: str, ticket_id: str, text: str) -> None:
    waiting = store.events_by_status("waiting_human")
    ev = next((e for e in waiting if e["ticket_id"] == ticket_id), None)
    if ev is None:
        raise not_in_inbox(ticket_id, waiting)
    cfg = thread_of(ticket_id, ev["event_id"])
    snap = graph.get_state(cfg)
    if not snap.interrupts:  # 上面查完收件箱之后,另一个收件箱命令刚把它处理完(原来是 IndexError 的 traceback)
        raise taken_meanwhile(ticket_id)
    if refused := refusal(command, ticket_id, snap):
        raise refused
    if not store.take_for_review(ev["event_id"]):
        if any(e["event_id"] == ev["event_id"] for e in store.events_by_status("waiting_human")):
            raise busy(ticket_id)  # 待办还在,是同一张工单的另一个事件在 worker 手里
        raise taken_meanwhile(ticket_id)
    # 拿到手之后再核对一遍:上面查过之后、拿到之前,别人可能刚 respond 过 —— 草稿换了,重写次数也可能刚好到了上限。
    # 这之后别人改不了这条待办。原来只有 accept 再核对:到上限时输掉的 respond 被图拒了,却说「已按意见重写」,意见没了
    try:
        snap = graph.get_state(cfg)
        refused = refusal(command, ticket_id, snap)
        # 没 list 过(seen 是 None)就照课文发;通知类待办没有草稿
        draft = snap.interrupts[0].value["action_request"]["args"].get("reply") if command == "accept" else None
        seen = None if draft is None else store.seen_draft(ticket_id, viewer())
    except KeyboardInterrupt:  # 拿走了、还没开始处理:原样放回收件箱(原来是 traceback,事件留在 processing)
        store.set_status(ev["event_id"], "waiting_human", owner=store.inbox_owner())
        raise Refused(f"{ticket_id} 这次被中断(Ctrl-C),仍在收件箱里") from None
    if refused is None and seen is not None and seen != fingerprint(draft):
        refused = Refused(f"{ticket_id} 的草稿在你上次看过之后被改写了(有人 respond 过),这次没有发;"
                          "先 uv run python inbox.py list 看看新草稿,再决定")
    if refused:
        store.set_status(ev["event_id"], "waiting_human", owner=store.inbox_owner())
        raise refused
    try:
        # sync:每个节点的结果写下了才跑下一个节点。默认的 async 在后台写、同时就往下跑:review 的结果(人的决定)
        # 还没写下,send 可能已经写了发件箱;这时被杀,checkpoint 里 review 还停在 interrupt,下一次 list 会把已经
        # 发出的工单再放回收件箱问人(tests/test_inbox.py 碰到过)。收件箱是人在敲命令,多等几毫秒无所谓。
        result = graph.invoke(Command(resume=answer_for(command, ticket_id, text)), cfg, durability="sync")
    except store.unavailable_errors():
        raise  # 数据库用不了:这时也改不了事件状态,交给 main() 说一行;下次运行 tidy() 按 checkpoint 更正
    except (Exception, KeyboardInterrupt) as e:
        # 出错,或者人等不及按了 Ctrl-C(respond 正在等模型重写):按 checkpoint 把事件放到该在的地方再退出。
        # 原来 Ctrl-C 带着 traceback 退出,事件留在 processing,等 worker 当成崩溃放回
        snap = graph.get_state(cfg)
        status = status_of(snap)
        interrupted = isinstance(e, KeyboardInterrupt)
        # 重写时模型说请求不对(400/413……):交回 worker 也只是原样再错一次就进死信,还让人等它「自动再试」。直接进死信,
        # 说清修好后怎么放回来;意见已经记在 checkpoint 里,--requeue-dead 之后从 draft 带着意见接着跑
        dead = not interrupted and status == "pending" and is_permanent(e)
        requeue = store.requeue_dead_command([ev["event_id"]]) if dead else None
        owner, what = store.inbox_owner(), "被中断(Ctrl-C)" if interrupted else describe(e, requeue=requeue)
        if dead:
            store.set_status(ev["event_id"], "dead", what, owner=owner)
        elif status == "pending":
            store.hand_to_worker(ev["event_id"], owner, what)
        elif status == "waiting_human":
            store.set_status(ev["event_id"], status, what, owner=owner)
        else:
            store.set_status(ev["event_id"], status, owner=owner)
            # 节点都走完了(回复已进发件箱 / ignore 已记下),报错的是途中某一次 checkpoint 写入:照实说结果
            print(f"(途中出过错:{what};这张工单已经处理完了)", file=sys.stderr)
            print(ticket_id, "→", snap.values["outcome"])
            return
        where = "仍在收件箱里" if status == "waiting_human" else "进了死信" if dead else "已交回 worker 续跑"
        raise Refused(f"{ticket_id} {f'这次{what}' if interrupted else f'处理失败({what})'},{where}") from e
    if "__interrupt__" in result:
        store.set_status(ev["event_id"], "waiting_human", owner=store.inbox_owner())
        item = result["__interrupt__"][0].value
        rounds = len(snap.values.get("feedback", []))
        if command != "respond" or len(graph.get_state(cfg).values.get("feedback", [])) == rounds:
            # 上面核对过了,按说不会到这里:图没有接受这个回答(review 又问了一次),待办原样留着,可以再处理
            raise Refused(f"{ticket_id} 这次没有处理成:{item['description']};仍在收件箱里")
        # 新草稿有好几行(真模型常这样写)时,后面几行和 list 里一样缩进,不和下一行输出混在一起
        first, *rest = item["action_request"]["args"]["reply"].splitlines() or [""]
        print("已按意见重写,新草稿:", "\n".join([visible(first), *(indented("", line) for line in rest)]))
        sys.stdout.flush()  # 真的写出去了才算看过(见 show_list)
        remember({ticket_id: item["action_request"]["args"]["reply"]})
        return
    store.set_status(ev["event_id"], finished_status(result["outcome"]), owner=store.inbox_owner())
    print(ticket_id, "→", result["outcome"])


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
    args 里已经去掉了 --;options_end 是它原来的位置(没有 -- 时是 len(args)),之后的不当选项看。"""
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
    if len(handed.strip()) > (limit := max_text_chars()):
        after_masking = "(手机号、卡号之类打码之后)" if handed != args[2] else ""
        return (f"{args[0]} 的文字有 {len(handed.strip())} 个字{after_masking},最多 {limit} 个(INBOX_MAX_TEXT_CHARS):"
                "多半是多粘贴了一段;什么都没有改")
    if command in NEEDS_TEXT and (bad := next((c for c in args[2] if CONTROL.fullmatch(c)), None)):
        return (f"{args[0]} 的文字里有控制字符 \\x{ord(bad):02x}(多半是复制粘贴或按错键带进来的),"
                "客户那边看到的会是乱码;删掉再试")
    return None


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # 从命令行运行:导入做完了,Ctrl-C 换回 KeyboardInterrupt(act() 按 checkpoint 收拾,见 config.run)
        config.interrupts_as_usual()
    args = sys.argv[1:] if argv is None else argv
    if not args:
        return usage("缺少子命令")
    # 「--」之后的都是工单号和文字(Unix 命令的老规矩):以 - 开头的工单号(-A7)、以 -- 开头的回复也能处理
    options_end = args.index(END_OF_OPTIONS, 1) if END_OF_OPTIONS in args[1:] else len(args)
    if "-h" in args[:options_end] or "--help" in args[:options_end]:  # 在 -- 之前哪个位置都算:不会把 --help 当成工单号或回复发出去
        print(f"用法:{USAGE}")
        return 0
    if not all(utf8(arg) for arg in args):
        return usage("参数里有不是 UTF-8 的字节:终端的编码多半不是 UTF-8(比如 GBK),什么都没有改;把终端改成 UTF-8 再试")
    command = ALIASES.get(args[0], args[0])
    if command not in ("list", "restart") and command not in ANSWER_TYPE:
        return usage(f"不认识的子命令:{args[0]}")
    args = args[:options_end] + args[options_end + 1:]
    if problem := bad_argument(command, args, options_end):
        return usage(problem)

    check_settings()  # 配置错了现在就退出:待办还没被拿走,不会卡在 processing
    try:
        store.init()
        with opened_graph(durable=True) as graph:  # 人的决定等落盘之后才发信
            missing = tidy(graph, say_missing=command != "restart")
            if command == "list":
                show_list(graph, missing)
                if missing:
                    return 1  # 有待办没列出来:脚本里分得清
            elif command == "restart":
                restart(list(dict.fromkeys(typed_id(a) for a in args[1:])), missing)
            elif (ticket_id := typed_id(args[1])) in missing:
                raise Refused(f"{ticket_id} 在 checkpoint 库里找不到,没有处理(见上一行)")
            else:
                act(graph, command, ticket_id, args[2].strip() if command in NEEDS_TEXT else "")
    except Refused as e:
        print(visible(str(e)), file=sys.stderr)
        return 1
    except store.unavailable_errors() as e:  # 数据库重启、连接被掐断、库被锁太久
        print(f"{store.unavailable(e)},这次没有做完;稍后再试,做到一半的下次运行 inbox.py 时会按 checkpoint 更正",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    config.run(main)  # list | head 提前关掉输出:退出码 141;处理待办之前按了 Ctrl-C:一行、退出码 130
