"""llm.py 的离线模型:没有设置 LLM_API_KEY 时 get_llm() 交出的 OfflineChatModel,以及它起草用的关键词分类和回复模板。
它是真正的 LangChain 聊天模型(BaseChatModel 的子类),支持 with_structured_output(..., method="function_calling")、
用一次工具调用回答,所以 agent.py 不用为离线另写一条路;它按关键词分类、按模板起草,重写时看得出照着主管的意见改了。
单独放一个文件,是因为课文的 llm.py 只有 get_llm():不联网、不花钱就能把整个实验跑通,是这里加上的。"""
import json
import math
import re
import sys
import threading
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from agent_question import ANSWER_MARK, ANSWERS_HEADER, ASK_RULE, INVOICES_HEADER


OFFLINE_MODEL = "offline-cloudledger"


_announced = threading.Lock()  # 拿到过就不再放开:一个进程只说一次。lru_cache 挡不住:几个处理线程同时第一次起草时各说一遍


def _announce_offline() -> None:
    if _announced.acquire(blocking=False):
        print(f"[llm] 没有设置 LLM_API_KEY,使用离线模型 {OFFLINE_MODEL}:按关键词分类、按模板起草,"
              "不联网、不花钱。设置 LLM_API_KEY 后自动换成真模型。", file=sys.stderr)


CATEGORY_WORDS = {  # 按顺序匹配,先命中的算
    "refund": ("退款", "退费", "重复扣款", "多扣"),
    "invoice": ("发票", "开票", "抬头", "税号"),
    "billing": ("扣费", "扣款", "续费", "套餐", "账单", "价格", "收费"),
    "bug": ("报错", "失败", "打不开", "闪退", "bug", "BUG", "异常", "卡死"),
    "account": ("登录", "密码", "账号", "权限", "验证码", "换绑"),
}
REPLIES = {
    "refund": "关于您提到的扣款和退款问题,我们已转交财务核实扣款记录,核实后会按原支付渠道处理,进度会在 1–3 个工作日内通过工单告知您。",
    "invoice": "关于发票的问题,我们已记录您的开票信息,财务同事核对后会为您重新处理,处理完成后电子发票会发送到您的预留邮箱。",
    "billing": "关于扣费和套餐的疑问,我们已调取您账户的账单明细,核对后会把每一笔费用的说明整理给您。",
    "bug": "您遇到的问题我们已经记录并转给技术同事排查,排查期间可以先刷新页面或换用网页版试试,有进展会第一时间告诉您。",
    "account": "关于账号的问题,为了您的账户安全,我们会先核实身份,再协助您处理,请留意预留手机收到的验证信息。",
    "other": "我们已经收到您的消息,相关同事会尽快查看并回复您。",
}
# 草稿里不许出现退款金额。¥ 是 U+00A5,输入法打出的全角 ￥ 是 U+FFE5;千位分隔符「1,299」「1，299」整个算一个数,
# 不会只拿掉「1」、留下「,299.00」
_NUMBER = r"(?:\d{1,3}(?:[,，]\d{3})+|\d+)(?:\.\d+)?"
_AMOUNT = re.compile(rf"[\u00a5\uffe5]\s*{_NUMBER}|{_NUMBER}\s*(?:元|块钱|块|RMB)")
_DIRECTIVE = ("别", "不要", "不用", "语气")  # 以这些开头的意见是给起草人的指令,不写进回复
# 带这些词的也是指令:道歉由开头那句负责(「先道歉」不该原样出现在给客户的回复里),长短是写法
_INSTRUCTION_WORDS = ("语气", "道歉", "抱歉", "简短", "短一点")


# 繁体字写的工单(Big5 邮件、港台客户)先把关键词里用到的字换成简体再匹配:不然「發票」认不出是发票,
# 「律師」「起訴」也认不出要通知主管(agent.needs_supervisor)
_SIMPLIFIED = str.maketrans("發開稅費續帳賬單價錯敗異閃錄碼號權驗證綁換師訴複頭",
                            "发开税费续账账单价错败异闪录码号权验证绑换师诉复头")


def simplified(text: str) -> str:
    """关键词里用到的繁体字换成简体(只为匹配关键词;给模型、给人看的原文不换)。"""
    return text.translate(_SIMPLIFIED)


def classify(text: str) -> str:
    text = simplified(text)
    for category, words in CATEGORY_WORDS.items():
        if any(w in text for w in words):
            return category
    return "other"


# agent.build_prompt 里主管意见那一节的开头:离线模型靠它把意见和工单原文分开
FEEDBACK_HEADER = "客服主管对上一版草稿的意见,必须照改:"


def offline_draft(prompt: str) -> dict:
    """从 agent.py 拼的提示词里读出工单和意见,写一份符合 Draft 规则的草稿(≤150 字,不写金额)。"""
    lines = prompt.splitlines()
    ticket = next((ln.split(":", 1)[1] for ln in lines if ln.startswith("工单 ") and ":" in ln), prompt)
    subject = ticket.split(":", 1)[0].strip()
    # 意见只在最后那一节里:工单原文也可能有「- 」开头的行(客户列的一二三条),那些不是意见
    _, header, feedback = prompt.rpartition(f"\n{FEEDBACK_HEADER}\n")
    notes = [ln[2:].strip() for ln in feedback.splitlines() if ln.startswith("- ")] if header else []
    category = classify(ticket)
    invoices, answers = _invoices(prompt), _answers(prompt)
    if not answers and ASK_RULE in prompt and (phrase := _vague_invoice(ticket, invoices)):
        return {"category": category, "summary": f"客户反映:{subject}"[:40], "reply": "",
                "question": f"客户说的「{phrase}」是哪张?系统里有 {len(invoices)} 张候选", "candidates": list(invoices)}
    named = f"您说的那张是{_named(answers[-1], invoices)}。" if answers else ""
    opening = "您好,"
    if any(w in prompt for w in ("等了", "久等")):
        opening += "让您久等了,非常抱歉。"
    if notes:
        body = "".join(_statement(n) for n in notes) or REPLIES[category]
        if "抱歉" not in opening and any(w in "".join(notes) for w in ("道歉", "软", "抱歉")):
            opening += "非常抱歉给您添了麻烦。"
        # 结尾:退款才说到账时间;开头已经道过歉的不再说一遍「给您添麻烦了」
        closing = "到账或处理时间以实际渠道为准," if category == "refund" else ""
        reply = opening + named + body + closing + ("感谢您的耐心。" if "抱歉" in opening else "给您添麻烦了。")
    else:
        reply = opening + named + REPLIES[category] + "感谢您的耐心。"
    reply = _AMOUNT.sub("", reply)
    return {"category": category, "summary": f"客户反映:{subject}"[:40], "reply": _fit(reply, 150)}


# ---- 提问:「上次那张发票」是哪张 ----
_INVOICE_ID = re.compile(r"INV-\d{4}-\d{4}")
_VAGUE_INVOICE = re.compile(r"(?:上次|上回|那张)[^,，。;；!！?？\s]{0,8}?发票|(?:上次|上回|那张)")


def _invoices(prompt: str) -> dict[str, str]:
    """提示词里列的客户发票:{发票号: 开具日期},最近的在前。"""
    _, header, rest = prompt.partition(f"\n{INVOICES_HEADER}\n")
    found = {}
    for line in rest.splitlines() if header else []:
        if not line.startswith("- "):
            break
        invoice_id, issued_on = line[2:].split()[:2]
        found[invoice_id] = issued_on
    return found


def _answers(prompt: str) -> list[str]:
    """提示词里问过客服的问答,每条是客服的回答(「提问:… 回答:」后面那段)。"""
    _, header, rest = prompt.partition(f"\n{ANSWERS_HEADER}\n")
    found = []
    for line in rest.splitlines() if header else []:
        if not line.startswith("- "):  # 这一节到空行为止,后面可能是主管意见那一节
            break
        found.append(line.rpartition(ANSWER_MARK)[2].strip())
    return found


def _vague_invoice(ticket: str, invoices: dict[str, str]) -> str | None:
    """工单说的是哪张发票定不下来时,工单里那个说法(「上次那张发票」);定得下来(客户只有一张、工单写了发票号)时是 None。
    只认「上次」「那张」和发票一起出现的:这是离线模型的关键词规则,真模型自己判断。"""
    text = simplified(ticket)
    if len(invoices) < 2 or "发票" not in text or any(i in text for i in invoices):
        return None
    match = _VAGUE_INVOICE.search(text)
    return None if match is None else match.group() if "发票" in match.group() else f"{match.group()}发票"


def _named(answer: str, invoices: dict[str, str]) -> str:
    """回答里指的那张发票,写进回复的样子:「发票 INV-2026-0121(2026-09-20 开具)」;回答里没有认得出的发票号时
    照抄回答(「客服确认的那张发票:…」)。"""
    ids = _INVOICE_ID.findall(answer)
    if ids and ids[0] in invoices:
        return f"发票 {ids[0]}({invoices[ids[0]]} 开具)"
    if ids:
        return f"发票 {ids[0]}"
    return f"客服确认的那张发票({_AMOUNT.sub('', answer)[:30]})"


def _statement(note: str) -> str:
    """把一条主管意见改写成回复里的陈述句:去掉「别写金额」这类指令,把「告诉客户」后面的内容留下。"""
    kept = []
    note = _AMOUNT.sub("", note)  # 先拿掉金额再按逗号断句:不然「1,299 元」在逗号处被断开,留下一个「1」
    for clause in re.split("[,\uff0c;\uff1b\u3002]", note):  # 半角和全角的逗号、分号,句号
        clause = clause.strip()
        if not clause or clause.startswith(_DIRECTIVE) or any(w in clause for w in _INSTRUCTION_WORDS):
            continue
        clause = re.sub(r"^(直接)?(告诉|跟|和)客户(说)?", "", clause).replace("这张", "您这笔扣款")
        kept.append(_AMOUNT.sub("", clause))
    return (",".join(k for k in kept if k) + "。") if kept else ""


def _fit(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit]
    end = max(cut.rfind("。"), cut.rfind("!"))
    return cut[: end + 1] if end > limit // 2 else cut[: limit - 1] + "。"


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) * 0.7))  # 中文大约 1.4 字一个 token,离线模型只能估


class OfflineChatModel(BaseChatModel):
    """不联网的聊天模型。绑了工具时用工具调用回答(with_structured_output 走的就是这条),否则回纯文本。"""

    model_name: str = OFFLINE_MODEL

    @property
    def _llm_type(self) -> str:
        return OFFLINE_MODEL

    def bind_tools(self, tools: list, *, tool_choice: Any = None, **kwargs: Any):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], tool_choice=tool_choice, **kwargs)

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        prompt = "\n".join(m.text for m in messages)
        draft = offline_draft(prompt)
        usage = {"input_tokens": estimate_tokens(prompt), "output_tokens": estimate_tokens(json.dumps(draft, ensure_ascii=False))}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        tools = kwargs.get("tools") or []
        if tools:
            call = {"name": tools[0]["function"]["name"], "args": draft, "id": "call_offline", "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call], usage_metadata=usage,
                                response_metadata={"model_name": OFFLINE_MODEL})
        else:
            message = AIMessage(content=draft["reply"], usage_metadata=usage, response_metadata={"model_name": OFFLINE_MODEL})
        return ChatResult(generations=[ChatGeneration(message=message)])

