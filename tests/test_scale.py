"""不止一个 worker:进程内并发、多个进程、kill -9,SQLite 和 PostgreSQL 各跑一遍(练习 6)。"""
import collections
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import LAB, rows, run
from langgraph.types import Command
from openai_stub import OpenAIStub

import store
import store_events
import worker as worker_mod
import worker_pool
from agent import opened_graph, thread_of

STOP_LINE = "收到停止信号:做完手上的事件就退出(再按一次 Ctrl-C 立即退出,手上的事件交回队列)\n"


def add_tickets(count: int, first: int = 5000) -> list[str]:
    """业务库里再造 count 张工单(内容借种子工单的),返回工单号。"""
    ids = [f"T{first + i}" for i in range(count)]
    conn = store.connect(store.biz_target())
    try:
        seed = conn.execute("SELECT customer_id, subject, body FROM tickets WHERE id = 'T1012'").fetchone()
        conn.executemany("INSERT INTO tickets VALUES (?, ?, ?, ?, 'open', '2026-11-01')",
                         [(t, seed["customer_id"], seed["subject"], seed["body"]) for t in ids])
    finally:
        conn.close()
    return ids


def queue(tickets: list[str]) -> None:
    store_events.add_events([(f"evt_{t}_created", "webhook", "ticket.created",
                       json.dumps({"id": f"evt_{t}_created", "type": "ticket.created", "data": {"ticket_id": t}}))
                      for t in tickets])


def accept_twice_at_once(tickets: list[str]) -> None:
    """每张工单同时批准两次(两个人同时点):回复也只能发一次,outbox 的 UNIQUE 说了算。"""
    with opened_graph() as graph, ThreadPoolExecutor(8) as pool:
        # 不吞异常:两次恢复都不该出错(后到的看到的要么是已经做完的 thread,要么和先到的一起跑到 send,
        # 由 outbox 的 UNIQUE 只留一行);出了错 pool.map 会把它抛出来,测试失败
        list(pool.map(lambda t: graph.invoke(Command(resume={"type": "accept", "args": None}), thread_of(t)),
                      tickets * 2))


def start_workers(env: dict, n: int, *args: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "worker.py", *args], cwd=LAB, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(n)]


def handled(output: str) -> list[str]:
    return [line.split()[0] for line in output.splitlines() if line.startswith("evt_")]


def test_three_workers_at_once_handle_each_of_20_events_exactly_once(any_lab):
    """练习 6 的验收:同时开三个 worker 处理 20 个事件,每个事件只处理一次,输出里没有重复的 event_id。"""
    queue([f"T{1001 + i}" for i in range(20)])
    procs = start_workers(any_lab, 3, "--once")
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    ids = [e for out, _ in outs for e in handled(out)]
    assert sorted(ids) == sorted(f"evt_T{1001 + i}_created" for i in range(20))  # 没有重复,也没有漏
    assert rows("SELECT status, attempts, COUNT(*) FROM events GROUP BY status, attempts") == [("waiting_human", 1, 20)]


def test_a_mail_ticket_stored_on_one_machine_is_drafted_by_a_worker_on_another(pg_lab, tmp_path):
    """README 的多台机器:设了 DATABASE_URL 时业务库也在 PostgreSQL 里,不是每台机器自己的 SQLite 文件:收信那台建的
    邮件工单,别的机器上的 worker 也找得到,不说「工单不存在:M…」、进死信。两台「机器」各有自己的目录(BIZ_DB 各指
    各的、都不存在),只共用 DATABASE_URL。"""
    mailbox = {**pg_lab, "BIZ_DB": str(tmp_path / "a" / "cloudledger.db")}
    elsewhere = {**pg_lab, "BIZ_DB": str(tmp_path / "b" / "cloudledger.db")}
    mail = run(["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], mailbox)
    ticket = mail.stdout.split()[0]
    assert (mail.returncode, mail.stderr, ticket[0]) == (0, "", "M")
    [(event_id,)] = rows("SELECT event_id FROM events WHERE ticket_id = ?", (ticket,))
    r = run(["worker.py", "--once"], elsewhere)
    assert (r.returncode, r.stdout) == (0, f"{event_id} → waiting_human\n"), r.stderr
    assert rows("SELECT status, attempts, last_error FROM events") == [("waiting_human", 1, None)]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_concurrency_inside_one_worker_drains_everything_once(any_lab, monkeypatch):
    with OpenAIStub(delay=0.3) as stub:
        monkeypatch.setenv("LLM_API_KEY", "sk-test")
        monkeypatch.setenv("LLM_BASE_URL", stub.base_url)
        tickets = add_tickets(24)
        queue(tickets)
        w = worker_mod.Worker(concurrency=8)
        try:
            done = w.run_once()
        finally:
            w.close()
        assert sorted(done) == sorted((f"evt_{t}_created", "waiting_human") for t in tickets)
        assert len(stub.requests) == 24
        # 模型那边数:同时在等回答的请求最多几个。一个一个做是 1;8 路并发不会超过 8(看的不是墙钟,机器忙时也不会误判)
        assert 4 <= stub.peak <= 8, f"8 路并发,模型那边最多同时只有 {stub.peak} 个请求"
    assert rows("SELECT COUNT(*) FROM llm_usage") == [(24,)]


@pytest.mark.parametrize("sigterms", [1, 2])
def test_sigterm_lets_in_flight_events_finish_and_leaves_the_rest_pending(any_lab, sigterms):
    """sigterms=2:SIGTERM 发给整个进程组时(systemd 停服务),uv run 还会再转发一次,worker 收到两次。
    SIGTERM 收到几次都是做完再退:第二次不当成「再按一次 Ctrl-C」(那会把手上的事件交回队列、立即退出)。"""
    with OpenAIStub(delay=1.0) as stub:
        env = {**any_lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MAX_RETRIES": "0"}
        tickets = add_tickets(12)
        queue(tickets)
        concurrency = 3 if sigterms == 1 else 1  # 并发 1:事件在主线程里跑,第二个信号也不打断它
        (proc,) = start_workers(env, 1, "--concurrency", str(concurrency))
        deadline = time.time() + 60
        while len(stub.requests) < concurrency and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        first = proc.stderr.readline()
        for _ in range(sigterms - 1):
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, first + err) == (0, STOP_LINE)
    finished = handled(out)
    assert concurrency <= len(finished) < 12
    statuses = dict(rows("SELECT status, COUNT(*) FROM events GROUP BY status"))
    assert statuses == {"waiting_human": len(finished), "pending": 12 - len(finished)}  # 没有卡在 processing 的


@pytest.mark.slow  # 负载测试:默认的 uv run pytest 不跑,.ci/run 用 -m slow 跑
def test_four_workers_500_events_one_killed_then_restart_finishes_with_one_reply_per_ticket(any_lab):
    tickets = add_tickets(500)
    queue(tickets)
    procs = start_workers(any_lab, 4, "--once")
    deadline = time.time() + 120
    while rows("SELECT COUNT(*) FROM events WHERE status <> 'pending'")[0][0] < 100 and time.time() < deadline:
        time.sleep(0.05)
    procs[0].send_signal(signal.SIGKILL)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert procs[0].returncode == -signal.SIGKILL  # 真的是被杀的,不是先做完退出了
    restart = run(["worker.py", "--once"], any_lab, timeout=300)
    assert restart.returncode == 0, restart.stderr
    outs.append(restart.stdout)
    ids = [e for out in outs for e in handled(out)]
    assert len(ids) == len(set(ids))  # 没有哪个事件被两个 worker 都做完
    assert rows("SELECT status, COUNT(*) FROM events GROUP BY status") == [("waiting_human", 500)]
    # 被杀的 worker(并发 1)手上最多一个事件。它要么还没做完:重启后被再领一次(attempts = 2)、打印一次;
    # 要么状态已经提交、那一行还没来得及打印就死了:没人打印它,但它也只被领过一次,没人再做一遍。
    # 提交状态和打印一行做不成原子的,所以「没打印」只能出现在被杀的那个身上,而且最多一个。
    unprinted = {f"evt_{t}_created" for t in tickets} - set(ids)
    attempts = dict(rows("SELECT event_id, attempts FROM events"))
    assert len(unprinted) <= 1 and all(attempts[e] == 1 for e in unprinted), (unprinted, attempts)
    assert sorted(collections.Counter(attempts.values()).items()) in ([(1, 500)], [(1, 499), (2, 1)])
    # 被杀的那个手上最多有一个事件在 draft 里:重启后它从 draft 续跑,其余的都只起草了一次
    per_ticket = rows("SELECT ticket_id, COUNT(*) FROM llm_usage GROUP BY ticket_id HAVING COUNT(*) > 1")
    assert len(per_ticket) <= 1 and all(n == 2 for _, n in per_ticket)

    accept_twice_at_once(tickets[:100])
    assert rows("SELECT COUNT(*), COUNT(DISTINCT ticket_id) FROM outbox") == [(100, 100)]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_second_ctrl_c_exits_at_once_and_hands_the_events_back(any_lab, concurrency):
    """模型 60 秒后才回答;第二次 Ctrl-C 之后 20 秒内就得退出。并发 > 1 时也一样,不等线程池里的
    线程都做完(那样「立即退出」要等到模型都回答了)。"""
    with OpenAIStub(delay=60) as stub:
        env = {**any_lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MAX_RETRIES": "0"}
        tickets = add_tickets(concurrency)
        queue(tickets)
        (proc,) = start_workers(env, 1, "--concurrency", str(concurrency))
        deadline = time.time() + 60
        while len(stub.requests) < concurrency and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        first = proc.stderr.readline()  # 第一次 Ctrl-C 的回答说出来了,再按第二次
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=20)
        finally:
            proc.kill()  # 超时没退出时别留下它
    assert (proc.returncode, out, first) == (0, "", STOP_LINE)
    assert sorted(err.splitlines()) == [f"evt_{t}_created 交回队列" for t in tickets]
    assert rows("SELECT status, attempts, claimed_by FROM events") == [("pending", 0, None)] * concurrency


def test_a_second_ctrl_c_while_the_database_is_locked_says_so_in_one_line_and_the_event_is_not_lost(lab):
    """第二次 Ctrl-C 时事件库正被别人锁着(超过 BUSY_TIMEOUT_S):手上的事件交不回去。一行说明(事件留在处理中、
    下次启动时放回)、退出码 1,不是一整段 traceback。锁放开以后下一次运行把它放回队列、做完。"""
    from conftest import write_locked

    with OpenAIStub(delay=60) as stub:
        env = {**lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MAX_RETRIES": "0",
               "BUSY_TIMEOUT_S": "0.5"}
        queue(add_tickets(1))
        (proc,) = start_workers(env, 1)
        deadline = time.time() + 60
        while not stub.requests and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        first = proc.stderr.readline()
        try:
            with write_locked():
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=20)
        finally:
            proc.kill()
    (ticket,) = [t for (t,) in rows("SELECT ticket_id FROM events")]
    assert (proc.returncode, out, first, err) == (
        1, "", STOP_LINE, "数据库暂时用不了(OperationalError: database is locked):手上的事件没能交回队列,"
                          "留在处理中;下次启动 worker 时会放回队列\n")
    assert rows("SELECT status, attempts FROM events") == [("processing", 1)]
    again = run(["worker.py", "--once"], lab)  # 离线模型
    assert (again.returncode, again.stdout) == (0, f"放回队列 1 个卡住的事件\nevt_{ticket}_created → waiting_human\n")
    assert rows("SELECT status FROM events") == [("waiting_human",)]


def test_a_second_ctrl_c_that_arrives_while_the_first_is_being_announced_still_exits_at_once(lab, monkeypatch):
    """Python 在信号处理函数的字节码之间就会处理下一个信号。worker 先记下在停了、再说「收到停止信号」:第二次 Ctrl-C
    正好在说的时候到(看到这一行马上再按)也算第二次,立即退出。先说再记的话,它被当成第一次,这一行说两遍、worker
    不退出(test_second_ctrl_c_exits_at_once_and_hands_the_events_back 大约每十次撞上一次)。这里让第二个信号确定落在
    print 里。"""
    w = worker_mod.Worker(2)
    said = []

    def print_and_get_interrupted(*args, **kwargs):
        said.append(args)
        if len(said) == 1:
            w.stop(signal.SIGINT)  # 第二次 Ctrl-C

    try:
        w.in_hand.add("evt_T1012_created")  # 手上有事件在做
        monkeypatch.setattr(worker_pool, "print", print_and_get_interrupted, raising=False)
        with pytest.raises(KeyboardInterrupt):
            w.stop(signal.SIGINT)
    finally:
        w.close()
    assert said == [(STOP_LINE.rstrip("\n"),)]


# 第 target 轮:第一次 stop() 执行到第 target 个 Python 行(它自己的、它调用的 Python 函数的)时,再来一个 SIGTERM
SECOND_SIGTERM_AT_EVERY_LINE = r"""
import os, signal, sys
import worker

ROUNDS, injected = 40, 0
for target in range(1, ROUNDS + 1):
    w, lines = worker.Worker(1), 0
    signal.signal(signal.SIGTERM, w.stop)

    def tracer(frame, event, arg):
        global lines, injected
        if event == "line":
            lines += 1
            if lines == target:
                injected += 1
                os.kill(os.getpid(), signal.SIGTERM)
        return tracer

    sys.settrace(tracer)
    w.stop(signal.SIGTERM)
    sys.settrace(None)
    w.run()  # 已经在停了:马上返回
    w.close()
print(injected)
"""


def test_a_second_sigterm_at_any_point_of_the_first_one_never_hangs_the_worker(lab):
    """SIGTERM 发给整个进程组(systemd、kill -- -PGID、timeout)时 worker 收到两次。第二个落在第一次 stop() 的
    哪一行都不会让 worker 卡住。要防的是:第二个正好落在第一个的 threading.Event.set() 里(它拿着 Event 的锁)时,处理
    函数再去 set,自己等自己,常驻 worker 永远停不下来(在 PostgreSQL 上 timeout -s TERM 大约三十来次碰上一次)。这里让第二个信号依次落在第一次 stop() 的每一行上:
    每一轮都停得下来,停止那一行只说一次。"""
    r = run(["-c", SECOND_SIGTERM_AT_EVERY_LINE], lab, timeout=90)
    assert (r.returncode, r.stderr) == (0, STOP_LINE * 40)
    assert int(r.stdout) >= 4  # 真的插进去了好几处(stop() 有几行,就有几轮插得进去)
