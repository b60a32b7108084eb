"""收件箱(inbox.py)在事件表上要的几条语句:处理一条待办前先把它从 waiting_human 拿走(两个人同时点同一条,
只有一个拿得到),以及记下每个人看到的是哪一版草稿、accept 前核对。课文的收件箱一次只有一个人用,不用这些。"""


import store
import worker_owner


def take_for_review(event_id: str, owner: str | None = None) -> bool:
    """收件箱处理一条待办前先把它从 waiting_human 拿走。两个人同时点同一条,只有一个拿得到;
    同一张工单的另一个事件正在 processing(worker 手里)时也拿不到。"""
    with store.opened() as conn:
        cur = worker_owner._unless_ticket_taken(
            conn, "UPDATE events SET status = 'processing', claimed_by = ?, updated_at = ? "
                  "WHERE event_id = ? AND status = 'waiting_human'", (owner or worker_owner.inbox_owner(), store.now(), event_id))
    return cur is not None and cur.rowcount == 1


# 收件箱记下某人看到了某张工单的哪一版草稿(见 SCHEMA 里的 inbox_seen);同一个人再看,换成新的那一版
SEEN_SQL = ("INSERT INTO inbox_seen (ticket_id, viewer, draft_sha, seen_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (ticket_id, viewer) DO UPDATE SET draft_sha = excluded.draft_sha, seen_at = excluded.seen_at")


def mark_seen(viewer: str, drafts: dict[str, str], wait_s: float) -> None:
    """记下 viewer 看到的草稿({工单号: 草稿全文的 SHA-256}),一个事务。等锁超过 wait_s 秒就抛错、一行都不记。"""
    if drafts:
        with store.transaction(wait_s=wait_s) as conn:
            conn.executemany(SEEN_SQL, [(ticket_id, viewer, sha, store.now()) for ticket_id, sha in drafts.items()])


def seen_draft(ticket_id: str, viewer: str) -> str | None:
    """viewer 最后一次看到的这张工单草稿的 SHA-256;没记下过就是 None。"""
    with store.opened() as conn:
        row = conn.execute("SELECT draft_sha FROM inbox_seen WHERE ticket_id = ? AND viewer = ?",
                           (ticket_id, viewer)).fetchone()
    return row[0] if row else None
