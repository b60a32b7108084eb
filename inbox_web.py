"""收件箱网页:inbox.py 的 list 变成一张列表页,四个子命令变成每张工单页上的四个按钮。

运行:
    uv run uvicorn inbox_web:app --port 8140

你会看到:一行「收件箱网页:……」说现在是只回答本机,还是要登录(INBOX_WEB_USERS);浏览器打开 http://127.0.0.1:8140/
是「待处理 N」和最早进收件箱的 50 条,点进一张工单看工单原文、当前草稿、第一版和每轮意见,下面是允许的那几个按钮。
/history 是最近的决定:谁、什么时候、改没改过文字。/api/inbox 和 POST /api/tickets/{工单号} 给 Agent Inbox 这类客户端用,
收发的是 HumanInterrupt 和 HumanResponse。

课文说收件箱条目照 Agent Inbox 的 HumanInterrupt 来定,终端收件箱换成网页时数据结构不用改:这里就是那个网页。
拿待办、续跑图、改事件状态都调 inbox.resume(),和命令行一条路,规则一样:先做决定的算数;每个表单带着它显示的那一版待办的
指纹,中间有人 respond 过、或者别人先决定了,就回 409、什么都不动。谁能进见 inbox_web_access.py。
"""
import difflib
import re
import threading
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel

import config
import inbox
import inbox_args
import inbox_repair
import inbox_seen
import inbox_story
import inbox_web_access
import store
from agent import open_graph, thread_of
from agent_question import QUESTION_ACTION
from agent_review import allowed, edited_reply
from agent_run import check_settings
from inbox_take import Conflict, Gone, Refused
from llm_pii import mask_pii

HERE = Path(__file__).resolve().parent
PAGE_SIZE = 50  # 列表页一页几条:一屏看得完,也只为这几条读 checkpoint
STATUS_OF = {Conflict: 409, Gone: 404, Refused: 400}
ACTION_LABEL = {"accept": "原样发出", "edit": "改完再发", "respond": "提意见重写", "ignore": "不回"}
BADGES = {"notify_supervisor": "通知主管", QUESTION_ACTION: "提问"}  # 不是审核草稿的两种待办(练习 5、agent_question.py)
SHORTCUTS = [("a", "accept 原样发出"), ("e", "edit 改完再发"), ("r", "respond 提意见"), ("i", "ignore 不回"),
             ("j / k", "下一条 / 上一条")]

templates = Jinja2Templates(directory=HERE / "templates")  # 默认就按 HTML 转义:工单里的 <script> 显示成文字


class Inbox:
    """整个进程共用的一个图(checkpoint 连接):第一次请求时打开,服务停下时关。"""

    def __init__(self):
        self.lock, self.graph, self.conn = threading.Lock(), None, None

    def get(self):
        with self.lock:
            if self.graph is None:
                check_settings()
                store.init()
                self.graph, self.conn = open_graph(durable=True)  # 人的决定等落盘之后才发信,和 inbox.py 一样
                inbox_repair.tidy(self.graph)  # 上次中途断掉的残局,和 inbox.py 每次运行前一样先收拾
            return self.graph

    def close(self):
        with self.lock:
            if self.conn is not None:
                self.conn.close()
            self.graph = self.conn = None


state = Inbox()


@asynccontextmanager
async def lifespan(app: FastAPI):
    """服务起来时:读账号(INBOX_WEB_USERS 写错了就起不来,说哪里错)、说一行现在是哪种门、打开图;停下时关掉。"""
    app.state.users = inbox_web_access.users()
    print(inbox_web_access.mode_line(app.state.users), flush=True)
    state.get()
    yield
    state.close()


app = FastAPI(title="CloudLedger 收件箱", lifespan=lifespan)


app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")


@app.middleware("http")
async def guard(request: Request, call_next):
    """每个请求先过门(inbox_web_access.admit);进得来的,request.state.reviewer 是做决定的人。"""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    who = inbox_web_access.admit(request.method, request.headers, request.client.host if request.client else None,
                                 own, request.app.state.users)
    if isinstance(who, inbox_web_access.Denied):
        return failure(request, who.status, who.message, who.headers)
    request.state.reviewer = who
    return await call_next(request)


# ---- 页面 ----
@app.get("/", response_class=HTMLResponse)
def list_page(request: Request, page: int = 1, done: str = "", outcome: str = ""):
    graph = state.get()
    events = inbox.waiting()
    pages = max(1, -(-len(events) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    rows = [row(graph, ev) for ev in events[(page - 1) * PAGE_SIZE:page * PAGE_SIZE]]
    return templates.TemplateResponse(request, "inbox_list.html", {
        "count": len(events), "rows": rows, "page": page, "pages": pages, "done": f"{done} → {outcome}" if done else "", "shortcuts": SHORTCUTS})


@app.get("/tickets/{ticket_id}", response_class=HTMLResponse)
def ticket_page(request: Request, ticket_id: str, redrafted: int = 0):
    graph = state.get()
    if (story := inbox_story.story(graph, ticket_id)) is None:
        return failure(request, 404, f"{ticket_id} 不在收件箱里,事件表和 checkpoint 里也没有它")
    item = current_item(graph, ticket_id) if story["waiting"] else None
    waiting_ids = [e["ticket_id"] for e in inbox.waiting()]
    near = neighbours(waiting_ids, ticket_id)
    sent = story["outbox"]["body"] if story["outbox"] else None
    first = (story["first_draft"] or {}).get("reply") or ""
    return templates.TemplateResponse(request, "inbox_ticket.html", {
        "s": story, "item": item, "fingerprint": inbox_seen.item_fingerprint(item) if item else "",
        "actions": [inbox.COMMAND_OF[k] for k in allowed(item)] if item else [], "labels": ACTION_LABEL,
        "diff": word_diff(first, sent) if sent is not None else None, "redrafted": redrafted,
        "prev": near[0], "next": near[1], "shortcuts": SHORTCUTS})


@app.post("/tickets/{ticket_id}")
def ticket_form(request: Request, ticket_id: str, action: str = Form(""), text: str = Form(""), choice: str = Form(""),
                draft_fingerprint: str = Form("")):
    """一个按钮(表单)交来的决定。做成了回到列表(respond 回到这张工单看新草稿);做不了时一页说明,状态码说明是哪种。
    回答提问时可以点一张候选(choice),也可以自己写(text,写了就用它)。"""
    try:
        result = decide(ticket_id, action, text.strip() or choice, request.state.reviewer, draft_fingerprint or None)
    except Refused as e:
        return failure(request, status_of(e), str(e))
    if result.new_draft is not None:
        return RedirectResponse(f"/tickets/{quote(ticket_id)}?redrafted={2 if result.answered else 1}", status_code=303)
    return RedirectResponse(f"/?{urlencode({'done': ticket_id, 'outcome': result.outcome})}", status_code=303)


@app.get("/history", response_class=HTMLResponse)
def history_page(request: Request):
    state.get()
    with store.opened() as conn:
        decisions = conn.execute(
            "SELECT ticket_id, action, reviewer, created_at, draft, final FROM review_log "
            "ORDER BY created_at DESC LIMIT 100").fetchall()
    rows = [{**dict(r), "changed": r["final"] is not None and r["final"] != r["draft"]} for r in decisions]
    return templates.TemplateResponse(request, "inbox_history.html", {"rows": rows, "shortcuts": []})


# ---- Agent Inbox 的接口 ----
class HumanResponse(BaseModel):
    type: Literal["accept", "edit", "response", "ignore"]
    args: Any = None


@app.get("/api/inbox")
def api_inbox():
    graph = state.get()
    items = []
    for ev in inbox.waiting():
        snap = graph.get_state(thread_of(ev["ticket_id"]))
        if snap.interrupts:
            items.append({"ticket_id": ev["ticket_id"], "event_id": ev["event_id"],
                          "waiting_since": str(ev["waiting_since"]), "interrupt": snap.interrupts[0].value})
    return items


@app.post("/api/tickets/{ticket_id}")
def api_answer(request: Request, ticket_id: str, answer: HumanResponse):
    """HumanResponse 交来的决定,和表单一样的规则。If-Match 带上待办的指纹(item_fingerprint)时也核对版本。"""
    command = inbox.COMMAND_OF[answer.type]
    text = (edited_reply(answer.model_dump()) if command == "edit" else
            answer.args if command == "respond" and isinstance(answer.args, str) else "")
    try:
        result = decide(ticket_id, command, text or "", request.state.reviewer, request.headers.get("if-match"))
    except Refused as e:
        return JSONResponse({"detail": str(e)}, status_code=status_of(e))
    return {"ticket_id": ticket_id, "outcome": result.outcome, "new_draft": result.new_draft, "note": result.note,
            "answered": result.answered}


# ---- 一条路:表单和接口都走这里,再进 inbox.resume() ----
def decide(ticket_id: str, command: str, text: str, reviewer: str, shown: str | None):
    """先查交来的东西(哪种处理、文字),再交给 inbox.resume();做不了时抛 Refused(Conflict → 409,Gone → 404)。"""
    if command not in inbox.ANSWER_TYPE:
        raise Refused(f"不认识的处理:{command!r},只能是 accept / edit / respond / ignore")
    text = text.strip()
    if problem := text_problem(command, text):
        raise problem
    graph = state.get()
    if shown is not None and not any(e["ticket_id"] == ticket_id for e in inbox.waiting()):
        if decided := decision_of(ticket_id):  # 页面打开之后别人先决定了:冲突,不是「没有这张工单」
            raise Conflict(f"{ticket_id} 已经由 {decided['reviewer'] or '别人'} 处理了({decided['action']}),这次没有动")
    return inbox.resume(graph, ticket_id, inbox.answer_for(command, ticket_id, text), reviewer=reviewer, shown=shown)


class TooLong(Refused):
    """文字超过 INBOX_MAX_TEXT_CHARS:413。"""


def text_problem(command: str, text: str) -> Refused | None:
    """edit 的回复、respond 的意见:不能是空的,不能夹控制字符,打码之后不能超过 INBOX_MAX_TEXT_CHARS(和命令行一样数)。"""
    if command not in inbox_args.NEEDS_TEXT:
        return None
    if inbox_args.blank(text):
        return Refused(f"{command} 要填{'改好的回复全文' if command == 'edit' else '给 Agent 的意见'},不能是空的;什么都没有改")
    handed = mask_pii(text) if command == "respond" else text
    if len(handed) > (limit := config.value("INBOX_MAX_TEXT_CHARS")):
        return TooLong(f"{command} 的文字有 {len(handed)} 个字,最多 {limit} 个(INBOX_MAX_TEXT_CHARS);什么都没有改")
    if bad := next((c for c in text if inbox_args.CONTROL.fullmatch(c)), None):
        return Refused(f"{command} 的文字里有控制字符 \\x{ord(bad):02x},客户那边看到的会是乱码;删掉再试")
    return None


def status_of(e: Refused) -> int:
    return 413 if isinstance(e, TooLong) else next(code for kind, code in STATUS_OF.items() if isinstance(e, kind))


def decision_of(ticket_id: str) -> dict | None:
    with store.opened() as conn:
        r = conn.execute("SELECT action, reviewer FROM review_log WHERE ticket_id = ?", (ticket_id,)).fetchone()
    return dict(r) if r else None


# ---- 页面上要的几样 ----
def row(graph, ev: dict) -> dict:
    """列表里的一行:工单号、类别和概括、等了多久、是不是通知;checkpoint 读不出来时说哪里不对(和 inbox.py list 一样照列)。"""
    base = {"ticket_id": ev["ticket_id"], "waited": waited(ev["waiting_since"] or ev["updated_at"]), "problem": None,
            "description": "", "badge": None}
    try:
        snap = graph.get_state(thread_of(ev["ticket_id"]))
    except Exception as e:  # noqa: BLE001 —— 一条坏的不能让整页打不开
        return {**base, "problem": f"checkpoint 读不出来({type(e).__name__}: {str(e)[:100]})"}
    if snap.created_at is None:
        return {**base, "problem": f"checkpoint 库里找不到:多半指错了库;库确实丢了就运行 {inbox_repair.restart_command([ev['ticket_id']])}"}
    item = snap.interrupts[0].value if snap.interrupts else None
    if not (isinstance(item, dict) and isinstance(item.get("description"), str)
            and isinstance(item.get("action_request"), dict)):
        return {**base, "problem": "checkpoint 里没有能处理的待办(正被处理,或者格式不对)"}
    return {**base, "description": item["description"], "badge": BADGES.get(item["action_request"].get("action"))}


def current_item(graph, ticket_id: str) -> dict | None:
    snap = graph.get_state(thread_of(ticket_id))
    return snap.interrupts[0].value if snap.interrupts else None


def neighbours(ids: list[str], ticket_id: str) -> tuple[str | None, str | None]:
    """收件箱里这张工单的上一条、下一条(j / k 用)。"""
    if ticket_id not in ids:
        return None, ids[0] if ids else None
    i = ids.index(ticket_id)
    return (ids[i - 1] if i > 0 else None), (ids[i + 1] if i + 1 < len(ids) else None)


def waited(since) -> str:
    seconds = (datetime.now(timezone.utc) - store.parse_time(since)).total_seconds()
    if seconds < 3600:
        return f"{max(0, int(seconds // 60))} 分钟"
    return f"{seconds / 3600:.1f} 小时" if seconds < 48 * 3600 else f"{seconds / 86400:.1f} 天"


TOKEN = re.compile(r"[A-Za-z0-9_.@-]+|\s+|.", re.S)  # 英文单词、数字连成一个;中文一个字一个(中文没有空格分词)


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """模型第一版和发出去的文字按词比:[("same" / "del" / "add", 文字), …]。"""
    a, b = TOKEN.findall(before), TOKEN.findall(after)
    parts: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            parts.append(("del", "".join(a[i1:i2])))
        if op in ("insert", "replace"):
            parts.append(("add", "".join(b[j1:j2])))
        if op == "equal":
            parts.append(("same", "".join(a[i1:i2])))
    return parts


def failure(request: Request, status: int, message: str, headers: dict | None = None):
    """做不了时的回答:/api/ 下是 JSON {"detail": …},别的是一页说明(带回列表的链接)。"""
    if request.url.path.startswith("/api/"):
        return JSONResponse({"detail": message}, status_code=status, headers=headers)
    return templates.TemplateResponse(request, "inbox_error.html", {"status": status, "message": message, "shortcuts": []},
                                      status_code=status, headers=headers)
