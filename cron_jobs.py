"""两个定时任务,交给 crontab 每天跑(完整的四条见 crontab.example):
    uv run python cron_jobs.py scan              # 超过 STALE_DAYS 天还开着、没回复过的工单,当成 ticket.stale 事件入队
    uv run python cron_jobs.py scan --limit 10   # 一次最多入队几个(默认 5)
    uv run python cron_jobs.py report            # 日报;设置了 SLACK_WEBHOOK_URL 就顺便发到 Slack

crontab(每天 9:00 扫描、9:05 出日报,按机器的时区):
0 9 * * * cd /ABSOLUTE/PATH/TO/ambient-agents && /ABSOLUTE/PATH/TO/uv run python cron_jobs.py scan >> cron.log 2>&1
5 9 * * * cd /ABSOLUTE/PATH/TO/ambient-agents && /ABSOLUTE/PATH/TO/uv run python cron_jobs.py report >> cron.log 2>&1

你会看到:
    scan:超过 20 天还开着的工单 9 张,其中没回复过的 9 张,本次入队 5 个
          事件 id 是 cron:stale:<工单号>:<日期>,同一天重跑入队 0 个。已在队列或收件箱里、客服选了「不回」、进了死信的
          工单不入队,有这种情况时多一行说明;created_at 不是 YYYY-MM-DD 开头的,在标准错误列出来。
    report:事件状态、队列深度、收件箱里等得最久的一条、死信(最多 REPORT_MAX_DEAD_LINES 条)、每类工单的处理结果、
          模型调用和单事件成本。

日期一律按 UTC(工单的 created_at、事件 id 里的日期)。
退出码:0 成功;1 日报发 Slack 失败(日报已经打印);2 参数或设置不对,什么都没做;
3 数据库暂时用不了(一行说明;下次照常跑,scan 重跑不会重复入队)。
"""
import json
import sys
from datetime import date, datetime, timedelta, timezone

import config
import cron_report
import store
import store_biz
import store_cron
import store_errors
import store_events

SCAN_LIMIT = 5                   # 个;scan 一次最多入队几个,别一早把收件箱塞满(--limit 可改)
STALE_EVENT_PREFIX = store_events.CRON_ID_PREFIX + "stale:"
EXIT_OK, EXIT_SLACK_FAILED, EXIT_USAGE, EXIT_DB_UNAVAILABLE = 0, 1, 2, 3


def stale_event_id(ticket_id: str, day: str) -> str:
    # 由「任务名 + 工单 + 日期」拼出来:同一天重复跑 scan,不会重复入队;明天还没处理的,明天再提醒一次
    return f"{STALE_EVENT_PREFIX}{ticket_id}:{day}"



def scan(limit: int = SCAN_LIMIT) -> dict:
    """scan 的 run_once:把该跟进的工单入队,打印汇总,返回各个数和这次新入队的工单。"""
    stale_days = config.value("STALE_DAYS")
    today = store.now()[:10]
    cutoff = (date.fromisoformat(today) - timedelta(days=stale_days)).isoformat()
    old, odd = store_cron.open_tickets_created_by(cutoff)
    blockers = store_cron.followup_blockers()
    # 已经有事件在排队或等人的工单不再提醒 —— 今天这次扫描自己入队的除外,所以同一天重跑挑出的还是同一批
    todays = {t for t, event_id in blockers["queued"] if event_id == stale_event_id(t, today)}
    queued = {t for t, event_id in blockers["queued"] if event_id != stale_event_id(t, today)}
    unreplied = [t for t in old if t not in blockers["replied"]]
    busy = [t for t in unreplied if t in queued]
    ignored = [t for t in unreplied if t in blockers["ignored"] and t not in queued]
    dead = [t for t in unreplied if t in blockers["dead"] and t not in queued and t not in blockers["ignored"]]
    todo = [t for t in unreplied if t not in queued and t not in blockers["ignored"] and t not in blockers["dead"]]
    enqueued = []
    for ticket_id in todo[:limit]:
        event_id = stale_event_id(ticket_id, today)
        payload = {"id": event_id, "type": "ticket.stale", "data": {"ticket_id": ticket_id}}
        if store.add_event(event_id, "cron", "ticket.stale", json.dumps(payload)):
            enqueued.append(ticket_id)
    print(f"超过 {stale_days} 天还开着的工单 {len(old)} 张,其中没回复过的 {len(unreplied)} 张,本次入队 {len(enqueued)} 个")
    # 同一天重跑:事件 id 带日期,今天入过队的不会再入。--limit 之外的也可能今天入过队(早些时候用更大的 --limit
    # 跑过):这些算「今天已经入过队」,不算「超出 --limit」
    already = [t for t in todo if t not in enqueued and (t in todays or t in todo[:limit])]
    over_limit = [t for t in todo[limit:] if t not in already]
    held = [(len(already), "今天已经入过队", ""), (len(busy), "已在队列或收件箱里", ""), (len(ignored), "客服选了不回", ""),
            (len(dead), "在死信里", "(查清原因后 uv run python worker.py --requeue-dead)"),
            (len(over_limit), f"超出 --limit {limit}", "")]
    if any(n for n, *_ in held):
        print("没有入队的:" + ",".join(f"{why} {n} 张{note}" for n, why, note in held if n))
    if odd:  # BIZ_DB 指着别的系统的库:日期格式不一样的工单算不出开了几天,说出来,不悄悄入队或漏掉
        examples = "、".join(f"{t}={day!r}" for t, day in sorted(odd)[:3]) + ("……" if len(odd) > 3 else "")
        print(f"业务库里 {len(odd)} 张开着的工单 created_at 不是 YYYY-MM-DD 开头的日期,算不出开了几天,没有算进来:"
              f"{examples}(改成 YYYY-MM-DD 才扫得到)", file=sys.stderr)
    return {"old": len(old), "unreplied": len(unreplied), "enqueued": enqueued, "already": already, "busy": busy,
            "ignored": ignored, "dead": dead, "over_limit": over_limit, "odd": [t for t, _ in odd]}


def build_report(numbers: dict | None = None, moment: datetime | None = None) -> str:
    """日报全文。numbers 默认现查事件库;moment 默认现在(UTC)。"""
    moment = moment or datetime.now(timezone.utc)
    n = numbers or store_cron.report_numbers(recent_since=moment - timedelta(days=config.value("REPORT_RECENT_DAYS")))
    by_status = {s: n["by_status"][s] for s in store.STATUSES if s in n["by_status"]}
    lines = [f"云簿后台 Agent 日报({moment.strftime('%Y-%m-%d %H:%M')} UTC)",
             f"事件状态:{by_status}",
             f"队列深度:{by_status.get('pending', 0)} 个事件等 worker 处理(pending)"]
    if oldest := n["oldest_waiting"]:
        # 按打印出来的那个数(一位小数)比:等了 23.96 小时,打印的是「已等 24.0 小时」,就要提醒
        hours = round((moment - store.parse_time(oldest["waiting_since"])).total_seconds() / 3600, 1)
        lines.append(f"收件箱里等得最久的:{oldest['event_id']},已等 {hours:.1f} 小时{cron_report.alert_note(hours)}"
                     f"(收件箱共 {by_status.get('waiting_human', 0)} 条)")
    else:
        lines.append("收件箱里没有等人处理的待办")
    lines.append(f"死信数:{len(n['dead'])}")
    shown = n["dead"][:config.value("REPORT_MAX_DEAD_LINES")]
    # 只取原因的第一行:多行的(traceback、psycopg 的 DETAIL)会把日报拆成不像死信的几行
    lines += [f"死信:{d['event_id']}  {((d['last_error'] or '').strip().splitlines() or [''])[0][:80]}" for d in shown]
    if more := len(n["dead"]) - len(shown):
        lines.append(f"死信:还有 {more} 条没有列出(REPORT_MAX_DEAD_LINES={len(shown)}),"
                     "事件表里 status 是 dead 的就是;查清原因后 uv run python worker.py --requeue-dead 放回队列")
    lines += cron_report.outcome_lines(n["outcomes"])  # 练习 4 的 review_log:每类工单怎么处理的
    lines.append(cron_report.cost_line(n["usage"]))
    return "\n".join(lines)


def report() -> int:
    """report 的 run_once:打印日报;有 SLACK_WEBHOOK_URL 就发过去。返回退出码。"""
    # 设置都先读一遍:不对的话还没打印日报就退出(退出码 2 = 什么都没做),不用等到有待办、有用量时才发现
    url, timeout = cron_report.report_settings()
    text = build_report()
    print(text, flush=True)
    if url:
        try:
            cron_report.post_to_slack(url, text, timeout)
        except cron_report.SlackError as e:
            print(f"日报没有发到 Slack:{e}", file=sys.stderr)
            return EXIT_SLACK_FAILED
        print("已发到 Slack")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = config.ArgumentParser(description="定时任务:scan 把久未回复的工单入队,report 出日报")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{scan,report}")
    p_scan = sub.add_parser("scan", help=f"把超过 STALE_DAYS(默认 {config.SETTINGS['STALE_DAYS'].default})天没回复的工单入队")
    p_scan.add_argument("--limit", type=int, default=SCAN_LIMIT, help=f"一次最多入队几个(默认 {SCAN_LIMIT})")
    sub.add_parser("report", help="日报:事件状态、队列深度、收件箱等待、死信、处理结果、成本;可发 Slack")
    args = parser.parse_args(argv)
    if args.command == "scan" and args.limit < 1:
        p_scan.error("--limit 至少是 1")
    try:
        # 先读设置、查业务库,再碰事件库:设置不对、业务库不在时连事件库文件都不该建出来(和 email_poller 一样)
        config.value("STALE_DAYS") if args.command == "scan" else cron_report.report_settings()
        if args.command == "scan" and (problem := store_biz.biz_db_problem()):
            print(problem, file=sys.stderr)
            return EXIT_USAGE
        store.init()
        if args.command == "report":
            return report()
        scan(args.limit)
    except SystemExit as e:  # config 读到不合法的设置(STALE_DAYS=abc 之类):说明原因,什么都没做
        if not isinstance(e.code, str):
            raise
        print(e.code, file=sys.stderr)
        return EXIT_USAGE
    except store_errors.unavailable_errors() as e:
        # scan 做到一半:已经入队的提交了;没入队的下次补上,事件 id 带日期,同一天重跑不会多出一个
        then = "scan 没有做完,稍后再跑(同一天重跑不会重复入队)" if args.command == "scan" else "没有出日报,稍后再跑"
        print(f"{store_errors.unavailable(e)},{then}", file=sys.stderr)
        return EXIT_DB_UNAVAILABLE
    return EXIT_OK


if __name__ == "__main__":
    config.run(main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
