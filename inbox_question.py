"""inbox.py 对提问类待办(agent_question.py 交出的 ask_human)的处理:list 里它标着【提问】,下面是工单原文、每张候选发票一行、
怎么回答;accept / edit 在拿走之前就被拒绝 —— 没有草稿可发,Agent 在等一个它自己查不到的事实;respond 带上回答(比如发票号),
Agent 照它起草,待办变成普通的审核待办。课文只说了有这种找人方式,收件箱的这几样是这里补上的。"""
from agent_question import QUESTION_ACTION
from inbox_show import indented
from inbox_take import Refused


def is_question_item(item: dict) -> bool:
    return item["action_request"]["action"] == QUESTION_ACTION


def candidate_line(candidate: dict) -> str:
    """一张候选发票给人看的一行:发票号、开具日期、金额、抬头;不是客户名下的发票(模型问的是别的)只有它本身。"""
    if "issued_on" not in candidate:
        return candidate["id"]
    return f"{candidate['id']}  {candidate['issued_on']} 开具  ¥{candidate['amount']}  抬头「{candidate['title']}」"


def list_lines(ticket_id: str, item: dict, rounds: int) -> list[str]:
    """list 里问题下面的几行:工单原文、每张候选一行、怎么回答(rounds:已经重写或回答过几轮,到上限时只能 ignore)。"""
    args = item["action_request"]["args"]
    lines = [indented("工单:", args["ticket_text"])] + [indented("候选:", candidate_line(c)) for c in args["candidates"]]
    if item["config"]["allow_respond"]:
        lines.append(indented("", f'回答:uv run python inbox.py respond {ticket_id} "<发票号或说明>";不回答就 ignore'))
    else:
        lines.append(f"        已按意见重写或回答 {rounds} 次,到上限了:只能 ignore")
    return lines


def refusal(command: str, ticket_id: str, ok: str) -> Refused:
    """accept / edit 一条提问类待办时的拒绝:没有草稿可发,说清楚该怎么回答。"""
    return Refused(f"{ticket_id} 是提问类待办,Agent 在等你回答它的问题,没有草稿可以 {command};只能 {ok}"
                   "(respond 带上回答,比如发票号)")


def new_text(item: dict) -> str:
    """respond 之后图又停下时给人看的新待办:草稿;模型又提了一个问题时是「【提问】问题」。"""
    args = item["action_request"]["args"]
    return f"【提问】{args['question']}" if is_question_item(item) else args["reply"]
