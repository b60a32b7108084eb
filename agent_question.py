"""agent.py 的第二种找人方式「提问」:课文说后台 Agent 找人有三种 —— 通知(练习 5)、提问、审核(主流程),提问是 Agent 卡在
一个自己查不到的事实上,比如「客户说的『上次那张发票』是哪张,系统里有三张候选」。课文只讲了这个意思,没有代码;这里补上:
提示词里列出客户名下的发票、说明定不下来时不要猜而是提问;模型在 Draft 的 question / candidates 里提出问题时,review 交出的
收件箱条目是 ask_human(照 Agent Inbox 的 HumanInterrupt:只能 respond 回答或 ignore);人的回答作为一条「提问:… 回答:…」
记进 feedback(和意见一样算一轮重写,MAX_REDRAFTS 一起管着),draft 带着问答再起草一版,之后就是普通的审核待办。
review_log 的 feedback 里也就留着这一轮问答;日报和 inbox.py show 认得出这种条目。"""
import config

QUESTION_ACTION = "ask_human"  # 提问类待办的 action_request.action
QUESTION_PREFIX = "提问:"      # feedback 里问答那一条的开头:「提问:<问题> 回答:<人的回答>」
ANSWER_MARK = " 回答:"
# prompt_part 接在工单后面的两节的开头,和请模型定不下来时提问的那句(离线模型看有没有它决定能不能问)
INVOICES_HEADER = "客户名下的发票(系统里查得到的,最近开的在前):"
ASK_RULE = ("工单说的是哪一张发票(或别的什么),从工单和上面的数据里定不下来时不要猜:reply 留空,"
            "在 question 里写一句要问客服的话,candidates 里列出候选的发票号。")
ANSWERS_HEADER = "你问过客服的问题和客服的回答,照回答写,不要再问一遍:"
CANDIDATE_FIELDS = ("id", "issued_on", "amount", "title")  # 收件箱条目里每张候选发票给人看的几项


def is_question(draft: dict) -> bool:
    """这一版「草稿」是不是一个问题(模型没写回复,在 question 里问人)。"""
    return bool(draft.get("question"))


def is_answer(note: str) -> bool:
    """feedback 里的这一条是不是对提问的回答(而不是对草稿的意见)。"""
    return note.startswith(QUESTION_PREFIX) and ANSWER_MARK in note


def answered(draft: dict, note: str) -> str:
    """respond 带来的文字记进 feedback 的样子:回答提问时连问题一起记(「提问:… 回答:…」),否则就是意见本身。"""
    return f"{QUESTION_PREFIX}{draft['question']}{ANSWER_MARK}{note}" if is_question(draft) else note


def split_answer(note: str) -> tuple[str, str]:
    """「提问:问题 回答:回答」→ (问题, 回答)。"""
    question, _, answer = note.removeprefix(QUESTION_PREFIX).rpartition(ANSWER_MARK)
    return question, answer


def remarks(feedback: list[str]) -> list[str]:
    """feedback 里对草稿的意见(不含问答):build_prompt 放进主管意见那一节。"""
    return [n for n in feedback if not is_answer(n)]


def invoice_line(invoice: dict) -> str:
    return f"{invoice['id']}  {invoice['issued_on']} 开具  {invoice['amount']} 元  抬头「{invoice['title']}」  {invoice['status']}"


def prompt_part(state: dict) -> str:
    """build_prompt 在工单后面接的两节:客户名下的发票(有的话),还有问过人的问答(有的话)。
    还能再问(重写次数没用完)时才请模型定不下来就提问:用完了的话问了也没人能回答,只能 ignore。"""
    part = ""
    if invoices := state.get("invoices"):
        part += f"\n{INVOICES_HEADER}\n" + "".join(f"- {invoice_line(i)}\n" for i in invoices)
        if len(state.get("feedback", [])) < config.value("MAX_REDRAFTS"):
            part += f"{ASK_RULE}\n"
    if answers := [n for n in state.get("feedback", []) if is_answer(n)]:
        part += f"\n{ANSWERS_HEADER}\n" + "".join(f"- {n}\n" for n in answers)
    return part


def candidates(state: dict) -> list[dict]:
    """模型列的候选,给人看:是客户名下的发票就带上日期、金额、抬头;不是的(模型问的是别的东西)原样给出。"""
    known = {i["id"]: i for i in state.get("invoices", [])}
    return [{k: known[c][k] for k in CANDIDATE_FIELDS} if c in known else {"id": c}
            for c in state["draft"].get("candidates") or []]


def question_item(state: dict, ticket_text: str, may_answer: bool) -> dict:
    """提问类待办的收件箱条目(HumanInterrupt):问题、候选、工单原文(ticket_text,已截好);只能 respond(回答)或 ignore,
    没有草稿可以 accept / edit。may_answer 是 may_respond(state):回答也算一轮重写。"""
    d = state["draft"]
    return {
        "action_request": {"action": QUESTION_ACTION,
                           "args": {"ticket_id": state["ticket_id"], "question": d["question"],
                                    "candidates": candidates(state), "ticket_text": ticket_text}},
        "config": {"allow_accept": False, "allow_edit": False, "allow_respond": may_answer, "allow_ignore": True},
        "description": f"【提问】[{d['category']}] {d['question']}",
    }
