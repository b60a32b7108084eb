"""混沌测试:几个 worker 进程对着一个慢模型干活,随机时刻 kill -9,再用 STALE_MINUTES=0 重启。

最后:每个事件都在等人(或者已经结束);没有一张工单被两个活着的 worker 同时起草;
续跑的 thread 没有从头来过;人批准时每张工单只发一封回复。SQLite 和 PostgreSQL 各一遍,限时。
再用 CHECKPOINT_DURABILITY=exit 各跑一遍:别的都一样,只是被杀的运行什么都没记下,thread 里只有最后一个 checkpoint。
"""
import random
import signal
import subprocess
import sys
import time

import pytest
from conftest import LAB, rows
from openai_stub import OpenAIStub
from test_scale import accept_twice_at_once, add_tickets, handled, queue
from test_worker import catches, wait_until

from agent import opened_graph, thread_of

pytestmark = pytest.mark.slow  # 混沌测试:默认的 uv run pytest 不跑,.ci/run 用 -m slow 跑

EVENTS = 200
WORKERS = 3
MAX_KILLS = 8
TIME_LIMIT_S = 150


def start(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "worker.py", "--concurrency", "2"], cwd=LAB, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def unfinished() -> int:
    return rows("SELECT COUNT(*) FROM events WHERE status IN ('pending', 'processing')")[0][0]


@pytest.mark.parametrize("durability", ["async", "exit"])
def test_random_kill_9_loses_nothing_duplicates_nothing_and_resumes_where_it_stopped(any_lab, durability):
    rng = random.Random(20261130)
    with OpenAIStub(delay=0.15) as stub:
        env = {**any_lab, "LLM_API_KEY": "sk-test", "LLM_BASE_URL": stub.base_url, "LLM_MAX_RETRIES": "0",
               "STALE_MINUTES": "0", "POLL_SECONDS": "0.2", "BACKOFF_BASE_MINUTES": "0",
               "CHECKPOINT_DURABILITY": durability}
        tickets = add_tickets(EVENTS)
        queue(tickets)
        procs = [start(env) for _ in range(WORKERS)]
        outputs, kills, deadline, kill_times = [], 0, time.time() + TIME_LIMIT_S, []
        while unfinished() and time.time() < deadline:
            time.sleep(rng.uniform(0.3, 1.5))
            if kills < MAX_KILLS:
                i = rng.randrange(WORKERS)
                kill_times.append(time.time())
                procs[i].send_signal(signal.SIGKILL)
                outputs.append(procs[i].communicate()[0])
                procs[i] = start(env)  # STALE_MINUTES=0:新进程马上把死掉的那个手上的事件放回队列
                kills += 1
        for p in procs:
            # 刚重启的进程可能还没装好 SIGTERM 的处理函数(最后一次 kill 之后队列正好空了):那时的 SIGTERM
            # 走默认处理,退出码是 -15 而不是 0。等它装好再发
            wait_until(lambda: catches(p.pid, signal.SIGTERM), "重启的 worker 没有装上 SIGTERM 的处理函数", timeout=30)
            p.send_signal(signal.SIGTERM)
        outputs += [p.communicate(timeout=60)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * WORKERS
        assert unfinished() == 0, f"{TIME_LIMIT_S} 秒内没做完"
        assert kills >= 3

        assert stub.overlaps == []  # 没有一张工单被两个活着的 worker 同时起草
        drafts = [r["ticket"] for r in stub.requests]
        extra = len(drafts) - len(set(drafts))
        assert set(drafts) == set(tickets)
        # 每个 worker 手上最多 2 个事件(--concurrency 2):杀一次最多让 2 张工单重新起草
        assert stub.abandoned <= kills * 2 and extra <= kills * 2, (extra, stub.abandoned, kills)
        # 同一张工单再起草一次,一定是有 worker 被杀了:前一次的请求没等到回答(发请求的 worker 被杀,stub 记下 abandoned;
        # 它可能在 kill 之前就发出了请求、stub 却在 kill 之后才记下 at,所以这种不比时间 —— 机器忙时 CI 碰上过),
        # 或者回答到了、draft 的结果还没写进 checkpoint 就被杀了(两次之间有一次 kill),续跑时 draft 节点重跑
        asked: dict[str, list[dict]] = {}
        for r in stub.requests:
            asked.setdefault(r["ticket"], []).append(r)
        for ticket, tries in asked.items():
            for before, after in zip(tries, tries[1:]):
                assert before["abandoned"] or any(before["at"] <= k <= after["at"] for k in kill_times), (
                    ticket, before["at"], after["at"], kill_times)
    assert rows("SELECT status, COUNT(*) FROM events GROUP BY status") == [("waiting_human", EVENTS)]
    finished = [e for out in outputs for e in handled(out)]
    assert len(finished) == len(set(finished))  # 事件表里没有哪个事件被两个 worker 都做完

    with opened_graph() as graph:
        for t in tickets:
            nexts = [h.next for h in graph.get_state_history(thread_of(t))]
            sources = [h.metadata["source"] for h in graph.get_state_history(thread_of(t))]
            if durability == "async":  # 续跑的 thread 没有从头来:只有一次输入,load 只排过一次
                assert sources.count("input") == 1 and nexts.count(("load",)) == 1, t
            else:  # exit:只有停在收件箱时写下的那一个;被杀的运行没留下半截 thread
                assert nexts == [("review",)], t
    accept_twice_at_once(tickets)
    assert rows("SELECT COUNT(*), COUNT(DISTINCT ticket_id) FROM outbox") == [(EVENTS, EVENTS)]


def test_the_stub_counts_two_live_drafts_of_one_ticket_as_an_overlap_but_not_one_whose_client_died():
    """上面「没有一张工单被两个活着的 worker 同时起草」靠 stub.overlaps:两个都等到回答的重叠要算;其中一个的客户端
    在等回答时断开了(被 kill -9 的 worker 死前刚发出的请求)不算。这里用真的 HTTP 请求把两种都造出来。"""
    import socket
    import threading

    import httpx

    body = {"model": "stub-model", "messages": [{"role": "user", "content": "工单 T1012:发票抬头写错"}]}
    with OpenAIStub(delay=0.5) as stub:
        url = f"{stub.base_url}/chat/completions"
        both = [threading.Thread(target=httpx.post, args=(url,), kwargs={"json": body, "timeout": 10}) for _ in range(2)]
        for t in both:
            t.start()
            time.sleep(0.1)
        for t in both:
            t.join()
        assert stub.overlaps == ["T1012"]

        stub.overlap_pairs.clear()
        data = httpx.Request("POST", url, json=body)
        head = "".join(f"{k}: {v}\r\n" for k, v in data.headers.items())
        dying = socket.create_connection(("127.0.0.1", stub.server.server_address[1]))
        dying.sendall(f"POST /v1/chat/completions HTTP/1.1\r\n{head}\r\n".encode() + data.read())
        time.sleep(0.1)
        live = threading.Thread(target=httpx.post, args=(url,), kwargs={"json": body, "timeout": 10})
        live.start()
        time.sleep(0.1)
        dying.close()  # 发请求的进程死了:内核关掉连接
        live.join()
        assert [(a["abandoned"], b["abandoned"]) for a, b in stub.overlap_pairs] == [(True, False)]
        assert stub.overlaps == []
