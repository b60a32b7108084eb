"""uv run python demo.py:课文的全流程,用真的 webhook 服务、真 HTTP、真进程跑一遍,结果和课文一致。"""
import contextlib
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import pytest
from conftest import LAB, free_port, run
from openai_stub import OpenAIStub

import demo


def test_demo_replays_the_lesson_and_checks_its_result(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    # 设了 DATABASE_URL(这里是一个连不上的)也照样用临时目录里的 SQLite,不去碰那个 PostgreSQL
    r = run(["demo.py"], {**env, "TMPDIR": str(tmp_path), "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"},
            timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for line in ("$ uv run python send_webhook.py T1012 2\n202 {'accepted': True, 'duplicate': False}\n"
                 "202 {'accepted': True, 'duplicate': True}\n",
                 "evt_T1012_created|pending|0\nevt_T1041_created|pending|0\nevt_T1003_created|pending|0\n"
                 "evt_T9999_created|pending|0\n",
                 "$ uv run python worker.py --once\nevt_T1012_created → waiting_human\n"
                 "evt_T1041_created → waiting_human\nevt_T1003_created → waiting_human\n"
                 "evt_T9999_created 第 1 次失败 → dead: 工单不存在:T9999\n",
                 "$ uv run python inbox.py accept T1012\nT1012 → sent\n",
                 "evt_T1012_created|done|1\nevt_T1041_created|done|1\nevt_T1003_created|ignored|1\n"
                 "evt_T9999_created|dead|1\n",
                 "和课文一致"):
        assert line in out
    assert list(tmp_path.iterdir()) == []  # 临时数据目录跑完就删了


def test_demo_with_port_8139_taken_uses_another_and_says_how_to_send_to_it_by_hand(tmp_path):
    """8139 被占着(多半是上次没停掉的 webhook):演示换一个端口照常跑完。打印的 send_webhook.py 命令不带 WEBHOOK_URL,
    所以说先 export 哪个 URL;只说「WEBHOOK_URL 已指向它」的话,学员照着自己敲,会发给占着 8139 的那个程序。"""
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    with socket.socket() as taken:
        with contextlib.suppress(OSError):  # 已经被别的程序占着也一样
            taken.bind(("127.0.0.1", demo.PORT))
            taken.listen()
        r = run(["demo.py"], {**env, "TMPDIR": str(tmp_path)}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    port = int(re.search(r"^\$ uv run uvicorn webhook:app --port (\d+)$", r.stdout, re.M)[1])
    assert port != demo.PORT
    assert (f"端口 8139 被占用,这次用 {port};WEBHOOK_URL 已指向它(照着下面的命令自己敲 send_webhook.py 时,先 export "
            f"WEBHOOK_URL=http://127.0.0.1:{port}/hooks/cloudledger,不然发给了占着 8139 的那个程序)。\n") in r.stdout
    assert r.stdout.rstrip().endswith("发件箱两行。")
    assert list(tmp_path.iterdir()) == []


def test_demo_with_a_model_it_cannot_reach_stops_with_the_reason_not_a_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    unreachable = {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "LLM_MAX_RETRIES": "0"}
    r = run(["demo.py"], {**env, **unreachable, "TMPDIR": str(tmp_path)}, timeout=300)
    assert r.returncode == 1
    assert "evt_T1012_created 第 1 次失败 → pending: OpenAIConnectionError: Connection error.\n" in r.stdout
    assert r.stderr.splitlines()[-1] == ("演示中断:T1012 没有进收件箱,看上面 worker 那一步为什么失败"
                                         "(用真模型时检查 LLM_API_KEY、LLM_BASE_URL;不设 LLM_API_KEY 就用离线模型)")
    assert "Traceback" not in r.stderr  # 也不是 StopIteration 的 traceback
    assert list(tmp_path.iterdir()) == []  # 临时数据目录照样删了


def test_demo_with_a_model_that_writes_multi_line_drafts_checks_the_whole_draft(tmp_path):
    """真模型的草稿常分几行:收件箱里后面几行缩进着,演示核对发件箱时要拿整段草稿比(只拿第一行的话对不上)。"""
    env = {k: v for k, v in os.environ.items() if k not in ("EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    with OpenAIStub() as stub:
        stub.multiline = True
        model = {"LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MODEL": "stub-model"}
        r = run(["demo.py", "--keep"], {**env, **model, "TMPDIR": str(tmp_path)}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\n        草稿:您好,\n        关于您提到的扣款和退款问题,\n" in r.stdout  # 收件箱里确实是好几行
    assert "\n和课文一致" in r.stdout
    # --keep:数据目录留着,最后一行说它在哪,里面是这一次的三个库
    [data] = tmp_path.iterdir()
    assert r.stdout.endswith(f"\n数据留在 {data}\n")
    assert {"ambient.db", "checkpoints.db", "cloudledger.db"} <= {p.name for p in data.iterdir()}
    with closing(sqlite3.connect(data / "ambient.db")) as conn:
        assert conn.execute("select ticket_id from outbox").fetchall() == [("T1012",), ("T1041",)]


def test_demo_that_does_not_match_the_lesson_says_so_and_with_keep_where_the_data_is(tmp_path):
    """演示途中事件表里多了一个别人发来的事件(另一个终端的 send_webhook.py 正好打到演示的端口上):结果和课文对不上,
    退出码 1。--keep 时最后一行说数据留在哪,好用 sqlite3 查原因(对不上时也说,不只在对得上时说)。"""
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    proc = subprocess.Popen([sys.executable, "demo.py", "--keep"], cwd=LAB, env={**env, "TMPDIR": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:  # store.py 那一步建好事件表,就塞进一个演示之外的事件
            assert time.time() < deadline and proc.poll() is None, "演示没有建出事件库"
            try:
                [data] = tmp_path.iterdir()
                with closing(sqlite3.connect(f"file:{data / 'ambient.db'}?mode=rw", uri=True, timeout=30)) as conn, conn:
                    conn.execute("INSERT INTO events (event_id, source, kind, payload, received_at, updated_at) "
                                 "VALUES ('evt_stray', 'webhook', 'ticket.created', '{}', '2026-12-03', '2026-12-03')")
                break
            except (ValueError, sqlite3.OperationalError):  # 目录、库或者表还没有
                time.sleep(0.05)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, out + err
    assert "\nevt_stray|" in out  # 结果那一段照样把整张事件表打出来
    assert out.endswith(f"\n和课文对不上:\n事件表应该是 {demo.EXPECTED_EVENTS}\n数据留在 {data}\n")
    assert (data / "ambient.db").exists()


def lab_copy(tmp_path, broken: str, extra: str) -> "os.PathLike":
    """实验目录的一份拷贝(只拷程序和数据文件),broken 这个文件的开头插进 extra:让演示的某一步真的失败,
    其余照常是真进程、真 HTTP。"""
    import shutil
    copy = tmp_path / "lab"
    shutil.copytree(LAB, copy, ignore=shutil.ignore_patterns(".*", "tests", "bench", "__pycache__", "*.db*", "cron.log"))
    (copy / broken).write_text(extra + "\n" + (copy / broken).read_text())
    return copy


def demo_in(copy, tmp_path) -> tuple[subprocess.CompletedProcess, int]:
    """在拷贝里跑 demo.py,临时数据目录建在 tmp_path/tmp 下;返回结果和它用的 webhook 端口。"""
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    (tmp_path / "tmp").mkdir()
    r = run([str(copy / "demo.py")], {**env, "TMPDIR": str(tmp_path / "tmp")}, cwd=copy, timeout=300)
    port = int(next(line for line in r.stdout.splitlines() if line.startswith("$ uv run uvicorn")).split()[-1])
    return r, port


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_a_step_that_fails_stops_the_demo_with_its_exit_code_and_leaves_no_server_or_data(tmp_path):
    """webhook 服务已经起来、第一次发 webhook 的那一步退出码不是 0(这里是拷贝里的 send_webhook.py 被改坏了):
    这一步的输出照样打出来,最后一行说是哪个退出码,退出码 1;后面的步骤不跑,webhook 服务停了,临时数据目录删了。"""
    copy = lab_copy(tmp_path, "send_webhook.py", 'raise SystemExit("发送失败(测试改坏的)")')
    r, port = demo_in(copy, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.endswith("\n## 终端 2:发 webhook T1012(连发两次,模拟上游重试)\n$ uv run python send_webhook.py T1012 2\n"
                             "发送失败(测试改坏的)\n")
    assert r.stderr == "演示中断:这一步的退出码是 1\n"
    assert "worker.py" not in r.stdout
    assert port_is_free(port)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_webhook_server_that_cannot_start_stops_the_demo_with_its_error_and_leaves_no_data(tmp_path):
    """uvicorn 起 webhook 服务时导入失败(拷贝里的 webhook.py 只在 uvicorn 进程里抛错;演示自己导入它读设置时不抛):
    演示说「webhook 服务没起来」并带上服务的报错,退出码 1;一个 webhook 都没发,临时数据目录删了。"""
    copy = lab_copy(tmp_path, "webhook.py",
                    'import sys\nif "uvicorn" in sys.modules:\n    raise RuntimeError("webhook 起不来(测试改坏的)")')
    r, port = demo_in(copy, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.endswith(f"\n## 终端 1:起 webhook 服务\n$ uv run uvicorn webhook:app --port {port}\n")
    assert r.stderr.startswith("webhook 服务没起来:\n")
    assert r.stderr.rstrip("\n").endswith("RuntimeError: webhook 起不来(测试改坏的)")
    assert port_is_free(port)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_webhook_server_that_hangs_at_startup_stops_the_demo_after_30_seconds_and_is_stopped(tmp_path):
    """uvicorn 起 webhook 服务时卡住(拷贝里的 webhook.py 在 uvicorn 进程里睡 10 分钟):演示等 30 秒,说没起来,
    退出码 1;卡住的服务被停掉(端口空着,没有留下进程),临时数据目录删了。"""
    copy = lab_copy(tmp_path, "webhook.py", 'import sys, time\nif "uvicorn" in sys.modules:\n    time.sleep(600)')
    started = time.monotonic()
    r, port = demo_in(copy, tmp_path)
    assert (r.returncode, r.stderr) == (1, "webhook 服务 30 秒内没起来\n"), r.stdout + r.stderr
    assert 30 <= time.monotonic() - started < 120
    assert r.stdout.endswith(f"\n## 终端 1:起 webhook 服务\n$ uv run uvicorn webhook:app --port {port}\n")
    assert port_is_free(port)
    leftover = subprocess.run(["pgrep", "-f", f"uvicorn webhook:app --port {port} "], capture_output=True, text=True)
    assert leftover.stdout == ""
    assert list((tmp_path / "tmp").iterdir()) == []


def test_demo_with_a_bad_setting_says_which_one_before_running_any_step(tmp_path):
    """设置不对时一开始就说是哪一项,一步都不跑:不是跑完建库、起服务、发 webhook 几步,到 worker 那一步才因为设置不对停下。"""
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    for name, value, problem in (("WORKER_CONCURRENCY", "abc", "WORKER_CONCURRENCY='abc' 不是数字"),
                                 ("WEBHOOK_SECRET", "whsec_", "WEBHOOK_SECRET 是 whsec_,后面没有密钥"),
                                 ("LLM_TIMEOUT_S", "-1", "LLM_TIMEOUT_S='-1' 不能小于 0.1"),
                                 ("INBOX_MAX_TEXT_CHARS", "abc", "INBOX_MAX_TEXT_CHARS='abc' 不是数字"),
                                 # 设置本身没错,只是比演示要 edit 的回复还短:也一步都不跑,不等发出 T1012、到 respond 那一步才停下
                                 ("INBOX_MAX_TEXT_CHARS", "10",
                                  f"INBOX_MAX_TEXT_CHARS=10 比演示要输入的文字({len(demo.EDITED)} 个字)还短")):
        r = run(["demo.py"], {**env, name: value, "TMPDIR": str(tmp_path)}, timeout=120)
        assert (r.returncode, r.stdout) == (1, "")
        assert r.stderr == f"演示没有开始:配置错误:{problem}(改好环境变量或 .env 里的这一项再跑)\n"
        assert list(tmp_path.iterdir()) == []  # 连临时数据目录都没建


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_demo_help_prints_usage_and_runs_nothing(tmp_path, flag):
    r = run(["demo.py", flag], {**os.environ, "TMPDIR": str(tmp_path)})
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{demo.USAGE}\n", "")
    assert demo.USAGE == ("用法:uv run python demo.py [--keep] [--web]"
                          "(--keep:跑完保留临时数据目录;--web:停在收件箱,在网页上处理)")
    assert list(tmp_path.iterdir()) == []


def test_demo_with_an_unknown_argument_shows_usage_and_runs_nothing(tmp_path):
    """打错了 --keep(比如 --kep)不能悄悄照跑、再把想留下的数据目录删掉。"""
    for args in (["--kep"], ["--web", "--web"]):
        r = run(["demo.py", *args], {**os.environ, "TMPDIR": str(tmp_path)})
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"{demo.USAGE}\n")
        assert list(tmp_path.iterdir()) == []


def test_demo_web_stops_at_the_inbox_serves_the_page_and_ctrl_c_ends_it_cleanly(tmp_path):
    """--web:跑到「看收件箱」,起收件箱网页、说地址;网页上能处理待办;在终端里按 Ctrl-C(整个进程组):退出码 0、
    一行「已停止收件箱网页」,两个服务都停了,临时数据目录删了。"""
    import httpx

    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    proc = subprocess.Popen([sys.executable, "demo.py", "--web"], cwd=LAB, env={**env, "TMPDIR": str(tmp_path)},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("收件箱网页:http://"):
                break
        url = seen[-1].split(":", 1)[1].split(" ")[0]
        assert seen[-1] == f"收件箱网页:{url} (在浏览器里处理 T1012、T1041、T1003;按 Ctrl-C 结束)\n"
        assert f"$ uv run uvicorn inbox_web:app --port {url.split(':')[2].rstrip('/')}\n" in seen
        assert "<title>待处理 3 · CloudLedger 收件箱</title>" in httpx.get(url).text
        assert httpx.post(f"{url}api/tickets/T1012", json={"type": "accept"}).json()["outcome"] == "sent"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, out, err) == (0, "已停止收件箱网页\n", "")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(url)


@pytest.mark.parametrize("sig, whole_group, again", [
    (signal.SIGINT, True, False), (signal.SIGINT, False, False), (signal.SIGINT, True, True),
    # kill(SIGTERM)和关掉终端(SIGHUP)也一样收拾完再退出:不然直接结束,临时目录留在 /tmp,只发给 demo 时 webhook 服务成了孤儿进程
    (signal.SIGTERM, True, False), (signal.SIGTERM, False, True), (signal.SIGHUP, False, False),
], ids=["ctrl-c-in-a-terminal", "kill-int-to-demo-only", "forwarded-again-like-uv-run", "kill-to-the-group",
        "kill-to-demo-only-twice", "terminal-closed"])
def test_ctrl_c_in_the_middle_of_the_demo_says_one_line_and_leaves_no_server_or_data_behind(tmp_path, sig, whole_group,
                                                                                            again):
    """在终端里按 Ctrl-C:SIGINT 发给整个前台进程组(demo、它起的 webhook 服务、正在跑的那一步);kill -INT 只发给 demo,
    它起的进程要它自己收。webhook 服务起来、正要发第一个 webhook 时按下:一行「已中断(Ctrl-C)」、退出码 130,
    没有 traceback;webhook 服务停了(端口空出来),临时数据目录删了,进程组里一个进程都不剩。
    这里用真进程量,不只靠 config.run 的单元测试。again:之后每 10 毫秒再给 demo 发一次,直到它退出 —— uv run 在终端外
    会把发给进程组的 SIGINT 再转发一次;收拾途中再来的信号不打断收拾,不然临时数据目录有一半的时候会留下来。"""
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB")}
    proc = subprocess.Popen([sys.executable, "demo.py"], cwd=LAB, env={**env, "TMPDIR": str(tmp_path)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    seen = []
    try:
        for line in proc.stdout:  # 读到「服务已在后台运行」就按
            seen.append(line)
            if line == "(服务已在后台运行)\n":
                break
        port = next(int(x.split("--port ")[1]) for x in seen if x.startswith("$ uv run uvicorn"))
        assert list(tmp_path.iterdir()) != []  # 临时数据目录这时还在
        os.killpg(proc.pid, sig) if whole_group else proc.send_signal(sig)
        while again and proc.poll() is None:
            proc.send_signal(sig)
            time.sleep(0.01)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, err) == ((130, "已中断(Ctrl-C)\n") if sig == signal.SIGINT else
                                      (128 + sig, f"已中断(收到 {sig.name})\n"))
    assert "Traceback" not in "".join(seen) + out
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    deadline = time.time() + 10
    while time.time() < deadline:  # demo 退出前等过 webhook 服务;正在跑的那一步也被 subprocess.run 收了
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("demo 退出了,它的进程组里还有进程")
