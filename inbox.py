"""命令行收件箱:列出等人处理的工单,对其中一条给出处理结果。

运行:
    uv run python inbox.py list
    uv run python inbox.py accept  T1012                      # 原样发出(别名 approve)
    uv run python inbox.py edit    T1012 "改过的回复全文"        # 改完再发
    uv run python inbox.py respond T1012 "语气再软一点,先道歉"   # 提意见,让 Agent 重写(会再调一次模型)
    uv run python inbox.py ignore  T1012                      # 不回(别名 reject)
    uv run python inbox.py restart T1012 [T1041 ...]          # checkpoint 库丢了的待办:交回 worker 从头起草(会再调一次模型)
    uv run python inbox.py show    T1041 [--json]             # 一张工单的经过:事件、模型调用、草稿和意见、决定、发件箱

你会看到:list 每条待办两行(工单号 + [类别] 概括,下一行是草稿);没有待办时一行「收件箱是空的」。处理后一行结果,
例如 T1012 → sent;respond 之后是「已按意见重写,新草稿: …」,待办留在收件箱里。做不了时说明原因,退出码 1;
命令写错时打印用法,退出码 2,什么都不动。

这个文件按课文的顺序:waiting()、main()、list、四种回答、resume()(graph.invoke(Command(resume=…)) 就在这里),
然后是练习 4、练习 5。课文之外的部分在旁边:inbox_take.py(拿到待办、两个命令抢同一条、出错时放回)、
inbox_repair.py(上次做到一半的残局、restart)、inbox_seen.py(几个人共用时只发看过的那一版)、
inbox_args.py(命令行参数检查)、inbox_show.py(终端上安全地显示)、inbox_story.py(show:一张工单的经过)、
inbox_question.py(提问类待办)。
"""
import sys

import config  # 只用标准库,导入很快:先装好 Ctrl-C 的处理,再做下面慢的导入

if __name__ == "__main__":
    config.quit_quietly_while_importing(f"{config.INTERRUPTED}:什么都还没动")

from langgraph.types import Command  # noqa: E402

import agent_trace  # noqa: E402
import inbox_args  # noqa: E402
import inbox_question  # noqa: E402
import inbox_repair  # noqa: E402
import inbox_seen  # noqa: E402
import inbox_show  # noqa: E402
import inbox_story  # noqa: E402
import inbox_take  # noqa: E402
import store  # noqa: E402
import store_errors  # noqa: E402
import store_events  # noqa: E402
import worker_owner  # noqa: E402
from agent import opened_graph, thread_of  # noqa: E402
from agent_review import allowed  # noqa: E402
from agent_run import check_settings, finished_status  # noqa: E402
from inbox_take import Refused, Result  # noqa: E402
from llm_pii import mask_pii  # noqa: E402


USAGE = __doc__.split("运行:")[1].split("你会看到")[0].rstrip()
ALIASES = {"approve": "accept", "reject": "ignore"}  # LangChain 1.x HumanInTheLoopMiddleware 的叫法
ANSWER_TYPE = {"accept": "accept", "edit": "edit", "respond": "response", "ignore": "ignore"}
COMMAND_OF = {v: k for k, v in ANSWER_TYPE.items()}


def waiting() -> list[dict]:
    """收件箱里的事件(status = 'waiting_human'),按到达的先后;每个带 event_id、ticket_id 等列。"""
    return store_events.events_by_status("waiting_human")


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # 从命令行运行:导入做完了,Ctrl-C 换回 KeyboardInterrupt(resume() 按 checkpoint 收拾,见 config.run)
        config.interrupts_as_usual()
    args = sys.argv[1:] if argv is None else argv
    if not args:
        return usage("缺少子命令")
    # 「--」之后的都是工单号和文字(Unix 命令的老规矩):以 - 开头的工单号(-A7)、以 -- 开头的回复也能处理
    options_end = args.index(inbox_args.END_OF_OPTIONS, 1) if inbox_args.END_OF_OPTIONS in args[1:] else len(args)
    if "-h" in args[:options_end] or "--help" in args[:options_end]:  # 在 -- 之前哪个位置都算:不会把 --help 当成工单号或回复发出去
        print(f"用法:{USAGE}")
        return 0
    if not all(inbox_args.utf8(arg) for arg in args):
        return usage("参数里有不是 UTF-8 的字节:终端的编码多半不是 UTF-8(比如 GBK),什么都没有改;把终端改成 UTF-8 再试")
    command = ALIASES.get(args[0], args[0])
    if command not in ("list", "restart", "show") and command not in ANSWER_TYPE:
        return usage(f"不认识的子命令:{args[0]}")
    if as_json := command == "show" and "--json" in args[1:options_end]:  # show 的 --json:整份经过印成一个 JSON
        i = args.index("--json")
        args, options_end = args[:i] + args[i + 1:], options_end - 1
    args = args[:options_end] + args[options_end + 1:]
    if problem := inbox_args.bad_argument(command, args, options_end):
        return usage(problem)

    check_settings()  # 配置错了现在就退出:待办还没被拿走,不会卡在 processing
    try:
        store.init()
        with opened_graph(durable=True) as graph:  # 人的决定等落盘之后才发信
            missing = inbox_repair.tidy(graph, say_missing=command != "restart")
            if command == "list":
                show_list(graph, missing)
                if missing:
                    return 1  # 有待办没列出来:脚本里分得清
            elif command == "restart":
                inbox_repair.restart(list(dict.fromkeys(inbox_args.typed_id(a) for a in args[1:])), missing)
            elif command == "show":
                inbox_story.show(graph, inbox_args.typed_id(args[1]), as_json)
            elif (ticket_id := inbox_args.typed_id(args[1])) in missing:
                raise Refused(f"{ticket_id} 在 checkpoint 库里找不到,没有处理(见上一行)")
            else:
                text = args[2].strip() if command in inbox_args.NEEDS_TEXT else ""
                show_result(resume(graph, ticket_id, answer_for(command, ticket_id, text)))
    except Refused as e:
        print(inbox_show.visible(str(e)), file=sys.stderr)
        return 1
    except store_errors.unavailable_errors() as e:  # 数据库重启、连接被掐断、库被锁太久
        print(f"{store_errors.unavailable(e)},这次没有做完;稍后再试,做到一半的下次运行 inbox.py 时会按 checkpoint 更正",
              file=sys.stderr)
        return 1
    return 0


def usage(problem: str) -> int:
    print(f"{inbox_show.visible(problem)}\n用法:{USAGE}", file=sys.stderr)
    return 2


def show_list(graph, missing: set[str]) -> None:
    listed = [e for e in waiting() if e["ticket_id"] not in missing]
    # 上面查完收件箱之后,另一个收件箱命令可能刚把其中一条处理完:checkpoint 里已经没有 interrupt,不列它
    snaps = [(ev, snap) for ev in listed if (snap := graph.get_state(thread_of(ev["ticket_id"]))).interrupts]
    if not snaps and not missing:
        print("收件箱是空的")
    shown = {}
    for ev, snap in snaps:
        item = snap.interrupts[0].value
        args = item["action_request"]["args"]
        print(inbox_show.visible(f"{ev['ticket_id']}  {item['description']}"))
        if item["action_request"]["action"] == "notify_supervisor":
            print(inbox_show.indented("工单:", args["ticket_text"]))
            print("        只能 ignore(看过即可)")
            continue
        if inbox_question.is_question_item(item):  # 提问:候选各一行,回答用 respond
            print("\n".join(inbox_question.list_lines(ev["ticket_id"], item, len(snap.values.get("feedback", [])))))
            continue
        print(inbox_show.indented("草稿:", args["reply"]))
        shown[ev["ticket_id"]] = args["reply"]
        if not item["config"]["allow_respond"]:
            rounds = len(snap.values.get("feedback", []))
            why = f"已按意见重写 {rounds} 次,到上限了" if rounds else REDRAFTS_OFF
            print(f"        {why}:只能 {' / '.join(COMMAND_OF[k] for k in allowed(item))}")
    # 先让人看到;记下看到了哪一版可能要等一会儿锁。输出被提前关掉(list | head)时这里抛 BrokenPipeError,
    # 就不记了:没送到人眼前的草稿不能算看过。写进了管道、对面读没读完,这里不知道(head 一次读走
    # 一整块再丢掉后面的,管道里也看不出剩下多少):这时整个列表都算看过
    sys.stdout.flush()
    inbox_seen.remember(shown)


def answer_for(command: str, ticket_id: str, text: str) -> dict:
    """HumanResponse。respond 的意见在这里就打码:交给 LangGraph 的回答会原样存进 checkpoint(writes 里的 __resume__),
    review 节点里再打码就晚了。edit 的回复是要发给客户的原文,不动。"""
    if command == "edit":
        return {"type": "edit", "args": {"action": "send_reply", "args": {"ticket_id": ticket_id, "reply": text}}}
    if command == "respond":
        return {"type": "response", "args": mask_pii(text)}
    return {"type": ANSWER_TYPE[command], "args": None}


def resume(graph, ticket_id: str, answer: dict, reviewer: str | None = None, shown: str | None = None) -> Result:
    """收件箱处理一条待办的唯一路径(命令行和网页收件箱 inbox_web.py 都调它):拿到这条待办,用人的回答(HumanResponse)
    续跑图,按图的结果改事件状态。reviewer 是谁在回答(写进 review_log),不给就是 INBOX_USER 或「登录名@主机名」;
    shown 是网页上那一版待办的指纹(不是这一版就拒绝,见 inbox_take.take)。做不了时抛 Refused(原因说给人听);这里不打印。"""
    command = COMMAND_OF[answer["type"]]
    in_inbox = waiting()
    ev = next((e for e in in_inbox if e["ticket_id"] == ticket_id), None)
    if ev is None:
        raise inbox_take.not_in_inbox(ticket_id, in_inbox)
    who = reviewer or inbox_seen.viewer()
    cfg = agent_trace.traced(thread_of(ticket_id, ev["event_id"]), reviewer=who)
    cfg["configurable"]["reviewer"] = who
    snap = inbox_take.take(graph, ev, cfg, command, lambda snap: refusal(command, ticket_id, snap), shown)
    try:
        # sync:每个节点的结果写下了才跑下一个节点。默认的 async 在后台写、同时就往下跑:review 的结果(人的决定)
        # 还没写下,send 可能已经写了发件箱;这时被杀,checkpoint 里 review 还停在 interrupt,下一次 list 会把已经
        # 发出的工单再放回收件箱问人(tests/test_inbox.py 碰到过)。收件箱是人在敲命令,多等几毫秒无所谓。
        result = graph.invoke(Command(resume=answer), cfg, durability="sync")
    except store_errors.unavailable_errors():
        raise  # 数据库用不了:这时也改不了事件状态,交给 main() 说一行;下次运行 tidy() 按 checkpoint 更正
    except (Exception, KeyboardInterrupt) as e:
        return inbox_take.after_failure(graph, ev, cfg, e)
    if "__interrupt__" in result:
        store.set_status(ev["event_id"], "waiting_human", owner=worker_owner.inbox_owner())
        item = result["__interrupt__"][0].value
        rounds = len(snap.values.get("feedback", []))
        if command != "respond" or len(graph.get_state(cfg).values.get("feedback", [])) == rounds:
            # 拿到手后核对过了,按说不会到这里:图没有接受这个回答(review 又问了一次),待办原样留着,可以再处理
            raise Refused(f"{ticket_id} 这次没有处理成:{item['description']};仍在收件箱里")
        return Result(ticket_id, new_draft=inbox_question.new_text(item),
                      answered=inbox_question.is_question_item(snap.interrupts[0].value))
    store.set_status(ev["event_id"], finished_status(result["outcome"]), owner=worker_owner.inbox_owner())
    return Result(ticket_id, outcome=result["outcome"])


def show_result(result: Result) -> None:
    if result.note:
        print(f"(途中出过错:{result.note};这张工单已经处理完了)", file=sys.stderr)
    if result.new_draft is None:
        print(result.ticket_id, "→", result.outcome)
        return
    # 新草稿有好几行(真模型常这样写)时,后面几行和 list 里一样缩进,不和下一行输出混在一起
    first, *rest = result.new_draft.splitlines() or [""]
    print("已按回答起草,新草稿:" if result.answered else "已按意见重写,新草稿:", "\n".join([inbox_show.visible(first), *(inbox_show.indented("", line) for line in rest)]))
    sys.stdout.flush()  # 真的写出去了才算看过(见 show_list)
    inbox_seen.remember({result.ticket_id: result.new_draft})


# ---- 练习 4:review_log ----
# 原稿、终稿、处理类型和 feedback 由 agent.py 的 send 节点写进 review_log。收件箱只把人的回答原样交给图:
# edit 的全文成了终稿,respond 的意见(answer_for 先打码)进 feedback。


# ---- 练习 5:通知类待办只能 ignore ----
# 通知类待办(notify_supervisor)的 config 只允许 ignore:accept / edit 在拿走之前就被拒绝,说清楚它是通知。
# 同一个函数也拒绝 MAX_REDRAFTS 用完之后的 respond,和提问类待办的 accept / edit(它也没有草稿,见 inbox_question.py)。
REDRAFTS_OFF = "起草时 MAX_REDRAFTS=0,没有按意见重写这一项"


def refusal(command: str, ticket_id: str, snap) -> Refused | None:
    """这条待办(snap 停在它的 interrupt 上)现在不接受 command 时的拒绝:通知类待办、提问类待办、重写到了上限;接受时是 None。"""
    item = snap.interrupts[0].value
    kinds = allowed(item)
    if ANSWER_TYPE[command] in kinds:
        return None
    ok = " / ".join(COMMAND_OF[k] for k in kinds)
    if item["action_request"]["action"] == "notify_supervisor":
        return Refused(f"{ticket_id} 是通知类待办,Agent 没有起草回复,不能 {command};只能 {ok}(看过即可)")
    if inbox_question.is_question_item(item) and command != "respond":  # 提问类待办:没有草稿可发
        return inbox_question.refusal(command, ticket_id, ok)
    if not (rounds := len(snap.values.get("feedback", []))):  # MAX_REDRAFTS=0:一次都没重写过
        return Refused(f"{ticket_id} {REDRAFTS_OFF},不能 respond;现在可以:{ok}")
    return Refused(f"{ticket_id} 已经按意见重写了 {rounds} 次,到上限了,不能再 respond;现在可以:{ok}")


if __name__ == "__main__":
    config.run(main)  # list | head 提前关掉输出:退出码 141;处理待办之前按了 Ctrl-C:一行、退出码 130
