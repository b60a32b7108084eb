"""把课文的全流程(练习 1)用真的零件跑一遍:真 webhook 服务、真 HTTP、真 SQLite 文件、真 worker 和收件箱进程。

运行:uv run python demo.py
你会看到每一步先打印它跑的命令(以 $ 开头,照着敲就能自己复现),再打印那条命令的输出;
最后是事件表、发件箱和审核记录(review_log),并核对结果和课文一致:T1012 done/1、T1041 done/1、T1003 ignored/1、T9999 dead,
发件箱恰好两行。一致就退出码 0,不一致就指出哪里不对、退出码 1。
环境变量或 .env 里有一项设置写错了,一步都不跑,只说「演示没有开始:配置错误:…」,退出码 1。

每次都在一个新的临时数据目录里跑(事件库、checkpoint、业务库都是新的),可以反复跑,不碰你自己的 ambient.db(设了 DATABASE_URL 也不碰那个 PostgreSQL)。
不需要 API key:没有 LLM_API_KEY 时用离线模型。加 --keep 可以保留数据目录,跑完自己用 sqlite3 看。

uv run python demo.py --web:跑到「看收件箱」为止,然后起收件箱网页(inbox_web.py),打印它的地址;在浏览器里处理
T1012、T1041、T1003,按 Ctrl-C 结束(退出码 0,收拾好临时目录)。
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import config
import inbox_seen
import webhook
import worker

LAB = config.HERE
USAGE = "用法:uv run python demo.py [--keep] [--web](--keep:跑完保留临时数据目录;--web:停在收件箱,在网页上处理)"
PORT = 8139  # 课文用的端口;被占用时换一个空闲端口
WEB_PORT = 8140  # 收件箱网页的端口(inbox_web.py 开头的命令);同上
FEEDBACK = "这张已确认是重复扣款,直接告诉客户退款申请已提交、原路退回,别写金额"
EDITED = ("您好,已确认 10 月 8 日的 INV-2026-0123 是重复扣款,退款申请已提交,会原路退回,"
          "到账时间以支付渠道为准。给您添麻烦了。")
EXPECTED_EVENTS = [("evt_T1012_created", "done", 1), ("evt_T1041_created", "done", 1),
                   ("evt_T1003_created", "ignored", 1), ("evt_T9999_created", "dead", 1)]


def free_port(preferred: int = PORT) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("找不到空闲端口")


def step(title: str, shown: str, argv: list[str], env: dict) -> str:
    """打印命令,像学员一样在实验目录里跑它,原样打印输出;失败(非 0)就停下。"""
    print(f"\n## {title}\n$ {shown}", flush=True)
    r = subprocess.run([sys.executable, *argv], cwd=LAB, env=env, capture_output=True, text=True, timeout=300)
    sys.stdout.write(r.stdout)
    for line in r.stderr.splitlines():
        if not line.startswith("[llm]"):  # 离线模型的提示每个进程说一次,演示里只在开头说一次
            print(line)
    if r.returncode != 0:
        raise SystemExit(f"演示中断:这一步的退出码是 {r.returncode}")
    return r.stdout


def draft_shown(listing: list[str], ticket_id: str) -> str | None:
    """inbox.py list 给人看的这张工单的草稿全文;不在收件箱里是 None。草稿有好几行(真模型常这样写)时,
    后面几行缩进 8 个空格,和「草稿:」那一行的正文接起来。"""
    indent = " " * 8
    for i, line in enumerate(listing[:-1]):
        if line.startswith(f"{ticket_id} ") and listing[i + 1].startswith(f"{indent}草稿:"):
            lines = [listing[i + 1].split("草稿:", 1)[1]]
            for more in listing[i + 2:]:
                if not more.startswith(indent) or more.startswith(f"{indent}已按意见重写"):
                    break
                lines.append(more[len(indent):])
            return "\n".join(lines)
    return None


def query(sql: str, path: Path) -> list[tuple]:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql)]
    finally:
        conn.close()


def show(sql: str, path: Path) -> list[tuple]:
    print(f'$ sqlite3 {path.name} "{sql}"')
    result = query(sql, path)
    for r in result:
        print("|".join("" if v is None else str(v) for v in r))
    return result


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float = 30, name: str = "webhook 服务") -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name}没起来:\n{proc.stderr.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{name} {seconds} 秒内没起来")


def serve_inbox_page(env: dict) -> int:
    """--web:起收件箱网页,说地址,等人在浏览器里处理完按 Ctrl-C。"""
    port = free_port(WEB_PORT)
    print(f"\n## 终端 3:起收件箱网页\n$ uv run uvicorn inbox_web:app --port {port}", flush=True)
    page = subprocess.Popen([sys.executable, "-m", "uvicorn", "inbox_web:app", "--port", str(port), "--log-level", "warning"],
                            cwd=LAB, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, page, name="收件箱网页")
        print(f"收件箱网页:http://127.0.0.1:{port}/ (在浏览器里处理 T1012、T1041、T1003;按 Ctrl-C 结束)", flush=True)
        while page.poll() is None:
            time.sleep(0.2)
        raise SystemExit(f"收件箱网页意外退出了(退出码 {page.returncode}):\n{page.stderr.read()}")
    except KeyboardInterrupt:
        print("已停止收件箱网页", flush=True)
        return 0
    finally:
        page.terminate()
        page.wait(timeout=10)


def check_settings() -> None:
    """演示里每个程序要读的设置(webhook 密钥、worker 和图的设置、SQLite 等锁的时间),开始之前先在这里读一遍:
    哪一项写错了,一步都不跑就说是哪一项,而不是跑到用它的那一步才停下。收件箱的文字上限比演示要输入的意见、
    改好的回复还短时也一样。"""
    config.value("BUSY_TIMEOUT_S")
    for read in (webhook.check_secret, worker.read_settings, inbox_seen.viewer):
        read()
    longest = max(len(FEEDBACK), len(EDITED))
    if (limit := config.value("INBOX_MAX_TEXT_CHARS")) < longest:  # 不然跑到 respond 那一步才被收件箱拒绝,T1012 已经发出去了
        raise SystemExit(f"配置错误:INBOX_MAX_TEXT_CHARS={limit} 比演示要输入的文字({longest} 个字)还短")


def stopped(signum: int, _frame) -> None:
    """SIGTERM(kill、systemd)和 SIGHUP(关掉终端)和 Ctrl-C 一样:一行原因,收拾好(停 webhook 服务、删临时目录)再退出,
    退出码 128 + 信号:不收拾的话临时目录留在 /tmp,只发给 demo 的信号还会让 webhook 服务成了孤儿进程。
    收拾的途中再来一次不理:不能打断收拾。"""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    print(f"已中断(收到 {signal.Signals(signum).name})", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:  # 本来就不理的(nohup 起的)照旧不理
            signal.signal(sig, stopped)
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if any(a not in ("--keep", "--web") for a in argv) or len(set(argv)) != len(argv):
        print(USAGE, file=sys.stderr)
        return 2
    keep, web = "--keep" in argv, "--web" in argv
    os.chdir(LAB)  # 和每一步一样在实验目录里读 .env
    # 演示总是用临时目录里的 SQLite:环境变量或 .env 里设了 DATABASE_URL 也不碰那个 PostgreSQL
    # (设成空串:空串算没设置,.env 也不会覆盖已经存在的环境变量)
    os.environ["DATABASE_URL"] = ""
    try:
        check_settings()
    except SystemExit as e:
        raise SystemExit(f"演示没有开始:{e.code}(改好环境变量或 .env 里的这一项再跑)") from None
    data = Path(tempfile.mkdtemp(prefix="ambient-demo-"))
    port = free_port()
    env = {**os.environ, "EVENTS_DB": str(data / "ambient.db"),
           "CHECKPOINTS_DB": str(data / "checkpoints.db"), "BIZ_DB": str(data / "cloudledger.db"), "WEBHOOK_URL": f"http://127.0.0.1:{port}/hooks/cloudledger",
           "PYTHONUNBUFFERED": "1"}
    events_db = data / "ambient.db"
    print(f"数据目录:{data}(EVENTS_DB、CHECKPOINTS_DB、BIZ_DB 都指向这里)")
    if not config.get("LLM_API_KEY"):
        print("没有 LLM_API_KEY:用离线模型起草(按关键词分类、按模板写,不联网)。")
    if port != PORT:
        # 下面打印的 send_webhook.py 命令不带 WEBHOOK_URL:照着自己敲的话,发到的是占着 8139 的那个(多半是上次没停掉的 webhook)
        print(f"端口 {PORT} 被占用,这次用 {port};WEBHOOK_URL 已指向它(照着下面的命令自己敲 send_webhook.py 时,先 "
              f"export WEBHOOK_URL={env['WEBHOOK_URL']},不然发给了占着 {PORT} 的那个程序)。")

    server = None
    try:
        step("准备数据库(业务库 42 张工单、30 个客户、55 张发票)", "uv run python store.py", ["store.py"], env)
        print(f"\n## 终端 1:起 webhook 服务\n$ uv run uvicorn webhook:app --port {port}", flush=True)
        server = subprocess.Popen([sys.executable, "-m", "uvicorn", "webhook:app", "--port", str(port),
                                   "--log-level", "warning"], cwd=LAB, env=env, stderr=subprocess.PIPE, text=True)
        wait_for_port(port, server)
        print("(服务已在后台运行)")
        for ticket, times in (("T1012", "2"), ("T1041", None), ("T1003", None), ("T9999", None)):
            args = [ticket] + ([times] if times else [])
            step(f"终端 2:发 webhook {ticket}" + ("(连发两次,模拟上游重试)" if times else ""),
                 "uv run python send_webhook.py " + " ".join(args), ["send_webhook.py", *args], env)
        show("select event_id, status, attempts from events", events_db)

        step("worker 处理一轮", "uv run python worker.py --once", ["worker.py", "--once"], env)
        listing = step("看收件箱", "uv run python inbox.py list", ["inbox.py", "list"], env).splitlines()
        shown_draft = draft_shown(listing, "T1012")
        if shown_draft is None:  # worker 那一步每个事件都失败了,多半是模型连不上
            raise SystemExit("演示中断:T1012 没有进收件箱,看上面 worker 那一步为什么失败"
                             "(用真模型时检查 LLM_API_KEY、LLM_BASE_URL;不设 LLM_API_KEY 就用离线模型)")
        if web:
            return serve_inbox_page(env)
        step("批准 T1012", "uv run python inbox.py accept T1012", ["inbox.py", "accept", "T1012"], env)
        step("对 T1041 提意见,让 Agent 重写", f'uv run python inbox.py respond T1041 "{FEEDBACK}"',
             ["inbox.py", "respond", "T1041", FEEDBACK], env)
        step("T1041 改完再发", f'uv run python inbox.py edit T1041 "{EDITED}"', ["inbox.py", "edit", "T1041", EDITED], env)
        step("忽略 T1003", "uv run python inbox.py ignore T1003", ["inbox.py", "ignore", "T1003"], env)

        print("\n## 结果")
        final = show("select event_id, status, attempts from events", events_db)
        outbox = show("select ticket_id, body from outbox", events_db)
        show("select ticket_id, action, draft = final, feedback from review_log", events_db)
    finally:  # 这时再来的 Ctrl-C(uv run 转发的那一次)不会打断收拾:config.run 让 Ctrl-C 只抛一次
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        if not keep:
            shutil.rmtree(data, ignore_errors=True)

    problems = []
    if final != EXPECTED_EVENTS:
        problems.append(f"事件表应该是 {EXPECTED_EVENTS}")
    if [t for t, _ in outbox] != ["T1012", "T1041"] or outbox[0][1] != shown_draft or outbox[1][1] != EDITED:
        problems.append("发件箱应该恰好两行:T1012 是模型原稿,T1041 是人改过的版本")
    kept = f"\n数据留在 {data}" if keep else ""
    if problems:  # 对不上时更要知道库在哪,好用 sqlite3 查原因
        print("\n和课文对不上:\n" + "\n".join(problems) + kept)
        return 1
    print("\n和课文一致:T1012、T1041 done,T1003 ignored,T9999 进了死信(只试 1 次:工单不存在是永久错误);"
          "发件箱两行。" + kept)
    return 0


if __name__ == "__main__":
    config.run(main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
