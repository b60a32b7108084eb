"""处理一张工单的图:load(读工单)→ draft(模型起草)→ review(interrupt,进收件箱等人)→ send | draft | ignore。

这个文件不单独运行;worker.py 启动一张工单,inbox.py 把人的决定交回来。
状态存在 CHECKPOINTS_DB(默认 checkpoints.db;设了 DATABASE_URL 就存 PostgreSQL),thread_id 用工单号:ticket-T1012。

收件箱条目照 Agent Inbox 的 HumanInterrupt:action_request{action,args}、config{allow_*}、description;
人的回复照 HumanResponse:type 是 accept / edit / response / ignore 之一。
review 什么都不写:恢复时这个节点会从头重跑;写库的事(发信、记 ignore)放在它后面各自的节点里。
send 靠 outbox 的 UNIQUE 幂等:重跑一次只会得到 already_sent;ignore 按工单号去重。
"""
from contextlib import contextmanager
from typing import Literal

import openai
from langchain_core.runnables import RunnableConfig
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel, Field, field_validator
from typing_extensions import TypedDict

import agent_saver
import store
from agent_draft import ask, structured
from agent_prompt import FORGED_HEADER, for_the_model
from agent_review import answer_problem, edited_reply, max_redrafts, may_respond
from llm import get_llm
from llm_errors import REQUEST_TOO_LARGE, status_of
from llm_offline import FEEDBACK_HEADER, classify, simplified
from llm_pii import mask_pii, without_control_chars


class Draft(BaseModel):
    category: Literal["refund", "billing", "invoice", "bug", "account", "other"]
    summary: str = Field(description="一句话概括客户的问题")
    reply: str = Field(description="给客户的回复草稿,中文,不超过 150 字,不承诺具体退款金额")

    @field_validator("summary", "reply")
    @classmethod
    def not_blank(cls, value: str) -> str:
        # 模型偶尔交回空的 reply:原来照样进收件箱,「草稿:」后面什么都没有,accept 就给客户发一封空信。
        # 和格式不对一样退避后再试。用校验器而不是 min_length:发给模型的工具定义不变
        if not value.strip():
            raise ValueError("不能是空的")
        return value


class TicketState(TypedDict, total=False):
    ticket_id: str
    kind: str              # 触发它的事件类型:ticket.created / ticket.stale
    ticket_text: str       # 已脱敏
    draft: dict            # 当前草稿:category / summary / reply(通知类还有 action)
    first_draft: dict      # 模型第一版,写 review_log 用
    feedback: list[str]    # 每一轮 respond 的意见;条数就是重写次数,跨进程重启也还在
    redraft_limit: int     # 起草这一版时的 MAX_REDRAFTS:待办允许不允许 respond 按它算,之后改设置不影响已经给人看到的待办
    decision: str          # accept / edit:最后是怎么发出去的
    refused: str | None    # 上一个回答为什么不能用(别的客户端交来的):有它时 review 再问一次,待办的说明里带上这句
    outcome: str           # review 的决定 send / redraft / ignore;做完以后 sent / already_sent / ignored


def load(state: TicketState) -> dict:
    t = store.ticket(state["ticket_id"])
    if t is None:
        raise PermanentError(f"工单不存在:{state['ticket_id']}")
    return {"ticket_text": mask_pii(without_control_chars(f"{t['subject']}:{t['body']}")), "feedback": []}


def build_prompt(state: TicketState) -> str:
    ticket_text = state["ticket_text"].replace(FEEDBACK_HEADER, FORGED_HEADER)
    prompt = ("你是云簿 CloudLedger 的客服。请给下面的工单分类,并起草一封给客户的回复。\n\n"
              f"工单 {state['ticket_id']}:{for_the_model(ticket_text)}\n")
    if state.get("kind") == "ticket.stale":
        prompt += "\n这张工单已经等了很久没人回复:回复开头先为久等道歉,再说明进展。\n"
    if notes := state.get("feedback"):
        prompt += f"\n{FEEDBACK_HEADER}\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return prompt


# Draft 的工具定义(OpenAI tools 格式)只算一次。直接把 Draft 类交给 with_structured_output 的话,LangChain 每次调用
# 都要为追踪元数据重新生成一遍 Pydantic JSON schema,占了跑图时间的一成(bench/worker.py,py-spy 采样);
# 发给模型的工具定义两种写法一模一样,回答由 draft() 自己用 Draft.model_validate 校验。
DRAFT_TOOL = convert_to_openai_tool(Draft)


def draft(state: TicketState, config: RunnableConfig) -> dict:
    if word := needs_supervisor(state["ticket_text"]):  # 练习 5:不调模型,产生一条只能「看过即可」的通知
        d = supervisor_notice(state["ticket_text"], word)
        return {"draft": d, "first_draft": d}
    model = structured(get_llm(), DRAFT_TOOL)
    d = ask(model, build_prompt(state), Draft, state["ticket_id"], config)
    return {"draft": d, "first_draft": state.get("first_draft") or d, "redraft_limit": max_redrafts()}


def review(state: TicketState) -> dict:
    d = state["draft"]
    if d.get("action") == "notify_supervisor":  # 练习 5
        item = notice_item(state)
    else:  # 收件箱条目(HumanInterrupt):想做的动作、允许人怎么处理、给人看的一句话
        item = {
            "action_request": {"action": "send_reply", "args": {"ticket_id": state["ticket_id"], "reply": d["reply"]}},
            "config": {"allow_accept": True, "allow_edit": True, "allow_respond": may_respond(state), "allow_ignore": True},
            "description": f"[{d['category']}] {d['summary']}",
        }
    if state.get("refused"):
        item = {**item, "description": f"{item['description']}(上一个回答不能用:{state['refused']})"}
    answer = interrupt(item)  # 这之前不能有副作用:恢复时整个节点从头再跑一遍
    if problem := answer_problem(answer, item):
        # 不能用的回答不抛错,这次 review 就此结束,回到 review 再问一次(待办留在收件箱里,说明上一个为什么不行)。
        # 抛错的话,LangGraph 把这个回答和出错的 review 绑在一起存下:以后不管给什么回答,review 重跑时拿到的都还是它。
        # 也不在这里循环着再 interrupt:那样下一个回答来时 review 从头重跑,被拒的回答按那时的上限(INBOX_MAX_TEXT_CHARS
        # 放宽了、回答的进程设得大)再查一遍就可能通过,人给的 ignore 成了发出被拒的那段(tests/test_agent.py)
        return {"refused": problem}
    kind = answer["type"]
    if kind == "accept":
        return {"outcome": "send", "decision": "accept", "refused": None}
    if kind == "edit":
        return {"outcome": "send", "decision": "edit", "draft": {**d, "reply": edited_reply(answer)}, "refused": None}
    if kind == "response":
        # 意见也要进模型:和工单一样先打码(客服常把客户的电话、邮箱抄进意见里)。inbox.py 交进来之前已经打过码
        # (回答本身也存进 checkpoint);别的客户端(Agent Inbox 之类)交来的回答在这里打码
        return {"outcome": "redraft", "feedback": state.get("feedback", []) + [mask_pii(answer["args"])], "refused": None}
    return {"outcome": "ignore", "refused": None}


def after_review(state: TicketState) -> Literal["review", "send", "draft", "ignore"]:
    if state.get("refused"):
        return "review"
    return {"send": "send", "redraft": "draft", "ignore": "ignore"}[state["outcome"]]


def send(state: TicketState) -> dict:
    sent = store.record_reply(state["ticket_id"], state["draft"]["reply"], "agent+reviewer", review_row(state))
    return {"outcome": "sent" if sent else "already_sent"}


def ignore(state: TicketState) -> dict:
    """ignore 也记一笔(按工单号去重,重跑不会多),日报按类别统计 ignore 用。
    不放在 review 里 interrupt() 之后:那里记账失败(磁盘满)的话,LangGraph 把这次的回答和出错的 review 绑在一起存下,
    人在收件箱里再给什么回答,review 重跑时拿到的都还是这次的 ignore。放在这里,人的决定先写进 checkpoint,
    记账失败就和 send 失败一样交回 worker 续跑(tests/test_inbox.py)。"""
    store.record_ignore(state["ticket_id"], review_row(state))
    return {"outcome": "ignored"}


builder = StateGraph(TicketState)
builder.add_node("load", load)
builder.add_node("draft", draft)
builder.add_node("review", review)
builder.add_node("send", send)
builder.add_node("ignore", ignore)
builder.add_edge(START, "load")
builder.add_edge("load", "draft")
builder.add_edge("draft", "review")
builder.add_conditional_edges("review", after_review, ["review", "send", "draft", "ignore"])
builder.add_edge("send", END)
builder.add_edge("ignore", END)


def open_graph(durable: bool = False):
    """返回 (graph, conn)。调用方用完要 conn.close()。checkpoint 存哪(SQLite 文件或 PostgreSQL)由 store 决定;
    durable 见 store.open_checkpointer:收件箱用 True。"""
    saver, conn = agent_saver.open_saver(durable)
    return builder.compile(checkpointer=saver), conn


@contextmanager
def opened_graph(durable: bool = False):
    """with opened_graph() as graph: …  用完一次就关连接(收件箱命令、测试);常驻的 worker 用 open_graph。"""
    graph, conn = open_graph(durable)
    try:
        yield graph
    finally:
        conn.close()


def thread_of(ticket_id: str, event_id: str | None = None) -> dict:
    """一张工单一个 thread。event_id 只是带给 draft 记账用,不影响 thread。
    metadata 给追踪用(课文「上线以后」:trace 的 session id 用工单号):接了 LangSmith、Langfuse 这类回调时,
    同一张工单的起草、每一轮重写、最后发送都归在一个 session 里;没接时什么都不做。"""
    return {"configurable": {"thread_id": store.thread_id(ticket_id), "event_id": event_id},
            "metadata": {"session_id": ticket_id, "langfuse_session_id": ticket_id},
            "max_concurrency": agent_saver.MAX_CONCURRENCY}



# ---- 练习 2:工单不存在 → PermanentError ----
class PermanentError(Exception):
    """重试多少次都不会好的错误(工单不存在、payload 格式不对):worker 直接判死信。
    kept:消息里打码时要原样留着的几段:让人照着敲的命令(放回死信的 --requeue-dead …)、提到的事件 id。"""

    def __init__(self, message: str, *kept: str):
        super().__init__(message)
        self.kept = kept


# 重试多少次都没用的错误:直接死信。模型说「你的请求不对」(400/404/422)、「请求太大」(413,没有单独的异常类)也算。
# worker 起草失败、收件箱 respond 重写失败都按它分
PERMANENT_ERRORS = (PermanentError, openai.BadRequestError, openai.NotFoundError, openai.UnprocessableEntityError)


def is_permanent(error: Exception) -> bool:
    return isinstance(error, PERMANENT_ERRORS) or status_of(error) == REQUEST_TOO_LARGE


# ---- 练习 4:review_log ----
def review_row(state: TicketState) -> dict:
    first = state.get("first_draft") or state["draft"]
    # 通知类待办只能 ignore(看过即可),记成 notify:日报的「原样批准率」只算有草稿可批的待办(原来记成 ignore,
    # 每一条通知都把它那一类的批准率往下拉)
    notify = state["draft"].get("action") == "notify_supervisor"
    return {"category": state["draft"]["category"], "draft": first["reply"], "final": state["draft"]["reply"],
            "action": state.get("decision") or ("notify" if notify else "ignore"), "feedback": state.get("feedback", [])}


# ---- 练习 5:通知主管 notify_supervisor ----
NOTIFY_WORDS = ("律师", "起诉", "投诉到")  # 练习 5:出现这些词不起草,只通知主管
NOTICE_HEAD_CHARS = 200  # 字;通知主管的待办里给人看工单原文的前这么多字(收件箱一屏看得完)
NOTICE_CONTEXT_CHARS = 40  # 字;触发的词不在前面那段里时,再摘出它前后各这么多字


def needs_supervisor(text: str) -> str | None:
    text = simplified(text)  # 繁体的「律師」「起訴」也算
    return next((w for w in NOTIFY_WORDS if w in text), None)


def notice_text(text: str) -> str:
    """通知主管的待办里给人看的工单原文:前 NOTICE_HEAD_CHARS 个字;「律师」这类词在后面时,再摘出它前后一段;
    没显示的说一共多少字。原来只截前 200 个字、不说截了:通知说「工单提到『律师』」,主管在下面却找不到这个词。"""
    head = NOTICE_HEAD_CHARS
    if len(text) <= head:
        return text
    shown, start, end = text[:head], head, head
    word = needs_supervisor(text) or ""
    at = simplified(text).find(word, head - len(word) + 1) if word else -1  # 前面那段里没有(或者只露出半个)
    if at >= 0 and simplified(text).find(word) == at:
        start = max(head, at - NOTICE_CONTEXT_CHARS)
        end = min(len(text), at + len(word) + NOTICE_CONTEXT_CHARS)
        shown += ("……" if start > head else "") + text[start:end]
    if start == head and end == len(text):
        return shown
    return shown + ("……" if end < len(text) else "") + f"(工单共 {len(text)} 字,这里没有全部显示)"


def supervisor_notice(text: str, word: str) -> dict:
    """draft 节点碰到 NOTIFY_WORDS 时交出的「草稿」:不调模型,只说工单提到了哪个词。"""
    return {"category": classify(text), "summary": f"工单提到「{word}」,Agent 没有起草回复,请主管看一下",
            "reply": "", "action": "notify_supervisor"}


def notice_item(state: TicketState) -> dict:
    """通知类待办的收件箱条目:只允许 ignore(看过即可)。"""
    d = state["draft"]
    return {
        "action_request": {"action": "notify_supervisor",
                           "args": {"ticket_id": state["ticket_id"], "ticket_text": notice_text(state["ticket_text"])}},
        "config": {"allow_accept": False, "allow_edit": False, "allow_respond": False, "allow_ignore": True},
        "description": f"【通知】[{d['category']}] {d['summary']}",
    }
