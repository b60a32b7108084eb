"""cron_jobs.py 的 scan / report,日报发 Slack(测试里起一个本机 HTTP 接收端),以及 crontab.example 能不能用。"""
import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import date, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import cron_jobs
import store
import store_events
import store_pg
from conftest import LAB, cli, cut_connections, drain, rows, run, write_locked

SEED = json.loads((LAB / "cloudledger_seed.json").read_text(encoding="utf-8"))
EVENTS = "SELECT event_id, source, kind, payload, status FROM events ORDER BY received_at, event_id"


def today() -> str:
    return store.now()[:10]


def old_open_tickets(days: int) -> list[str]:
    """种子数据里开着、至少 days 天的工单,最老的在前(和 scan 的顺序一样)。"""
    found = [t for t in SEED["tickets"] if t["status"] == "open" and t["age_days"] >= days]
    return [t["id"] for t in sorted(found, key=lambda t: (-t["age_days"], t["id"]))]


def stale_event(ticket_id: str, day: str | None = None) -> tuple:
    event_id = f"cron:stale:{ticket_id}:{day or today()}"
    payload = json.dumps({"id": event_id, "type": "ticket.stale", "data": {"ticket_id": ticket_id}})
    return (event_id, "cron", "ticket.stale", payload, "pending")


def execute(sql: str, args: tuple = ()) -> None:
    conn = store.connect()
    try:
        conn.execute(sql, args)
    finally:
        conn.close()


def add_event_with(event_id: str, ticket_id: str, status: str, updated_at: str | None = None,
                   error: str | None = None, kind: str = "ticket.created") -> None:
    store.add_event(event_id, "webhook", kind,
                    json.dumps({"id": event_id, "type": kind, "data": {"ticket_id": ticket_id}}))
    execute("UPDATE events SET status = ?, last_error = ?, updated_at = COALESCE(?, updated_at) WHERE event_id = ?",
            (status, error, updated_at, event_id))


# ---------------------------------------------------------------- scan
def test_scan_enqueues_the_oldest_unreplied_tickets_up_to_the_limit_and_a_same_day_rerun_adds_none(any_lab):
    stale = old_open_tickets(20)
    assert stale == ["T1029", "T1020", "T1010", "T1007", "T1022", "T1002", "T1031", "T1011", "T1038"]
    r = cli(["cron_jobs.py", "scan"], any_lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == ["超过 20 天还开着的工单 9 张,其中没回复过的 9 张,本次入队 5 个",
                                     "没有入队的:超出 --limit 5 4 张"]
    assert rows(EVENTS) == [stale_event(t) for t in stale[:5]]

    again = cli(["cron_jobs.py", "scan"], any_lab)  # 补跑、手动再跑:同一天同一批工单,一个都不多
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.splitlines() == ["超过 20 天还开着的工单 9 张,其中没回复过的 9 张,本次入队 0 个",
                                         "没有入队的:今天已经入过队 5 张,超出 --limit 5 4 张"]
    assert rows(EVENTS) == [stale_event(t) for t in stale[:5]]


def test_tickets_enqueued_today_by_a_larger_limit_are_counted_as_enqueued_today_not_over_the_limit(lab):
    """同一天先用小的、再用大的、再用默认的 --limit:每次说明里的几项加起来都是没回复过的 9 张,今天入过队的
    不会被说成「超出 --limit」(--limit 9 之后再跑默认的 5,入过队的 4 张不算超出)。"""
    stale = old_open_tickets(20)
    expected = [
        (["--limit", "3"], 3, "没有入队的:超出 --limit 3 6 张"),
        (["--limit", "9"], 6, "没有入队的:今天已经入过队 3 张"),
        ([], 0, "没有入队的:今天已经入过队 9 张"),
        (["--limit", "2"], 0, "没有入队的:今天已经入过队 9 张"),
    ]
    for args, enqueued, held in expected:
        r = cli(["cron_jobs.py", "scan", *args], lab)
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines() == [f"超过 20 天还开着的工单 9 张,其中没回复过的 9 张,本次入队 {enqueued} 个", held]
    assert sorted(rows(EVENTS)) == sorted(stale_event(t) for t in stale)


def test_scan_on_a_write_locked_database_says_so_in_one_line_and_enqueues_nothing_while_report_still_works(lab):
    """事件库被别人占着写锁超过 BUSY_TIMEOUT_S(有人在 sqlite3 里改了东西没提交):scan 一行说明、退出码 3,一个都没入队;
    只读的 report 照样出(WAL 下读不等写锁)。锁放开之后 scan 照常。"""
    env = {**lab, "BUSY_TIMEOUT_S": "0.2"}
    with write_locked():  # 新进程:本进程留着的连接是按默认的 BUSY_TIMEOUT_S 打开的
        scan = run(["cron_jobs.py", "scan"], env)
        report = run(["cron_jobs.py", "report"], env)
    assert (scan.returncode, scan.stdout) == (3, "")
    assert scan.stderr == ("数据库暂时用不了(OperationalError: database is locked),"
                           "scan 没有做完,稍后再跑(同一天重跑不会重复入队)\n")
    assert (report.returncode, report.stderr) == (0, "")
    unlocked = cli(["cron_jobs.py", "report"], lab)
    assert report.stdout.splitlines()[1:] == unlocked.stdout.splitlines()[1:]  # 第一行是时间
    assert rows(EVENTS) == []
    again = cli(["cron_jobs.py", "scan"], lab)
    assert (again.returncode, again.stderr) == (0, "")
    assert rows(EVENTS) == [stale_event(t) for t in old_open_tickets(20)[:5]]


@pytest.mark.parametrize("command, then", [
    ("scan", "scan 没有做完,稍后再跑(同一天重跑不会重复入队)"),
    ("report", "没有出日报,稍后再跑"),
])
def test_cut_database_connections_stop_the_job_in_one_line_with_exit_3_and_the_next_run_works(pg_lab, monkeypatch,
                                                                                              capsys, command, then):
    """PostgreSQL 重启、连接在服务器那头被掐断之后,cron 任务用上了死连接:一行说明、退出码 3,没有 traceback,
    什么都没写;下一次(crontab 明天、或者手动再跑)照常。"""
    monkeypatch.setenv("PG_IDLE_CHECK_S", "86400")  # 借连接前不查,死连接一定会被用上
    store_pg.close_pools()
    assert rows(EVENTS) == []  # 开好连接池
    assert cut_connections(os.getpid()) >= 1
    assert cron_jobs.main([command]) == 3
    assert capsys.readouterr() == (
        "", f"数据库暂时用不了(AdminShutdown: terminating connection due to administrator command),{then}\n")
    assert rows(EVENTS) == []
    assert cron_jobs.main([command]) == 0
    assert capsys.readouterr().err == ""
    assert rows(EVENTS) == ([stale_event(t) for t in old_open_tickets(20)[:5]] if command == "scan" else [])


def test_scan_uses_stale_days_and_limit(lab):
    r = cli(["cron_jobs.py", "scan", "--limit", "1"], {**lab, "STALE_DAYS": "40"})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == ["超过 40 天还开着的工单 2 张,其中没回复过的 2 张,本次入队 1 个",
                                     "没有入队的:超出 --limit 1 1 张"]
    assert rows(EVENTS) == [stale_event("T1029")]


def test_scan_names_open_tickets_whose_created_at_is_not_a_date_and_does_not_enqueue_them(any_lab):
    """BIZ_DB 指着别的系统的库,日期写法不一样:说出来、不入队;日期对的照常扫。防的是:按字符串和截止日比,
    ''、'15/11/2026'、'1893456000'(2030 年的 unix 时间)都「早于」截止日,悄悄当成久未回复入队,一句提示都没有。"""
    conn = store.connect(store.biz_target())
    for ticket_id, created_at in (("X1", ""), ("X2", "15/11/2026"), ("X3", "1893456000"), ("X4", "2026-02-30")):
        conn.execute("INSERT INTO tickets (id, customer_id, subject, body, status, created_at) "
                     "SELECT ?, customer_id, subject, body, 'open', ? FROM tickets WHERE id = 'T1029'",
                     (ticket_id, created_at))
    conn.close()
    r = cli(["cron_jobs.py", "scan", "--limit", "1"], {**any_lab, "STALE_DAYS": "40"})
    assert (r.returncode, r.stdout.splitlines(), r.stderr) == (0, [
        "超过 40 天还开着的工单 2 张,其中没回复过的 2 张,本次入队 1 个", "没有入队的:超出 --limit 1 1 张"],
        "业务库里 4 张开着的工单 created_at 不是 YYYY-MM-DD 开头的日期,算不出开了几天,没有算进来:X1=''、X2='15/11/2026'、"
        "X3='1893456000'……(改成 YYYY-MM-DD 才扫得到)\n")
    assert rows(EVENTS) == [stale_event("T1029")]


def test_scan_in_a_log_file_puts_its_summary_before_the_note_about_odd_dates(lab, tmp_path):
    """crontab 里是 >> cron.log 2>&1:标准输出写进文件时攒满一块才写的话,标准错误上的说明会跑到结果前面。"""
    conn = store.connect(store.biz_target())
    conn.execute("INSERT INTO tickets (id, customer_id, subject, body, status, created_at) "
                 "SELECT 'X2', customer_id, subject, body, 'open', '15/11/2026' FROM tickets WHERE id = 'T1029'")
    conn.close()
    log = tmp_path / "cron.log"
    cron_env = {k: v for k, v in lab.items() if k != "PYTHONUNBUFFERED"}  # cron 的环境里没有它
    with log.open("ab") as f:
        r = subprocess.run([sys.executable, "cron_jobs.py", "scan", "--limit", "1"], cwd=LAB, stdout=f,
                           stderr=subprocess.STDOUT, env={**cron_env, "STALE_DAYS": "40"}, timeout=120)
    assert r.returncode == 0
    assert log.read_text(encoding="utf-8").splitlines() == [
        "超过 40 天还开着的工单 2 张,其中没回复过的 2 张,本次入队 1 个", "没有入队的:超出 --limit 1 1 张",
        "业务库里 1 张开着的工单 created_at 不是 YYYY-MM-DD 开头的日期,算不出开了几天,没有算进来:X2='15/11/2026'"
        "(改成 YYYY-MM-DD 才扫得到)"]


def test_scan_dates_timestamptz_tickets_in_utc_whatever_the_sessions_time_zone(pg_lab):
    """PostgreSQL 里工单表的 created_at 是 timestamptz 时,psycopg 按会话的时区给出时间(国内的服务器多半默认
    Asia/Shanghai)。日期一律按 UTC;按会话的时区取日期的话,UTC 晚上 8 点建的工单成了第二天,
    刚好 40 天的那张扫不到,换台服务器结果就不同。"""
    import psycopg

    day = date.fromisoformat(today()) - timedelta(days=40)
    with psycopg.connect(pg_lab["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SET timezone = 'UTC'")
        conn.execute("ALTER TABLE tickets ALTER COLUMN created_at TYPE timestamptz USING created_at::timestamptz")
        conn.execute("INSERT INTO tickets (id, customer_id, subject, body, status, created_at) "
                     "SELECT 'X1', customer_id, subject, body, 'open', %s FROM tickets WHERE id = 'T1029'",
                     (datetime(day.year, day.month, day.day, 20, tzinfo=timezone.utc),))
    for zone in ("UTC", "Asia/Shanghai"):
        r = cli(["cron_jobs.py", "scan", "--limit", "1"], {**pg_lab, "STALE_DAYS": "40", "PGTZ": zone})
        assert (r.returncode, r.stderr) == (0, ""), zone
        assert r.stdout.splitlines()[0].startswith("超过 40 天还开着的工单 3 张,其中没回复过的 3 张,"), (zone, r.stdout)


def test_scan_dates_text_timestamps_with_an_offset_in_utc_like_timestamptz(lab):
    """别的系统导出的 created_at 是带时区的文字(「…T07:30:00+08:00」):和 timestamptz 一样按 UTC 的日子。只取前 10 个字的话,
    UTC 前一天晚上 11 点半建的工单成了第二天,刚好 40 天的那张扫不到;同一时刻写成 UTC 的那张却扫得到。"""
    day = date.fromisoformat(today()) - timedelta(days=40)
    conn = store.connect(store.biz_target())
    for ticket, written in (("X1", f"{day + timedelta(days=1)}T07:30:00+08:00"), ("X2", f"{day}T23:30:00Z")):
        conn.execute("INSERT INTO tickets (id, customer_id, subject, body, status, created_at) "
                     "SELECT ?, customer_id, subject, body, 'open', ? FROM tickets WHERE id = 'T1029'", (ticket, written))
    conn.close()
    r = cli(["cron_jobs.py", "scan", "--limit", "1"], {**lab, "STALE_DAYS": "40"})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == ["超过 40 天还开着的工单 4 张,其中没回复过的 4 张,本次入队 1 个", "没有入队的:超出 --limit 1 3 张"]


def test_scan_leaves_out_replied_ignored_and_already_queued_tickets(any_lab):
    store.record_reply("T1029", "已经回复过了", "agent+reviewer",
                       {"category": "refund", "draft": "已经回复过了", "final": "已经回复过了", "action": "accept"})
    add_event_with("evt_T1020_created", "T1020", "ignored")          # 客服在收件箱里选了不回
    add_event_with("evt_T1010_created", "T1010", "waiting_human")    # 正在收件箱里等人
    yesterday = (date.fromisoformat(today()) - timedelta(days=1)).isoformat()
    add_event_with(f"cron:stale:T1007:{yesterday}", "T1007", "pending", kind="ticket.stale")  # 昨天的提醒还没处理
    # 昨天的提醒试了 MAX_ATTEMPTS 次进了死信:要人查清后 --requeue-dead,今天的扫描不能绕过死信再入队、再调模型
    add_event_with(f"cron:stale:T1022:{yesterday}", "T1022", "dead", kind="ticket.stale")
    r = cli(["cron_jobs.py", "scan"], any_lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [
        "超过 20 天还开着的工单 9 张,其中没回复过的 8 张,本次入队 4 个",
        "没有入队的:已在队列或收件箱里 2 张,客服选了不回 1 张,在死信里 1 张(查清原因后 uv run python worker.py --requeue-dead)"]
    new = [e[0] for e in rows(EVENTS) if e[0].endswith(today())]
    assert new == [stale_event(t)[0] for t in ("T1002", "T1031", "T1011", "T1038")]
    # 死信放回队列之后,它就是「已在队列里」;今天入队的 4 个算今天这次扫描自己的,重跑照旧挑出它们,不重复入队
    assert store_events.requeue_dead() == 1
    again = cli(["cron_jobs.py", "scan"], any_lab)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.splitlines() == ["超过 20 天还开着的工单 9 张,其中没回复过的 8 张,本次入队 0 个",
                                         "没有入队的:今天已经入过队 4 张,已在队列或收件箱里 3 张,客服选了不回 1 张"]
    assert [e[0] for e in rows(EVENTS) if e[0].endswith(today())] == new


def test_the_next_days_scan_enqueues_what_the_limit_left_out_and_the_report_flags_yesterdays_waiting_reminders(
        any_lab, monkeypatch):
    """课文自测 4:id 带日期,明天还没处理的再提醒一次。第一天 --limit 5 入队 5 张、worker 起草进收件箱,另外 4 张没轮上。
    第二天的扫描换了日期:没轮上的 4 张入队;昨天那 5 张的跟进还在收件箱里等人,不再起草第二份(一张工单一个 thread),
    第二天的日报说它们等了一天多、该提醒值班的人了。"""
    day1 = today()
    first = cli(["cron_jobs.py", "scan"], any_lab)
    assert first.stdout.splitlines() == ["超过 20 天还开着的工单 9 张,其中没回复过的 9 张,本次入队 5 个",
                                         "没有入队的:超出 --limit 5 4 张"]
    reminded = ["T1029", "T1020", "T1010", "T1007", "T1022"]
    assert drain() == [(stale_event(t, day1)[0], "waiting_human") for t in reminded]

    real_now = store.now
    monkeypatch.setattr(store, "now", lambda: store.stamp(store.parse_time(real_now()) + timedelta(days=1)))
    day2 = today()
    assert day2 == (date.fromisoformat(day1) + timedelta(days=1)).isoformat()
    assert cron_jobs.scan()["enqueued"] == ["T1002", "T1031", "T1011", "T1038"]
    assert [e[0] for e in rows(EVENTS) if e[0].endswith(day2)] == [
        stale_event(t, day2)[0] for t in ("T1002", "T1031", "T1011", "T1038")]
    assert rows("SELECT COUNT(*) FROM events") == [(9,)]  # 收件箱里的 5 张没有第二个事件

    moment = store.parse_time(real_now()) + timedelta(hours=25)
    report = cron_jobs.build_report(moment=moment).splitlines()
    assert (f"收件箱里等得最久的:cron:stale:T1029:{day1},已等 25.0 小时(超过 24 小时,该提醒值班的人了)(收件箱共 5 条)"
            in report)


def test_worker_drafts_an_apologising_follow_up_for_stale_tickets(lab):
    assert cli(["cron_jobs.py", "scan", "--limit", "1"], lab).returncode == 0
    store.add_event("evt_T1041_created", "webhook", "ticket.created",
                    json.dumps({"id": "evt_T1041_created", "type": "ticket.created", "data": {"ticket_id": "T1041"}}))
    w = cli(["worker.py", "--once"], lab)
    assert (w.returncode, w.stdout.splitlines()) == (0, [f"cron:stale:T1029:{today()} → waiting_human",
                                                        "evt_T1041_created → waiting_human"])
    listing = cli(["inbox.py", "list"], lab).stdout.splitlines()
    assert listing[0:2] == ["T1029  [refund] 客户反映:退费审核通过迟迟没到账",
                            "        草稿:您好,让您久等了,非常抱歉。关于您提到的扣款和退款问题,我们已转交财务核实扣款记录,"
                            "核实后会按原支付渠道处理,进度会在 1–3 个工作日内通过工单告知您。感谢您的耐心。"]
    assert listing[2:4] == ["T1041  [refund] 客户反映:同一笔账单被扣了两次",
                            "        草稿:您好,关于您提到的扣款和退款问题,我们已转交财务核实扣款记录,"
                            "核实后会按原支付渠道处理,进度会在 1–3 个工作日内通过工单告知您。感谢您的耐心。"]


@pytest.mark.parametrize("args, env, code, message", [
    (["scan", "--limit", "0"], {}, 2, "cron_jobs.py scan:错误:--limit 至少是 1"),
    (["scan", "--limit", "many"], {}, 2, "cron_jobs.py scan:错误:--limit 要的是整数,不是 'many'"),
    ([], {}, 2, "cron_jobs.py:错误:缺少参数:{scan,report}"),
    (["bogus"], {}, 2, "cron_jobs.py:错误:{scan,report} 没有 'bogus' 这一项(可选:'scan', 'report')"),
    (["scan", "--bogus"], {}, 2, "cron_jobs.py:错误:不认识的参数:--bogus"),
    (["scan"], {"STALE_DAYS": "abc"}, 2, "配置错误:STALE_DAYS='abc' 不是数字"),
    (["scan"], {"STALE_DAYS": "-3"}, 2, "配置错误:STALE_DAYS='-3' 不能小于 0"),
    (["scan"], {"STALE_DAYS": "nan"}, 2, "配置错误:STALE_DAYS='nan' 不是数字"),
    (["scan"], {"STALE_DAYS": "1000000"}, 2, "配置错误:STALE_DAYS='1000000' 不能大于 36500"),
    # report 先读完它的设置:不对就什么都不打印(不等有待办、有用量、要发 Slack 时才发现)
    (["report"], {"INBOX_ALERT_HOURS": "abc"}, 2, "配置错误:INBOX_ALERT_HOURS='abc' 不是数字"),
    (["report"], {"LLM_PRICE_PER_1K_TOKENS": "-0.1"}, 2, "配置错误:LLM_PRICE_PER_1K_TOKENS='-0.1' 不能小于 0"),
    (["report"], {"REPORT_RECENT_DAYS": "0"}, 2, "配置错误:REPORT_RECENT_DAYS='0' 不能小于 1"),
    (["report"], {"EDIT_RISE_ALERT_POINTS": "lots"}, 2, "配置错误:EDIT_RISE_ALERT_POINTS='lots' 不是数字"),
    (["report"], {"SLACK_WEBHOOK_URL": "http://127.0.0.1:9/hook", "SLACK_TIMEOUT_S": "abc"}, 2,
     "配置错误:SLACK_TIMEOUT_S='abc' 不是数字"),
    # Slack 地址写错也是设置不对(不是日报打印完才发现、退出码 1,像是 Slack 那边出了错);路径是密钥,只露开头
    (["report"], {"SLACK_WEBHOOK_URL": "http://[::1/services/T000/B000/SECRETTOKEN"}, 2,
     "配置错误:SLACK_WEBHOOK_URL='http://[::1/serv…' 不是合法的网址(Invalid IPv6 URL)"),
    (["report"], {"SLACK_WEBHOOK_URL": "hooks.slack.com/services/T000/B000/SECRETTOKEN"}, 2,
     "配置错误:SLACK_WEBHOOK_URL='hooks.slack.com/…' 不是合法的网址(要以 http:// 或 https:// 开头,后面是主机名)"),
    # idna 编不出来的主机名:不是日报打印完才来一个 UnicodeError traceback、退出码 1
    (["report"], {"SLACK_WEBHOOK_URL": "https://hooks..slack.com/services/T000/B000/SECRETTOKEN"}, 2,
     "配置错误:SLACK_WEBHOOK_URL='https://hooks..s…' 不是合法的网址(主机名有一段是空的(连着两个点、以点开头)"
     "或者超过 63 个字符)"),
    # 网址中间夹着制表符(复制时带进来的):urlsplit 会悄悄删掉它,不能等日报打印完才「连不上 Slack」、退出码 1
    (["report"], {"SLACK_WEBHOOK_URL": "http://127.0.0.1:9/ser\tvices/T000/B000/SECRETTOKEN"}, 2,
     "配置错误:SLACK_WEBHOOK_URL='http://127.0.0.1…' 不是合法的网址(里面有空白或控制字符 '\\t',多半是复制时带进来的)"),
])
def test_bad_arguments_and_settings_exit_2_before_anything_is_printed_or_enqueued(lab, tmp_path, args, env, code,
                                                                                  message):
    fresh = tmp_path / "fresh-events.db"  # 还没有的事件库:设置不对时连文件都不该建出来
    r = cli(["cron_jobs.py", *args], {**lab, **env, "EVENTS_DB": str(fresh)})
    assert (r.returncode, r.stdout) == (code, "")
    assert not fresh.exists()
    if message.startswith("配置错误"):
        assert r.stderr == message + "\n"
    else:  # 命令行写错:中文的用法在前,错误在最后一行
        assert r.stderr.startswith("用法:cron_jobs.py") and r.stderr.endswith("\n" + message + "\n")
    assert rows(EVENTS) == []


def test_scan_without_business_database_says_how_to_build_it(lab, tmp_path):
    missing = tmp_path / "gone.db"
    r = cli(["cron_jobs.py", "scan"], {**lab, "BIZ_DB": str(missing)})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"业务库不存在:{missing}(先运行 uv run python store.py 建库)\n"
    assert rows(EVENTS) == [] and not missing.exists()


def test_scan_without_business_database_does_not_create_the_event_database(lab, tmp_path):
    """先查业务库、再建事件库:退出码 2 说「什么都没做」,事件库文件也就真的没建出来(和 email_poller 一样)。"""
    missing, fresh = tmp_path / "gone.db", tmp_path / "fresh-events.db"
    r = cli(["cron_jobs.py", "scan"], {**lab, "BIZ_DB": str(missing), "EVENTS_DB": str(fresh)})
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"业务库不存在:{missing}(先运行 uv run python store.py 建库)\n")
    assert not fresh.exists() and not missing.exists()


# ---------------------------------------------------------------- report
def header(moment: datetime) -> str:
    return f"云簿后台 Agent 日报({moment.strftime('%Y-%m-%d %H:%M')} UTC)"


def test_report_on_an_empty_database(any_lab):
    moment = datetime(2026, 11, 30, 1, 5, tzinfo=timezone.utc)
    assert cron_jobs.build_report(moment=moment).splitlines() == [
        header(moment),
        "事件状态:{}",
        "队列深度:0 个事件等 worker 处理(pending)",
        "收件箱里没有等人处理的待办",
        "死信数:0",
        "处理结果:还没有审核记录(review_log 是空的)",
        "模型成本:还没有模型调用记录(llm_usage 是空的)",
    ]
    r = cli(["cron_jobs.py", "report"], any_lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[1:] == cron_jobs.build_report(moment=moment).splitlines()[1:]


def fill_watch_list_data() -> None:
    """两个 pending、两个在收件箱(一个等了两天)、一个死信、一个 done;四条审核记录;三次模型调用。"""
    add_event_with("evt_T1041_created", "T1041", "pending")
    add_event_with("evt_T1003_created", "T1003", "pending")
    add_event_with("evt_T1012_created", "T1012", "waiting_human", updated_at="2026-11-28T01:00:00.000000+00:00")
    add_event_with("evt_T1025_created", "T1025", "waiting_human", updated_at="2026-11-29T20:00:00.000000+00:00")
    add_event_with("evt_T9999_created", "T9999", "dead", error="PermanentError: 工单不存在:T9999")
    add_event_with("evt_T1002_created", "T1002", "done")
    for ticket, category, action, feedback in (("T1002", "refund", "accept", []),
                                               ("T1017", "refund", "edit", ["别写金额", "语气软一点"]),
                                               ("T1028", "invoice", "ignore", []),
                                               ("T1023", "refund", "accept", ["先道歉"])):
        execute("INSERT INTO review_log (ticket_id, category, draft, final, action, feedback, created_at) "
                "VALUES (?, ?, '草稿', '终稿', ?, ?, ?)", (ticket, category, action, json.dumps(feedback), store.now()))
    store_events.record_usage("evt_T1041_created", "T1041", "deepseek-flash", 300, 100)
    store_events.record_usage("evt_T1041_created", "T1041", "deepseek-flash", 320, 120)
    store_events.record_usage("evt_T1003_created", "T1003", "deepseek-flash", 280, 90)


WATCH_LIST = [
    "事件状态:{'pending': 2, 'waiting_human': 2, 'done': 1, 'dead': 1}",
    "队列深度:2 个事件等 worker 处理(pending)",
    "收件箱里等得最久的:evt_T1012_created,已等 48.1 小时(超过 24 小时,该提醒值班的人了)(收件箱共 2 条)",
    "死信数:1",
    "死信:evt_T9999_created  PermanentError: 工单不存在:T9999",
    "处理结果(按类别):",
    "  invoice:1 张,accept 0,edit 0,ignore 1,原样批准率 0%;近 7 天 1 张,edit 率 0%",
    "  refund:3 张,accept 2,edit 1,ignore 0,原样批准率 67%,其中 2 张提过意见重写(response 共 3 轮);"
    "近 7 天 3 张,edit 率 33%",
]


def test_report_counts_notify_items_apart_from_the_approval_rate_of_their_category(any_lab):
    """通知类待办只能 ignore(看过即可)。它单独一行,类别里只算有草稿可批的待办;
    算进 ignore 的话,每一条都把它那一类的「原样批准率」往下拉。"""
    for ticket, category, action in (("T1002", "refund", "accept"), ("T1010", "refund", "notify"),
                                     ("M51677e", "bug", "notify")):
        execute("INSERT INTO review_log (ticket_id, category, draft, final, action, feedback, created_at) "
                "VALUES (?, ?, '', NULL, ?, '[]', ?)", (ticket, category, action, store.now()))
    moment = datetime.now(timezone.utc)
    assert cron_jobs.build_report(moment=moment).splitlines()[5:8] == [
        "处理结果(按类别):",
        "  refund:1 张,accept 1,edit 0,ignore 0,原样批准率 100%;近 7 天 1 张,edit 率 0%",
        "  通知类待办:2 条看过了(没有草稿,不算批准率)",
    ]


def test_report_shows_queue_depth_inbox_wait_dead_letters_outcomes_per_category_and_cost(any_lab, monkeypatch):
    fill_watch_list_data()
    moment = datetime(2026, 11, 30, 1, 5, tzinfo=timezone.utc)
    assert cron_jobs.build_report(moment=moment).splitlines() == [header(moment), *WATCH_LIST,
        "模型成本:调用 3 次,token 输入 900 / 输出 310,约 ¥0.0024;2 个事件,平均每个事件 ¥0.0012"
        "(按 ¥0.002/千 token 估算,见 LLM_PRICE_PER_1K_TOKENS)"]
    monkeypatch.setenv("LLM_PRICE_PER_1K_TOKENS", "0.004")
    assert cron_jobs.build_report(moment=moment).splitlines()[-1] == (
        "模型成本:调用 3 次,token 输入 900 / 输出 310,约 ¥0.0048;2 个事件,平均每个事件 ¥0.0024"
        "(按 ¥0.004/千 token 估算,见 LLM_PRICE_PER_1K_TOKENS)")
    monkeypatch.setenv("INBOX_ALERT_HOURS", "72")
    assert cron_jobs.build_report(moment=moment).splitlines()[3] == (
        "收件箱里等得最久的:evt_T1012_created,已等 48.1 小时(收件箱共 2 条)")
    # 等了 48 小时 5 分(48.08),打印的是 48.1:按打印的数比,说「已等 48.1 小时」就要提醒
    monkeypatch.setenv("INBOX_ALERT_HOURS", "48.1")
    assert cron_jobs.build_report(moment=moment).splitlines()[3] == (
        "收件箱里等得最久的:evt_T1012_created,已等 48.1 小时(超过 48.1 小时,该提醒值班的人了)(收件箱共 2 条)")


def test_report_lists_at_most_report_max_dead_lines_dead_letters_one_line_each(lab, monkeypatch):
    """API key 半夜过期,一早 25 条积压全在死信里,原因还是好几行的:全列出来的话日报翻不到底(发给 Slack 的
    也超过一条消息的长度),多行的原因还把日报拆成不像死信的几行。所以每条一行(原因的第一行),最多
    REPORT_MAX_DEAD_LINES 条(默认 20),其余的说还有几条、去哪里看。"""
    for i in range(25):
        add_event_with(f"evt_T{2000 + i}_created", f"T{2000 + i}", "dead",
                       updated_at=f"2026-11-30T00:{i:02d}:00.000000+00:00",
                       error="OpenAIAuthenticationError: Error code: 401\nTraceback (most recent call last):\n  ...")
    moment = datetime(2026, 11, 30, 1, 5, tzinfo=timezone.utc)
    lines = cron_jobs.build_report(moment=moment).splitlines()
    start = lines.index("死信数:25")
    assert lines[start + 1:start + 23] == [
        *(f"死信:evt_T{2000 + i}_created  OpenAIAuthenticationError: Error code: 401" for i in range(20)),
        "死信:还有 5 条没有列出(REPORT_MAX_DEAD_LINES=20),事件表里 status 是 dead 的就是;"
        "查清原因后 uv run python worker.py --requeue-dead 放回队列",
        "处理结果:还没有审核记录(review_log 是空的)"]
    monkeypatch.setenv("REPORT_MAX_DEAD_LINES", "30")
    assert len([x for x in cron_jobs.build_report(moment=moment).splitlines() if x.startswith("死信:")]) == 25
    r = cli(["cron_jobs.py", "report"], {**lab, "REPORT_MAX_DEAD_LINES": "0"})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith("配置错误:REPORT_MAX_DEAD_LINES=")


def test_report_flags_a_category_whose_edit_rate_jumped_this_week_although_its_history_hides_it(any_lab,
                                                                                                  monkeypatch):
    """课文自测 6:某一类 edit 率一周里从 10% 涨到 40%。全部历史合起来只是 15 张里 3 张(20%),
    只看这个数看不出来;日报另算最近 REPORT_RECENT_DAYS 天,和之前比,涨得多就提醒。"""
    moment = datetime(2026, 11, 30, 1, 5, tzinfo=timezone.utc)
    old, recent = store.stamp(moment - timedelta(days=30)), store.stamp(moment - timedelta(days=2))
    reviews = ([("refund", "edit" if i == 0 else "accept", old) for i in range(10)]
               + [("refund", "edit" if i < 2 else "accept", recent) for i in range(5)]
               + [("invoice", "accept", old)] * 2)
    for i, (category, action, created_at) in enumerate(reviews):
        execute("INSERT INTO review_log (ticket_id, category, draft, final, action, feedback, created_at) "
                "VALUES (?, ?, '草稿', '终稿', ?, '[]', ?)", (f"T9{i:03d}", category, action, created_at))
    outcomes = cron_jobs.build_report(moment=moment).splitlines()[5:8]
    assert outcomes == [
        "处理结果(按类别):",
        "  invoice:2 张,accept 2,edit 0,ignore 0,原样批准率 100%;近 7 天没有",
        "  refund:15 张,accept 12,edit 3,ignore 0,原样批准率 80%;近 7 天 5 张,edit 率 40%(之前 10%),"
        "涨了 30 个百分点:看看模型、提示词或业务规则是不是变了"]
    monkeypatch.setenv("EDIT_RISE_ALERT_POINTS", "31")  # 门槛比涨幅高:只报数,不提醒
    assert cron_jobs.build_report(moment=moment).splitlines()[7] == (
        "  refund:15 张,accept 12,edit 3,ignore 0,原样批准率 80%;近 7 天 5 张,edit 率 40%(之前 10%)")
    monkeypatch.setenv("REPORT_RECENT_DAYS", "60")  # 窗口包住全部记录:没有「之前」可比
    assert cron_jobs.build_report(moment=moment).splitlines()[7] == (
        "  refund:15 张,accept 12,edit 3,ignore 0,原样批准率 80%;近 60 天 15 张,edit 率 20%")


def test_report_command_prints_the_same_report(lab):
    fill_watch_list_data()
    r = cli(["cron_jobs.py", "report"], lab)
    assert (r.returncode, r.stderr) == (0, "")
    expected = cron_jobs.build_report().splitlines()
    hours = re.compile(r"已等 [\d.]+ 小时")
    assert [hours.sub("已等 … 小时", line) for line in r.stdout.splitlines()[1:]] == \
           [hours.sub("已等 … 小时", line) for line in expected[1:]]


# ---------------------------------------------------------------- 发到 Slack
class Receiver:
    """本机的假 Slack:记下收到的 POST,回 status。"""

    def __init__(self, status: int = 200, body: bytes = b"ok"):
        self.received: list[tuple[str, str, bytes]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                data = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, self.headers["Content-Type"], data))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/SECRETTOKEN"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slack_env(lab):
    return {**lab, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def report_to_slack(env: dict) -> tuple[subprocess.CompletedProcess, list]:
    """跑 report,发给本机的假 Slack;返回运行结果和假 Slack 收到的请求。"""
    slack = Receiver()
    try:
        return cli(["cron_jobs.py", "report"], {**env, "SLACK_WEBHOOK_URL": slack.url}), slack.received
    finally:
        slack.close()


def test_report_is_posted_to_slack_as_text(slack_env):
    fill_watch_list_data()
    r, received = report_to_slack(slack_env)
    assert (r.returncode, r.stderr) == (0, "")
    report, sent_line = r.stdout.rsplit("\n", 2)[0], r.stdout.splitlines()[-1]
    assert sent_line == "已发到 Slack"
    assert len(received) == 1
    path, content_type, body = received[0]
    assert (path, content_type) == ("/services/T000/B000/SECRETTOKEN", "application/json")
    assert json.loads(body) == {"text": report}


def test_the_report_shows_in_slack_as_it_is_printed_and_a_customers_message_id_cannot_ping_the_channel(slack_env):
    """Slack 把 & < > 当控制字符:邮件的 Message-ID 是客户写的,<!channel> 原样发过去会通知整个频道;
    <20261122090112.zw01@example.com> 这样平常的也会丢了尖括号、成了链接,和事件表对不上。所以写成 &lt; &gt; &amp;,
    Slack 里显示的和终端打印的一字不差;终端里照旧是原文。"""
    add_event_with("<!channel> & co", "T1012", "waiting_human", updated_at="2026-11-01T01:00:00.000000+00:00")
    r, received = report_to_slack(slack_env)
    assert (r.returncode, r.stderr) == (0, "")
    report = r.stdout.rsplit("\n", 2)[0]
    assert "收件箱里等得最久的:<!channel> & co," in report
    sent = json.loads(received[0][2])["text"]
    assert "收件箱里等得最久的:&lt;!channel&gt; &amp; co," in sent and "<" not in sent
    assert html.unescape(sent) == report  # Slack 显示出来的就是终端里的那份


def test_a_socks_proxy_in_the_environment_is_used_and_named_when_it_is_not_running(slack_env):
    """Clash 之类「复制终端代理命令」设的 all_proxy=socks5://…:走这个代理(装着 socksio),日报打印完不会接着一段 ImportError
    的 traceback;代理没开时一行说明,说出是哪个代理。"""
    proxy = f"socks5://127.0.0.1:{closed_port()}"
    env = {**slack_env, "all_proxy": proxy, "ALL_PROXY": proxy, "NO_PROXY": "", "no_proxy": "",
           "SLACK_WEBHOOK_URL": "https://hooks.slack.invalid/services/T000/B000/SECRETTOKEN"}
    r = cli(["cron_jobs.py", "report"], env)
    assert r.returncode == 1
    assert r.stdout.splitlines()[1:] == cron_jobs.build_report().splitlines()[1:]  # 日报照样打印了
    assert r.stderr == ("日报没有发到 Slack:连不上 Slack(https://hooks.slack.invalid):[Errno 111] Connection refused"
                        f"(检查 SLACK_WEBHOOK_URL 和网络;这个请求走的是环境变量里的代理 {proxy}:代理没开或不通时也是这样,"
                        "不走代理就把主机加进 NO_PROXY)\n")


def silent_port(stack: list) -> int:
    """接受连接但永远不回话的端口。"""
    s = socket.create_server(("127.0.0.1", 0))
    stack.append(s)
    return s.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trickling_port(stack: list) -> int:
    """回了响应头以后,每 0.2 秒才挤出一个字节正文的端口(说好 1000 个字节):每一次读都不超时,整个回答要 200 秒。"""
    s = socket.create_server(("127.0.0.1", 0))
    stack.append(s)

    def serve() -> None:
        try:
            conn, _ = s.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n")
            for _ in range(1000):
                conn.sendall(b"o")
                time.sleep(0.2)
        except OSError:  # 测试结束关了端口,或者客户端走了
            pass

    threading.Thread(target=serve, daemon=True).start()
    return s.getsockname()[1]


@pytest.mark.parametrize("case", ["http 500", "refused", "no answer", "trickle"])
def test_slack_failure_is_reported_after_the_report_exits_non_zero_and_never_hangs(slack_env, case):
    started = time.monotonic()
    assert run(["cron_jobs.py", "report"], slack_env).returncode == 0
    alone = time.monotonic() - started  # 不发 Slack 的日报要多久:下面最多多出 SLACK_TIMEOUT_S=1 秒
    opened: list = []
    slack = Receiver(status=500, body=b"invalid_payload") if case == "http 500" else None
    port = {"refused": closed_port, "no answer": lambda: silent_port(opened),
            "trickle": lambda: trickling_port(opened)}.get(case, lambda: None)()
    url = slack.url if slack else f"http://127.0.0.1:{port}/services/T000/B000/SECRETTOKEN"
    started = time.monotonic()
    try:
        r = run(["cron_jobs.py", "report"], {**slack_env, "SLACK_WEBHOOK_URL": url, "SLACK_TIMEOUT_S": "1"}, timeout=60)
    finally:
        for s in opened:
            s.close()
        if slack:
            slack.close()
    took = time.monotonic() - started
    # 超时用的是 SLACK_TIMEOUT_S(1 秒),不是默认的 10 秒:消息里的「1 秒」是照设置写的,这里量真的等了多久
    assert took < alone + 1 + 4, (took, alone)
    assert r.returncode == 1
    assert r.stdout.splitlines()[1:] == cron_jobs.build_report().splitlines()[1:]  # 日报照样打印了
    where = f"http://127.0.0.1:{url.split(':')[2].split('/')[0]}"  # 主机和端口,不带路径(路径就是密钥)
    expected = {
        "http 500": f"日报没有发到 Slack:Slack({where})拒绝了日报:HTTP 500 invalid_payload",
        "refused": f"日报没有发到 Slack:连不上 Slack({where}):[Errno 111] Connection refused(检查 SLACK_WEBHOOK_URL 和网络)",
        "no answer": f"日报没有发到 Slack:发送到 Slack({where})超时:1 秒没有回应",
        # 对方一直在挤字节,每一次读都不超时:不能等到它挤完(这里 200 秒)
        "trickle": f"日报没有发到 Slack:发送到 Slack({where})超时:1 秒没有回应",
    }[case]
    assert r.stderr == expected + "\n"
    assert "SECRETTOKEN" not in r.stderr  # webhook 地址的路径就是密钥,不能进日志


# ---------------------------------------------------------------- crontab.example
FIELD_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]  # 分 时 日 月 星期(0 和 7 都是星期日)
JOB = re.compile(r"cd /ABSOLUTE/PATH/TO/ambient-agents && /ABSOLUTE/PATH/TO/uv run python (\S+\.py)((?: [\w-]+)*) "
                 r">> cron\.log 2>&1")


def valid_field(text: str, low: int, high: int) -> bool:
    for item in text.split(","):
        m = re.fullmatch(r"(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?", item)
        if not m:
            return False
        numbers = [int(n) for n in (m.group(2), m.group(3)) if n is not None]
        if any(not low <= n <= high for n in numbers) or (len(numbers) == 2 and numbers[0] > numbers[1]):
            return False
        if m.group(4) is not None and int(m.group(4)) == 0:
            return False
    return True


def test_valid_field_rejects_what_cron_rejects():
    assert valid_field("*/5", 0, 59) and valid_field("1-5,10", 0, 23) and valid_field("0", 0, 7)
    assert not any(valid_field(f, 0, 59) for f in ("60", "5-1", "*/0", "a", "", "1,,2"))


def test_crontab_example_has_the_four_jobs_with_valid_schedules_and_runnable_commands(lab):
    text = (LAB / "crontab.example").read_text(encoding="utf-8")
    jobs = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    parsed = []
    for line in jobs:
        fields = line.split(None, 5)
        assert len(fields) == 6, line
        assert all(valid_field(f, lo, hi) for f, (lo, hi) in zip(fields[:5], FIELD_RANGES)), line
        m = JOB.fullmatch(fields[5])
        assert m, f"命令应该是 cd 实验目录 && uv 的绝对路径 run python 脚本 >> cron.log 2>&1:{line}"
        parsed.append((" ".join(fields[:5]), m.group(1) + m.group(2)))
    assert parsed == [("* * * * *", "email_poller.py"), ("* * * * *", "worker.py --once"),
                      ("0 9 * * *", "cron_jobs.py scan"), ("5 9 * * *", "cron_jobs.py report")]
    assert "UTC" in text and "PATH" in text

    uv = shutil.which("uv")
    for line in jobs:  # 把占位符换成真路径,去掉日志重定向,加 --help,像 cron 一样交给 sh 跑
        command = line.split(None, 5)[5].replace(" >> cron.log 2>&1", " --help")
        command = command.replace("/ABSOLUTE/PATH/TO/ambient-agents", str(LAB))
        command = command.replace("/ABSOLUTE/PATH/TO/uv run python", f"{uv} run python" if uv else sys.executable)
        r = subprocess.run(["sh", "-c", command], cwd="/", env=lab, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (command, r.stderr)
        assert r.stdout.startswith("用法:"), command
