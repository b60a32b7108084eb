"""`bench/webhook.py --parts` 用:把 webhook.py 拆开,量它比空端点多出来的 CPU 花在哪一步。不单独运行,也不存任何事件。

BENCH_WEBHOOK_PART 选一种(每种是一个单独的 uvicorn 进程,代码就是 webhook.py,只换掉「交给写库进程」这一步):
- no_store:读请求体、验签、解析照常,然后直接回 202 —— 量这三步的代价;
- await_only:同上,但先等一个在事件循环下一轮就完成的 future —— 再加上「请求挂起一次、再恢复」的代价
  (回 202 之前要等组提交落盘,请求就一定要挂起一次;FastAPI 的每层中间件都在这条协程链上)。
和真 webhook 的差就是交给写库进程(event_writer.py)这一步:两个进程之间收发一批、SQLite 插入、落盘。
(这两个拆开的 webhook 启动时也照样拉起一个写库进程,只是不用它。)
"""
import asyncio
import os

import webhook


async def no_store(event: tuple) -> bool:
    return True


async def await_only(event: tuple) -> bool:
    future = asyncio.get_running_loop().create_future()
    future.get_loop().call_soon(future.set_result, True)
    return await future


webhook.committer.add = {"no_store": no_store, "await_only": await_only}[os.environ["BENCH_WEBHOOK_PART"]]
app = webhook.app
