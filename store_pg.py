"""练习 6 的 PostgreSQL:设了 DATABASE_URL 时,store.py 的 connect() 从这里的连接池借连接,
PgConnection 让它用起来和 sqlite3 的连接一样(? 占位符、按列名取值)。这里还有:
连接池的设置(借出去之前查一下闲了很久的连接还连着没有,连到只能读的服务器的连接不放回池里)、
DATABASE_URL 写错时在连接之前就说清楚、分清服务器拒绝连接是设置不对还是暂时的、建表被拒绝时一行说明,
以及 LangGraph 的 checkpointer(SQLite 文件或 PostgreSQL)。课文练习 6 只说换成 Postgres;几台机器、
几个进程共用一个库时,这些都会碰上。"""
import functools
import logging
import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager

import config
import store
import store_errors
import store_sqlite
import store_upgrade
import worker_owner


PG_CONNECT_TIMEOUT_S = 10  # 秒;第一次连 PostgreSQL 最多等多久,连不上就说明原因退出(不会一直挂着)
# 秒;从连接池借一个连接最多等多久(连接都借出去了时排队等;服务器连不上时也等到这么久才报「数据库暂时用不了」)。
# webhook 的写库进程一次只借一个,借不到只可能是连不上:它把这个数改小(webhook_writer.py),503 几秒内就回
PG_POOL_WAIT_S = 30.0


# 建表时 PostgreSQL 不让建的几种(按 psycopg 的错误类名):是设置的问题,等多久都不会好
PG_DDL_REFUSALS = {
    # 表都建好了的话,只有读写权限的用户也能运行(init() 不执行 DDL);走到这里是表还没建,或者这一版要给表加东西
    "InsufficientPrivilege": ("DATABASE_URL 的用户不能建表或改表",
                              "表还没建好,或者这一版程序要给表加列、加表;请库的所有者(或者有 CREATE 权限的用户)用同一个库和 "
                              "schema 运行一次 uv run python store.py,再 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES "
                              "IN SCHEMA <schema> TO <用户>。PostgreSQL 15 起普通用户不能在 public 里建表"),
    "ReadOnlySqlTransaction": ("DATABASE_URL 指的 PostgreSQL 只能读",
                               "多半连到了备库,或者设了 default_transaction_read_only;换成主库的地址"),
    # schema 在、这个用户却没有它的 USAGE 权限时,PostgreSQL 也当它不在(current_schema() 是空的)
    "InvalidSchemaName": ("DATABASE_URL 的 search_path 里没有一个存在的 schema",
                          "先 CREATE SCHEMA(schema 其实在的话,是这个用户没有它的 USAGE 权限:请库的所有者 "
                          "GRANT USAGE ON SCHEMA <schema> TO <用户>),或者改掉 options 里的 search_path"),
}


@contextmanager
def pg_refusing_ddl():
    """建表时 PostgreSQL 不让建(PG_DDL_REFUSALS):每个程序都先 init(),在这里一行说清楚、什么都还没做。
    PostgreSQL 15 起普通用户不能在 public 里建表,新手最常碰上的就是第一种。"""
    try:
        yield
    except Exception as e:  # 不在这里 import psycopg:没装时由 require_psycopg() 说怎么装(连库时才用到它)
        if not type(e).__module__.startswith("psycopg") or (refusal := PG_DDL_REFUSALS.get(type(e).__name__)) is None:
            raise
        what, advice = refusal
        raise SystemExit(f"{what}({store_errors.first_line(e)}):{advice}。什么都没做") from None


SCHEMA_LOCK = 20261130      # advisory lock 的编号:几个进程同时建事件表时排队
CHECKPOINT_LOCK = 20261131  # 同上,建 checkpoint 表用;和上面分开,两件事互不等待
_pools: dict = {}
_pools_lock = threading.Lock()


def init_postgres() -> None:
    """store.init() 在 PostgreSQL 上:建事件库的表、索引,补上后加的列(store_upgrade.PG_ADDED_COLUMNS)。"""
    # 都建好了(平常都是):一条 DDL 也不执行。CREATE … IF NOT EXISTS 什么都不做时也要建表的权限(schema 的 CREATE、
    # 表的所有者),所以库的所有者建好表之后,只有读写权限的用户(生产上常这样配)也能运行每个程序;
    # 也不用每次启动都为 CREATE INDEX 拿一下 events 的 SHARE 锁,和正在领事件的 worker 互相等
    with store.opened() as conn:
        if problem := store_upgrade.foreign_table(conn):
            raise SystemExit(problem)
        if store_upgrade.pg_nothing_to_build(conn):
            store_upgrade.pg_rights_or_exit(conn)
            return
    with pg_refusing_ddl():
        with store.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))  # 几个 worker 同时第一次启动
            # 等锁的时候,拿着锁的那个(所有者的 store.py、另一台机器上的 worker)可能刚好建完:再看一次,
            # 不然只有读写权限的用户在这里照样执行 DDL、被拒绝,虽然表已经都在了
            built_meanwhile = store_upgrade.pg_nothing_to_build(conn)
            if not built_meanwhile:
                conn.executescript(store.SCHEMA.format(**store.DIALECTS["postgres"]))
                store_upgrade.pg_add_columns(conn)
                conn.execute(store.ONE_PROCESSING_PER_TICKET)
    if built_meanwhile:
        with store.opened() as conn:
            store_upgrade.pg_rights_or_exit(conn)


def _pg_pool(url: str, durable: bool = True):
    """每个进程、每个 URL 两个连接池(提交等不等落盘,见 connect()),第一次用到时才建(import 时不连数据库)。"""
    with _pools_lock:
        if (url, durable) not in _pools:
            _pools[url, durable] = open_pg_pool(url, durable, row_factory=_pg_rows)
        return _pools[url, durable]


def open_pg_pool(url: str, durable: bool, **kwargs):
    """开一个连 url 的连接池(事件表的、checkpoint 的都用它),等第一个连接连上。
    没装依赖、URL 不是 PostgreSQL 的或写错了(见 url_problem)、PG_CONNECT_TIMEOUT_S 秒内连不上:以 SystemExit 退出,
    一行说明原因。"""
    scheme = url.split("://", 1)[0] if "://" in url else ""  # 不带 :// 的是 libpq 的 key=value 写法,也认
    if scheme and scheme not in ("postgresql", "postgres"):
        raise SystemExit(f"配置错误:DATABASE_URL 要以 postgresql:// 开头,现在是 {scheme}://…")
    require_psycopg()
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout

    if problem := url_problem(url):
        raise SystemExit(problem)
    max_size, idle_limit = config.value("PG_POOL_SIZE"), config.value("PG_IDLE_CHECK_S")  # 设置写错了先说它,用不着去连服务器
    # psycopg 和连接池在数据库断开后每秒好几行英文 WARNING;这些程序自己会说一行「数据库暂时用不了(…)」,只留 ERROR 及以上
    logging.getLogger("psycopg").setLevel(logging.ERROR)

    def check(conn) -> None:
        """借出去之前(连接池的 check 回调):上次借出去已经是 idle_limit 秒以前,就先确认还连着;死了就抛错,
        连接池扔掉它、换一个。刚连上的不查。不用连接池的 reset 回调记「还回来的时间」:设了 reset,每次还连接
        都要交给连接池的后台线程去做,PostgreSQL 上每个事件慢 1 ms 多(bench/worker.py 量过)。"""
        now, last = time.monotonic(), getattr(conn, "_ambient_taken_at", None)
        conn._ambient_taken_at = now
        if last is not None and now - last >= idle_limit:
            ConnectionPool.check_connection(conn)

    try:  # 先自己连一次:连不上时马上说出原因。连接池只会在日志里刷屏、重试到超时,最后说一句「超时了」
        psycopg.connect(url, connect_timeout=PG_CONNECT_TIMEOUT_S).close()
    except psycopg.Error as e:
        if isinstance(e, psycopg.OperationalError) and not refused_for_good(str(e)):
            raise  # 服务器没开、还在启动、连接数满了、网络不通:和用着用着断了一样是「数据库暂时用不了」,各个程序照常处理
        reason = ";".join(line.strip() for line in store_errors._safe_url(str(e)).splitlines() if line.strip()) or type(e).__name__
        raise SystemExit(f"连不上 DATABASE_URL 指的 PostgreSQL:{reason}") from None
    # connect_timeout:接上了却一直不回话的服务器,连接池的后台线程也别一直等着(连不上时关连接池要等它)
    pool = ConnectionPool(url, connection_class=_pooled_connection_class(), min_size=1, max_size=max_size,
                          timeout=PG_POOL_WAIT_S, kwargs={"autocommit": True, "application_name": worker_owner.pg_application_name(),
                                  "connect_timeout": PG_CONNECT_TIMEOUT_S, **kwargs},
                          configure=_configure(durable), check=check, open=False)
    try:
        pool.open(wait=True, timeout=PG_CONNECT_TIMEOUT_S)
    except PoolTimeout:
        pool.close()
        raise SystemExit(f"连不上 DATABASE_URL 指的 PostgreSQL:连接池 {PG_CONNECT_TIMEOUT_S} 秒内没有连上"
                         "(单独连一次是通的:服务器太忙,或者连接数满了)") from None
    return pool


def found_read_only(error: BaseException | None) -> bool:
    """这个错误是不是说连接连到了只能读的服务器上(主备切换时连到了还只能读的那台、用户或库上设了
    default_transaction_read_only)。这样连上的连接整个会话都只能读:还回连接池之前关掉,连接池另连一个,能写了
    (或者 URL 里写了 target_session_attrs=read-write、换到了新的主库)就好了。留在池里的话,服务器早就能写了,
    程序还一直说「只能读」。"""
    return type(error).__name__ == "ReadOnlySqlTransaction"


@functools.cache
def _pooled_connection_class():
    """连接池里的连接用的类:psycopg 的 Connection,多一件事 —— 用 with pool.connection() 借出去的(LangGraph 的
    PostgresSaver 就这样借、这样还),在里面碰上 found_read_only() 的错误,还回去之前关掉。
    事件表的连接不走 with,由 PgConnection.release() 做同一件事。"""
    import psycopg

    class PooledConnection(psycopg.Connection):
        def __exit__(self, exc_type, exc_val, exc_tb) -> None:
            super().__exit__(exc_type, exc_val, exc_tb)
            if found_read_only(exc_val):
                self.close()

    return PooledConnection


# 主机名里能有的字符(下划线不合规矩,但 docker compose 的服务名里常见,也解析得了);IP 地址另外认
HOSTNAME = re.compile(r"[A-Za-z0-9._-]+")
EXAMPLE_URL = "postgresql://用户@主机:5432/库名"


def url_problem(url: str) -> str | None:
    """DATABASE_URL(URL 或 libpq 的 key=value 写法)写得不对时,给人看的那一行「配置错误:…」;看不出毛病时是 None。
    这些错 libpq 要到连接时才说,psycopg 报的是 OperationalError,和服务器没开分不出来,会被当成「数据库暂时
    用不了」一直重试。域名解析不了的合法主机名还算暂时的(DNS 也会出故障)。"""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as e:  # 少了 :// 里的冒号、不是 URL 也不是 key=value、主机名里有空格
        reason = ";".join(line.strip() for line in store_errors._safe_url(str(e)).splitlines() if line.strip()) or type(e).__name__
        return f"配置错误:DATABASE_URL 读不懂({reason}):要写成 {EXAMPLE_URL}"
    hosts = (params.get("host") or "").split(",")
    for host in hosts:
        # 空的:默认的 Unix socket;/ 开头:Unix socket 所在的目录;@ 开头:Linux 的抽象 socket
        if host and not host.startswith(("/", "@")) and not HOSTNAME.fullmatch(host) and not _is_ip(host):
            return (f"配置错误:DATABASE_URL 里的主机 {host!r} 不是合法的主机名(只能有英文字母、数字、点和减号):"
                    "换成数据库所在机器的名字或 IP 地址")
    for address in (params.get("hostaddr") or "").split(","):
        if address.strip() and not _is_ip(address.strip()):
            return f"配置错误:DATABASE_URL 里的 hostaddr={address!r} 不是 IP 地址"
    ports = (params.get("port") or "").split(",")
    for port in ports:
        number = port.strip()  # libpq 容许前后有空格
        if number and not (number.isascii() and number.isdigit() and 1 <= int(number) <= 65535):
            return f"配置错误:DATABASE_URL 里的端口 {port!r} 不对:要是 1–65535 之间的整数(PostgreSQL 默认是 5432)"
    if len(ports) > 1 and len(ports) != len(hosts):
        return (f"配置错误:DATABASE_URL 里有 {len(hosts)} 个主机、{len(ports)} 个端口:端口要么只写一个,"
                "要么每个主机一个")
    # 没写库名时 libpq 用和用户同名的库(常常就是系统库 postgres),实验的表就建到了那里。PGDATABASE、
    # pg_service.conf 里的服务也能给出库名,这时不管
    if not params.get("dbname") and not params.get("service") and not os.environ.get("PGDATABASE") \
            and not os.environ.get("PGSERVICE"):
        return (f"配置错误:DATABASE_URL 里没有库名:在最后写上,例如 {EXAMPLE_URL}(不写的话 PostgreSQL 用和用户"
                "同名的库,常常是系统库 postgres,实验的表会建到那里)")
    return None


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# 服务器回了 FATAL 却不是设置的问题:等一会儿再连就好
PG_BUSY_FATALS = ("the database system is starting up", "the database system is shutting down",
                  "the database system is in recovery mode", "the database system is not yet accepting connections",
                  "the database system is not accepting connections", "too many clients already",
                  "remaining connection slots are reserved")


# libpq 自己(不是服务器)因为 DATABASE_URL 里的参数拒绝连接:sslmode=bogus 之类的值写错了,要 SSL 而服务器不支持,
# 要 channel binding 而服务器没用。等多久都不会好,不算「数据库暂时用不了」
PG_CLIENT_REFUSALS = ("connection is bad: invalid ", "but SSL was required", "channel binding required")


def refused_for_good(error: str) -> bool:
    """连 PostgreSQL 时的错误是不是设置的问题(库不存在、用户不存在、密码不对、pg_hba 不让连):服务器接了、回了 FATAL;
    或者 libpq 按 URL 里的参数就不连(PG_CLIENT_REFUSALS)。
    不是(连接被拒、超时、域名解析不了,或者服务器正忙着启动、连接数满了)就是暂时的,常驻的 worker 等着再试。
    psycopg 连接时的错误没有 sqlstate,只能看服务器说的话(服务器的 lc_messages 不是英文时看不懂,一律算暂时的)。"""
    if any(refusal in error for refusal in PG_CLIENT_REFUSALS):
        return True
    return "FATAL:" in error and not any(busy in error for busy in PG_BUSY_FATALS)


def require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        raise SystemExit("设置了 DATABASE_URL,但没装 PostgreSQL 的依赖:运行 uv sync --extra postgres") from None


def drop_broken_connections() -> bool:
    """PostgreSQL:连接池里闲着的连接每个空跑一条语句,断了的扔掉(连接池在后台另连),返回 True;SQLite 没有连接池,
    返回 False。连接被掐断(服务器重启、pg_terminate_backend、主备切换)时池里的连接往往一起死了,闲得不够
    PG_IDLE_CHECK_S 的借出去之前不查:一次失败之后紧接着再借,借到的多半还是死的。worker 交回事件前用它,交回才有得重来。"""
    if store.dialect() != "postgres":
        return False
    with _pools_lock:
        pools = list(_pools.values())
    for pool in pools:
        pool.check()
    return True


def close_pools() -> None:
    """关掉本进程开的 PostgreSQL 连接池(测试换库时用;进程退出时会自动关)。"""
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


class Row(tuple):
    """像 sqlite3.Row:能按位置取,也能按列名取,dict(row) 得到 {列名: 值}。"""

    def __new__(cls, values, index: dict):
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key):
        return tuple.__getitem__(self, self._index[key] if isinstance(key, str) else key)

    def keys(self):
        return list(self._index)


def _pg_rows(cursor):
    index = {c.name: i for i, c in enumerate(cursor.description or [])}
    return lambda values: Row(values, index)


class PgConnection:
    """sqlite3.Connection 用到的那一小部分:execute(? 占位符)、executescript、executemany,用完 release()。
    从连接池借一个连接;或者包一个已经借好的 raw(搬家时和 checkpoint 同一个连接、同一个事务),release() 不还它。"""

    def __init__(self, pool, raw=None):
        self.pool, self.raw = (None, raw) if raw is not None else (pool, pool.getconn())
        self.read_only = False  # 这个连接连到了只能读的服务器上,见 release()

    def execute(self, query: str, args=()):
        with self.noting_read_only():
            return self.raw.execute(self.placeholders(query), tuple(args))

    def executescript(self, script: str) -> None:
        with self.noting_read_only():
            self.raw.execute(script)  # 不带参数时 psycopg 允许一次执行多条语句

    def executemany(self, query: str, rows) -> None:
        with self.noting_read_only():
            self.raw.cursor().executemany(self.placeholders(query), rows)

    @contextmanager
    def noting_read_only(self):
        try:
            yield
        except Exception as e:
            self.read_only = self.read_only or found_read_only(e)
            raise

    @staticmethod
    def placeholders(query: str) -> str:
        """? 换成 psycopg 的 %s;SQL 里本来的 %(比如 LIKE 'M%')写成 %%,不然 psycopg 当它是占位符、报错。"""
        return query.replace("%", "%%").replace("?", "%s")

    def release(self) -> None:
        """还回连接池(包着别人借好的 raw 时什么都不做)。"""
        if self.pool is not None:
            if self.read_only:  # 见 found_read_only():关掉再还,连接池另连一个
                self.raw.close()
            self.pool.putconn(self.raw)

    close = release  # 连接池的连接:close() 就是还回池里,和 psycopg_pool 的 putconn 一样


def _configure(durable: bool):
    """连接池每连上一个新连接时做的设置。
    lock_timeout = BUSY_TIMEOUT_S:等别人的锁最多这么久,和 SQLite 的 busy_timeout 一样,等不到就是「数据库暂时用不了」
    (webhook 回 503、常驻 worker 说一行再试),不会因为有人在 psql 里开着事务占着一行就一直挂着。
    synchronous_commit:durable 的连接明确设成 on(回了 202 的事件断电也在,不随服务器或库上的默认值);其余的设成 off,
    和 SQLite 的 synchronous=NORMAL 同一个取舍(见 store.connect()):checkpoint 和 worker 记账的连接用它,
    checkpoint 这样写每个事件省 0.7 ms 左右(bench/worker.py)。"""
    settings = (f"SET lock_timeout = '{max(1, int(config.value('BUSY_TIMEOUT_S') * 1000))}ms'",  # 0 在 PostgreSQL 是一直等
                f"SET synchronous_commit = {'on' if durable else 'off'}")

    def configure(conn) -> None:
        for setting in settings:
            conn.execute(setting)
    return configure


def open_checkpointer(durable: bool = False):
    """LangGraph 的 checkpointer:SQLite 文件(默认)或 PostgreSQL。返回 (saver, 用完要 close 的东西)。
    durable=False(worker):checkpoint 的提交不等落盘,丢了只是从更早的节点重跑。
    durable=True(收件箱):等落盘。人的决定写下了才会发信;SQLite 上 checkpoint 和发件箱在两个文件里,
    不等的话断电后可能发件箱里有回复、checkpoint 却退回到 interrupt,同一张工单又回到收件箱。"""
    if store.dialect() == "postgres":
        require_psycopg()
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        pool = open_pg_pool(store.database_url(), durable, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(pool)
        with store.opened() as conn:
            if pg_checkpoint_tables_current(conn, saver):  # 同 init():建好了就不执行 setup() 里的 DDL
                return saver, pool
            # 用 try 轮询,不用 pg_advisory_lock 排队:排队的语句一直挂着快照,而 setup() 里的
            # CREATE INDEX CONCURRENTLY 要等所有快照结束 —— 两边互等,PostgreSQL 还看不出这是死锁
            while not conn.execute("SELECT pg_try_advisory_lock(?)", (CHECKPOINT_LOCK,)).fetchone()[0]:
                time.sleep(0.05)
            try:
                with pg_refusing_ddl():
                    if not pg_checkpoint_tables_current(conn, saver):  # 等锁的时候别人可能刚建完(同 init())
                        saver.setup()
            finally:
                conn.execute("SELECT pg_advisory_unlock(?)", (CHECKPOINT_LOCK,))
        return saver, pool
    from langgraph.checkpoint.sqlite import SqliteSaver

    try:
        conn = sqlite3.connect(store.checkpoints_db(), check_same_thread=False, timeout=config.value("BUSY_TIMEOUT_S"),
                               factory=store_sqlite.FileConnection)
        store_sqlite.use_wal(conn)  # worker 和收件箱是不同进程,同时写 checkpoint
    except sqlite3.DatabaseError as e:  # 路径设错了、指到了不是数据库的文件
        raise SystemExit(store_errors.cannot_open("checkpoint 库", "CHECKPOINTS_DB", store.checkpoints_db(), e)) from None
    # worker 的 checkpoint 用 NORMAL:进程崩溃(kill -9)时一个不丢,只有断电可能丢最后几个 checkpoint,
    # 那张工单就从更早的节点重跑一遍(节点幂等,outbox 有 UNIQUE)。收件箱、事件表和发件箱是 FULL。
    conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
    conn.identity = store_sqlite.file_identity(store.checkpoints_db())  # 常驻的 worker 领事件前核对(same_checkpoints_or_exit)
    saver = SqliteSaver(conn)
    saver.setup()
    return saver, conn


def pg_checkpoint_tables_current(conn, saver) -> bool:
    """LangGraph 的 checkpoint 表已经升到这个版本的 PostgresSaver 要的样子了吗(setup() 里记在 checkpoint_migrations 的最后一版)。"""
    if "checkpoint_migrations" not in store_upgrade.pg_objects(conn):
        return False
    # init() 查过权限,可那时这几张表可能还没有(所有者的 store.py 刚刚建好):读版本号之前再查一次,缺权限时一行说清楚
    store_upgrade.pg_rights_or_exit(conn)
    return conn.execute(PG_CHECKPOINT_VERSION).fetchone()[0] >= len(saver.MIGRATIONS) - 1  # 更新的版本升过的也行


PG_CHECKPOINT_VERSION = "SELECT coalesce(max(v), -1) FROM checkpoint_migrations"


def same_checkpoints_or_exit(conn) -> None:
    """open_checkpointer 返回的 SQLite 连接:checkpoint 库文件还是打开时那一个吗(见 unchanged_or_exit)。PostgreSQL 时不用查。"""
    if isinstance(conn, store_sqlite.FileConnection):
        store_sqlite.unchanged_or_exit(store.checkpoints_db(), conn.identity)
