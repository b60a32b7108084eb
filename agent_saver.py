"""agent.py 的 checkpoint 提速:worker 刚看过、确定还是空的 thread,LangGraph 开跑时不再读第二遍(known_new);
每次 invoke 只用一个后台线程写 checkpoint(MAX_CONCURRENCY)。课文的 open_graph() 只是把 SqliteSaver 交给 compile;
这两处都不改图的行为,只省 worker 每个事件花在 checkpoint 上的时间,所以放在课文代码旁边,不混进去。"""


# worker 跑一张工单之前先 get_state 看它的 thread(等人?做完了?崩在半路?)。看到的是空的,就从头跑:这时在
# configurable 里带上这个键,LangGraph 开跑时就不再把同一个 thread 读第二遍(PostgreSQL 上一次读要 1 ms 多)。
# 这中间没有别人会写这个 thread:同一张工单同时只有一个事件在 processing(store.CLAIM_SQL),
# 收件箱只碰停在 interrupt 的 thread。以 "__" 开头的键 LangGraph 不写进 checkpoint 的 metadata。
KNOWN_NEW = "__known_new_thread"


def known_new(config: dict) -> dict:
    """同一个 config,标上「刚看过,这个 thread 还是空的」。"""
    return {**config, "configurable": {**config["configurable"], KNOWN_NEW: True}}


# 一次 invoke 里最多同时跑几件事。这张图每一步只有一个节点,节点本来就在调用线程里一个接一个地跑;这个数限制的是
# LangGraph 每次 invoke 新建的后台线程池:不设时它为每个 checkpoint 写入(put / put_writes)各起一个新线程,
# 一个事件起 3 个,起线程、等新线程拿到 GIL、几个线程抢 PostgresSaver 的锁,占了 worker 一成多的时间(py-spy 采样)。
# 设成 1:后台只有一个线程,按提交的顺序写(LangGraph 本来就等上一个 checkpoint 写完才写下一个)。
# 实测每个事件 SQLite 省约 0.5 ms、PostgreSQL 省约 2 ms(bench/worker.py)。
MAX_CONCURRENCY = 1
