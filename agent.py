"""后台处理一张工单:load(读工单)→ draft(起草)→ review(interrupt,进收件箱等人)→ send / draft / ignore。

worker.py 跑它,inbox.py 把人的决定交回来;thread_id 用工单号(ticket-T1012),checkpoint 存在 SQLite 或 PostgreSQL。
收件箱条目照 Agent Inbox 的 HumanInterrupt(action_request / config / description),人的回答照 HumanResponse
(type 是 accept / edit / response / ignore)。review 在 interrupt() 之前什么都不写:恢复时这个节点从头重跑。
send 靠 outbox 的 UNIQUE 幂等,重跑只得到 already_sent;ignore 按工单号去重。
"""
from contextlib import contextmanager
from typing import Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel, Field, ValidationInfo, field_validator
from typing_extensions import TypedDict

import agent_question
import agent_saver
import config as settings  # 节点的参数 config 是 LangGraph 的 RunnableConfig
import store
import store_biz
import store_move
from agent_draft import ask, structured
from agent_prompt import FORGED_HEADER, for_the_model
from agent_review import answer_problem, edited_reply, may_respond
from llm import get_llm
from llm_offline import FEEDBACK_HEADER, classify, simplified
from llm_pii import mask_pii, without_control_chars


class Draft(BaseModel):
    category: Literal["refund", "billing", "invoice", "bug", "account", "other"]
    summary: str = Field(description="一句话概括客户的问题")
    # 提问(agent_question.py):工单指的东西在数据里定不下来时,不写回复,问人。排在 reply 前面:校验 reply 时看得到它
    question: str | None = Field(None, description="定不下来、要问客服的一句话(这时 reply 留空);能起草回复时不填")
    candidates: list[str] | None = Field(None, description="question 的候选(发票号),让客服从中选")
    reply: str = Field(description="给客户的回复草稿,中文,不超过 150 字,不承诺具体退款金额")

    @field_validator("summary", "reply")
    @classmethod
    def not_blank(cls, value: str, info: ValidationInfo) -> str:
        # 空的 reply 进了收件箱,accept 就给客户发一封空信:和格式不对一样退避后再试;提问时才可以不写回复。
        # 用校验器而不用 min_length:发给模型的工具定义不变
        if not value.strip() and not (info.field_name == "reply" and (info.data.get("question") or "").strip()):
            raise ValueError("不能是空的")
        return value


class TicketState(TypedDict, total=False):
    ticket_id: str
    kind: str              # 触发它的事件类型:ticket.created / ticket.stale
    ticket_text: str       # 已脱敏
    invoices: list[dict]   # 客户名下的发票(提问时的候选),最近的在前
    draft: dict            # 当前草稿:category / summary / reply(通知类还有 action,提问时有 question / candidates)
    first_draft: dict      # 模型第一版(提问不算),写 review_log 用
    feedback: list[str]    # 每一轮 respond 的意见或对提问的回答;条数就是重写次数
    redraft_limit: int     # 起草这一版时的 MAX_REDRAFTS:这条待办还能不能 respond 按它算
    decision: str          # accept / edit:最后是怎么发出去的
    reviewer: str | None   # 谁回答的:收件箱续跑时放在 config 里(configurable.reviewer),写进 review_log
    refused: str | None    # 上一个回答为什么不能用:有它时 review 再问一次,待办的说明里带上这句
    outcome: str           # review 的决定 send / redraft / ignore;做完以后 sent / already_sent / ignored


def load(state: TicketState) -> dict:
    t = store_biz.ticket(state["ticket_id"])
    if t is None:
        raise PermanentError(f"工单不存在:{state['ticket_id']}")
    return {"ticket_text": mask_pii(without_control_chars(f"{t['subject']}:{t['body']}")), "feedback": [],
            "invoices": store_biz.invoices(t["customer_id"])}


def build_prompt(state: TicketState) -> str:
    ticket_text = state["ticket_text"].replace(FEEDBACK_HEADER, FORGED_HEADER)
    prompt = ("你是云簿 CloudLedger 的客服。请给下面的工单分类,并起草一封给客户的回复。\n\n"
              f"工单 {state['ticket_id']}:{for_the_model(ticket_text)}\n")
    prompt += agent_question.prompt_part(state)  # 客户的发票、问过人的问答(提问)
    if state.get("kind") == "ticket.stale":
        prompt += "\n这张工单已经等了很久没人回复:回复开头先为久等道歉,再说明进展。\n"
    if notes := agent_question.remarks(state.get("feedback", [])):
        prompt += f"\n{FEEDBACK_HEADER}\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return prompt


# Draft 的工具定义(OpenAI tools 格式)只算一次:把 Draft 类交给 with_structured_output 时,LangChain 每次调用都为
# 追踪元数据重新生成一遍 JSON schema,占跑图时间的一成(bench/worker.py)。发给模型的定义一样,回答由 agent_draft.ask 校验。
DRAFT_TOOL = convert_to_openai_tool(Draft)


def draft(state: TicketState, config: RunnableConfig) -> dict:
    if word := needs_supervisor(state["ticket_text"]):  # 练习 5:不起草,只通知主管
        d = supervisor_notice(state["ticket_text"], word)
        return {"draft": d, "first_draft": d}
    model = structured(get_llm(), DRAFT_TOOL)  # 即 get_llm().with_structured_output(Draft, method="function_calling")
    d = ask(model, build_prompt(state), Draft, state["ticket_id"], config)
    first = state.get("first_draft") or (None if agent_question.is_question(d) else d)  # 提问不是草稿
    return {"draft": d, "first_draft": first, "redraft_limit": settings.value("MAX_REDRAFTS")}


def review(state: TicketState, config: RunnableConfig) -> dict:
    d = state["draft"]
    if d.get("action") == "notify_supervisor":  # 练习 5
        item = notice_item(state)
    elif agent_question.is_question(d):  # 提问:卡在查不到的事实上,只能回答或 ignore
        item = agent_question.question_item(state, notice_text(state["ticket_text"]), may_respond(state))
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
        # 不能用的回答(别的客户端交来的)不抛错:这次 review 结束,after_review 回到 review 再问一次。
        # 抛错的话 LangGraph 把这个回答和出错的 review 一起存下,以后重跑拿到的都还是它;在这里循环着再 interrupt 的话,
        # 下次重跑会按那时的上限重查被拒的回答,可能让它通过(tests/test_agent.py)
        return {"refused": problem}
    kind, answered = answer["type"], {"refused": None, "reviewer": config["configurable"].get("reviewer")}
    if kind == "accept":
        return {"outcome": "send", "decision": "accept", **answered}
    if kind == "edit":
        return {"outcome": "send", "decision": "edit", "draft": {**d, "reply": edited_reply(answer)}, **answered}
    if kind == "response":
        # 意见也进模型,和工单一样先打码(客服常把客户的电话抄进意见里);inbox.py 交来之前已经打过,别的客户端的在这里打
        note = agent_question.answered(d, mask_pii(answer["args"]))  # 回答提问时连问题一起记
        return {"outcome": "redraft", "feedback": state.get("feedback", []) + [note], **answered}
    return {"outcome": "ignore", **answered}


def after_review(state: TicketState) -> Literal["review", "send", "draft", "ignore"]:
    if state.get("refused"):
        return "review"
    return {"send": "send", "redraft": "draft", "ignore": "ignore"}[state["outcome"]]


def send(state: TicketState) -> dict:
    sent = store.record_reply(state["ticket_id"], state["draft"]["reply"], "agent+reviewer", review_row(state))
    return {"outcome": "sent" if sent else "already_sent"}


def ignore(state: TicketState) -> dict:
    """ignore 也记一笔(按工单号去重),日报按类别统计用。它是单独的节点而不在 review 里:人的决定先写进 checkpoint,
    记账失败(磁盘满)就和 send 失败一样交回 worker 续跑,不会把这次的回答和出错的 review 绑在一起(tests/test_inbox.py)。"""
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
    """返回 (graph, conn)。调用方用完要 conn.close()。checkpoint 存在 SQLite 文件或 PostgreSQL(store 决定);
    durable=True(收件箱用)等 checkpoint 落盘,见 store_pg.open_checkpointer。"""
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
    """一张工单一个 thread。event_id 只带给 draft 记账用。metadata 给追踪用(课文「上线以后」:session id 用工单号),
    接了 LangSmith、Langfuse 时同一张工单的起草、重写、发送归在一个 session 里。"""
    return {"configurable": {"thread_id": store_move.thread_id(ticket_id), "event_id": event_id},
            "metadata": {"session_id": ticket_id, "langfuse_session_id": ticket_id},
            "max_concurrency": agent_saver.MAX_CONCURRENCY}



# ---- 练习 2:工单不存在 → PermanentError ----
class PermanentError(Exception):
    """重试多少次都不会好的错误(工单不存在、payload 格式不对):worker 直接判死信。
    kept:消息里打码时要原样留着的几段:让人照着敲的命令(放回死信的 --requeue-dead …)、提到的事件 id。"""

    def __init__(self, message: str, *kept: str):
        super().__init__(message)
        self.kept = kept


def is_permanent(error: Exception) -> bool:
    """重试多少次都没用的错误,worker 和收件箱直接判死信:PermanentError,还有模型说请求不对或太大的。"""
    if isinstance(error, PermanentError):
        return True
    from llm_errors import rejects_request  # 到要分辨模型的错误时才导入 openai

    return rejects_request(error)


# ---- 练习 4:review_log ----
def review_row(state: TicketState) -> dict:
    first = state.get("first_draft") or state["draft"]
    # 通知类待办只能 ignore,记成 notify:日报的「原样批准率」只算有草稿可批的待办
    notify = state["draft"].get("action") == "notify_supervisor"
    return {"category": state["draft"]["category"], "draft": first["reply"], "final": state["draft"]["reply"],
            "action": state.get("decision") or ("notify" if notify else "ignore"), "feedback": state.get("feedback", []),
            "reviewer": state.get("reviewer")}


# ---- 练习 5:通知主管 notify_supervisor ----
NOTIFY_WORDS = ("律师", "起诉", "投诉到")  # 出现这些词不起草,只通知主管
NOTICE_HEAD_CHARS = 200  # 字;通知主管的待办里给人看工单原文的前这么多字(收件箱一屏看得完)
NOTICE_CONTEXT_CHARS = 40  # 字;触发的词不在前面那段里时,再摘出它前后各这么多字


def needs_supervisor(text: str) -> str | None:
    text = simplified(text)  # 繁体的「律師」「起訴」也算
    return next((w for w in NOTIFY_WORDS if w in text), None)


def notice_text(text: str) -> str:
    """通知主管的待办里给人看的工单原文:前 NOTICE_HEAD_CHARS 个字;触发的词在后面时再摘出它前后一段,
    主管看得到通知说的那个词;没显示全的说一共多少字。"""
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
