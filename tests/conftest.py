"""测试共用的东西:每个测试一套全新的临时数据库,环境变量只在这个测试里生效。"""
import io
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB))
os.environ["AMBIENT_NO_DOTENV"] = "1"  # 不读开发者本机的 .env
for _name in ("LLM_API_KEY", "LLM_FALLBACK_MODEL", "DATABASE_URL", "SLACK_WEBHOOK_URL", "IMAP_HOST", "LANGFUSE_PUBLIC_KEY",
              "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST"):
    os.environ.pop(_name, None)

import config  # noqa: E402
import store  # noqa: E402
import store_biz  # noqa: E402
import store_pg  # noqa: E402
import store_sqlite  # noqa: E402
import worker_owner  # noqa: E402

# 测试里起的程序都当是在终端前台跑的:Ctrl-C(SIGINT)到得了它们。pytest 本身被放到后台跑(脚本里 `… &`)时继承了
# 「不理 SIGINT」,子进程又继承下去,worker、收件箱就照旧不理(它们该这样),按 Ctrl-C 的测试就测不到东西。
# 「从后台跑、本来就不理」的情形由各自的测试在子进程里自己设(preexec_fn)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def stop_signals_restored():
    """在 pytest 进程里直接调 worker.main() 的测试会装上 worker 的处理函数,退出时换成「不理」(config.ignore_stop_signals)。
    不换回来,之后起的子进程都继承「不理 SIGINT」,被当成从脚本里放到后台跑的:按 Ctrl-C 的测试失败,pytest 自己也按不停。"""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """一套新的事件库、checkpoint 库和业务库;返回给子进程用的环境变量。"""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    env = new_lab(tmp_path, monkeypatch.setenv)
    child = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "DATABASE_URL")}
    yield {**child, **env}
    # 每个测试一套新库:留着的连接不关,几百个测试下来打开的文件描述符会超过 1024,select() 就用不了了
    store_sqlite.close_connections()


def new_lab(folder: Path, setenv) -> dict:
    """在 folder 里建好三个 SQLite 库,用 setenv 指过去;返回这几个环境变量。"""
    env = {
        "EVENTS_DB": str(folder / "ambient.db"),
        "CHECKPOINTS_DB": str(folder / "checkpoints.db"),
        "BIZ_DB": str(folder / "cloudledger.db"),
        "AMBIENT_NO_DOTENV": "1",
    }
    for k, v in env.items():
        setenv(k, v)
    store.init()
    store_biz.build_biz_db(Path(env["BIZ_DB"]))
    return env


def run(args: list[str], env: dict, timeout: float = 120, input: str | None = None,
        cwd: Path = LAB) -> subprocess.CompletedProcess:
    """像学员一样在实验目录里跑一个脚本(真的新进程);cwd 换一个目录时,脚本要写绝对路径(.env 从 cwd 读)。
    timeout 秒还没结束就判失败;失败信息里是它那时各线程的栈(-X faulthandler,先发 SIGABRT),卡在哪里一看便知。"""
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", *args], cwd=cwd, env=env, text=True,
                            stdin=None if input is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(input, timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    pytest.fail(f"{' '.join(args)[:200]} 超过 {timeout:g} 秒没结束。标准输出:\n{out[-5000:]}\n"
                f"标准错误(最后是各线程当时的栈):\n{err[-20000:]}", pytrace=False)


def cli(args: list[str], env: dict, input: str | None = None) -> subprocess.CompletedProcess:
    """在本进程里跑一个命令(inbox.py list、worker.py --once……),返回和 run() 一样的 (退出码, stdout, stderr)。
    走的是 `uv run python <脚本>` 的同一条路:config.run(main, argv),只是不再起一个进程、不再导入一遍 LangGraph。
    环境变量换成 env(时区 TZ 也跟着换),命令结束后复原;测试这边留着的 SQLite 连接和 PostgreSQL 连接池先关掉,命令按 env 里的
    设置(BUSY_TIMEOUT_S、PG_POOL_SIZE……)重新打开,像新进程一样。
    进程本身才是要测的东西时(kill -9、信号、.env、编码、导入时的行为)用 run()。"""
    import importlib

    import llm
    import llm_offline

    script, *argv = [os.fsdecode(a) for a in args]  # 参数是 bytes 时,像 Python 解码 sys.argv 那样(surrogateescape)
    main = importlib.import_module("store_cli" if script == "store.py" else script.removesuffix(".py")).main
    out, err = io.TextIOWrapper(io.BytesIO(), "utf-8"), io.TextIOWrapper(io.BytesIO(), "utf-8", "backslashreplace")
    saved_env, saved_argv, saved_stdin = dict(os.environ), sys.argv, sys.stdin
    store_sqlite.close_connections()
    store_pg.close_pools()
    os.environ.clear()
    os.environ.update(env)
    time.tzset()
    sys.argv, sys.stdin = [script, *argv], io.StringIO(input or "")
    llm._build.cache_clear()  # 模型每个进程建一次、「使用离线模型」说一次:每个命令都像新进程
    llm_offline._announced = threading.Lock()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            config.run(main, argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=err)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        time.tzset()
        sys.argv, sys.stdin = saved_argv, saved_stdin
    out.flush(), err.flush()
    return subprocess.CompletedProcess(args, code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode())


# 在 python -c 里接着这一句写:像 python <脚本> 或 python -m <模块> 一样运行 -c 后面的第一个参数(先在 -c 里改点什么)
RUN_AS_MAIN = ("sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__') if sys.argv[0].endswith('.py') "
               "else runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def imported_at_exit(*modules: str) -> list[str]:
    """接在 run() 的 ["-c", …, 脚本, 参数…] 里:像 RUN_AS_MAIN 一样跑脚本,进程退出时在标准输出上多印一行:
    modules 里哪些导入过了(照给的顺序)。查命令有没有导入用不上的重东西(LangGraph 的图、openai)。"""
    return ["-c", f"import atexit, runpy, sys; atexit.register(lambda: print([m for m in {modules!r} if m in sys.modules])); "
            + RUN_AS_MAIN]


# 磁盘满了:这个进程一个字节都写不进任何文件(RLIMIT_FSIZE = 0;SIGXFSZ 不理,write() 就返回 EFBIG,SQLite 说 disk I/O
# error)。软限制而已,测试可以用 resource.prlimit 给它放开,像腾出了空间。以 root 跑也拦得住,不用挂一个小文件系统。
# 标准输出、标准错误要是管道(run()、Popen(stdout=PIPE)):写进文件的话,连说明也写不出来。
# 程序走完、Python 退出时(程序自己的 atexit 都跑过了)再放开:coverage.py 量子进程时要在最后写下它的数据文件
FULL_DISK = ["-c", "import atexit, resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
             "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY)); "
             "atexit.register(resource.setrlimit, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2); "
             + RUN_AS_MAIN]


def refused_startup(r: subprocess.CompletedProcess, message: str) -> tuple:
    """uvicorn 的应用启动失败时应有的 (退出码, stdout, stderr):退出码 3,日志里是那句说明,不是 traceback。"""
    pid = r.stderr.partition("[")[2].partition("]")[0]
    return 3, "", (f"INFO:     Started server process [{pid}]\nINFO:     Waiting for application startup.\n"
                   f"ERROR:    {message}\nERROR:    Application startup failed. Exiting.\n")


# 让进程在写 checkpoint 的某一刻消失,像 kill -9 一样不清理、不回滚(die_at);或者在那一刻让 PostgreSQL 服务器
# 断掉这个进程的所有连接、然后接着往下跑,像数据库正好在这时重启(cut_at)。两种时刻:
# "put:<step>":第 step 步的 checkpoint 要写(put)时。这时上一步各节点的结果(put_writes)已经写下了:默认的 async
#   下两次写入在后台线程里按顺序做,kill -9 真会落在这中间(test_chaos 碰到过)。
# "writes:<channel>":某个节点的结果里有 channel 这个键、要写下(put_writes)时,也就是这个节点刚跑完、结果还没存。
#   "writes:<channel>=<值>":只在这个键的值是它时(字符串),比如 writes:outcome=ignored 是 ignore 节点的结果。
DIE_AT = """
import os, runpy, sys
from agent import opened_graph
with opened_graph() as graph:
    saver_class = type(graph.checkpointer)
action, _, spec = sys.argv.pop(1).rpartition("@")
kind, _, where = spec.partition(":")
def strike():
    if action != "cut":
        os._exit(9)
    import psycopg, worker_owner  # 用一个新连接去断:这个进程自己池里的连接都在名单上
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE application_name = %s",
                      (worker_owner.pg_application_name(),))  # 10000:等那些连接真的断了(毫秒)再往下跑
real_put, real_put_writes = saver_class.put, saver_class.put_writes
def put(self, config, checkpoint, metadata, new_versions):
    if kind == "put" and metadata.get("step") == int(where):
        strike()
    return real_put(self, config, checkpoint, metadata, new_versions)
channel_wanted, has_value, value_wanted = where.partition("=")
def put_writes(self, config, writes, task_id, task_path=""):
    if kind == "writes" and any(channel == channel_wanted and (not has_value or value == value_wanted)
                                for channel, value in writes):
        strike()
    return real_put_writes(self, config, writes, task_id, task_path)
saver_class.put, saver_class.put_writes = put, put_writes
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def dead_owner() -> str:
    """本机上一个已经退出的进程的 worker id(「主机名:进程号」):它名下 processing 的事件算「进程没了」。"""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return f"{socket.gethostname()}:{dead.pid}"


def die_at(env: dict, when: str, *args: str) -> subprocess.CompletedProcess:
    """跑实验目录里的一个脚本(args 同 run),在 when(见 DIE_AT)那一刻死掉;断言它确实是这样死的。"""
    r = run(["-c", DIE_AT, when, *args], env)
    assert r.returncode == 9, r.stderr
    return r


def cut_at(env: dict, when: str, *args: str) -> subprocess.CompletedProcess:
    """跑实验目录里的一个脚本,到 when(见 DIE_AT)那一刻让 PostgreSQL 断掉它的所有连接,让它接着跑完。"""
    return run(["-c", DIE_AT, f"cut@{when}", *args], env)


def cut_connections(pid: int, *, quiet_for_s: float | None = None) -> int:
    """像 PostgreSQL 重启、防火墙或 PgBouncer 掐掉闲连接那样,在服务器那头断掉这个进程的所有连接;返回断了几个。
    用一个单独的连接来做:测试进程自己的连接池也可能在被断的名单里。
    quiet_for_s:只在这个进程的连接全都闲着、最近一条语句结束还不到 quiet_for_s 秒时断(同一条语句里判断和断开),
    否则等一会儿再看。worker 每 POLL_SECONDS 查一次队列,这样断开正好落在两次查询之间,不会赶上一条正在跑的语句。"""
    import psycopg

    name = worker_owner.pg_application_name(worker_owner.worker_id(pid))
    quiet = "" if quiet_for_s is None else (
        " AND (SELECT bool_and(state = 'idle') AND clock_timestamp() - max(state_change) < make_interval(secs => %s)"
        " FROM pg_stat_activity WHERE application_name = %s)")
    args = (name,) if quiet_for_s is None else (name, quiet_for_s, name)
    deadline = time.monotonic() + 60
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        while True:
            n = conn.execute("SELECT COUNT(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
                             "WHERE application_name = %s" + quiet, args).fetchone()[0]
            if n or quiet_for_s is None or time.monotonic() > deadline:
                return n
            time.sleep(0.01)


@contextmanager
def write_locked(path=None):
    """像有人在 sqlite3 里开了事务、改了东西还没提交那样,占着这个 SQLite 库(默认事件库)的写锁,直到 with 结束。"""
    conn = sqlite3.connect(path or store.events_db(), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
    finally:
        conn.close()  # 没提交的事务随之回滚


@contextmanager
def someone_holds_the_events_table():
    """像有人在 sqlite3 / psql 里开着事务、写了事件表还没提交那样占着它的锁,直到 with 结束(回滚)。"""
    if store.dialect() == "sqlite":
        with write_locked():
            yield
        return
    import psycopg

    with psycopg.connect(store.database_url()) as conn:  # 不是 autocommit:with 结束前一直在事务里
        conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")
        yield
        conn.rollback()


def die_before_checkpoint(env: dict, step: int, *args: str) -> subprocess.CompletedProcess:
    """在写第 step 步的 checkpoint 之前死掉。"""
    return die_at(env, f"put:{step}", *args)


def drain(concurrency: int | None = None) -> list[tuple[str, str]]:
    """在本进程里开一个 worker,把现在能领的事件处理完:[(event_id, 新状态)]。"""
    import worker

    w = worker.Worker(concurrency)
    try:
        return w.run_once()
    finally:
        w.close()


def rows(sql: str, args: tuple = (), path=None) -> list[tuple]:
    conn = store.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()


def checkpoint_bytes() -> bytes:
    """checkpoint 库里存下的全部东西(checkpoint、每个节点的 writes、恢复时人给的回答),拼成一串字节:
    查某段文字有没有原样存下来用。"""
    if store.dialect() == "sqlite":
        queries, conn = ["SELECT checkpoint FROM checkpoints", "SELECT metadata FROM checkpoints",
                         "SELECT value FROM writes"], store.connect(store.checkpoints_db())
    else:
        queries, conn = ["SELECT checkpoint::text FROM checkpoints", "SELECT metadata::text FROM checkpoints",
                         "SELECT blob FROM checkpoint_blobs WHERE blob IS NOT NULL",
                         "SELECT blob FROM checkpoint_writes"], store.connect()
    try:
        return b"".join(v.encode() if isinstance(v := r[0], str) else bytes(v)
                        for q in queries for r in conn.execute(q).fetchall())
    finally:
        conn.close()


@contextmanager
def tcp_proxy(host: str, port: int, relay_if, then: str = "close", hold: threading.Event | None = None):
    """127.0.0.1 上的一个 TCP 代理,挡在真的 PostgreSQL 前面。每来一个连接问一次 relay_if(计数):真就原样转过去;
    假就 then="close":一接上就关掉(像服务器连接数满了、正在重启);then="silent":接上了、一个字也不回(像服务器卡死了)。
    hold 设着的时候,已经转着的连接收到的字节先扣着不转(像网络不通了:连接还在,谁也等不到对方的回话),放开后照转。
    返回 (代理的端口, 计数 {"relayed": 转过去几个, "refused": 没转过去的几个})。"""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    seen, stop, relays, silent = {"relayed": 0, "refused": 0}, threading.Event(), [], []

    def relay(client, upstream):
        with client, upstream:
            try:
                while True:
                    for sock in select.select([client, upstream], [], [])[0]:
                        if not (data := sock.recv(65536)):
                            return  # 有一头关了
                        while hold is not None and hold.is_set() and not stop.is_set():
                            time.sleep(0.01)
                        (upstream if sock is client else client).sendall(data)
            except OSError:
                return

    def serve():
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            if not relay_if(seen):
                seen["refused"] += 1
                silent.append(client) if then == "silent" else client.close()
                continue
            seen["relayed"] += 1
            t = threading.Thread(target=relay, args=(client, socket.create_connection((host, port))),
                                 name="proxy-relay", daemon=True)
            t.start()
            relays.append(t)

    acceptor = threading.Thread(target=serve, name="proxy-accept", daemon=True)
    acceptor.start()
    try:
        yield server.getsockname()[1], seen
    finally:
        stop.set()
        acceptor.join(5)
        server.close()
        for client in silent:
            client.close()
        for t in relays:
            t.join(5)


PG_URL = os.environ.get("TEST_DATABASE_URL", "")


@pytest.fixture
def pg_url() -> str:
    """测试用的 PostgreSQL(TEST_DATABASE_URL);没设时跳过这个测试。"""
    if not PG_URL:
        pytest.skip("没有设置 TEST_DATABASE_URL(CI 会设成本机的 postgresql://postgres@127.0.0.1:5432/test)")
    return PG_URL


@contextmanager
def pg_schema():
    """PostgreSQL 里一个新的空 schema,返回只看得见它的 DATABASE_URL;用完连同里面的表一起删掉。"""
    import uuid

    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        store_pg.close_pools()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '60s'")  # 还有进程占着锁时报错,不要一直等
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def read_write_role(owner_url: str, usage: bool = True):
    """一个新的 PostgreSQL 用户:能用 owner_url 的 schema(USAGE;usage=False 时连这个也没有),不能在里面建表;
    返回 (它的 DATABASE_URL, 给它读写权限的函数)。生产上常这样配:表由库的所有者建,程序用只有读写权限的用户连。"""
    import uuid

    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = schema_of(owner_url)
    role = f"t_{uuid.uuid4().hex[:12]}"

    def grant_read_write() -> None:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")

    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        if usage:
            conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    try:
        yield make_conninfo(owner_url, user=role), grant_read_write
    finally:
        store_pg.close_pools()
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def schema_of(url: str) -> str:
    """pg_schema() 给的 URL 只看得见的那个 schema。"""
    from psycopg.conninfo import conninfo_to_dict

    return conninfo_to_dict(url)["options"].split("=")[1]


@pytest.fixture
def pg_lab(lab, monkeypatch, pg_url):
    """同一套实验环境,但事件库和 checkpoint 放在真的 PostgreSQL 里:每个测试一个新 schema,用完删掉。"""
    with pg_schema() as url:
        monkeypatch.setenv("DATABASE_URL", url)
        store.init()
        store_biz.build_biz_tables()  # 业务表也建在这个 schema 里(拷 lab 建的 SQLite 业务库,和 store.py 第一次运行一样)
        yield {**lab, "DATABASE_URL": url}


@pytest.fixture(params=["sqlite", "postgres"])
def any_lab(request):
    """跑两遍:SQLite(默认)和 PostgreSQL(练习 6)。"""
    return request.getfixturevalue("lab" if request.param == "sqlite" else "pg_lab")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proxies_that_are_not_running() -> dict:
    """终端里设着代理(Clash 之类「复制终端代理命令」给的那三个变量),代理却没开。"""
    http, socks = f"http://127.0.0.1:{free_port()}", f"socks5://127.0.0.1:{free_port()}"
    return {"http_proxy": http, "https_proxy": http, "all_proxy": socks, "HTTP_PROXY": http, "HTTPS_PROXY": http,
            "ALL_PROXY": socks, "NO_PROXY": "", "no_proxy": ""}


@contextmanager
def serving(app):
    """真的 uvicorn 上的 app(真的 HTTP),跑在 pytest 进程的一个线程里:不用为每个测试再起一个 uvicorn 进程、再导入一遍
    FastAPI。设置读本进程的环境变量(lab 设好的那一套);返回基础 URL。服务起来时的那一行(lifespan 打印的)留在 pytest
    的输出里。进程本身才是要测的东西时(kill -9、退出码)另起进程。"""
    import uvicorn

    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started:
            assert thread.is_alive() and time.time() < deadline, "服务没起来"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextmanager
def webhook_server(env: dict):
    """起一个真的 uvicorn webhook 进程,等它能连上;返回 (进程, 基础 URL)。"""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "webhook:app", "--port", str(port),
                             "--log-level", "warning"], cwd=LAB, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "webhook 服务没起来"
                time.sleep(0.1)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
