"""收件箱网页有多快:1,000 条待办等在收件箱里时,列表页(GET /)和一张工单页(GET /tickets/{工单号})各要多久。

运行:
    uv run python bench/inbox_web.py                  # 1,000 条待办,每页 200 次请求
    uv run python bench/inbox_web.py --items 100 --requests 20 --rounds 1   # 冒烟

你会看到一张表:两种页面的 p50、p95(毫秒)、是基线的几分之一、目标(p50 ≤ 100 ms)和 ✓/✗;基线是同一份数据上的
`uv run python inbox.py list`(一个新进程,列出全部 1,000 条),在同一次运行里量。网页是另一个进程里真的 uvicorn,
请求走真的 HTTP(一个连接,一个接一个)。没达到目标也是退出码 0(量成了);某一步失败才是 1。
准备数据时 worker 用离线模型起草 1,000 条,要一二十秒。
"""
import argparse
import contextlib
import io
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

TARGET_MS = 100


def prepare(folder: Path, env: dict, items: int) -> list[str]:
    """folder 里建好三个库,items 张照 T1012 抄的工单都起草好、等在收件箱里;返回工单号(进收件箱的先后)。"""
    common.use_env(env)
    import store
    import store_biz
    import worker

    store.init()
    store_biz.build_biz_db(Path(env["BIZ_DB"]))
    tickets = [f"W{n:04}" for n in range(items)]
    with store.opened(store.biz_target()) as conn:
        conn.executemany("INSERT INTO tickets (id, customer_id, subject, body, status, created_at) "
                         "SELECT ?, customer_id, subject, body, status, created_at FROM tickets WHERE id = 'T1012'",
                         [(t,) for t in tickets])
    for t in tickets:
        payload = json.dumps({"type": "ticket.created", "data": {"ticket_id": t}})
        store.add_event(f"evt_{t}_created", "webhook", "ticket.created", payload)
    w = worker.Worker()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # worker 每个事件说一行:1,000 行不打印
            w.run_once()
    finally:
        w.close()
    return tickets


def serve(env: dict) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "inbox_web:app", "--port", str(port),
                             "--log-level", "warning"], cwd=common.ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"inbox_web 没起来:\n{proc.stderr.read()}")
            time.sleep(0.05)
    raise SystemExit("inbox_web 60 秒内没起来")


def timed_gets(client, path: str, n: int, expect: str) -> list[float]:
    """GET path n 次,每次的毫秒数;回答不是 200、或者页面里没有 expect 就停下。"""
    took = []
    for _ in range(n):
        start = time.perf_counter()
        r = client.get(path)
        took.append((time.perf_counter() - start) * 1000)
        if r.status_code != 200 or expect not in r.text:
            raise SystemExit(f"GET {path} → {r.status_code}:{r.text[:300]}")
    return took


def timed_list(env: dict, items: int) -> float:
    """基线:uv run python inbox.py list 一次(新进程),毫秒。"""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "inbox.py", "list"], cwd=common.ROOT, env=env, capture_output=True, text=True)
    took = (time.perf_counter() - start) * 1000
    if r.returncode != 0 or r.stdout.count("草稿:") < items:
        raise SystemExit(f"inbox.py list 退出码 {r.returncode}:\n{r.stdout[-500:]}{r.stderr}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description="量收件箱网页的列表页和工单页")
    parser.add_argument("--items", type=common.positive_int, default=1000, help="收件箱里有几条待办(默认 1000)")
    parser.add_argument("--requests", type=common.positive_int, default=200, help="每种页面每轮请求几次(默认 200)")
    parser.add_argument("--rounds", type=common.positive_int, default=3, help="几轮;基线每轮量 3 次(默认 3)")
    args = parser.parse_args()
    import httpx

    common.print_header("收件箱网页", common.command_line("bench/inbox_web.py"))
    with tempfile.TemporaryDirectory() as tmp:
        env = common.clean_env(**common.lab_env(Path(tmp)))
        started = time.perf_counter()
        tickets = prepare(Path(tmp), env, args.items)
        print(f"准备:{args.items} 条待办,{time.perf_counter() - started:.1f} 秒\n", flush=True)
        middle = tickets[len(tickets) // 2]
        pages = {"GET /(列表页,50 条)": ("/", f"待处理 {args.items}"),
                 f"GET /tickets/{middle}(工单页)": (f"/tickets/{middle}", 'data-action="accept"')}
        times: dict[str, list[float]] = {name: [] for name in pages}
        baseline: list[float] = []
        proc, url = serve(env)
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                for name, (path, expect) in pages.items():
                    timed_gets(client, path, 5, expect)  # 预热:第一次请求打开图、收拾残局
                for _ in range(args.rounds):
                    for name, (path, expect) in pages.items():
                        times[name] += timed_gets(client, path, args.requests, expect)
                    baseline += [timed_list(env, args.items) for _ in range(3)]
        finally:
            proc.terminate()
            proc.wait(30)
    base = common.median(baseline)
    rows = [["inbox.py list(新进程,列出全部)", base, common.percentile(baseline, 95), "1(基线)", "", ""]]
    for name, took in times.items():
        p50 = common.median(took)
        rows.append([name, p50, common.percentile(took, 95), f"1/{base / p50:.0f}", f"p50 ≤ {TARGET_MS} ms",
                     common.mark(p50 <= TARGET_MS)])
    common.table(["请求", "p50(ms)", "p95(ms)", "比基线", "目标", ""], rows)
    print(f"{args.items} 条待办;{args.rounds} 轮,每轮每种页面 {args.requests} 次、inbox.py list 3 次")
    return 0


if __name__ == "__main__":
    sys.exit(main())
