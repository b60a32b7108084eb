"""uv run python store.py 做的事:建好缺的库(事件库、业务库,设了 DATABASE_URL 时还有 checkpoint 的表,
之后只有读写权限的用户也能运行每个程序),--from-sqlite 时再搬家,最后打印各表行数;已经建好的不会重建,可以反复运行。
退出码:0 好了;1 数据库暂时用不了或打不开、业务库拷不进 PostgreSQL、SQLite 事件库已经搬走却没设 DATABASE_URL;
2 BIZ_DB 指着的库不是这里建的、PostgreSQL 里只有半套业务表(都不去动它)、搬不了,或者参数不对。
课文的 store.py 只被别的程序 import;这里让人单独运行它来建库、看库。"""
import sys
from pathlib import Path

import store
import store_biz
import store_errors
import store_move
import store_pg


def counts(path: Path | None, tables: tuple[str, ...]) -> dict[str, int]:
    with store.opened(path) as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}


USAGE = ("用法:uv run python store.py               建好缺的库,打印各表行数\n"
         "      uv run python store.py --from-sqlite  (设了 DATABASE_URL 时)另外把 EVENTS_DB、CHECKPOINTS_DB 里的"
         "事件、发件箱、审核记录和 checkpoint 搬进 PostgreSQL")


def main(args: list[str] = ()) -> int:
    args = list(args)
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args not in ([], ["--from-sqlite"]):  # 写错的选项、多余的词:说明一下,不建库
        print(f"store.py 不认识这些参数:{' '.join(args)}\n{USAGE}", file=sys.stderr)
        return 2
    if args and store.dialect() != "postgres":
        print("--from-sqlite 是把 SQLite 里的东西搬进 PostgreSQL:先设好 DATABASE_URL=postgresql://…(写进 .env 或 export)"
              "再运行。什么都没做", file=sys.stderr)
        return 2
    try:
        return build_and_count(from_sqlite=bool(args))
    except store_errors.unavailable_errors() as e:  # PostgreSQL 重启、连接被掐断;SQLite 被锁太久
        again = " --from-sqlite(已经建好的不会重建;这一次什么都没搬)" if args else "(已经建好的不会重建)"
        print(f"{store_errors.unavailable(e)},稍后再运行 uv run python store.py{again}", file=sys.stderr)
        return 1


def build_and_count(from_sqlite: bool = False) -> int:
    """建库(已有就不动);from_sqlite 时再把 SQLite 事件库和 checkpoint 搬进 PostgreSQL;打印每张表的行数。"""
    store.init()
    if store.dialect() == "postgres":  # 业务表也在这个库里
        # checkpoint 的表也在这时建好:库的所有者运行一次 store.py,之后只有读写权限的用户也能运行 worker 和收件箱
        store_pg.open_checkpointer(durable=True)[1].close()
        url = store_errors._safe_url(store.database_url())
        if source := store_biz.build_biz_tables():
            print(f"已在 {url} 新建业务表 customers、tickets、invoices({source})")
        elif problem := store_biz.biz_db_problem(hint=False):  # 只剩半套(有人删了一张):不在上面补,说清楚
            print(f"{problem}。没有动它:确定剩下的那张业务表没用了(不是别的程序的),才把它也删掉(DROP TABLE)再运行 "
                  "uv run python store.py,就会新建一套", file=sys.stderr)
            return 2
        if from_sqlite:
            try:
                done, not_marked = store_move.move_from_sqlite()
            except store_move.MoveRefused as e:
                print(f"没有搬:{e}", file=sys.stderr)
                return e.code
            print(done)
            if not_marked is None:
                print(f"{store.events_db()} 里记下了已搬进 PostgreSQL:以后不设 DATABASE_URL 的程序都会说明原因、不用它,"
                      "还开着的 SQLite worker 也领不到事件了,同一张工单不会在两边各处理一遍")
            else:  # PostgreSQL 已经提交了:搬家本身成功,只是 SQLite 挡不住了
                print(f"没能在 {store.events_db()} 里记下已搬走({not_marked}):修好以后再运行一次 uv run python store.py "
                      "--from-sqlite 补上这个记号(不会再搬一遍);在那之前一定设着 DATABASE_URL 运行,"
                      "别再不设它跑 worker 或收件箱,不然同一张工单会在两边各处理一遍", file=sys.stderr)
        where = {"事件库": (url, None), "业务库": (url, None)}
    else:
        biz = store.biz_db()
        if not biz.exists() or biz.stat().st_size == 0:  # 空文件(touch 出来的)里什么都没有,建在它上面不丢东西
            if role := store_biz.other_lab_db(biz, set()):
                print(store_biz.not_biz_db(biz, role), file=sys.stderr)
                return 2
            if store_biz.build_biz_db(biz):
                print(f"已新建业务库 {biz}")
        elif problem := store_biz.biz_db_problem(hint=False):
            print(problem + store_biz.biz_advice(problem), file=sys.stderr)
            return 2
        where = {"事件库": (store.events_db(), None), "业务库": (biz, biz)}
    tables = {"事件库": ("events", "outbox", "review_log", "llm_usage"), "业务库": tuple(store_biz.BIZ_COLUMNS)}
    with store.opened(where["业务库"][1]) as conn:  # 发票表是可选的:有才数
        if store_biz.has_invoices(conn, where["业务库"][1]):
            tables["业务库"] += ("invoices",)
    for label, (shown, path) in where.items():
        print(f"{label} {shown}:" + ",".join(f"{t} {n} 行" for t, n in counts(path, tables[label]).items()))
    if store.dialect() == "postgres" and not from_sqlite and (note := store_move.sqlite_note()):
        print(note)
    return 0
