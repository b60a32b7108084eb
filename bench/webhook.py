"""webhook 吞吐基准:我们的 webhook.py 对比「只回 202 的空 FastAPI」,同一个 uvicorn、同样的设置。

运行:
    uv run python bench/webhook.py            # 完整:每种 7 轮 × 3000 个请求,1 分钟左右
    uv run python bench/webhook.py --quick    # 冒烟:每种 3 轮 × 500 个请求,10 秒左右
    uv run python bench/webhook.py --parts    # 另外量两个拆开的 webhook,看比空端点多出来的 CPU 花在哪一步
    uv run python bench/webhook.py --lesson   # 另外量课文的写法(请求里直接写 SQLite),和真 webhook 并排
    uv run python bench/webhook.py --requests 1000 --rounds 5   # 自己定每轮请求数、轮数

你会看到:日期、nproc、Python 版本,然后一张表,每行一种负载(空端点 / 新事件 / 重复投递):
req/s 和 p50/p99 延迟(各轮的中位数)、相对空端点的比值、服务进程每个请求用的 CPU、峰值内存(VmHWM);
最后几行 ✓/✗:新事件的比值是否 ≥ 0.80(重复投递的比值也对照同一目标,供参考),所有回了 202 的事件
在 kill -9 之后是否都在库里,有没有回错的请求。退出码总是 0(参数写错时 2,argparse 说哪里不对)。

崩溃那一轮:各轮量完之后,再往 webhook 发一轮新事件,回到一半时把 webhook 和它的写库进程一起 kill -9
(这时还有几十个请求在路上、写库进程手上可能正有一批),然后核对:每个回了 202 的事件都在库里。
它查的是「落盘之后才回 202」;断电时还在不在,靠的是 synchronous=FULL 的 fsync,kill -9 量不出来。

预热:开始计时前两边各先发一轮(同样多的请求),这一轮存下的事件也就是「重复投递」要重发的那些。

做法:起两个真的 uvicorn 子进程(各自一个临时端口,监听 127.0.0.1),用 32 条 keep-alive 连接同时发
签好名的请求。客户端是手写的 asyncio HTTP/1.1(请求事先拼好、签好),比 httpx 省 CPU 得多:
这台机器只有 2 核,客户端太慢的话两边都会被客户端卡住,比值就虚高了;表里的「客户端 CPU」一栏用来检查这一点。
"""
import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from common import mark, median, percentile, table

import store
from send_webhook import sign

CONNECTIONS = 32          # 条;并发连接数,照 issue 6
REQUESTS = 3000           # 个;每轮每种负载发多少个请求(我们的 webhook 在这台机器上每秒一两千个,一轮 2–3 秒)
ROUNDS = 7                # 轮;机器是共享的、有噪声(同一台机器上常有别人在跑测试),每种负载量这么多轮取中位数
QUICK_REQUESTS = 500      # 个;--quick 时每轮的请求数
QUICK_ROUNDS = 3          # 轮;--quick 时的轮数
TARGET_RATIO = 0.80       # 倍;issue 6 的目标:新事件的 req/s ≥ 空端点的 0.80
START_TIMEOUT_S = 30      # 秒;uvicorn 起不来就放弃
REQUEST_TIMEOUT_S = 30    # 秒;一轮的时限是它再加上每个请求 1 秒,超过了整个基准出错停下(组提交卡住时不会无限等)
SECRET = "bench-secret"   # 只在这次运行的临时服务里用
PATH = "/hooks/cloudledger"
# 两个服务用同一组 uvicorn 参数;不打访问日志(每个请求一行日志会成为瓶颈,两边都一样关掉)
UVICORN_ARGS = ["--host", "127.0.0.1", "--log-level", "warning", "--no-access-log"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """等 uvicorn 开始监听;它先退出了就带上它的 stderr 报错。"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn 提前退出(退出码 {proc.returncode}):{log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{timeout} 秒内端口 {port} 没有开始监听")


def descendants(pid: int) -> list[int]:
    """还活着的子孙进程(webhook 的写库进程)。"""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:  # 这个线程刚好退出了
            continue
        for child in children:
            found += [int(child), *descendants(int(child))]
    return found


def cpu_seconds(pid: int) -> float:
    """服务累计用掉的 CPU 时间(用户态 + 内核态),秒:进程自己、已经退出并被它收回的子进程、还活着的子孙进程。"""
    total = 0
    for i, p in enumerate([pid, *descendants(pid)]):
        fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        total += sum(int(f) for f in fields[11:15 if i == 0 else 13])
    return total / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """服务的峰值常驻内存,MiB:进程自己和它的子孙进程(写库进程)各自的 VmHWM 加起来。"""
    return sum(common.peak_rss_mb(p) for p in [pid, *descendants(pid)])


class Server:
    """一个 uvicorn 子进程。"""

    def __init__(self, app: str, env: dict, log: Path):
        self.port = free_port()
        with open(log, "w") as err:  # 日志写文件,不用管道:管道满了 uvicorn 会卡住
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", app, "--port", str(self.port), *UVICORN_ARGS],
                cwd=common.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        wait_for_port(self.port, self.proc, log, START_TIMEOUT_S)

    def kill(self) -> None:
        """kill -9:不给它收尾的机会,看回过 202 的事件是不是还在库里。"""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def build_requests(port: int, bodies: list[bytes]) -> list[bytes]:
    """拼好完整的 HTTP/1.1 请求(签名在计时之外算好;时间戳容差 300 秒,一轮用不了那么久)。"""
    out = []
    for body in bodies:
        head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nX-CloudLedger-Signature: {sign(body, SECRET)}\r\n\r\n")
        out.append(head.encode() + body)
    return out


def event_bodies(prefix: str, n: int) -> list[bytes]:
    return [json.dumps({"id": f"{prefix}-{i:06d}", "type": "ticket.created",
                        "data": {"ticket_id": f"T{1001 + i % 41}"}}).encode() for i in range(n)]


async def _connection(port: int, requests: list[bytes], order, results: list, after_each=None) -> None:
    """一条连接:从 order 里拿下一个请求、发出去、读完回答,直到 order 空了。after_each 不是 None 时(崩溃那一轮)
    每读完一个回答调它一次;服务被杀掉后连接断了、连不上,这条连接就停下,不算出错。"""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        if after_each is None:
            raise
        return
    try:
        await _send_all(reader, writer, requests, order, results, after_each)
    except (OSError, asyncio.IncompleteReadError):
        if after_each is None:
            raise
    finally:
        writer.close()


async def _send_all(reader, writer, requests, order, results, after_each=None) -> None:
    for i in order:  # 32 个协程共用一个迭代器:谁空了谁拿下一个
        start = time.perf_counter()
        writer.write(requests[i])
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        body = await reader.readexactly(length)
        results[i] = (int(head[9:12]), body, time.perf_counter() - start)
        if after_each is not None:
            after_each()


async def _load(port: int, requests: list[bytes], after_each=None) -> tuple[float, list]:
    results: list = [None] * len(requests)
    order = iter(range(len(requests)))
    start = time.perf_counter()
    tasks = [_connection(port, requests, order, results, after_each) for _ in range(CONNECTIONS)]
    await asyncio.wait_for(asyncio.gather(*tasks), REQUEST_TIMEOUT_S + len(requests))
    return time.perf_counter() - start, results


def crash_round(server: Server, bodies: list[bytes]) -> dict:
    """崩溃那一轮(见文件开头):发一轮新事件,回到一半时 webhook 和写库进程一起 kill -9。
    返回回了 202 的事件 id、kill 之前回了几个、有几个请求没等到回答。"""
    pids = [server.proc.pid, *descendants(server.proc.pid)]
    kill_after, answered = len(bodies) // 2, 0

    def count_and_maybe_kill() -> None:
        nonlocal answered
        answered += 1
        if answered == kill_after:
            for pid in reversed(pids):  # 写库进程先:它手上那一批来不及再提交
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    _, results = asyncio.run(_load(server.port, build_requests(server.port, bodies), count_and_maybe_kill))
    server.proc.wait()
    ok = {json.loads(bodies[i])["id"] for i, r in enumerate(results)
          if r is not None and r[0] == 202 and json.loads(r[1]) == {"accepted": True, "duplicate": False}}
    return {"acknowledged": ok, "kill_after": kill_after, "unanswered": sum(r is None for r in results)}


def load(server: Server, bodies: list[bytes]) -> dict:
    """发一轮;返回 req/s、延迟、每个请求的服务端 CPU、客户端 CPU 占比,以及每个请求的 (状态码, JSON)。"""
    requests = build_requests(server.port, bodies)
    cpu_before, client_before = cpu_seconds(server.proc.pid), time.process_time()
    elapsed, results = asyncio.run(_load(server.port, requests))
    cpu_after, client_after = cpu_seconds(server.proc.pid), time.process_time()
    latencies = [r[2] for r in results]
    return {"rps": len(bodies) / elapsed, "p50": percentile(latencies, 50) * 1000,
            "p99": percentile(latencies, 99) * 1000, "server_cpu_ms": (cpu_after - cpu_before) / len(bodies) * 1000,
            "client_cpu": (client_after - client_before) / elapsed,
            "answers": [(status, json.loads(body) if status < 500 else body) for status, body, _ in results]}


def check_answers(answers: list, duplicate: bool) -> int:
    """回得不对的请求数:应当全是 202 {"accepted": true, "duplicate": <duplicate>}。"""
    want = {"accepted": True, "duplicate": duplicate}
    return sum(1 for status, body in answers if status != 202 or body != want)


def durability(events_db: Path) -> str:
    """这次的事件库的落盘设置:journal_mode 记在库文件里;synchronous 是每个连接自己的,用写库进程同样的
    store.connect(durable=True) 打开一个连接读出来:表头写的是这次真的设置,不是照抄的一句。"""
    conn = store.connect(events_db, durable=True)
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        level = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[conn.execute("PRAGMA synchronous").fetchone()[0]]
    finally:
        conn.close()
    return f"journal_mode={mode},synchronous={level}"


def stored_ids(events_db: Path) -> set[str]:
    conn = store.connect(events_db)  # 给了路径:永远是 SQLite 文件
    try:
        return {r[0] for r in conn.execute("SELECT event_id FROM events")}
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="webhook 吞吐基准(对比只回 202 的空端点)")
    parser.add_argument("--quick", action="store_true", help=f"冒烟:{QUICK_ROUNDS} 轮 × {QUICK_REQUESTS} 个请求")
    parser.add_argument("--requests", type=common.positive_int, help=f"每轮每种负载的请求数(默认 {REQUESTS})")
    parser.add_argument("--rounds", type=common.positive_int, help=f"轮数(默认 {ROUNDS})")
    parser.add_argument("--parts", action="store_true",
                        help="另外起两个拆开的 webhook(bench/webhook_parts.py),看多出来的 CPU 花在哪一步")
    parser.add_argument("--lesson", action="store_true",
                        help="另外起一个课文写法的 webhook(请求里直接写 SQLite,bench/webhook_parts.py lesson)")
    args = parser.parse_args(argv)
    n = args.requests if args.requests is not None else (QUICK_REQUESTS if args.quick else REQUESTS)
    rounds = args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else ROUNDS)
    common.print_header("webhook 吞吐:我们的 webhook.py 对比只回 202 的空 FastAPI",
                        common.command_line("bench/webhook.py"))
    print(f"设置:{CONNECTIONS} 条并发 keep-alive 连接;每种负载 {rounds} 轮 × {n} 个请求,取中位数;"
          f"uvicorn {' '.join(UVICORN_ARGS)}(单进程);事件库是临时 SQLite 文件,组提交。\n", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:
        env = common.clean_env(**common.lab_env(Path(tmp)), WEBHOOK_SECRET=SECRET)
        ours = Server("webhook:app", env, Path(tmp) / "webhook.log")
        bare = Server("bench.bare_app:app", env, Path(tmp) / "bare.log")
        extra = [*(PARTS if args.parts else ()), *(["lesson"] if args.lesson else [])]
        parts = {part: Server("bench.webhook_parts:app",
                              {**env, "BENCH_WEBHOOK_PART": part, "BENCH_LESSON_DB": str(Path(tmp) / "lesson.db")},
                              Path(tmp) / f"{part}.log")
                 for part in extra}
        try:
            results, acknowledged, wrong = run_rounds(ours, bare, n, rounds, parts)
            rss = {"bare": peak_rss_mb(bare.proc.pid), "new": peak_rss_mb(ours.proc.pid)}
            rss |= {part: peak_rss_mb(server.proc.pid) for part, server in parts.items()}
            crash = crash_round(ours, event_bodies("crash", n))
            acknowledged |= crash["acknowledged"]
        finally:
            for server in (ours, bare, *parts.values()):
                server.kill()
        # webhook 和写库进程都已经被 kill -9:现在库里有的,就是它们崩溃前真正提交了的
        missing = acknowledged - stored_ids(Path(env["EVENTS_DB"]))
        settings = durability(Path(env["EVENTS_DB"]))
    report(results, rss, rounds, n, acknowledged, missing, wrong, crash, settings)
    return 0


def run_rounds(ours: Server, bare: Server, n: int, rounds: int, parts: dict[str, Server]):
    """预热(也把重复投递要用的事件先存进去),然后每轮把每种负载各跑一遍;每轮换一下先后次序,抵消机器负载的漂移。"""
    seeded = event_bodies("seed", n)
    load(bare, seeded)
    warm = load(ours, seeded)
    for server in parts.values():
        load(server, seeded)
    acknowledged = {json.loads(seeded[i])["id"] for i, (s, _) in enumerate(warm["answers"]) if s == 202}
    kinds = ["bare", "new", "duplicate", *parts]
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    wrong = {k: 0 for k in kinds}
    for r in range(rounds):
        fresh = event_bodies(f"round{r}", n)
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            if kind in parts:  # 拆开的 webhook 不存事件,回的都是 duplicate=false
                res = load(parts[kind], fresh)
                wrong[kind] += check_answers(res["answers"], duplicate=False)
            elif kind == "duplicate":  # 预热时存过的事件原样再发一次(重新签名,就像上游重试)
                res = load(ours, seeded)
                wrong[kind] += check_answers(res["answers"], duplicate=True)
            elif kind == "new":
                res = load(ours, fresh)
                wrong[kind] += check_answers(res["answers"], duplicate=False)
                acknowledged |= {json.loads(fresh[i])["id"] for i, (s, _) in enumerate(res["answers"]) if s == 202}
            else:
                res = load(bare, fresh)
                wrong[kind] += sum(1 for s, _ in res["answers"] if s != 202)
            results[kind].append(res)
        print(f"第 {r + 1}/{rounds} 轮:" + ",".join(f"{k} {results[k][-1]['rps']:.0f} req/s" for k in kinds), flush=True)
    return results, acknowledged, wrong


def paired_ratio(ours: list[dict], bare: list[dict]) -> float:
    return median(o["rps"] / b["rps"] for o, b in zip(ours, bare))


def report(results, rss, rounds, n, acknowledged, missing, wrong, crash, settings: str) -> None:
    labels = {"bare": "空 FastAPI(基线,只回 202)", "new": "webhook.py:新事件(验签 + 组提交落盘)",
              "duplicate": "webhook.py:重复投递(验签 + 去重)"}
    ratio = {kind: paired_ratio(results[kind], results["bare"]) for kind in labels}
    rows = []
    for kind, label in labels.items():
        rs = results[kind]
        rows.append([label, median(r["rps"] for r in rs), f"{ratio[kind]:.2f}", median(r["p50"] for r in rs),
                     median(r["p99"] for r in rs),
                     median(r["server_cpu_ms"] for r in rs), f"{median(r['client_cpu'] for r in rs):.0%}",
                     rss.get(kind, rss["new"]), wrong[kind]])
    print(f"\n## 结果({rounds} 轮的中位数,每轮 {n} 个请求,{CONNECTIONS} 条连接)\n")
    table(["负载", "req/s", "÷ 基线(逐轮)", "p50 ms", "p99 ms", "服务端 CPU ms/请求", "客户端 CPU", "峰值 RSS MiB",
           "回错的请求"], rows)
    print("每轮的 req/s:")
    for kind, label in labels.items():
        print(f"- {label}:" + "、".join(f"{r['rps']:.0f}" for r in results[kind]))
    print("\n「÷ 基线(逐轮)」:每轮用这一轮的 req/s 除以同一轮空端点的 req/s,再取各轮的中位数"
          "(同一轮里前后脚量的,机器负载的起伏大体抵消)。")
    print("服务端 CPU 和峰值 RSS 都算上了 webhook 的写库进程(webhook_writer.py)。峰值 RSS 是整个运行(全部轮次)里"
          "各进程 VmHWM 的和;新事件和重复投递是同一个 webhook。")
    client_busy = max(median(r["client_cpu"] for r in results[k]) for k in results)
    if client_busy > 0.9:
        print(f"注意:客户端 CPU 占到 {client_busy:.0%},客户端可能成了瓶颈,比值会偏高。")

    new_ratio, dup_ratio = ratio["new"], ratio["duplicate"]
    print("\n## 目标\n")
    print(f"- {mark(new_ratio >= TARGET_RATIO)} 新事件 req/s ÷ 空端点 = {new_ratio:.2f}(目标 ≥ {TARGET_RATIO:.2f},"
          "每个 202 之前都已提交落盘)")
    print(f"- {mark(dup_ratio >= TARGET_RATIO)} 重复投递 req/s ÷ 空端点 = {dup_ratio:.2f}(同一目标,供参考)")
    print(f"- {mark(not missing)} 回了 202 的新事件 {len(acknowledged)} 个(其中崩溃那一轮 {len(crash['acknowledged'])} 个:"
          f"回到第 {crash['kill_after']} 个时 webhook 和写库进程一起被 kill -9,{crash['unanswered']} 个请求没等到回答(在路上的和还没发出去的));"
          "之后库里" + ("一个不少" if not missing else f"缺 {len(missing)} 个,例如 {sorted(missing)[:3]}")
          + f"。事件库 {settings}")
    bad = sum(wrong.values())
    print(f"- {mark(not bad)} 回错的请求:{bad} 个(新事件应是 duplicate=false,重复投递应是 duplicate=true)")
    if new_ratio < TARGET_RATIO:
        print("\n没达标:看上表「服务端 CPU ms/请求」一栏,webhook 每个请求比空端点多用的 CPU 就是差距所在。")
    if any(part in results for part in PARTS):
        report_parts(results)
    if "lesson" in results:
        report_lesson(results, rss)
    sys.stdout.flush()


PARTS = {"no_store": "读请求体、验签、解析,不存(bench/webhook_parts.py no_store)",
         "await_only": "同上,再挂起一次等下一轮事件循环(await_only)"}


def report_parts(results: dict[str, list[dict]]) -> None:
    """--parts:从空端点一步步加到真 webhook,每一步多用多少服务端 CPU、吞吐是空端点的几成。"""
    steps = [("bare", "空 FastAPI(基线)"), ("no_store", PARTS["no_store"]), ("await_only", PARTS["await_only"]),
             ("new", "webhook.py:新事件(再交给写库进程,组提交落盘)")]
    print("\n## 差距在哪(--parts):从空端点一步步加到真 webhook\n")
    rows, before = [], None
    for kind, label in steps:
        cpu = median(r["server_cpu_ms"] for r in results[kind])
        rows.append([label, f"{cpu:.3f}", "—" if before is None else f"{cpu - before:+.3f}",
                     f"{paired_ratio(results[kind], results['bare']):.2f}"])
        before = cpu
    table(["这一步", "服务端 CPU ms/请求", "比上一步多", "req/s ÷ 空端点(逐轮)"], rows)
    print("服务端 CPU 是 uvicorn 进程和它的写库进程的用户态 + 内核态时间(/proc/<pid>/stat)。")


def report_lesson(results: dict[str, list[dict]], rss: dict) -> None:
    """--lesson:课文的写法(请求里直接写 SQLite)和真 webhook 并排,都除以同一轮的空端点。"""
    print("\n## 课文的写法(--lesson):请求里直接写 SQLite,每个请求提交一次\n")
    rows = []
    for kind, label in (("bare", "空 FastAPI(基线)"), ("lesson", LESSON),
                        ("new", "webhook.py:新事件(写库进程组提交,每个 202 之前已落盘)")):
        rs = results[kind]
        rows.append([label, median(r["rps"] for r in rs), f"{paired_ratio(rs, results['bare']):.2f}",
                     median(r["p50"] for r in rs), median(r["p99"] for r in rs),
                     median(r["server_cpu_ms"] for r in rs), rss[kind]])
    table(["负载", "req/s", "÷ 空端点(逐轮)", "p50 ms", "p99 ms", "服务端 CPU ms/请求", "峰值 RSS MiB"], rows)
    print("每轮的 req/s(课文的写法):" + "、".join(f"{r['rps']:.0f}" for r in results["lesson"]))
    print("课文写法那个服务的峰值 RSS 里含一个闲着的写库进程(拆开的 webhook 启动时照样拉起它,见 bench/webhook_parts.py),"
          "约 13 MiB;课文自己的写法没有这个进程。")
    print(f"webhook.py ÷ 课文的写法(逐轮):{paired_ratio(results['new'], results['lesson']):.1f} 倍")


LESSON = "课文的写法:协程里直接写 SQLite(每个请求连库、提交一次;bench/webhook_parts.py lesson)"


if __name__ == "__main__":
    sys.exit(main())
