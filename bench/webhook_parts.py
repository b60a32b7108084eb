"""`bench/webhook.py --parts` 用:把 webhook.py 拆开,量它比空端点多出来的 CPU 花在哪一步。不单独运行,也不存任何事件。

BENCH_WEBHOOK_PART 选一种(每种是一个单独的 uvicorn 进程,代码就是 webhook.py,只换掉「交给写库进程」这一步):
- no_store:读请求体、验签、解析照常,然后直接回 202 —— 量这三步的代价;
- await_only:同上,但先等一个在事件循环下一轮就完成的 future —— 再加上「请求挂起一次、再恢复」的代价
  (回 202 之前要等组提交落盘,请求就一定要挂起一次;FastAPI 的每层中间件都在这条协程链上)。
和真 webhook 的差就是交给写库进程(webhook_writer.py)这一步:两个进程之间收发一批、SQLite 插入、落盘。
- lesson(`bench/webhook.py --lesson`):课文的写法做基线 —— 在请求的协程里直接写 SQLite:每个请求连一次库、
  INSERT OR IGNORE、提交一次(落盘),库是 sqlite3 的默认设置(rollback journal,synchronous=FULL),写的时候整个事件循环停着等。
  写进 BENCH_LESSON_DB 这个单独的库(和真 webhook 的事件库分开,同一批新事件两边都是新的)。
(这几个拆开的 webhook 启动时也照样拉起一个写库进程,只是不用它。)
"""
import asyncio
import os
import sqlite3

import store
import webhook

LESSON_TABLE = """CREATE TABLE IF NOT EXISTS events (
    event_id TEXT PRIMARY KEY, source TEXT NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending', received_at TEXT NOT NULL)"""


async def no_store(event: tuple) -> bool:
    return True


async def await_only(event: tuple) -> bool:
    future = asyncio.get_running_loop().create_future()
    future.get_loop().call_soon(future.set_result, True)
    return await future


async def lesson(event: tuple) -> bool:
    conn = sqlite3.connect(os.environ["BENCH_LESSON_DB"], timeout=10)
    try:
        with conn:  # 提交(落盘)之后才回 202,和课文一样
            cur = conn.execute("INSERT OR IGNORE INTO events (event_id, source, type, payload, received_at) "
                               "VALUES (?, ?, ?, ?, ?)", (*event, store.now()))
        return cur.rowcount == 1
    finally:
        conn.close()


PART = os.environ["BENCH_WEBHOOK_PART"]
if PART == "lesson":
    with sqlite3.connect(os.environ["BENCH_LESSON_DB"]) as first:
        first.execute(LESSON_TABLE)
    first.close()
webhook.committer.add = {"no_store": no_store, "await_only": await_only, "lesson": lesson}[PART]
app = webhook.app
