"""定时任务(cron_jobs.py)要的查询:哪些开着的工单超过了天数、哪些工单要避开(回过了、不回、已经在队列里、进了死信),
以及日报要的数(各状态事件数、等得最久的待办、死信、按类别的处理结果、模型用量)。
放在这里是因为它们读的是 store.py 的表;cron_jobs.py 只管什么时候跑、怎么说。"""
import json
import re
from datetime import date, datetime, timezone

import store
from agent_question import is_answer


def open_tickets_created_by(last_day: str) -> tuple[list[str], list[tuple[str, str]]]:
    """业务库里 created_at 不晚于 last_day(YYYY-MM-DD)、还开着的工单,最老的在前;另外返回 created_at 不是
    YYYY-MM-DD 开头的开着的工单 (工单号, 原样的 created_at),它们没法比,不算进去。在 Python 里逐个认日期,
    不在 SQL 里按字符串比:''、'15/11/2026'、1893456000 按字符串都「早于」截止日(课文「坑」那一节)。"""
    with store.opened(store.biz_target()) as conn:
        rows = conn.execute("SELECT id, created_at FROM tickets WHERE status = 'open' ORDER BY created_at, id").fetchall()
    old, odd = [], []
    for r in rows:
        day = ticket_day(r["created_at"])
        if day is None:
            odd.append((r["id"], str(r["created_at"])))
        elif day <= last_day:
            old.append(r["id"])
    return old, odd


def ticket_day(value) -> str | None:
    """工单 created_at 的日期(YYYY-MM-DD);认不出是哪天时是 None。PostgreSQL 里别人的表可能是 date / timestamp 类型。"""
    if isinstance(value, str) and re.match(r"\d{4}-\d{2}-\d{2}.", value):
        # 文字里带着时区的(「2026-11-15T07:30:00+08:00」,别的系统导出的):和 timestamptz 一样按 UTC 的日子
        # (前 10 个字是 11-15,同一时刻写成 UTC 却是 11-14)
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass  # 别的写法(「2026-11-15 上午」):下面照旧取前 10 个字
    if isinstance(value, datetime) and value.tzinfo is not None:
        # timestamptz:psycopg 按会话的时区给出(国内的服务器多半默认 Asia/Shanghai),日期一律按 UTC 算,先换过去,
        # 扫不扫得到一张工单不随服务器的设置变
        value = value.astimezone(timezone.utc)
    if isinstance(value, (date, datetime)):
        return value.isoformat()[:10]
    if isinstance(value, str) and re.match(r"\d{4}-\d{2}-\d{2}", value):
        try:
            return date.fromisoformat(value[:10]).isoformat()
        except ValueError:
            return None
    return None


def followup_blockers() -> dict[str, set]:
    """定时扫描要避开的工单。replied:outbox 里有回复;ignored:客服在收件箱里选了不回;
    queued:(工单号, 事件 id),这张工单已经有事件在队列里、处理中或在收件箱里等人;
    dead:有事件进了死信(要人查清后 --requeue-dead,定时任务不能绕过死信每天自动再试、再调模型)。"""
    with store.opened() as conn:
        replied = conn.execute("SELECT ticket_id FROM outbox").fetchall()
        ignored = conn.execute(
            "SELECT ticket_id FROM events WHERE status = 'ignored' AND ticket_id IS NOT NULL "
            "UNION SELECT ticket_id FROM review_log WHERE action IN ('ignore', 'notify')"
        ).fetchall()
        queued = conn.execute(
            "SELECT ticket_id, event_id FROM events "
            "WHERE status IN ('pending', 'processing', 'waiting_human') AND ticket_id IS NOT NULL"
        ).fetchall()
        dead = conn.execute(
            "SELECT DISTINCT ticket_id FROM events WHERE status = 'dead' AND ticket_id IS NOT NULL"
        ).fetchall()
    return {"replied": {r[0] for r in replied}, "ignored": {r[0] for r in ignored},
            "queued": {(r[0], r[1]) for r in queued}, "dead": {r[0] for r in dead}}


def report_numbers(recent_since: datetime | None = None) -> dict:
    """日报要的数,都从事件库来:各状态事件数、收件箱里等得最久的、死信、按类别的处理结果、模型用量。
    处理结果另外数一份 recent_since 以来的(看 edit 率是不是突然涨了)。"""
    with store.opened() as conn:
        by_status = conn.execute("SELECT status, COUNT(*) FROM events GROUP BY status").fetchall()
        oldest = conn.execute(
            # waiting_since 是空的:状态是别处直接改成 waiting_human 的(sqlite3 里手改、别的工具):按 updated_at 算,
            # 日报不能因为一行手改的数据就出 traceback
            "SELECT event_id, ticket_id, COALESCE(waiting_since, updated_at) AS waiting_since FROM events "
            "WHERE status = 'waiting_human' ORDER BY COALESCE(waiting_since, updated_at), event_id LIMIT 1"
        ).fetchone()
        dead = conn.execute(
            "SELECT event_id, last_error FROM events WHERE status = 'dead' ORDER BY updated_at, event_id"
        ).fetchall()
        reviews = conn.execute("SELECT category, action, feedback, created_at FROM review_log ORDER BY category").fetchall()
        usage = conn.execute(
            "SELECT COUNT(*) AS calls, COALESCE(SUM(input_tokens), 0) AS input_tokens, "
            "COALESCE(SUM(output_tokens), 0) AS output_tokens, "
            "COUNT(DISTINCT COALESCE(event_id, 'ticket:' || ticket_id)) AS events FROM llm_usage"
        ).fetchone()
    return {"by_status": {r[0]: int(r[1]) for r in by_status}, "oldest_waiting": dict(oldest) if oldest else None,
            "dead": [dict(r) for r in dead], "outcomes": _outcomes_by_category(reviews, recent_since),
            "usage": {k: int(usage[k]) for k in ("calls", "input_tokens", "output_tokens", "events")}}


NOTIFIED = "(通知)"  # _outcomes_by_category 里通知类待办那一行的类别名;排在各个类别后面


def _outcomes_by_category(reviews, recent_since: datetime | None) -> list[dict]:
    """review_log 按类别数:accept / edit / ignore 各几张(每张工单最后是其中一种);responded 是其中提过意见重写的张数,
    response 是 feedback 里意见的总条数(重写了几轮);asked / answers 是 Agent 提过问的张数和人回答的轮数
    (feedback 里「提问:… 回答:…」那种条目,见 agent_question.py),不算进意见;
    recent_tickets / recent_edit 是 recent_since 以来的张数和 edit 数。通知类待办(notify)没有草稿可批,
    不算进任何一类,只数总共几条(类别名 NOTIFIED)。
    在 Python 里数而不是用 SQL 的 JSON 函数:SQLite 和 PostgreSQL 的写法不一样。"""
    out: dict[str, dict] = {}
    for category, action, feedback, created_at in reviews:
        if action == "notify":
            category = NOTIFIED
        o = out.setdefault(category, {"category": category, "tickets": 0, "accept": 0, "edit": 0, "ignore": 0,
                                      "responded": 0, "response": 0, "asked": 0, "answers": 0,
                                      "recent_tickets": 0, "recent_edit": 0})
        o["tickets"] += 1
        if action in ("accept", "edit", "ignore"):
            o[action] += 1
        if recent_since and store.parse_time(created_at) >= recent_since:
            o["recent_tickets"] += 1
            o["recent_edit"] += action == "edit"
        try:
            notes = json.loads(feedback or "[]")
            rounds = len(notes)
        except (ValueError, TypeError):
            notes, rounds = [], 0  # feedback 不是合法 JSON:这一行的意见不算
        answers = sum(isinstance(n, str) and is_answer(n) for n in notes) if isinstance(notes, list) else 0
        rounds -= answers
        o["response"] += rounds
        o["responded"] += rounds > 0
        o["answers"] += answers
        o["asked"] += answers > 0
    return sorted(out.values(), key=lambda o: o["category"] == NOTIFIED)
