"""两个定时任务,交给 crontab 每天跑(见 crontab.example):

运行:
    uv run python cron_jobs.py scan              # 超过 STALE_DAYS 天还开着、没回复过的工单,当成 ticket.stale 事件塞进队列
    uv run python cron_jobs.py scan --limit 10   # 一次最多入队几个(默认 5)
    uv run python cron_jobs.py report            # 日报;设置了 SLACK_WEBHOOK_URL 就顺便发到 Slack

你会看到:
    scan:超过 20 天还开着的工单 9 张,其中没回复过的 9 张,本次入队 5 个
          同一天再跑一次(补跑、手动跑):……本次入队 0 个。事件 id 是 cron:stale:<工单号>:<日期>,同一天同一张工单只有一个。
          已经在队列或收件箱里的、客服选了「不回」的、事件进了死信的工单不再入队,有这种情况时多一行说明。
          created_at 不是 YYYY-MM-DD 开头的开着的工单(别的系统的库)不入队,标准错误多一行列出来。
          worker 处理 ticket.stale 事件时,提示词会说这张工单等了很久,草稿开头先为久等道歉。
    report:事件状态、队列深度(pending)、收件箱里等得最久的一条、死信数和每条死信(最多 REPORT_MAX_DEAD_LINES 条)、
          每类工单的处理结果(accept / edit / ignore 各几张,其中几张提过意见重写、共几轮 response)、
          模型调用次数、token 和单事件成本。

日期一律按 UTC:工单的 created_at、事件 id 里的日期都是 UTC 的日子。
退出码:0 成功;1 日报发 Slack 失败(日报已经打印出来了);2 参数或设置不对,什么都没做;
3 数据库暂时用不了(PostgreSQL 重启、连接被掐断、SQLite 被锁太久),一行说明,下次照常跑(scan 重跑不会重复入队)。
"""
import json
import queue
import sys
import threading
from datetime import date, datetime, timedelta, timezone

import httpx

import config
import store
import store_biz
import store_cron
import store_errors
import store_events

STALE_DAYS = 20                  # 天(0–36500);开着超过这么多天(课文:「超过 20 天还开着的工单」)就该跟进
SCAN_LIMIT = 5                   # 个;scan 一次最多入队几个,别一早把收件箱塞满(--limit 可改)
STALE_EVENT_PREFIX = store_events.CRON_ID_PREFIX + "stale:"
SLACK_TIMEOUT_S = 10             # 秒(0.1–3600);Slack 连不上或不回话时最多等这么久,crontab 里的任务不能挂住
INBOX_ALERT_HOURS = 24           # 小时(至少 0);收件箱里有待办等了超过这么久(约一个工作日),日报里标出来提醒值班的人
# 元 / 千 token,输入输出合起来算的一个均价。默认按课文「一次起草约 0.0015 元」反推:一次起草大约
# 六七百个 token(提示词 + 结构化输出),约合 0.002 元 / 千 token;换模型或服务商调价时按价目表改。
LLM_PRICE_PER_1K_TOKENS = 0.002
OUTCOME_KINDS = ("accept", "edit", "ignore")  # 每张工单最后是其中一种;response(提意见重写)是途中的,另外说
# 天(1–365);日报的处理结果另算最近这么多天的 edit 率,和之前的比。只看全部历史的话,一千条旧记录能把
# 一周里从 10% 涨到 40% 的 edit 率冲淡成 12%(课文自测 6),看不出模型、提示词或业务规则变了
REPORT_RECENT_DAYS = 7
# 百分点(0–100);最近的 edit 率比之前高出这么多,日报那一类后面加一句提醒
EDIT_RISE_ALERT_POINTS = 20
# 条(至少 1);日报最多列出这么多条死信,其余的只说还有几条。API key 半夜过期时,一早几百条积压全在死信里:
# 原来一条一行全列出来,日报翻不到底,发给 Slack 的也超过了它一条消息的长度
REPORT_MAX_DEAD_LINES = 20
EXIT_OK, EXIT_SLACK_FAILED, EXIT_USAGE, EXIT_DB_UNAVAILABLE = 0, 1, 2, 3


class SlackError(Exception):
    """日报没能发到 Slack。"""


# ---------------------------------------------------------------- scan
def stale_event_id(ticket_id: str, day: str) -> str:
    # 由「任务名 + 工单 + 日期」拼出来:同一天重复跑 scan,不会重复入队;明天还没处理的,明天再提醒一次
    return f"{STALE_EVENT_PREFIX}{ticket_id}:{day}"


def stale_days_setting() -> int:
    return config.integer("STALE_DAYS", STALE_DAYS, minimum=0, maximum=36500)


def scan(limit: int = SCAN_LIMIT) -> dict:
    """scan 的 run_once:把该跟进的工单入队,打印汇总,返回各个数和这次新入队的工单。"""
    stale_days = stale_days_setting()
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
    # 跑过):原来一律说成「超出 --limit」,像是漏掉了
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


# ---------------------------------------------------------------- report
def build_report(numbers: dict | None = None, moment: datetime | None = None) -> str:
    """日报全文。numbers 默认现查事件库;moment 默认现在(UTC)。"""
    moment = moment or datetime.now(timezone.utc)
    n = numbers or store_cron.report_numbers(recent_since=moment - timedelta(days=recent_days()))
    by_status = {s: n["by_status"][s] for s in store.STATUSES if s in n["by_status"]}
    lines = [f"云簿后台 Agent 日报({moment.strftime('%Y-%m-%d %H:%M')} UTC)",
             f"事件状态:{by_status}",
             f"队列深度:{by_status.get('pending', 0)} 个事件等 worker 处理(pending)"]
    if oldest := n["oldest_waiting"]:
        # 按打印出来的那个数(一位小数)比:原来等了 23.96 小时,打印「已等 24.0 小时」,却不提醒
        hours = round((moment - store.parse_time(oldest["waiting_since"])).total_seconds() / 3600, 1)
        lines.append(f"收件箱里等得最久的:{oldest['event_id']},已等 {hours:.1f} 小时{alert_note(hours)}"
                     f"(收件箱共 {by_status.get('waiting_human', 0)} 条)")
    else:
        lines.append("收件箱里没有等人处理的待办")
    lines.append(f"死信数:{len(n['dead'])}")
    shown = n["dead"][:max_dead_lines()]
    # 只取原因的第一行:多行的(traceback、psycopg 的 DETAIL)原来把日报拆成了不像死信的几行
    lines += [f"死信:{d['event_id']}  {((d['last_error'] or '').strip().splitlines() or [''])[0][:80]}" for d in shown]
    if more := len(n["dead"]) - len(shown):
        lines.append(f"死信:还有 {more} 条没有列出(REPORT_MAX_DEAD_LINES={len(shown)}),"
                     "事件表里 status 是 dead 的就是;查清原因后 uv run python worker.py --requeue-dead 放回队列")
    lines += outcome_lines(n["outcomes"])
    lines.append(cost_line(n["usage"]))
    return "\n".join(lines)


def max_dead_lines() -> int:
    return config.integer("REPORT_MAX_DEAD_LINES", REPORT_MAX_DEAD_LINES, minimum=1)


def alert_hours() -> float:
    return config.number("INBOX_ALERT_HOURS", INBOX_ALERT_HOURS, minimum=0)


def recent_days() -> float:
    return config.number("REPORT_RECENT_DAYS", REPORT_RECENT_DAYS, minimum=1, maximum=365)


def edit_rise_points() -> float:
    return config.number("EDIT_RISE_ALERT_POINTS", EDIT_RISE_ALERT_POINTS, minimum=0, maximum=100)


def price_per_1k_tokens() -> float:
    return config.number("LLM_PRICE_PER_1K_TOKENS", LLM_PRICE_PER_1K_TOKENS, minimum=0)


def slack_timeout() -> float:
    return config.number("SLACK_TIMEOUT_S", SLACK_TIMEOUT_S, minimum=0.1, maximum=3600)


def report_settings() -> tuple[str, float]:
    """report 用的设置都读一遍,返回 (Slack 地址, 超时);不对就以 SystemExit 退出。"""
    alert_hours()
    max_dead_lines()
    recent_days()
    edit_rise_points()
    price_per_1k_tokens()
    url = config.url("SLACK_WEBHOOK_URL", secret=True)  # 路径就是密钥,错误信息里不能带全
    return url, slack_timeout() if url else 0


def alert_note(hours: float) -> str:
    limit = alert_hours()
    return f"(超过 {limit:g} 小时,该提醒值班的人了)" if hours >= limit else ""


def outcome_lines(outcomes: list[dict]) -> list[str]:
    """每类工单人是怎么处理的:accept 多的可以考虑自动发,edit 突然变多说明模型或业务规则变了。
    accept / edit / ignore 加起来是这一类的张数;response(提意见让 Agent 重写)发生在途中,重写完还是以这三种之一结束,
    所以另外说有几张提过意见、一共几轮(review_log.feedback 里的条数),不和它们并列(并列的话四个数加起来比张数多)。"""
    if not outcomes:
        return ["处理结果:还没有审核记录(review_log 是空的)"]
    lines = ["处理结果(按类别):"]
    for o in outcomes:
        if o["category"] == store_cron.NOTIFIED:  # 只能看过即可,没有草稿可批:不算批准率
            lines.append(f"  通知类待办:{o['tickets']} 条看过了(没有草稿,不算批准率)")
            continue
        counts = ",".join(f"{k} {o[k]}" for k in OUTCOME_KINDS)
        responded = f",其中 {o['responded']} 张提过意见重写(response 共 {o['response']} 轮)" if o["responded"] else ""
        lines.append(f"  {o['category']}:{o['tickets']} 张,{counts},原样批准率 {o['accept'] / o['tickets']:.0%}"
                     + responded + recent_note(o))
    return lines


def recent_note(o: dict) -> str:
    """最近 REPORT_RECENT_DAYS 天这一类的 edit 率,之前也有记录时和之前比;涨得多就提醒。"""
    days, recent = recent_days(), o["recent_tickets"]
    if not recent:
        return f";近 {days:g} 天没有"
    rate = o["recent_edit"] / recent
    note = f";近 {days:g} 天 {recent} 张,edit 率 {rate:.0%}"
    if before := o["tickets"] - recent:
        before_rate = (o["edit"] - o["recent_edit"]) / before
        note += f"(之前 {before_rate:.0%})"
        if (rise := (rate - before_rate) * 100) >= edit_rise_points() and rise > 0:
            note += f",涨了 {rise:.0f} 个百分点:看看模型、提示词或业务规则是不是变了"
    return note


def cost_line(usage: dict) -> str:
    if not usage["calls"]:
        return "模型成本:还没有模型调用记录(llm_usage 是空的)"
    price = price_per_1k_tokens()
    tokens = usage["input_tokens"] + usage["output_tokens"]
    cost = tokens / 1000 * price
    per_event = cost / usage["events"] if usage["events"] else cost
    return (f"模型成本:调用 {usage['calls']} 次,token 输入 {usage['input_tokens']} / 输出 {usage['output_tokens']},"
            f"约 ¥{cost:.4f};{usage['events']} 个事件,平均每个事件 ¥{per_event:.4f}"
            f"(按 ¥{price:g}/千 token 估算,见 LLM_PRICE_PER_1K_TOKENS)")


def post_to_slack(url: str, text: str, timeout: float) -> None:
    """POST {"text": 日报}。连不上、超时、对方回非 2xx 都抛 SlackError;错误里不带完整 URL(路径里有密钥)。
    整个请求(连接、发送、读完回答)最多 timeout 秒:httpx 的 timeout 只管每一次读写,对方每秒挤一个字节的话
    原来能一直拖下去(试过 SLACK_TIMEOUT_S=3 时等了 41 秒)。所以请求放在一个后台线程里,这里只等 timeout 秒;
    到点还没回完就说超时,那个线程不再管(守护线程,进程退出时跟着结束)。"""
    where = _host_of(url)
    answer: queue.Queue = queue.Queue()

    def send() -> None:
        try:
            answer.put(httpx.post(url, json={"text": slack_text(text)}, timeout=timeout))
        except Exception as e:  # noqa: BLE001 —— 交给下面按种类说
            answer.put(e)

    threading.Thread(target=send, name="slack", daemon=True).start()
    try:
        r = answer.get(timeout=timeout)
    except queue.Empty:
        r = httpx.TimeoutException("whole request took too long")
    if isinstance(r, httpx.TimeoutException):
        raise SlackError(f"发送到 Slack({where})超时:{timeout:g} 秒没有回应") from r
    if isinstance(r, (httpx.HTTPError, httpx.InvalidURL)):
        raise SlackError(f"连不上 Slack({where}):{r or type(r).__name__}(检查 SLACK_WEBHOOK_URL 和网络"
                         f"{config.proxy_note(url)})") from r
    if isinstance(r, Exception):
        raise r
    if not r.is_success:
        raise SlackError(f"Slack({where})拒绝了日报:HTTP {r.status_code} {r.text.strip()[:200]}")


def slack_text(text: str) -> str:
    """日报原样显示在 Slack 里:Slack 把 & < > 当控制字符(<!channel> 通知整个频道,<…> 是链接),要写成 &amp; &lt; &gt;。
    邮件的 Message-ID 是客户写的(<!channel> 也行),原来原样发过去,Slack 里的事件号也丢了两边的尖括号、对不上事件表。"""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _host_of(url: str) -> str:
    try:
        u = httpx.URL(url)  # 路径里有密钥,不打印;端口要说(原来连不上 127.0.0.1:1 时只说 http://127.0.0.1)
        return f"{u.scheme}://{u.host}" + (f":{u.port}" if u.port else "")
    except httpx.InvalidURL:
        return "SLACK_WEBHOOK_URL 不是合法的网址"


def report() -> int:
    """report 的 run_once:打印日报;有 SLACK_WEBHOOK_URL 就发过去。返回退出码。"""
    # 设置都先读一遍:不对的话还没打印日报就退出(退出码 2 = 什么都没做),不用等到有待办、有用量时才发现
    url, timeout = report_settings()
    text = build_report()
    print(text, flush=True)
    if url:
        try:
            post_to_slack(url, text, timeout)
        except SlackError as e:
            print(f"日报没有发到 Slack:{e}", file=sys.stderr)
            return EXIT_SLACK_FAILED
        print("已发到 Slack")
    return EXIT_OK


# ---------------------------------------------------------------- 命令行
def main(argv: list[str] | None = None) -> int:
    parser = config.ArgumentParser(description="定时任务:scan 把久未回复的工单入队,report 出日报")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{scan,report}")
    p_scan = sub.add_parser("scan", help=f"把超过 STALE_DAYS(默认 {STALE_DAYS})天没回复的工单入队")
    p_scan.add_argument("--limit", type=int, default=SCAN_LIMIT, help=f"一次最多入队几个(默认 {SCAN_LIMIT})")
    sub.add_parser("report", help="日报:事件状态、队列深度、收件箱等待、死信、处理结果、成本;可发 Slack")
    args = parser.parse_args(argv)
    if args.command == "scan" and args.limit < 1:
        p_scan.error("--limit 至少是 1")
    try:
        # 先读设置、查业务库,再碰事件库:设置不对、业务库不在时连事件库文件都不该建出来(和 email_poller 一样)
        stale_days_setting() if args.command == "scan" else report_settings()
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
