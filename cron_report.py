"""给 cron_jobs.py 的 report() 补上课文「上线以后盯什么」里列出、课文代码没有算的几项,并把日报安全地发到 Slack:收件箱等太久
时的提醒;每类工单的处理结果(accept / edit / ignore,来自练习 4 的 review_log)和最近的 edit 率变化;模型调用的 token 与单事件
成本。日报的几个设置(提醒门槛、列几条死信、最近几天、价格)在打印之前一起读一遍,写错了就什么都不做。发 Slack 的整个请求
有总时限,对方每秒挤一个字节也拖不住 crontab 里的任务;& < > 转义后再发,客户写的 Message-ID 在 Slack 里原样显示、不会变成
@channel;错误信息里不带 webhook 地址的路径(那就是密钥)。"""
import queue
import threading

import httpx

import config
import store_cron

OUTCOME_KINDS = ("accept", "edit", "ignore")  # 每张工单最后是其中一种;response(提意见重写)是途中的,另外说


class SlackError(Exception):
    """日报没能发到 Slack。"""








def report_settings() -> tuple[str, float]:
    """report 用的设置都读一遍,返回 (Slack 地址, 超时);不对就以 SystemExit 退出。"""
    config.value("INBOX_ALERT_HOURS")
    config.value("REPORT_MAX_DEAD_LINES")
    config.value("REPORT_RECENT_DAYS")
    config.value("EDIT_RISE_ALERT_POINTS")
    config.value("LLM_PRICE_PER_1K_TOKENS")
    url = config.value("SLACK_WEBHOOK_URL")  # 路径就是密钥,错误信息里不能带全
    return url, config.value("SLACK_TIMEOUT_S") if url else 0


def alert_note(hours: float) -> str:
    limit = config.value("INBOX_ALERT_HOURS")
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
        asked = f",{o['asked']} 张 Agent 提过问(回答 {o['answers']} 轮)" if o["asked"] else ""  # agent_question.py
        lines.append(f"  {o['category']}:{o['tickets']} 张,{counts},原样批准率 {o['accept'] / o['tickets']:.0%}"
                     + responded + asked + recent_note(o))
    return lines


def recent_note(o: dict) -> str:
    """最近 REPORT_RECENT_DAYS 天这一类的 edit 率,之前也有记录时和之前比;涨得多就提醒。"""
    days, recent = config.value("REPORT_RECENT_DAYS"), o["recent_tickets"]
    if not recent:
        return f";近 {days:g} 天没有"
    rate = o["recent_edit"] / recent
    note = f";近 {days:g} 天 {recent} 张,edit 率 {rate:.0%}"
    if before := o["tickets"] - recent:
        before_rate = (o["edit"] - o["recent_edit"]) / before
        note += f"(之前 {before_rate:.0%})"
        if (rise := (rate - before_rate) * 100) >= config.value("EDIT_RISE_ALERT_POINTS") and rise > 0:
            note += f",涨了 {rise:.0f} 个百分点:看看模型、提示词或业务规则是不是变了"
    return note


def cost_line(usage: dict) -> str:
    if not usage["calls"]:
        return "模型成本:还没有模型调用记录(llm_usage 是空的)"
    price = config.value("LLM_PRICE_PER_1K_TOKENS")
    tokens = usage["input_tokens"] + usage["output_tokens"]
    cost = tokens / 1000 * price
    per_event = cost / usage["events"] if usage["events"] else cost
    return (f"模型成本:调用 {usage['calls']} 次,token 输入 {usage['input_tokens']} / 输出 {usage['output_tokens']},"
            f"约 ¥{cost:.4f};{usage['events']} 个事件,平均每个事件 ¥{per_event:.4f}"
            f"(按 ¥{price:g}/千 token 估算,见 LLM_PRICE_PER_1K_TOKENS)")


def post_to_slack(url: str, text: str, timeout: float) -> None:
    """POST {"text": 日报}。连不上、超时、对方回非 2xx 都抛 SlackError;错误里不带完整 URL(路径里有密钥)。
    整个请求(连接、发送、读完回答)最多 timeout 秒:httpx 的 timeout 只管每一次读写,对方每秒挤一个字节就能
    一直拖下去。所以请求放在一个后台线程里,这里只等 timeout 秒;到点还没回完就说超时,那个线程不再管
    (守护线程,进程退出时跟着结束)。"""
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
    邮件的 Message-ID 是客户写的(<!channel> 也行);不转义的话,Slack 里的事件号还会丢了两边的尖括号、对不上事件表。"""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _host_of(url: str) -> str:
    try:
        u = httpx.URL(url)  # 路径里有密钥,不打印;端口要说(连不上 127.0.0.1:1 时说的是哪个端口)
        return f"{u.scheme}://{u.host}" + (f":{u.port}" if u.port else "")
    except httpx.InvalidURL:
        return "SLACK_WEBHOOK_URL 不是合法的网址"
