"""数据库出错时给人看什么,给 store.py 和各个程序用:分清「暂时用不了」(库被锁太久、磁盘满了、
PostgreSQL 在重启或连接被掐断,常驻的 worker 等一会儿再试)和「设置不对」(路径错了、不是数据库文件,
说清楚是哪一项设置),错误只留第一行、去掉连接串里的密码。课文里出错就是一段 traceback;
常驻的程序不能因为数据库重启一下就退出,也不能把等多久都不会好的错误当成暂时的。"""
import os
import sqlite3
from pathlib import Path

import config


# SQLite 的这几种错误(主错误码)不是设置的问题,过一会儿可能就好了:磁盘出错(IOERR)、磁盘满了(FULL)、
# 别的程序占着库太久(BUSY、LOCKED)
TEMPORARY_SQLITE_ERRORS = {sqlite3.SQLITE_IOERR: "所在的磁盘满了或者出错了", sqlite3.SQLITE_FULL: "所在的磁盘满了或者出错了",
                           sqlite3.SQLITE_BUSY: "被别的程序占着太久", sqlite3.SQLITE_LOCKED: "被别的程序占着太久"}


def cannot_open(what: str, setting: str, path: Path, error: Exception) -> str:
    """SQLite 打不开一个库时给人看的一行:sqlite3 只会说 unable to open database file。
    看不出设置有什么不对、错误又是 TEMPORARY_SQLITE_ERRORS 里的(比如磁盘满了)时不返回,抛一个带上是哪个库的
    OperationalError:各个程序照「数据库暂时用不了」处理(常驻的 worker 等着再试,邮件轮询退出码 1、cron 3),
    不让人去查一项没有错的设置。"""
    try:
        if not path.parent.is_dir():
            reason = f"目录 {path.parent} 不存在"
        elif path.is_dir():
            reason = "这是一个目录,不是文件"
        elif "file is not a database" in str(error):
            reason = "这个文件不是 SQLite 数据库,指错了文件?"
        elif not os.access(path.parent, os.W_OK):  # 库文件旁边还要建 -wal、-shm(新库连文件本身也要建)
            reason = f"目录 {path.parent} 不能写:没有写权限,或者在只读的文件系统上"
        elif (why := TEMPORARY_SQLITE_ERRORS.get((getattr(error, "sqlite_errorcode", None) or 0) & 0xFF)) is not None:
            temporary = sqlite3.OperationalError(f"{error}:{what} {path} {why}")
            temporary.sqlite_errorcode = error.sqlite_errorcode  # temporary() 认它
            raise temporary from error
        else:
            reason = str(error)
    except OSError as e:  # 名字太长之类:连「在不在」都问不了
        reason = e.strerror or str(e)
    return f"{what}打不开:{setting}={path}({reason})"


def unavailable_errors() -> tuple[type[Exception], ...]:
    """数据库暂时用不了时抛的异常:SQLite 的 OperationalError(库被锁太久、磁盘出错),PostgreSQL 的连接断了、
    服务器在重启、连接池借不到连接(PoolTimeout 也是 psycopg.OperationalError)。常驻的 worker 遇到它们不退出。"""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.OperationalError,)
    # 主备切换后连到了还只能读的那台(或者有人打开了 default_transaction_read_only):也是等一会儿再试,
    # 和 SQLite 的库只能读时一样。它的类是 InternalError,所以单独列出
    return sqlite3.OperationalError, psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction


def temporary(error: BaseException) -> bool:
    """unavailable_errors() 里、等一会儿可能就好了的那些:PostgreSQL 的连接断了、服务器在重启、连接数满了、磁盘满了、
    只能读;SQLite 的被锁太久、磁盘满了或出错、库只能读。worker 跑图时碰上它们,事件交回队列、不算一次失败。
    同属 OperationalError、等多久都一样的不算:SQLite 的 no such table / no such column(业务库被人改了表),
    PostgreSQL 的 54 类(超出程序限制:索引行太大、语句太复杂)。它们照常算失败,到 MAX_ATTEMPTS 进死信,
    不然常驻的 worker 每隔 POLL_SECONDS 就领一次、交回一次,一直转下去。"""
    if isinstance(error, sqlite3.OperationalError):
        code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
        return code in TEMPORARY_SQLITE_ERRORS or code == sqlite3.SQLITE_READONLY
    return isinstance(error, unavailable_errors()) and not (getattr(error, "sqlstate", None) or "").startswith("54")


def unavailable(error: Exception) -> str:
    """遇上 unavailable_errors() 时给人看的那一行的开头:「数据库暂时用不了(类型名: 原文第一行)」。
    psycopg 的错误常带好几行 DETAIL / HINT,日志和终端里只留第一行。各个程序在后面接上自己接下来怎么办。
    SQLite 的库文件只能读时(READONLY)补一句查什么:等多久都不会好,要人去改。"""
    if (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF == sqlite3.SQLITE_READONLY:
        return f"数据库暂时用不了({first_line(error)}:{READ_ONLY_HINT})"
    return f"数据库暂时用不了({first_line(error)})"


READ_ONLY_HINT = "库文件只能读:查一下它的写权限、是不是在只读的文件系统上、有没有被 chattr +i 锁住"


def first_line(error: Exception) -> str:
    """「类型名: 原文第一行」:psycopg 的错误常带好几行 DETAIL / HINT,给人看的一行里只留第一行。"""
    return f"{type(error).__name__}: {(_safe_url(str(error)).strip().splitlines() or [''])[0]}"


def with_detail(error: Exception) -> str:
    """first_line() 再接上 PostgreSQL 的 DETAIL:约束冲突时只有它说是哪一行,比如
    Key (customer_id)=(C999) is not present in table "customers"。DETAIL 末尾的英文句号去掉:后面接的是中文标点。"""
    detail = (getattr(getattr(error, "diag", None), "message_detail", None) or "").strip().rstrip(".")
    return first_line(error) + (f";{detail}" if detail else "")


_safe_url = config.hide_password  # 打印用:去掉连接串(或者引了它的报错)里的密码
