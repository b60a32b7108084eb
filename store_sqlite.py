"""SQLite 连接的细节,给 store.py 的 connect() / transaction() 用:每个线程、
每个库文件留一个连接一直用(重开一次比语句本身还贵),发现库文件在程序运行时被删掉或换掉就停下,
两个程序同时第一次打开新库时换 WAL 模式会撞锁、隔一会儿再试,等别人的写锁最多等 BUSY_TIMEOUT_S 秒。
课文每次都新开一个连接,一个进程一个线程时够用;这里 webhook、几个 worker 和收件箱同时写同一个库文件。"""
import os
import sqlite3
import threading
import time
from pathlib import Path

import config
import store




def file_identity(path: Path | str) -> tuple[int, int] | None:
    """这个文件是哪一个(设备号、inode);不在了是 None。"""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def unchanged_or_exit(path: Path | str, identity: tuple[int, int] | None) -> None:
    """一直开着的 SQLite 连接,它的库文件还是打开时那一个吗?有人在程序运行时删掉、换掉了它(「想从头再来」删了
    ambient.db* 又运行 store.py)时,开着的连接还连着那个删掉的文件,写进去的事件没人看得见。这时以 SystemExit 停下
    (webhook 的写库进程停下后,下一批由新开的写库进程写进新文件)。"""
    if file_identity(path) != identity:
        raise SystemExit(f"SQLite 库文件 {path} 在这个程序运行时被删掉或换掉了:这个程序不再用它,重新启动后用新的文件"
                         "(想从头再来时,先停掉 webhook、worker,再删库)")


_kept = threading.local()


def close_connections() -> None:
    """真的关掉这个线程留着的 SQLite 连接(测试换一套临时库之前用;进程退出时会自动关)。"""
    for conn in _kept.__dict__.pop("conns", {}).values():
        conn.close()


class FileConnection(sqlite3.Connection):
    """记着打开时库文件是哪一个(identity,见 file_identity):一直开着的连接用它发现文件被删掉、换掉了。"""

    identity: tuple[int, int] | None = None


class KeptConnection(FileConnection):
    """SQLite 连接每个线程、每个库文件只开一个,一直用下去(store.connect() 记在 _kept 里):用完调 release(),
    只回滚没提交的事务,连接留给这个线程下次用。每次都重新打开的话,打开、解析表结构、关闭(最后一个连接关闭时
    还要做一次 WAL checkpoint)比语句本身还贵:实测领取一个事件从 2 ms 降到 0.4 ms。
    close() 真的关掉它,并从 _kept 里拿掉:这个线程下次 connect() 另开一个。"""

    key: tuple[str, bool] | None = None  # 在 _kept 里的键:(库文件, durable)

    def release(self) -> None:
        if self.in_transaction:
            self.execute("ROLLBACK")

    def close(self) -> None:
        conns = _kept.__dict__.get("conns", {})
        if conns.get(self.key) is self:
            del conns[self.key]
        super().close()


def kept_connection(path: Path | str | None, durable: bool) -> KeptConnection:
    """store.connect() 在 SQLite 上:这个线程留着的那个连接,没有就打开一个留下。"""
    key = (str(path or store.events_db()), durable)
    kept = _kept.__dict__.setdefault("conns", {})
    if (conn := kept.get(key)) is not None:
        unchanged_or_exit(key[0], conn.identity)
    else:
        # 事件库没有就建(init 建表);给了路径的库(业务库)只打开已有的:sqlite3 默认会顺手建一个空文件,
        # 之后 store.py 以为业务库已经在了,worker 读工单只会得到 no such table
        target = key[0] if path is None else f"{Path(key[0]).absolute().as_uri()}?mode=rw"
        conn = sqlite3.connect(target, timeout=config.value("BUSY_TIMEOUT_S"), isolation_level=None, factory=KeptConnection,
                               uri=path is not None)
        conn.row_factory = sqlite3.Row
        # WAL 模式(init 写进库文件):读写不互相挡
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.identity = file_identity(key[0])
        conn.key = key
        kept[key] = conn
    return conn


WAL_RETRY_S = 0.01  # 秒;新库换成 WAL 撞上别人也在换时,隔多久再试(最多试到 BUSY_TIMEOUT_S)


def use_wal(conn: sqlite3.Connection) -> None:
    """PRAGMA journal_mode = WAL。两个连接同时第一次打开同一个新库文件时(两个 worker、webhook 和 worker 一起起来),
    换日志模式那一下 SQLite 不等 busy_timeout,当场说 database is locked。这里隔一会儿再试,最多等 BUSY_TIMEOUT_S 秒。"""
    deadline = time.monotonic() + config.value("BUSY_TIMEOUT_S")
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "database is locked" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_S)
