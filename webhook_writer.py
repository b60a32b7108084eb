r"""webhook 的写库进程:从标准输入一行读一批事件,放进一个事务写进事件库(一次落盘),在标准输出回一行结果。

平时不用自己运行:webhook.py 启动时把它拉起来当子进程,webhook 退出(哪怕是被 kill -9)时它读到输入结束,也跟着退出。
想看它怎么工作,可以手动喂一批(一行一个 JSON 数组,每个事件是 [event_id, 来源, 类型, 原始请求体];
EVENTS_DB 指向一个临时库、DATABASE_URL 清空(设着的话写的是 PostgreSQL,EVENTS_DB 不管用),
别把演示事件写进真的事件表,worker 会去处理它):
    echo '[["evt_demo", "webhook", "ticket.created", "{\"data\": {\"ticket_id\": \"T1012\"}}"]]' | DATABASE_URL= EVENTS_DB=/tmp/writer-demo.db uv run python webhook_writer.py
你会看到 {"new": [true]};再跑一遍是 {"new": [false]}(已经在库里了)。写不进去时回 {"error": "<异常类型>: <信息>"},
进程不退出,接着读下一批。

为什么单独一个进程:写库放在 webhook 进程的一个线程里时,它和事件循环抢同一把 GIL,机器慢的时候每个请求多花
0.1–0.2 ms CPU,吞吐只有空端点的七成多;放到这里,事件循环只管收发请求,写库在另一个核上做(bench/webhook.py)。
"""
import json
import os
import signal
import sys
import threading
import time

import config
import store
import store_errors
import store_events
import store_pg

# 秒;PostgreSQL 上借连接最多等多久(见 store_pg.PG_POOL_WAIT_S)。这个进程一次只借一个,借不到就是连不上:
# 连接池默认等 30 秒的话,排在后面的一批再等 30 秒,请求 30–60 秒后才拿到 503,上游的发送方早就超时了
POOL_WAIT_S = 3.0
BATCH_MARGIN_S = 5    # 秒;一批最多写 BUSY_TIMEOUT_S(等锁)再加这么久,见 batch_time_limit_s
ORPHAN_CHECK_S = 1.0  # 秒;多久看一次 webhook 还在不在


def batch_time_limit_s() -> float:
    """写一批最多花多久:等别人的锁最多 BUSY_TIMEOUT_S,再加 BATCH_MARGIN_S。webhook 等回话等这么久(过了就杀掉这个进程、
    这一批回 503);webhook 没了以后,手上那一批也再给这么久(exit_when_orphaned)。"""
    return config.value("BUSY_TIMEOUT_S") + BATCH_MARGIN_S


def serve(lines, out, ready: bool = True) -> None:
    """lines 里每一行是一批事件;每批回一行。ready=False:事件库还没打开(启动时数据库连不上),每批先试着打开。"""
    for line in lines:
        try:
            if not ready:
                store.init()
                ready = True
            reply = {"new": store_events.add_events([tuple(event) for event in json.loads(line)])}
        except Exception as e:  # noqa: BLE001 —— 写不进去(磁盘满、库被锁太久、这一行不是一批事件):告诉 webhook,接着干
            reply = {"error": store_errors.first_line(e)}  # psycopg 的错误常带 LINE 1: … 好几行,503 的 detail 里只要第一行
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


def exit_when_orphaned(parent: int) -> None:
    """后台线程:webhook(parent)没了(哪怕是 kill -9)以后,手上这一批再给 batch_time_limit_s() 秒写完,还没退出就结束进程。
    平时 webhook 一没,这里读到输入结束就退出了,手上的一批照样写完(上游重发时得到 duplicate);可它要是正卡在数据库里
    (网络不通、服务器不回话),就一直读不到,webhook 都退了它还挂着,成了孤儿进程。这时结束它不丢什么:
    回话已经没人收,没回 202 的事件上游会重发。webhook 还在的话,到这时也会杀掉它。"""
    grace = batch_time_limit_s()
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    time.sleep(grace)
    os._exit(0)


def main() -> int:
    # Ctrl-C 和 SIGTERM 会发给整个进程组:这里不理它们,由 webhook 写完手上的一批、关掉输入来结束,不会半途丢下一批
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=exit_when_orphaned, args=(os.getppid(),), daemon=True, name="orphan-check").start()
    store_pg.PG_POOL_WAIT_S = POOL_WAIT_S
    out = os.fdopen(os.dup(1), "wb")  # 回复走启动时的标准输出
    os.dup2(2, 1)                     # 别处打印的东西改进标准错误,不会混进回复里
    try:
        store.init()
        ready = True
    except store_errors.unavailable_errors():  # 数据库暂时连不上(写库进程被杀后重新拉起时正好碰上):不退出,每一批回
        ready = False                   # 「写不进去」和原因,webhook 回 503(而不是每一批一段 traceback)
    try:
        serve(sys.stdin.buffer, out, ready)
    except BrokenPipeError:  # webhook 已经不在了:这一批已经提交,它没来得及回 202,上游重发时会得到 duplicate
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
