"""worker.py 和 inbox.py 跑 agent.py 的图时要的几样:跑之前把图用到的设置都查一遍(check_settings),
图走完或停在收件箱时这个事件该记成什么状态(finished_status、interrupted_status)。课文的 worker 只看一个事件;
这里同一张工单可能有好几个事件(上游换了 event_id 又通知一次),收件箱里只留一条待办,所以这些判断放在一处,两边共用。"""
import agent_trace
import config
import store_events
from llm import llm_settings


FINISHED = ("sent", "already_sent", "ignored")


def finished_status(outcome: str) -> str:
    """图走完了(outcome 在 FINISHED 里),事件该是什么状态:人选了不回是 ignored,发出了(或早就发过)是 done。"""
    return "ignored" if outcome == "ignored" else "done"


def interrupted_status(ticket_id: str, event_id: str) -> str:
    """thread 停在收件箱(interrupt)时,这个事件该是什么状态:这张工单已经有别的事件在收件箱里,它就是 done
    (一张工单一个 thread,收件箱里只占一条待办;它是上游换了个 event_id 又通知的一次);没有就由它接手等人。"""
    waiting = store_events.events_by_status("waiting_human")
    return "done" if any(e["ticket_id"] == ticket_id and e["event_id"] != event_id for e in waiting) else "waiting_human"


def check_settings() -> None:
    """跑图要用的设置都读一遍,不对就以 SystemExit 退出。worker 领事件之前、收件箱拿走待办之前调用,
    免得节点跑到一半才发现、事件白用一次尝试。"""
    for name in ("MAX_REDRAFTS", "MAX_TICKET_CHARS", "INBOX_MAX_TEXT_CHARS", "LLM_DEADLINE_S"):
        config.value(name)
    llm_settings()
    agent_trace.check_settings()
