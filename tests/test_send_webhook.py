"""send_webhook.py 和 store.py 的命令行:坏参数、服务没起来、对方拒绝,都说清楚,什么都不存。"""
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from conftest import LAB, cli, cut_connections, free_port, proxies_that_are_not_running, rows, run, webhook_server
from test_webhook import unread_in_pipe, webhook_here, writer_pids

import send_webhook
import store
import store_biz
import store_cli
import store_pg
import webhook
import worker_owner


def send(args: list[str], env: dict, url: str) -> subprocess.CompletedProcess:
    """在本进程里跑 send_webhook.py args,发到 url(退出码、标准输出、标准错误和新进程里一样)。"""
    return cli(["send_webhook.py", *args], {**env, "WEBHOOK_URL": url})


@pytest.mark.parametrize("args, problem", [
    ([], "缺少工单号"),
    (["T1012", "0"], "重复次数要是正整数,现在是 '0'"),  # 每一种先说哪里不对,再打印用法
    (["T1012", "two"], "重复次数要是正整数,现在是 'two'"),
    (["T1012", "2", "extra"], "参数太多了"),
    (["T1012", "²"], "重复次数要是正整数,现在是 '²'"),
])
def test_bad_arguments_say_what_is_wrong_print_usage_and_exit_2_without_sending(lab, args, problem):
    with webhook_here() as url:  # 服务开着:参数不对时一个请求也不该发出去
        r = send(args, lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"{problem}\n用法:uv run python send_webhook.py 工单号 [重复次数,正整数]\n"
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


@pytest.mark.parametrize("times", ["101", "99999999999999999999999", "1" + "0" * 5000])  # 5001 位:int() 不肯转
def test_a_repeat_count_over_100_is_refused_and_nothing_is_sent(lab, times):
    """重复次数最多 100:多写几个 0 也不会一直发下去(没有上限的话,走查时发了两万多次才按住)。"""
    with webhook_here() as url:
        r = send(["T1012", times], lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "重复次数最多 100(模拟上游重试,几次就够了)\n用法:uv run python send_webhook.py 工单号 [重复次数,正整数]\n"
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_a_repeat_count_with_thousands_of_leading_zeros_is_just_that_number(lab):
    """超过 4300 位的数字串 int() 不肯转(ValueError 的 traceback):先去掉开头的 0,值是 2 就发两次。"""
    with webhook_here() as url:
        r = send(["T1012", "0" * 5000 + "2"], lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stderr, r.stdout) == (0, "", "202 {'accepted': True, 'duplicate': False}\n"
                                                         "202 {'accepted': True, 'duplicate': True}\n")
    assert rows("SELECT event_id FROM events") == [("evt_T1012_created",)]


@pytest.mark.parametrize("ticket_id", ["--halp", "-T1012", "", "  "])
def test_option_like_or_empty_ticket_id_is_refused_and_nothing_is_sent(lab, ticket_id):
    """以 - 开头的、空的工单号不签也不发:不然 --halp 会被当成工单号发出去,事件表里多一个 evt_--halp_created。"""
    with webhook_here() as url:
        r = send([ticket_id], lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"工单号不能是 {ticket_id!r}\n用法:uv run python send_webhook.py 工单号 [重复次数,正整数]\n"
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


@pytest.mark.parametrize("ticket_id", ["T 1012", "T１２", "T\x01", "A" * 65, "T1012/../x", "工单1"])
def test_a_ticket_id_the_webhook_would_refuse_is_refused_in_chinese_before_sending(lab, ticket_id):
    """webhook 不收的工单号在发之前就用中文说清楚、退出码 2;发出去的话,webhook 回一句英文的 400
    (控制字符时说的还是 id 而不是工单号)。"""
    with webhook_here() as url:
        r = send([ticket_id], lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"工单号只能由英文字母、数字、_ 和 - 组成(最多 64 个),现在是 {ticket_id!r}\n"
                        "用法:uv run python send_webhook.py 工单号 [重复次数,正整数]\n")
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


@pytest.mark.parametrize("args", [["-h"], ["--help"], ["T1012", "-h"], ["T1012", "2", "--help"]])
def test_help_prints_usage_and_sends_nothing(lab, args):
    """-h 写在后面也是要看用法(T1012 -h 不是重复次数 '-h')。"""
    with webhook_here() as url:
        r = send([*args], lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stdout, r.stderr) == (0, "用法:uv run python send_webhook.py 工单号 [重复次数,正整数]\n", "")
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


@pytest.mark.parametrize("url, problem", [
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://127.0.0.1:http/hooks", "Port could not be cast to integer value as 'http'"),
    # 这几种是 WEBHOOK_URL 写错了,不是「webhook 服务没起来」:退出码 2,不让人去查服务
    ("127.0.0.1:8139/hooks/cloudledger", "要以 http:// 或 https:// 开头,后面是主机名"),
    ("ftp://127.0.0.1/hooks", "要以 http:// 或 https:// 开头,后面是主机名"),
    ("http://", "要以 http:// 或 https:// 开头,后面是主机名"),
    # idna 编不出来的主机名:连接之前就说,不是连接时的 UnicodeError traceback
    ("http://a..b/hooks", "主机名有一段是空的(连着两个点、以点开头)或者超过 63 个字符"),
    ("http://hooks\x80.example/hooks", "主机名有域名里不允许的字符:'hooks\\x80'"),
    # 网址里的密码不打印出来,和连不上时一样打成 ***
    ("http://admin:S3cretPW@127.0.0.1:99999/hooks/cloudledger", "Port out of range 0-65535"),
])
def test_malformed_webhook_url_is_a_clear_error_and_nothing_is_sent(lab, url, problem):
    r = send(["T1012"], lab, url)
    assert (r.returncode, r.stdout) == (2, "")
    shown = url.replace(":S3cretPW@", ":***@")
    assert r.stderr == f"配置错误:WEBHOOK_URL={shown!r} 不是合法的网址({problem})\n"
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_a_redirect_says_which_address_to_use_and_nothing_is_stored(lab):
    """WEBHOOK_URL 末尾多了一个 /:FastAPI 回 307 让改发到没有 / 的地址。光一个「307 」看不出哪里不对:说要改发到哪个地址、退出码 1。
    不跟着跳过去(POST 跳转要重发请求体,由人改好设置再发)。"""
    with webhook_here() as url:
        r = send(["T1012"], lab, url + "/hooks/cloudledger/")
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "307 \n", f"对方让改发到 {url}/hooks/cloudledger:把 WEBHOOK_URL 改成这个地址再发\n")
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_a_double_dash_before_the_ticket_id_sends_that_ticket(lab):
    """-- 是「后面都不是选项」的老写法:-- T1012 的工单号是 T1012,不是重复次数。"""
    with webhook_here() as url:
        r = send(["--", "T1012"], lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stdout, r.stderr) == (0, "202 {'accepted': True, 'duplicate': False}\n", "")
    assert rows("SELECT event_id FROM events") == [("evt_T1012_created",)]


def test_a_proxy_set_in_the_terminal_is_not_used_for_the_webhook_on_this_machine(lab):
    """发给本机的请求不走终端里设的代理:走的话,all_proxy 是 socks5:// 而没装 socksio 时是一段 ImportError 的
    traceback,http_proxy 指着没开的代理时说「webhook 服务起来了吗?」,其实 webhook 好好的。"""
    with webhook_here() as url:
        for host in ("127.0.0.1", "localhost"):
            target = url.replace("127.0.0.1", host) + "/hooks/cloudledger"
            r = send(["T1012"], {**lab, **proxies_that_are_not_running()}, target)
            assert (r.returncode, r.stderr) == (0, ""), host
    assert rows("SELECT event_id FROM events") == [("evt_T1012_created",)]


def test_a_proxy_that_is_not_running_is_named_when_the_webhook_is_elsewhere(lab):
    """webhook 在别的机器上、请求走代理、代理没开:报的也是「连不上」,说一句走的是哪个代理,别只让人去查 webhook。"""
    proxies = proxies_that_are_not_running()
    url = "http://webhook.invalid:8139/hooks/cloudledger"
    r = send(["T1012"], {**lab, **proxies}, url)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"发不出去:{url} 连不上(ConnectError: ")
    assert r.stderr.endswith("webhook 服务起来了吗?先在另一个终端运行 uv run uvicorn webhook:app --port 8139;这个请求走的是"
                             f"环境变量里的代理 {proxies['http_proxy']}:代理没开或不通时也是这样,不走代理就把主机加进 NO_PROXY\n")
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_server_not_running_is_one_clear_message_with_the_port_of_webhook_url_and_exit_1(lab):
    """提示的端口是 WEBHOOK_URL 里的那个,不总是 8139。"""
    port = free_port()
    url = f"http://127.0.0.1:{port}/hooks/cloudledger"
    r = send(["T1012"], lab, url)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"发不出去:{url} 连不上(ConnectError: ")
    assert r.stderr.endswith(f"webhook 服务起来了吗?先在另一个终端运行 uv run uvicorn webhook:app --port {port}\n")
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_https_against_the_http_webhook_says_to_use_http_not_that_the_service_is_down(lab):
    """SSL 握手失败说的是改成 http://,不说「webhook 服务起来了吗?」:服务明明在跑。"""
    with webhook_here() as url:
        https = url.replace("http://", "https://") + "/hooks/cloudledger"
        r = send(["T1012"], lab, https)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"发不出去:{https} 连不上(ConnectError: [SSL")
    assert r.stderr.endswith("WEBHOOK_URL 是 https://,可 uv run uvicorn webhook:app 起的服务是 http 的:"
                             "把 WEBHOOK_URL 改成 http://…\n")
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def no_answer_message(url: str, what: str, error: str, ticket_id: str) -> str:
    other = ("" if "没有回答" in what else
             ";要是 WEBHOOK_URL 的端口指到了别的服务(数据库、Redis……),它们不说 HTTP,也是这样断开,先核对 WEBHOOK_URL")
    return (f"没等到回答:请求已经发给 {url},{what}({error})。webhook 可能已经存下了这个事件,"
            f"再发一次同一个事件是安全的(事件 id 不变,已经存下了只会回 duplicate: true):"
            f"uv run python send_webhook.py {ticket_id}{other}\n")


def test_a_delivery_the_webhook_does_not_answer_in_time_says_it_may_be_stored_and_resending_is_safe(lab, monkeypatch):
    """webhook 开着,只是没在时限内回答(写库进程停住了,像事件库被锁着的时候):说事件可能已经存下了、
    再发一次是安全的,退出码 1,而不是「连不上……webhook 服务起来了吗?」(那会让人去起一个已经在跑的服务)。
    照着再发一次,回 duplicate。"""
    with webhook_here() as base:
        url = base + "/hooks/cloudledger"
        writer = webhook.committer.proc.pid
        os.kill(writer, signal.SIGSTOP)
        try:
            with monkeypatch.context() as m:
                m.setattr(send_webhook, "TIMEOUT_S", 1)  # 等回答的时间从 10 秒改成 1 秒,测试不用干等
                r = send(["T1012"], lab, url)
        finally:
            os.kill(writer, signal.SIGCONT)  # 它接着把那一批写完:事件其实存下了,只是回答没人收
        assert (r.returncode, r.stdout) == (1, "")
        assert r.stderr == no_answer_message(url, "但 1 秒内没有回答", "ReadTimeout: timed out", "T1012")
        again = send(["T1012"], lab, url)  # 照提示再发一次
    assert (again.returncode, again.stdout, again.stderr) == (0, "202 {'accepted': True, 'duplicate': True}\n", "")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]


@contextmanager
def waiting_for_the_answer(env: dict, writer: int, url: str, ticket_id: str, **popen):
    """webhook 的写库进程(进程号 writer)停住(SIGSTOP),send_webhook.py(一个新进程)发出去的请求已经交到它手上、
    在等回答:给出 (sender, writer)。出来时写库进程接着跑,把这一批写完。popen:另外给 subprocess.Popen 的参数。"""
    os.kill(writer, signal.SIGSTOP)
    sender = subprocess.Popen([sys.executable, "send_webhook.py", ticket_id], cwd=LAB, env={**env, "WEBHOOK_URL": url},
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    try:
        deadline = time.time() + 30
        while not unread_in_pipe(writer):  # 这一批已经交给(停住的)写库进程了
            assert time.time() < deadline and sender.poll() is None, "请求应该已经到了写库进程那里"
            time.sleep(0.01)
        yield sender, writer
    finally:
        os.kill(writer, signal.SIGCONT)


def test_a_delivery_whose_connection_drops_before_the_answer_says_it_may_be_stored_and_it_was(lab):
    """请求已经交给写库进程,webhook 这时被 kill -9,连接断了:事件其实已经存下了(写库进程照样写完这一批),
    所以说可能已经存下、再发一次是安全的,不说「webhook 服务起来了吗?」;再发一次回 duplicate,只有一行。"""
    with webhook_server(lab) as (proc, base):
        url = base + "/hooks/cloudledger"
        (writer,) = writer_pids(proc.pid)
        with waiting_for_the_answer(lab, writer, url, "T1030") as (sender, _):
            proc.kill()
            proc.wait(timeout=10)
        out, err = sender.communicate(timeout=60)
        deadline = time.time() + 30
        while worker_owner._process_alive(writer):  # 它写完这一批、回话时发现 webhook 不在了,退出
            assert time.time() < deadline, "写库进程应该写完这一批就退出"
            time.sleep(0.05)
    assert (sender.returncode, out) == (1, "")
    assert err == no_answer_message(url, "但还没回答,连接就断了",
                                    "RemoteProtocolError: Server disconnected without sending a response.", "T1030")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1030_created", "pending", 0)]
    with webhook_here() as base:
        again = send(["T1030"], lab, base + "/hooks/cloudledger")
    assert (again.returncode, again.stdout, again.stderr) == (0, "202 {'accepted': True, 'duplicate': True}\n", "")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1030_created", "pending", 0)]


@pytest.mark.parametrize("again_and_again", [False, True], ids=["once", "again-and-again"])
def test_ctrl_c_while_waiting_for_the_answer_is_one_line_exit_130_and_resending_is_a_duplicate(lab, again_and_again):
    """Ctrl-C 是一行说明、退出码 130,没有 KeyboardInterrupt 的 traceback(send_webhook.py 走 config.run)。
    连按几下(或者 uv run 把发给进程组的 SIGINT 再转发一次)也一样:config.run 让 Ctrl-C 只抛一次,之后的不理,
    第二下落在退出途中也不会让进程被信号结束(退出码 -2)。"""
    from test_worker import signal_until_it_exits

    with webhook_here() as base:
        url = base + "/hooks/cloudledger"
        with waiting_for_the_answer(lab, webhook.committer.proc.pid, url, "T1030") as (sender, _):
            if again_and_again:
                out, err = signal_until_it_exits(sender, signal.SIGINT)
            else:
                sender.send_signal(signal.SIGINT)
                out, err = sender.communicate(timeout=30)
        assert (sender.returncode, out, err) == (130, "", "已中断(Ctrl-C)\n")
        again = send(["T1030"], lab, url)
    assert (again.returncode, again.stdout, again.stderr) == (0, "202 {'accepted': True, 'duplicate': True}\n", "")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1030_created", "pending", 0)]


def test_started_with_ctrl_c_ignored_like_a_background_job_it_still_ignores_it_and_delivers(lab):
    """脚本里 `uv run python send_webhook.py T1030 &`:shell 让后台的程序不理 SIGINT。config.run 让 Ctrl-C 只抛一次,
    但本来就不理的照旧不理:收到 SIGINT 也接着等,回答来了照常打印 202,事件存了一行。"""
    with webhook_here() as base:
        url = base + "/hooks/cloudledger"
        with waiting_for_the_answer(lab, webhook.committer.proc.pid, url, "T1030",
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) as (sender, _):
            for _ in range(5):
                sender.send_signal(signal.SIGINT)
                time.sleep(0.05)
            assert sender.poll() is None, "不理 SIGINT 的程序被 Ctrl-C 停下了"
        out, err = sender.communicate(timeout=60)
    assert (sender.returncode, out, err) == (0, "202 {'accepted': True, 'duplicate': False}\n", "")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1030_created", "pending", 0)]


def test_output_closed_early_exits_141_quietly_after_the_delivery_it_made(lab):
    """send_webhook.py T1030 3 | head -0:安静退出,没有 BrokenPipeError 的 traceback。第一次投递存下了,
    打印它的结果时发现没人看,就不再发了(和 cat、grep 一样,退出码 141)。"""
    from test_config import into_a_closed_pipe

    with webhook_here() as base:
        code, err = into_a_closed_pipe(["send_webhook.py", "T1030", "3"], {**lab, "WEBHOOK_URL": base + "/hooks/cloudledger"})
    assert (code, err) == (141, "")
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1030_created", "pending", 0)]


def test_a_webhook_url_pointing_at_a_service_that_does_not_speak_http_says_to_check_the_url(lab):
    """WEBHOOK_URL 的端口写成了别的服务的(这里是一个像 Redis 那样回一行错误就断开的 TCP 服务):除了「webhook
    可能已经存下了」,还多一句先核对 WEBHOOK_URL,不让人以为是 webhook 出了事;退出码 1,什么都没存。"""
    with socket.create_server(("127.0.0.1", 0)) as server:
        def answer_like_redis():
            conn, _ = server.accept()
            with conn:
                # 把整个请求读完再回话、关连接:缓冲区里还有没读的字节时关连接,内核发的是 RST,
                # 客户端看到的就成了 ReadError 而不是「断开了」,消息随调度时机变
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(b"-ERR unknown command 'POST'\r\n")
        threading.Thread(target=answer_like_redis, daemon=True).start()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/hooks/cloudledger"
        r = send(["T1012"], lab, url)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == no_answer_message(url, "但还没回答,连接就断了",
                                         "RemoteProtocolError: Server disconnected without sending a response.",
                                         "T1012")
    assert rows("SELECT event_id FROM events") == []


def test_duplicate_delivery_over_real_http_prints_the_lessons_lines(lab):
    with webhook_here() as url:
        r = send(["T1012", "2"], lab, url + "/hooks/cloudledger")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "202 {'accepted': True, 'duplicate': False}\n202 {'accepted': True, 'duplicate': True}\n"
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]


def test_rejected_delivery_is_printed_and_exits_1(lab, monkeypatch):
    monkeypatch.setenv("WEBHOOK_SECRET", "server-secret")
    with webhook_here() as url:  # 发送方是一个新进程:这个进程的环境变量是 webhook 的(密钥不同)
        r = run(["send_webhook.py", "T1012"], {**lab, "WEBHOOK_URL": url + "/hooks/cloudledger",
                                               "WEBHOOK_SECRET": "client-secret"})
    assert (r.returncode, r.stdout, r.stderr) == (1, "401 {'detail': 'bad signature'}\n", "")
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_store_builds_missing_databases_and_prints_row_counts(tmp_path):
    env = {"EVENTS_DB": str(tmp_path / "e.db"), "CHECKPOINTS_DB": str(tmp_path / "c.db"),
           "BIZ_DB": str(tmp_path / "b.db"), "AMBIENT_NO_DOTENV": "1", "PATH": "/usr/bin:/bin"}
    first = run(["store.py"], env)  # 一个真的进程:退出码和打印的几行
    assert first.returncode == 0, first.stderr
    assert first.stdout == (f"已新建业务库 {tmp_path / 'b.db'}\n"
                            f"事件库 {tmp_path / 'e.db'}:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行\n"
                            f"业务库 {tmp_path / 'b.db'}:customers 30 行,tickets 42 行,invoices 55 行\n")
    again = cli(["store.py"], env)  # 已经有了就不动,也不重建
    assert (again.returncode, again.stdout, again.stderr) == (0, first.stdout.split("\n", 1)[1], "")
    assert rows("SELECT COUNT(*) FROM tickets WHERE status = 'open'", path=tmp_path / "b.db") == [(30,)]


STORE_USAGE = ("用法:uv run python store.py               建好缺的库,打印各表行数\n"
               "      uv run python store.py --from-sqlite  (设了 DATABASE_URL 时)另外把 EVENTS_DB、CHECKPOINTS_DB 里的"
               "事件、发件箱、审核记录和 checkpoint 搬进 PostgreSQL\n")


@pytest.mark.parametrize("args, code, out, err", [
    (["--help"], 0, STORE_USAGE, ""),
    (["-h"], 0, STORE_USAGE, ""),
    (["--reset"], 2, "", "store.py 不认识这些参数:--reset\n" + STORE_USAGE),
    (["init", "now"], 2, "", "store.py 不认识这些参数:init now\n" + STORE_USAGE),
    (["--from-sqlite", "now"], 2, "", "store.py 不认识这些参数:--from-sqlite now\n" + STORE_USAGE),
])
def test_store_with_arguments_prints_usage_and_builds_nothing(tmp_path, args, code, out, err):
    """store.py 认得 -h / --help,别的参数一律不认:打印用法,什么库都不建。"""
    env = {"EVENTS_DB": str(tmp_path / "e.db"), "CHECKPOINTS_DB": str(tmp_path / "c.db"),
           "BIZ_DB": str(tmp_path / "b.db"), "AMBIENT_NO_DOTENV": "1", "PATH": "/usr/bin:/bin"}
    r = cli(["store.py", *args], env)
    assert (r.returncode, r.stdout, r.stderr) == (code, out, err)
    assert list(tmp_path.iterdir()) == []


def test_store_with_cut_database_connections_says_so_in_one_line_and_the_next_run_works(pg_lab, monkeypatch, capsys):
    monkeypatch.setenv("PG_IDLE_CHECK_S", "86400")  # 借连接前不查,死连接一定会被用上
    store_pg.close_pools()
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]  # 开好连接池
    assert cut_connections(os.getpid()) >= 1
    assert store_cli.main() == 1
    assert capsys.readouterr() == ("", "数据库暂时用不了(AdminShutdown: terminating connection due to administrator "
                                       "command),稍后再运行 uv run python store.py(已经建好的不会重建)\n")
    assert store_cli.main() == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(":events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行")


def test_stale_scan_finds_some_but_not_all_open_tickets_whatever_the_build_date(tmp_path):
    from datetime import date

    for day in (date(2026, 1, 1), date(2030, 6, 15)):
        path = tmp_path / f"{day}.db"
        store_biz.build_biz_db(path, today=day)
        ages = [(day - date.fromisoformat(r[0])).days
                for r in rows("SELECT created_at FROM tickets WHERE status = 'open'", path=path)]
        assert 0 < sum(a > 20 for a in ages) < len(ages)


def test_a_learners_own_business_database_is_left_alone(tmp_path):
    own = tmp_path / "mine.db"
    with closing(sqlite3.connect(own)) as conn:
        conn.executescript(store_biz.BIZ_SCHEMA)
    env = {"EVENTS_DB": str(tmp_path / "e.db"), "BIZ_DB": str(own), "AMBIENT_NO_DOTENV": "1", "PATH": "/usr/bin:/bin"}
    r = cli(["store.py"], env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (f"事件库 {tmp_path / 'e.db'}:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行\n"
                        f"业务库 {own}:customers 0 行,tickets 0 行,invoices 0 行\n")


def test_store_builds_the_business_database_over_an_empty_file(tmp_path):
    biz = tmp_path / "b.db"
    biz.touch()  # 旧版 worker 在建库之前运行时会留下这样一个空文件
    env = {"EVENTS_DB": str(tmp_path / "e.db"), "BIZ_DB": str(biz), "AMBIENT_NO_DOTENV": "1", "PATH": "/usr/bin:/bin"}
    r = cli(["store.py"], env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (f"已新建业务库 {biz}\n"
                        f"事件库 {tmp_path / 'e.db'}:events 0 行,outbox 0 行,review_log 0 行,llm_usage 0 行\n"
                        f"业务库 {biz}:customers 30 行,tickets 42 行,invoices 55 行\n")


@pytest.mark.parametrize("which, role", [("EVENTS_DB", "是事件库"), ("CHECKPOINTS_DB", "是 checkpoint 库")])
def test_biz_db_pointing_at_the_events_or_checkpoint_db_says_so_and_never_says_to_delete_it(lab, which, role):
    """BIZ_DB 写成了事件库(或 checkpoint 库)的路径:store.py 说它是哪个库、让 BIZ_DB 指回业务库,
    不说「里没有表……删掉它再运行」(照做就删掉了全部事件和收件箱里的待办);什么都不动,事件照旧在。"""
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    saver, conn = store_pg.open_checkpointer()  # 建出 checkpoint 库(worker 第一次运行时也是这样)
    conn.close()
    path = lab[which]
    message = f"BIZ_DB 指的 {path} {role},不是业务库:让 BIZ_DB 指到业务库(不设就是脚本旁边的 cloudledger.db)\n"
    for command, code in ((["store.py"], 2), (["worker.py", "--once"], 1), (["cron_jobs.py", "scan"], 2)):
        r = cli(command, {**lab, "BIZ_DB": path})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message), command
    assert Path(path).exists()
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]


def test_biz_db_pointing_where_the_checkpoint_db_will_be_is_refused_before_store_builds_anything_there(tmp_path):
    """新目录,worker 还没跑过(checkpoint 库还没建出来),BIZ_DB 却写成了 CHECKPOINTS_DB 的路径:store.py 一开始就说,
    什么都不建。不然它在那里建起业务库、退出码 0,之后 worker 把 LangGraph 的表也写进同一个文件,哪个程序都不说。"""
    checkpoints = tmp_path / "checkpoints.db"
    env = {"EVENTS_DB": str(tmp_path / "ambient.db"), "CHECKPOINTS_DB": str(checkpoints), "BIZ_DB": str(checkpoints),
           "AMBIENT_NO_DOTENV": "1", "PATH": "/usr/bin:/bin"}
    r = cli(["store.py"], env)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", (
        f"BIZ_DB 指的 {checkpoints} 是 checkpoint 库,不是业务库:让 BIZ_DB 指到业务库(不设就是脚本旁边的 cloudledger.db)\n"))
    assert not checkpoints.exists()


def test_biz_db_pointing_at_a_directory_is_named_by_every_command_and_store_does_not_say_delete_it(lab, tmp_path):
    """每个命令都说 BIZ_DB 是一个目录;store.py 只叫人把 BIZ_DB 指到业务库,不叫人删掉它(是个目录,删掉它不是办法)。"""
    folder = tmp_path / "biz"
    folder.mkdir()
    problem = f"业务库打不开:BIZ_DB={folder}(这是一个目录,不是文件)"
    for command, code, stderr in (
            (["store.py"], 2, f"{problem}。没有动它:让 BIZ_DB 指到业务库(不设就是脚本旁边的 cloudledger.db)\n"),
            (["worker.py", "--once"], 1, problem + "\n"), (["cron_jobs.py", "scan"], 2, problem + "\n")):
        r = cli(command, {**lab, "BIZ_DB": str(folder)})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", stderr), command
    assert list(folder.iterdir()) == []


def test_store_refuses_a_business_database_without_its_tables_and_leaves_it_as_it_was(tmp_path):
    other = tmp_path / "notes.db"
    with closing(sqlite3.connect(other)) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('别弄丢我')")
    before = other.read_bytes()
    env = {"EVENTS_DB": str(tmp_path / "e.db"), "BIZ_DB": str(other), "AMBIENT_NO_DOTENV": "1", "PATH": "/usr/bin:/bin"}
    r = cli(["store.py"], env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"业务库 {other} 里没有表:customers、tickets。没有动它:让 BIZ_DB 指到业务库(不设就是脚本旁边的 "
                        "cloudledger.db);确定这个文件没用了,才删掉它再运行 uv run python store.py,就会新建一份\n")
    assert other.read_bytes() == before
    assert rows("SELECT body FROM notes", path=other) == [("别弄丢我",)]


def test_a_business_database_without_its_tables_stops_worker_scan_and_mail_and_touches_nothing(lab, tmp_path):
    """BIZ_DB 指到一个别的 SQLite 库:worker、定时扫描、邮件轮询一启动就说缺哪几张表、去运行 store.py(那里说怎么修);
    事件不领、不入队,那个库一个字节都不变。"""
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    other = tmp_path / "notes.db"
    with closing(sqlite3.connect(other)) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('别弄丢我')")
    before = other.read_bytes()
    message = f"业务库 {other} 里没有表:customers、tickets(运行 uv run python store.py,它说怎么修)\n"
    for command, code in ((["worker.py", "--once"], 1), (["cron_jobs.py", "scan"], 2),
                          (["email_poller.py", "--eml", "samples"], 2)):
        r = cli(command, {**lab, "BIZ_DB": str(other)})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message), command
    assert other.read_bytes() == before
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]
