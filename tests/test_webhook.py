"""webhook 入口:验签、防重放、去重,坏请求回清楚的错误且什么都不存。"""
import array
import asyncio
import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import signal
import sqlite3
import subprocess
import sys
import termios
import threading
import time
import types
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import (LAB, cut_connections, refused_startup, rows, run, serving, someone_holds_the_events_table, tcp_proxy,
                      webhook_server)
from fastapi.testclient import TestClient

import send_webhook
import store
import store_events
import store_sqlite
import worker_owner
import webhook
import webhook_commit

SECRET = "test-secret"
URL = "/hooks/cloudledger"


@pytest.fixture
def client(lab, monkeypatch):
    monkeypatch.setenv("WEBHOOK_SECRET", SECRET)
    with TestClient(webhook.app) as c:
        yield c


def body_for(ticket_id="T1012", event_id=None, kind="ticket.created") -> bytes:
    return json.dumps({"id": event_id or f"evt_{ticket_id}_created", "type": kind,
                       "data": {"ticket_id": ticket_id}}).encode()


def post(client, body: bytes, signature: str | None = None, **headers):
    if signature is not None:
        headers["x-cloudledger-signature"] = signature
    return client.post(URL, content=body, headers={"content-type": "application/json", **headers})


def stored() -> list[tuple]:
    return rows("SELECT event_id, source, kind, status, attempts FROM events ORDER BY received_at")


def test_signed_event_is_stored_and_acknowledged_with_202(client):
    body = body_for("T1012")
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert (r.headers["content-type"], r.content) == ("application/json", b'{"accepted":true,"duplicate":false}')
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]
    assert rows("SELECT payload, ticket_id FROM events") == [(body.decode(), "T1012")]


def test_redelivery_is_reported_as_duplicate_and_stored_once(client):
    body = body_for("T1012")
    first = post(client, body, send_webhook.sign(body, SECRET))
    second = post(client, body, send_webhook.sign(body, SECRET))
    assert [first.json(), second.json()] == [{"accepted": True, "duplicate": False},
                                             {"accepted": True, "duplicate": True}]
    assert len(stored()) == 1


def test_other_event_types_are_acknowledged_but_not_queued(client):
    body = body_for(kind="ticket.closed")
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (202, {"accepted": False, "reason": "ignored type"})
    assert stored() == []


def test_a_signature_written_in_upper_case_hex_is_the_same_signature(client):
    body = body_for()
    ts = int(time.time())
    good = send_webhook.sign(body, SECRET, ts).split("v1=")[1]
    r = post(client, body, f"t={ts},v1={good.upper()}")
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


def test_any_matching_v1_signature_passes_during_secret_rotation(client):
    body = body_for()
    ts = int(time.time())
    good = send_webhook.sign(body, SECRET, ts).split("v1=")[1]
    old = send_webhook.sign(body, "old-secret", ts).split("v1=")[1]
    r = post(client, body, f"t={ts},v0=deadbeef,v1={old},v1={good}")
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


@pytest.mark.parametrize("scheme", ["cloudledger", "standard"])
def test_a_valid_signature_on_a_second_signature_header_line_is_accepted_like_on_one_merged_line(client, scheme):
    """换密钥期间上游每把密钥各写一行签名头(代理也可能把它们合成一行,RFC 9110 §5.3 说两种一样):每一行都看,
    新密钥的签名在第二行时和合成一行时一样回 202(只看第一行的话是 401);两行都不对照样 401、什么都不存。"""
    body = body_for()
    ts = int(time.time())
    if scheme == "cloudledger":
        name, lines = "x-cloudledger-signature", [send_webhook.sign(body, s, ts) for s in ("old-secret", SECRET)]
        extra, bad = [], send_webhook.sign(body, "another-secret", ts)
    else:
        name = "webhook-signature"
        lines = [standard_headers(body, s, ts=ts)[name] for s in (b"old-secret", SECRET.encode())]
        extra = [(k, v) for k, v in standard_headers(body, SECRET.encode(), ts=ts).items() if k != name]
        bad = standard_headers(body, b"another-secret", ts=ts)[name]
    r = client.post(URL, content=body, headers=[*extra, (name, lines[0]), (name, bad)])
    assert (r.status_code, r.json()) == (401, {"detail": "bad signature"})
    assert stored() == []
    r = client.post(URL, content=body, headers=[*extra, (name, lines[0]), (name, lines[1])])
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    merged = client.post(URL, content=body, headers=[*extra, (name, (", " if scheme == "cloudledger" else " ").join(lines))])
    assert (merged.status_code, merged.json()) == (202, {"accepted": True, "duplicate": True})
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


def test_signature_lines_signed_a_second_apart_are_each_checked_against_their_own_timestamp(client):
    """换密钥期间上游每把密钥各签一行,两行的 t 差一秒(正好跨过一秒)。每个 v1 和它自己的 t 一起核对,哪种顺序、
    分行还是合成一行都是 202。只留最后一个 t 核对所有签名的话,新密钥那行在前时,它自己明明对,却回 401。"""
    body = body_for()
    ts = int(time.time())
    new, old = send_webhook.sign(body, SECRET, ts), send_webhook.sign(body, "old-secret", ts + 1)
    answers = [client.post(URL, content=body, headers=[("x-cloudledger-signature", line) for line in lines])
               for lines in ([new, old], [old, new], [f"{new}, {old}"], [f"{old}, {new}"])]
    assert [(r.status_code, r.json()) for r in answers] == [(202, {"accepted": True, "duplicate": False})] + [
        (202, {"accepted": True, "duplicate": True})] * 3
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


def test_with_several_timestamps_none_passing_the_first_ones_error_is_given_and_nothing_stored(client):
    body = body_for()
    ts = int(time.time())
    stale = send_webhook.sign(body, SECRET, ts - 3600)  # 对的密钥,时间戳太旧
    wrong = send_webhook.sign(body, "another-secret", ts)  # 时间戳对,密钥不对
    r = client.post(URL, content=body, headers=[("x-cloudledger-signature", stale), ("x-cloudledger-signature", wrong)])
    assert (r.status_code, r.json()) == (400, {"detail": "timestamp too old"})
    r = client.post(URL, content=body, headers=[("x-cloudledger-signature", wrong), ("x-cloudledger-signature", stale)])
    assert (r.status_code, r.json()) == (401, {"detail": "bad signature"})
    r = client.post(URL, content=body, headers=[("x-cloudledger-signature", f"{stale}, {send_webhook.sign(body, SECRET, ts)}")])
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})  # 一个过期、一个对:收下
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


def frozen_clock(monkeypatch) -> int:
    """webhook 看到的「现在」停在这一秒:刚好超出 ±300 秒一秒的时间戳,不会因为测试和服务端之间跨过了一秒而变成刚好在界内
    (CI 上碰到过:now + 301 在服务端看来只差 300 秒,回了 202)。"""
    now = int(time.time())
    monkeypatch.setattr(webhook, "time", types.SimpleNamespace(time=lambda: float(now)))
    return now


@pytest.mark.parametrize("scheme", ["cloudledger", "standard"])
@pytest.mark.parametrize("seconds_off", [-300, -299, 299, 300])
def test_timestamp_up_to_300_seconds_off_either_way_is_accepted_and_stored(client, monkeypatch, scheme, seconds_off):
    """窗口的另一面:离「现在」不超过 ±300 秒(含 300)的签名照收。只测 ±301 被拒的话,窗口被改小了也发现不了。"""
    body = body_for("T1041")
    ts = frozen_clock(monkeypatch) + seconds_off
    headers = ({"x-cloudledger-signature": send_webhook.sign(body, SECRET, ts)} if scheme == "cloudledger"
               else standard_headers(body, SECRET.encode(), ts=ts))
    r = client.post(URL, content=body, headers=headers)
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert stored() == [("evt_T1041_created", "webhook", "ticket.created", "pending", 0)]


@pytest.mark.parametrize("header, status, detail", [
    (None, 400, "missing signature header (X-CloudLedger-Signature or webhook-signature)"),
    ("garbage", 400, "bad signature header"),
    ("t=abc,v1=00", 400, "bad signature header"),
    ("v1=00", 400, "bad signature header"),
    ("t={now},v0=00", 400, "bad signature header"),
    ("t={old},v1={sig_old}", 400, "timestamp too old"),
    ("t={future},v1={sig_future}", 400, "timestamp too far in the future"),
    # 毫秒时间戳:说是毫秒,而不是一律说「签名头格式不对」(README 说未来的时间戳是 too far in the future)
    ("t={millis},v1={sig_millis}", 400, "timestamp is in milliseconds: send unix seconds"),
    ("t={now}000000,v1=00", 400, "timestamp too far in the future"),
    ("t=1{now}00000000,v1=00", 400, "bad signature header"),  # 19 位:不像任何时间戳
    ("t={now},v1={wrong}", 401, "bad signature"),
    ("t={now},v1=非ASCII签名", 401, "bad signature"),
])
def test_bad_signature_is_rejected_and_nothing_stored(client, monkeypatch, header, status, detail):
    body = body_for()
    now = frozen_clock(monkeypatch)
    sig = lambda ts, secret=SECRET: send_webhook.sign(body, secret, ts).split("v1=")[1]  # noqa: E731
    if header is not None:
        header = header.format(now=now, old=now - 301, future=now + 301, sig_old=sig(now - 301),
                               sig_future=sig(now + 301), wrong=sig(now, "wrong-secret"),
                               millis=now * 1000 + 123, sig_millis=sig(now * 1000 + 123))
    r = client.post(URL, content=body, headers={"x-cloudledger-signature": header.encode("utf-8")}
                    if header is not None else {})
    assert (r.status_code, r.json()) == (status, {"detail": detail})
    assert stored() == []


def test_signature_over_reserialized_json_is_rejected(client):
    """常见误区:拿解析后再序列化的 JSON 去验签。空格一变签名就对不上。"""
    body = body_for()
    signature = send_webhook.sign(json.dumps(json.loads(body), separators=(",", ":")).encode(), SECRET)
    r = post(client, body, signature)
    assert (r.status_code, r.json()) == (401, {"detail": "bad signature"})
    assert stored() == []


NOT_PRINTABLE = "id must be printable: no control, invisible or non-ASCII space characters, no unpaired surrogates"
WHITESPACE = "id must not start or end with whitespace"


@pytest.mark.parametrize("body, detail", [
    (b"not json", "body is not UTF-8 JSON"),
    (b"\xff\xfe{}", "body is not UTF-8 JSON"),
    (b'\xef\xbb\xbf{"id": "e1", "type": "ticket.created", "data": {"ticket_id": "T1"}}',
     "body starts with a byte order mark: send UTF-8 JSON without it"),
    (b"[" * 100000 + b"]" * 100000, "body is nested too deeply"),  # 合法的 JSON,只是嵌套太深
    (b"[" * 100000, "body is nested too deeply"),  # 没写完的也一样:还没读到结尾就已经递归太深
    (b"[1, 2]", "body must be a JSON object with id, type and data.ticket_id"),
    (b'{"type": "ticket.created", "data": {"ticket_id": "T1"}}', "id must be a non-empty string (at most 200 characters)"),
    (b'{"id": "", "type": "ticket.created", "data": {"ticket_id": "T1"}}', "id must be a non-empty string (at most 200 characters)"),
    (b'{"id": "e\\ud800", "type": "ticket.created", "data": {"ticket_id": "T1"}}', NOT_PRINTABLE),
    (b'{"id": "e\\u0000", "type": "ticket.created", "data": {"ticket_id": "T1"}}', NOT_PRINTABLE),
    (b'{"id": "a\\u00a0b", "type": "ticket.created", "data": {"ticket_id": "T1"}}', NOT_PRINTABLE),  # 不间断空格
    (b'{"id": "a\\u200bb", "type": "ticket.created", "data": {"ticket_id": "T1"}}', NOT_PRINTABLE),  # 零宽空格
    (b'{"id": "e\\n1", "type": "ticket.created", "data": {"ticket_id": "T1"}}', NOT_PRINTABLE),
    (b'{"id": " ", "type": "ticket.created", "data": {"ticket_id": "T1"}}', WHITESPACE),  # 日志里看不见
    (b'{"id": "e1 ", "type": "ticket.created", "data": {"ticket_id": "T1"}}', WHITESPACE),  # 和 e1 成了两个事件
    (b'{"id": " e1", "type": "ticket.closed"}', WHITESPACE),
    (b'{"id": "e1", "data": {"ticket_id": "T1"}}', "type must be a string"),
    (b'{"id": "e1", "type": "ticket.created"}', "data.ticket_id must be a string of letters, digits, _ or - (at most 64)"),
    (b'{"id": "e1", "type": "ticket.created", "data": {"ticket_id": 1012}}', "data.ticket_id must be a string of letters, digits, _ or - (at most 64)"),
    (b'{"id": "e1", "type": "ticket.created", "data": {"ticket_id": "T1; drop"}}', "data.ticket_id must be a string of letters, digits, _ or - (at most 64)"),
])
def test_malformed_body_is_rejected_with_400_and_nothing_stored(client, body, detail):
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (400, {"detail": detail})
    assert stored() == []


def test_valid_json_with_an_integer_over_4300_digits_is_rejected_with_400_naming_the_limit_and_nothing_stored(lab, monkeypatch):
    """合法的 JSON,只是有个整数超过了 Python 肯转换的 4300 位:仍然 400,但说的是整数太长,
    不是「不是 JSON」。不处理的事件类型也一样(整个请求体先解析)。真的 HTTP,真的 uvicorn。"""
    huge = "1" * 5000
    bodies = [f'{{"id": "e1", "type": "ticket.created", "data": {{"ticket_id": "T1", "amount": {huge}}}}}'.encode(),
              f'{{"id": "e2", "type": "ticket.closed", "n": -{huge}}}'.encode()]
    assert all(json.loads(b.decode().replace(huge, "1")) for b in bodies)  # 除了那个数,就是普通的 JSON
    monkeypatch.setenv("WEBHOOK_SECRET", SECRET)
    with webhook_here() as base_url:
        answers = [deliver(base_url, b) for b in bodies]
        assert deliver(base_url, body_for("T1012")) == (202, {"accepted": True, "duplicate": False})
    assert answers == [(400, {"detail": "body has an integer longer than 4300 digits"})] * 2
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


def test_body_over_one_mebibyte_is_rejected_with_413_and_nothing_stored(client):
    body = json.dumps({"id": "big", "type": "ticket.created", "data": {"ticket_id": "T1012"},
                       "pad": "x" * (1024 * 1024)}).encode()
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (413, {"detail": "body larger than 1048576 bytes"})

    def chunks():  # 不带 Content-Length 的分块上传也要在读到 1 MiB 时停下
        for _ in range(20):
            yield b"x" * 65536
    r = client.post(URL, content=chunks(), headers={"x-cloudledger-signature": "t=1,v1=00"})
    assert (r.status_code, r.json()) == (413, {"detail": "body larger than 1048576 bytes"})
    assert stored() == []


# ---------------------------------------------------------------- Standard Webhooks
def standard_headers(body: bytes, secret_key: bytes, msg_id="msg_1", ts=None) -> dict:
    ts = str(int(time.time()) if ts is None else ts)
    sig = base64.b64encode(hmac.new(secret_key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
    return {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": f"v1,{sig}"}


def test_standard_webhooks_signature_with_whsec_secret_is_accepted(lab, monkeypatch):
    key = b"0123456789abcdef0123456789abcdef"
    monkeypatch.setenv("WEBHOOK_SECRET", "whsec_" + base64.b64encode(key).decode())
    body = body_for("T1041")
    with TestClient(webhook.app) as c:
        headers = standard_headers(body, key)
        headers["webhook-signature"] = "v1,bm90LXRoaXMtb25l " + headers["webhook-signature"] + " v1a,ignored"
        r = c.post(URL, content=body, headers=headers)
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert stored() == [("evt_T1041_created", "webhook", "ticket.created", "pending", 0)]


def test_standard_webhooks_with_plain_secret_uses_its_raw_bytes(client):
    body = body_for("T1003")
    r = client.post(URL, content=body, headers=standard_headers(body, SECRET.encode()))
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert stored() == [("evt_T1003_created", "webhook", "ticket.created", "pending", 0)]


@pytest.mark.parametrize("change, status, detail", [
    ({"webhook-signature": "v1,AAAA"}, 401, "bad signature"),
    ({"webhook-signature": "v2,AAAA"}, 400, "bad signature header"),
    ({"webhook-id": ""}, 400, "bad signature header"),
    ({"webhook-timestamp": "soon"}, 400, "bad signature header"),
    ({"webhook-timestamp": "1000"}, 400, "timestamp too old"),
])
def test_bad_standard_webhooks_headers_are_rejected_and_nothing_stored(client, change, status, detail):
    body = body_for()
    headers = {**standard_headers(body, SECRET.encode()), **change}
    r = client.post(URL, content=body, headers=headers)
    assert (r.status_code, r.json()) == (status, {"detail": detail})
    assert stored() == []


def batches_written(monkeypatch, hold_until_pending: int) -> list[int]:
    """记下组提交每一批交给写库进程几个事件。第一批先等一等,直到排队的请求有 hold_until_pending 个
    (另外那些在发的请求都排上了也算;最多 10 秒):写库进程在写的时候到达的请求排成下一批,这里让这件事确定发生,而不是看线程调度的运气。"""
    sizes: list[int] = []
    write = webhook.committer._write

    async def counted(events):
        sizes.append(len(events))
        deadline = time.monotonic() + 10
        # 排队的最多是另外那些在发的(SENDERS 个里减去这一批的):都排上了就不用再等
        wanted = min(hold_until_pending, SENDERS - sizes[0])
        while len(sizes) == 1 and len(webhook.committer.pending) < wanted and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return await write(events)

    monkeypatch.setattr(webhook.committer, "_write", counted)
    return sizes


SENDERS = 16  # send_concurrently 同时发几个请求


def send_concurrently(client, bodies: list[bytes]) -> list[dict]:
    with ThreadPoolExecutor(SENDERS) as pool:
        return list(pool.map(lambda b: post(client, b, send_webhook.sign(b, SECRET)).json(), bodies))


def test_many_concurrent_deliveries_are_group_committed_and_each_answered(client, monkeypatch):
    """组提交:并发到达的请求一批写进一个事务,每个请求拿到的都是自己那条的结果。"""
    sizes = batches_written(monkeypatch, hold_until_pending=10)
    answers = send_concurrently(client, [body_for(f"T{2000 + i}") for i in range(60)] * 2)
    assert sum(a == {"accepted": True, "duplicate": False} for a in answers) == 60
    assert sum(a == {"accepted": True, "duplicate": True} for a in answers) == 60
    assert rows("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM events") == [(60, 60)]
    assert sum(sizes) == 120 and max(sizes) >= 10 and len(sizes) < 120, sizes  # 一批多个,不是一个请求一个事务


@pytest.mark.parametrize("limit, value, most", [
    ("MAX_BATCH", 7, 7),
    ("MAX_BATCH_CHARS", 3 * len(body_for("T2000")), 3),  # 三个请求体正好够,第四个就超了
    ("MAX_BATCH_CHARS", 10, 1),  # 一个请求体就比上限长:照样自己成一批,不会卡住
])
def test_a_group_commit_batch_stays_within_its_event_and_size_limits(client, monkeypatch, limit, value, most):
    monkeypatch.setattr(webhook_commit, limit, value)
    sizes = batches_written(monkeypatch, hold_until_pending=20)
    answers = send_concurrently(client, [body_for(f"T{2000 + i}") for i in range(40)])
    assert answers == [{"accepted": True, "duplicate": False}] * 40
    assert rows("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM events") == [(40, 40)]
    assert sum(sizes) == 40 and max(sizes) == most, sizes


def test_event_store_failure_answers_503_and_the_retry_is_stored(client):
    """写库失败(这里用触发器让 INSERT 失败,和磁盘满时一样是真的 SQLite 错误):回 503,什么都没存;上游重试就收下。"""
    body = body_for("T1012")
    with store.opened() as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'disk is full'); END")
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (
        503, {"detail": "event store unavailable (IntegrityError: disk is full), retry later"})
    assert stored() == []
    with store.opened() as conn:
        conn.execute("DROP TRIGGER refuse")
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


def test_a_batch_reports_each_event_as_new_or_duplicate(any_lab):
    """组提交写的一批里:已经在库里的、同一批里出现两次的(只有第一次算新的)、超过一条 INSERT 能带的行数。"""
    def event(n: int) -> tuple[str, str, str, str]:
        return (f"evt_{n}", "webhook", "ticket.created", body_for(f"T{n}", f"evt_{n}").decode())

    assert store_events.add_events([event(1)]) == [True]
    batch = [event(1), event(2), event(2), event(3)] + [event(n) for n in range(10, 10 + store_events.INSERT_CHUNK + 5)]
    assert store_events.add_events(batch) == [False, True, False, True] + [True] * (store_events.INSERT_CHUNK + 5)
    assert rows("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM events") == [(store_events.INSERT_CHUNK + 8,) * 2]
    assert rows("SELECT ticket_id FROM events WHERE event_id = 'evt_2'") == [("T2",)]



def test_an_event_another_process_has_not_committed_yet_is_reported_as_a_duplicate(pg_lab):
    """两个 webhook 进程几乎同时收到同一个事件(PostgreSQL):先到的那个插入了、还没提交,后到的等它提交完,
    得到「重复」(duplicate=true);库里只有一行。先查再插的话,后到的看不见没提交的行,两边都会说是新的。"""
    import threading

    import psycopg

    payload = body_for("T1012", "evt_race").decode()
    stamp = store.now()
    result: list = []
    with psycopg.connect(pg_lab["DATABASE_URL"]) as first, psycopg.connect(pg_lab["DATABASE_URL"],
                                                                          autocommit=True) as watcher:
        first.execute("INSERT INTO events (event_id, source, kind, payload, ticket_id, received_at, updated_at) "
                      "VALUES ('evt_race', 'webhook', 'ticket.created', %s, 'T1012', %s, %s)", (payload, stamp, stamp))
        second = threading.Thread(target=lambda: result.append(
            store_events.add_events([("evt_race", "webhook", "ticket.created", payload)])))
        second.start()
        deadline = time.time() + 30
        while not watcher.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                  "AND application_name = %s", (worker_owner.pg_application_name(),)).fetchone()[0]:
            assert time.time() < deadline, "后到的 INSERT 应该在等先到的事务"
            time.sleep(0.02)
        first.commit()
        second.join(30)
    assert result == [[False]]
    assert rows("SELECT event_id, source, status FROM events") == [("evt_race", "webhook", "pending")]

NOWHERE = "postgresql://postgres@127.0.0.1:1/nowhere"


def test_the_webhook_warns_at_startup_when_it_runs_on_the_lessons_public_default_secret(lab):
    for env, expected in ((lab, f"WARNING:  {webhook.DEFAULT_SECRET_WARNING}\n"),
                          # cp .env.example .env:设了,值还是公开的默认密钥,也提醒
                          ({**lab, "WEBHOOK_SECRET": "dev-secret-change-me"},
                           "WARNING:  WEBHOOK_SECRET 还是课文里公开的默认密钥 dev-secret-change-me(多半是从 .env.example 抄来的):"
                           "谁都能照着它伪造签名,上线前一定要换掉\n"),
                          ({**lab, "WEBHOOK_SECRET": "not-the-default"}, "")):
        with webhook_server(env) as (proc, _):
            pass
        assert proc.stderr.read().decode() == expected  # --log-level warning:没有别的行


@pytest.mark.parametrize("settings, message", [
    ({"WEBHOOK_SECRET": "whsec_not*base64"}, "配置错误:WEBHOOK_SECRET 以 whsec_ 开头,但后面不是合法的 base64"),
    ({"WEBHOOK_SECRET": "whsec_"}, "配置错误:WEBHOOK_SECRET 是 whsec_,后面没有密钥"),  # 不当成空密钥:那样谁都能签出对的签名
    ({"WEBHOOK_BODY_TIMEOUT_S": "0"}, "配置错误:WEBHOOK_BODY_TIMEOUT_S='0' 不能小于 0.1"),
    ({"DATABASE_URL": NOWHERE}, '数据库暂时用不了(OperationalError: connection failed: connection to server at "127.0.0.1", '
     "port 1 failed: Connection refused),webhook 没有启动:数据库能连上以后再启动"),
    ({"DATABASE_URL": NOWHERE, "PG_POOL_SIZE": "0"}, "配置错误:PG_POOL_SIZE='0' 不能小于 1"),
    ({"DATABASE_URL": NOWHERE, "PG_IDLE_CHECK_S": "soon"}, "配置错误:PG_IDLE_CHECK_S='soon' 不是数字"),
    ({"EVENTS_DB": "{tmp}/no-such-dir/ambient.db"}, "事件库打不开:EVENTS_DB={tmp}/no-such-dir/ambient.db(目录 {tmp}/no-such-dir 不存在)"),
])
def test_a_setting_that_cannot_work_stops_the_webhook_with_one_line_and_nothing_stored(lab, tmp_path, settings, message):
    """uvicorn 的日志里是那句说明,不是一整段 traceback;退出码 3(uvicorn:应用启动失败),什么都没存、没建。"""
    settings = {k: v.format(tmp=tmp_path) for k, v in settings.items()}
    r = run(["-m", "uvicorn", "webhook:app", "--port", "0"], {**lab, **settings}, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == refused_startup(r, message.format(tmp=tmp_path))
    assert stored() == []
    assert not (tmp_path / "no-such-dir").exists()


def writer_pids(pid: int) -> list[int]:
    """webhook 进程的子进程(它的写库进程)。"""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # 这个线程刚好退出了
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def unread_in_pipe(pid: int) -> int:
    """进程 pid 的标准输入管道里还有多少字节没被读走。"""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
        return count[0]
    finally:
        os.close(fd)


def test_writer_process_killed_mid_batch_answers_503_then_a_new_one_takes_the_retry(client):
    """写库进程读走了一批、还没写完就没了:这一批回 503,什么都没存;下一个请求到来时拉起新的写库进程,上游重试就收下。
    (这一批它可能已经提交了,所以不能悄悄交给新的写库进程再写一遍,见下一个测试。)"""
    old = webhook.committer.proc.pid
    body = body_for("T1012")
    # 占着事件库的写锁:写库进程读走这一批以后卡在等锁上,提交不了
    with contextlib.closing(sqlite3.connect(os.environ["EVENTS_DB"], isolation_level=None)) as lock:
        lock.execute("BEGIN IMMEDIATE")
        os.kill(old, signal.SIGSTOP)  # 先停住它:看得见这一批交到了它的管道里,再放它去读
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(post, client, body, send_webhook.sign(body, SECRET))
            deadline = time.time() + 10
            while not unread_in_pipe(old) and time.time() < deadline:
                time.sleep(0.01)
            assert unread_in_pipe(old) > 0, "这一批应该已经交给写库进程了"
            os.kill(old, signal.SIGCONT)
            while unread_in_pipe(old) and time.time() < deadline:  # 它读走了这一批,正在等锁
                time.sleep(0.01)
            assert unread_in_pipe(old) == 0, "写库进程应该已经读走了这一批"
            os.kill(old, signal.SIGKILL)
            r = answer.result(timeout=30)
        lock.execute("ROLLBACK")
    assert (r.status_code, r.json()) == (
        503, {"detail": "event store unavailable (writer process exited with code -9), retry later"})
    assert stored() == []
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]
    assert webhook.committer.proc.pid != old and worker_owner._process_alive(webhook.committer.proc.pid)


def webhook_here():
    """真的 uvicorn 上的 webhook(真的 HTTP、真的写库子进程),跑在 pytest 进程的一个线程里:不用为每个测试再起一个
    uvicorn 进程、再导入一遍 FastAPI。设置读本进程的环境变量(lab 设好的那一套,事件写进这个测试自己的库);
    返回基础 URL。webhook 进程本身才是要测的东西时(kill -9)用 conftest 的 webhook_server()。"""
    return serving(webhook.app)


def deliver(base_url: str, body: bytes) -> tuple[int, dict]:
    """真的 HTTP:签好名 POST 给 uvicorn 上的 webhook,返回 (状态码, 响应 JSON)。"""
    request = urllib.request.Request(base_url + URL, data=body, method="POST", headers={
        "content-type": "application/json", "x-cloudledger-signature": send_webhook.sign(body, SECRET)})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_writer_that_dies_before_reading_the_batch_hands_it_to_a_new_writer_and_the_delivery_gets_202(lab):
    """写库进程在两批之间没了(被 kill -9,webhook 还没收到它退出的消息),下一批交过去时它已经读不了了:这一批它
    一个字节都没读走,不可能提交过,交给新拉起的写库进程,回 202 duplicate: false,而不是 503。
    回答是对的:库里原来没有它(不是 duplicate),之后重发才是 duplicate;库里只有一行。"""
    with webhook_server({**lab, "WEBHOOK_SECRET": SECRET}) as (proc, base_url):
        (old,) = writer_pids(proc.pid)
        os.kill(old, signal.SIGSTOP)  # 停住它,这一批交过去以后它读不了;再 kill -9,它没读就没了
        body = body_for("T1012")
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(deliver, base_url, body)
            deadline = time.time() + 10
            while not unread_in_pipe(old) and time.time() < deadline:
                time.sleep(0.01)
            assert unread_in_pipe(old) == len(json.dumps([["evt_T1012_created", "webhook", "ticket.created",
                                                           body.decode()]])) + 1
            os.kill(old, signal.SIGKILL)
            assert answer.result(timeout=30) == (202, {"accepted": True, "duplicate": False})
        (new,) = writer_pids(proc.pid)
        assert new != old and worker_owner._process_alive(new)
        assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]
        assert deliver(base_url, body) == (202, {"accepted": True, "duplicate": True})
        assert writer_pids(proc.pid) == [new]
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]
    assert rows("SELECT payload FROM events") == [(body.decode(),)]


def test_a_delivery_blocked_by_someone_elses_transaction_answers_503_after_busy_timeout_and_the_retry_is_stored(
        any_lab):
    """有人在 sqlite3 / psql 里开着事务、占着事件表没提交:等 BUSY_TIMEOUT_S 秒还等不到就回 503,什么都没存,
    上游重试时收下。PostgreSQL 上也一样,不会一直等下去,让这一批和排在后面的请求都没有回答。"""
    body = body_for("T1041")
    with webhook_server({**any_lab, "WEBHOOK_SECRET": SECRET, "BUSY_TIMEOUT_S": "1"}) as (proc, base_url):
        # 先收一个:写库进程建好表、连上了(它启动时建表也要等锁,那时被占着就是另一回事:它起不来,这一批 503)
        assert deliver(base_url, body_for("T1012")) == (202, {"accepted": True, "duplicate": False})
        with someone_holds_the_events_table():
            started = time.monotonic()
            answer = deliver(base_url, body)
            waited = time.monotonic() - started
        locked = ("OperationalError: database is locked" if store.dialect() == "sqlite"
                  else "LockNotAvailable: canceling statement due to lock timeout")
        assert answer == (503, {"detail": f"event store unavailable ({locked}), retry later"})
        assert 1 <= waited < 5
        assert [e[0] for e in stored()] == ["evt_T1012_created"]
        assert deliver(base_url, body) == (202, {"accepted": True, "duplicate": False})
    assert [e[0] for e in stored()] == ["evt_T1012_created", "evt_T1041_created"]
    assert proc.stderr.read() == b""


def test_deleting_the_database_while_the_webhook_runs_loses_no_acknowledged_event(lab):
    """「想从头再来」删了 ambient.db*、运行了 store.py,webhook 却还开着:写库进程开着的连接还连着删掉的文件。
    它发现文件换了就停下(说一行),这一批回 503、什么都没存,不会回了 202 却把事件写进没人看得见的文件;
    上游重试时新拉起的写库进程写进新文件。回了 202 的都在新文件里。"""
    with webhook_server({**lab, "WEBHOOK_SECRET": SECRET}) as (proc, base_url):
        assert deliver(base_url, body_for("T1012")) == (202, {"accepted": True, "duplicate": False})
        for suffix in ("", "-wal", "-shm"):
            Path(lab["EVENTS_DB"] + suffix).unlink(missing_ok=True)
        assert run(["store.py"], lab).returncode == 0
        store_sqlite.close_connections()  # 测试进程自己开着的连接也连着删掉的文件
        assert deliver(base_url, body_for("T1041")) == (
            503, {"detail": "event store unavailable (writer process exited with code 1), retry later"})
        assert stored() == []
        assert deliver(base_url, body_for("T1041")) == (202, {"accepted": True, "duplicate": False})
        assert deliver(base_url, body_for("T1012")) == (202, {"accepted": True, "duplicate": False})  # 新库里没有它
    assert [e[0] for e in stored()] == ["evt_T1041_created", "evt_T1012_created"]
    assert proc.stderr.read().decode().splitlines() == [
        f"SQLite 库文件 {lab['EVENTS_DB']} 在这个程序运行时被删掉或换掉了:这个程序不再用它,重新启动后用新的文件"
        "(想从头再来时,先停掉 webhook、worker,再删库)"]


def test_cut_database_connections_answer_503_with_the_reason_and_the_retry_is_stored(pg_lab, monkeypatch, capfd):
    """PostgreSQL 重启、写库进程的连接在服务器那头被掐断:用上死连接的那一批回 503(原因一行),什么都没存;
    上游重试时连接池换了新连接,收下。写库进程不退出,也不往 webhook 的日志里打 psycopg 的英文 WARNING。"""
    monkeypatch.setenv("WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("PG_IDLE_CHECK_S", "86400")  # 借连接前不查,死连接一定会被用上
    with TestClient(webhook.app) as client:
        first = body_for("T1012")
        assert post(client, first, send_webhook.sign(first, SECRET)).status_code == 202
        writer = webhook.committer.proc.pid
        assert cut_connections(writer) >= 1
        body = body_for("T1041")
        r = post(client, body, send_webhook.sign(body, SECRET))
        assert (r.status_code, r.json()) == (503, {"detail": "event store unavailable (AdminShutdown: terminating "
                                                             "connection due to administrator command), retry later"})
        assert [e[0] for e in stored()] == ["evt_T1012_created"]
        r = post(client, body, send_webhook.sign(body, SECRET))
        assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})
        assert webhook.committer.proc.pid == writer
    assert [e[0] for e in stored()] == ["evt_T1012_created", "evt_T1041_created"]
    assert capfd.readouterr().err == ""


@contextlib.contextmanager
def webhook_behind_a_proxy(pg_lab: dict, up: threading.Event, hold: threading.Event | None = None, **settings: str):
    """真的 uvicorn webhook,连 PostgreSQL 经过 tcp_proxy:up 清掉时新连接一接上就被关掉(服务器不在),
    hold 设着时已有的连接不转字节(网络不通)。返回 (webhook 进程, 基础 URL, 代理的端口)。"""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(pg_lab["DATABASE_URL"])
    with tcp_proxy(params.get("host") or "127.0.0.1", int(params.get("port") or 5432), lambda _: up.is_set(),
                   hold=hold) as (port, _):
        url = make_conninfo("", **{**params, "host": "127.0.0.1", "port": str(port)})
        with webhook_server({**pg_lab, "WEBHOOK_SECRET": SECRET, "DATABASE_URL": url, **settings}) as (proc, base_url):
            yield proc, base_url, port


def killed(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 10
    while worker_owner._process_alive(pid) and time.time() < deadline:
        time.sleep(0.01)


def test_a_writer_restarted_while_postgres_is_down_answers_503_with_the_reason_and_the_retry_is_stored(pg_lab):
    """写库进程被杀、重新拉起时 PostgreSQL 正好连不上:新的写库进程不退出,这一批马上回 503、说出原因,
    而不是一起来就带着一段 traceback 退出(每一批一段,打进 webhook 的日志)、503 里只有「writer process exited with code 1」;
    数据库回来以后上游重试就收下,还是这一个写库进程。"""
    up = threading.Event()
    up.set()
    with webhook_behind_a_proxy(pg_lab, up) as (proc, base_url, port):
        assert deliver(base_url, body_for("T1012")) == (202, {"accepted": True, "duplicate": False})
        up.clear()
        killed(*writer_pids(proc.pid))
        started = time.monotonic()
        answer = deliver(base_url, body_for("T1041"))
        assert time.monotonic() - started < 5
        assert answer == (503, {"detail": 'event store unavailable (OperationalError: connection failed: connection to '
                                          f'server at "127.0.0.1", port {port} failed: server closed the connection '
                                          "unexpectedly), retry later"})
        assert [e[0] for e in stored()] == ["evt_T1012_created"]
        (writer,) = writer_pids(proc.pid)
        up.set()
        assert deliver(base_url, body_for("T1041")) == (202, {"accepted": True, "duplicate": False})
        assert writer_pids(proc.pid) == [writer]
    assert [e[0] for e in stored()] == ["evt_T1012_created", "evt_T1041_created"]
    assert proc.stderr.read() == b""


def test_postgres_going_away_under_a_running_webhook_answers_503_within_seconds_and_the_retry_is_stored(pg_lab):
    """PostgreSQL 不在了(连接被掐断,新连接连不上):几秒内 503、说原因。写库进程向连接池借连接只等
    几秒:等满连接池默认的 30 秒的话,排在后面的一批再等 30 秒,请求 30–60 秒后才拿到 503,send_webhook.py 这样
    10 秒超时的发送方什么回答都没拿到。
    数据库回来以后上游重试就收下。"""
    up = threading.Event()
    up.set()
    with webhook_behind_a_proxy(pg_lab, up, PG_IDLE_CHECK_S="86400") as (proc, base_url, _):
        assert deliver(base_url, body_for("T1012")) == (202, {"accepted": True, "duplicate": False})
        up.clear()
        (writer,) = writer_pids(proc.pid)
        assert cut_connections(writer) >= 1
        body = body_for("T1041")
        assert deliver(base_url, body) == (503, {"detail": "event store unavailable (AdminShutdown: terminating "
                                                           "connection due to administrator command), retry later"})
        started = time.monotonic()
        answer = deliver(base_url, body)
        assert time.monotonic() - started < 10
        assert answer == (503, {"detail": "event store unavailable (PoolTimeout: couldn't get a connection after "
                                          "3.00 sec), retry later"})
        assert [e[0] for e in stored()] == ["evt_T1012_created"]
        up.set()
        deadline = time.monotonic() + 60  # 连接池隔一会儿才重连一次(越来越久):上游照常隔一会儿重发
        while (answer := deliver(base_url, body))[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert answer == (202, {"accepted": True, "duplicate": False})
        assert writer_pids(proc.pid) == [writer]
    assert [e[0] for e in stored()] == ["evt_T1012_created", "evt_T1041_created"]
    assert proc.stderr.read() == b""


@contextlib.contextmanager
def a_stalled_writer(pg_lab: dict):
    """webhook(BUSY_TIMEOUT_S=1)收下一个事件之后,它和 PostgreSQL 之间的网络不通了(hold 设着)。
    返回 (webhook 进程, 基础 URL, 写库进程的 pid, hold)。"""
    up, hold = threading.Event(), threading.Event()
    up.set()
    with webhook_behind_a_proxy(pg_lab, up, hold, BUSY_TIMEOUT_S="1") as (proc, base_url, _):
        assert deliver(base_url, body_for("T1012")) == (202, {"accepted": True, "duplicate": False})
        (writer,) = writer_pids(proc.pid)
        hold.set()
        yield proc, base_url, writer, hold


def test_a_stalled_database_connection_answers_503_after_the_time_limit_and_a_new_writer_takes_the_retry(pg_lab):
    """和 PostgreSQL 之间的网络不通了(连接还在,谁也等不到回话):写库进程卡在读 socket 上。等 BUSY_TIMEOUT_S + 5
    秒还没回话就杀掉它,这一批回 503;下一批拉起新的写库进程。一直等的话,这一批和后面的请求都没有回答,关服务也卡住。"""
    with a_stalled_writer(pg_lab) as (proc, base_url, writer, hold):
        started = time.monotonic()
        answer = deliver(base_url, body_for("T1041"))
        assert 6 <= time.monotonic() - started < 15
        assert answer == (503, {"detail": "event store unavailable (writer process did not answer within 6 s), "
                                          "retry later"})
        assert not worker_owner._process_alive(writer)
        hold.clear()
        assert deliver(base_url, body_for("T1041")) == (202, {"accepted": True, "duplicate": False})
        (new,) = writer_pids(proc.pid)
        assert new != writer
        started = time.monotonic()
        proc.terminate()
        proc.wait(timeout=30)
        assert time.monotonic() - started < 10
    assert [e[0] for e in stored()] == ["evt_T1012_created", "evt_T1041_created"]


def with_no_answer(base_url: str, body: bytes) -> None:
    """发出去,webhook 在回答之前就没了(连接断开)。"""
    with pytest.raises(OSError):
        deliver(base_url, body)


def test_a_writer_stuck_on_the_database_dies_with_a_killed_webhook(pg_lab):
    """写库进程卡在数据库上(网络不通)时 webhook 被 kill -9:它读不到输入结束。它发现 webhook 没了以后,手上那一批再给 BUSY_TIMEOUT_S + 5 秒,还卡着就退出,不会一直挂着成了孤儿进程。它手上那一批没回过 202,上游会重发。"""
    with a_stalled_writer(pg_lab) as (proc, base_url, writer, hold):
        with ThreadPoolExecutor(1) as pool:
            pool.submit(with_no_answer, base_url, body_for("T1041"))
            time.sleep(1)  # 写库进程读走了这一批,卡在数据库上
            proc.kill()
            proc.wait(timeout=10)
            killed_at = time.time()
            while worker_owner._process_alive(writer) and time.time() < killed_at + 20:
                time.sleep(0.05)
            assert not worker_owner._process_alive(writer)
            assert 6 <= time.time() - killed_at < 12  # 1 + 5 秒的宽限,再加上最多 1 秒才发现 webhook 没了
            hold.clear()
    assert [e[0] for e in stored()] == ["evt_T1012_created"]


def stop_writer() -> None:
    """把现在的写库进程杀掉;下一批到来时 webhook 会拉起新的。"""
    proc = webhook.committer.proc
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while worker_owner._process_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.01)


def test_a_writer_that_cannot_be_started_answers_503_and_nothing_is_stored(client, monkeypatch):
    stop_writer()
    body = body_for("T1012")
    with monkeypatch.context() as m:
        m.setattr(sys, "executable", "/nonexistent/python3")
        r = post(client, body, send_webhook.sign(body, SECRET))
    assert r.status_code == 503
    assert r.json() == {"detail": "event store unavailable (cannot start writer process: [Errno 2] No such file or "
                                  "directory: '/nonexistent/python3'), retry later"}
    assert stored() == []
    r = post(client, body, send_webhook.sign(body, SECRET))  # 能拉起来了:上游重试就收下
    assert (r.status_code, r.json()) == (202, {"accepted": True, "duplicate": False})


def test_a_writer_answering_garbage_answers_503_and_nothing_is_stored(client, monkeypatch, tmp_path):
    garbage = tmp_path / "garbage_writer.py"
    garbage.write_text("import sys\nfor line in sys.stdin:\n    print('not json', flush=True)\n", encoding="utf-8")
    monkeypatch.setattr(webhook_commit, "WRITER", garbage)
    stop_writer()
    body = body_for("T1012")
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (
        503, {"detail": "event store unavailable (writer process answered b'not json\\n'), retry later"})
    assert stored() == []


def test_a_delivery_arriving_while_the_webhook_shuts_down_answers_503_and_nothing_is_stored(client, monkeypatch):
    body = body_for("T1012")
    with monkeypatch.context() as m:
        m.setattr(webhook.committer, "stopping", True)  # lifespan 的收尾已经开始:排着的写完,不再收新的
        r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (503, {"detail": "event store unavailable (shutting down), retry later"})
    assert stored() == []


def test_a_whsec_secret_broken_after_startup_is_a_500_with_the_reason_and_nothing_stored(client, monkeypatch):
    monkeypatch.setenv("WEBHOOK_SECRET", "whsec_not*base64")
    body = body_for()
    r = client.post(URL, content=body, headers=standard_headers(body, b"whatever"))
    assert (r.status_code, r.json()) == (500, {"detail": "配置错误:WEBHOOK_SECRET 以 whsec_ 开头,但后面不是合法的 base64"})
    assert stored() == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_writer_process_exits_with_the_webhook(lab, sig):
    """webhook 被 kill -9 或者正常停掉,写库进程都跟着退出,不留下孤儿进程;回过 202 的事件都在库里。"""
    with webhook_server({**lab, "WEBHOOK_SECRET": SECRET}) as (proc, url):
        body = body_for("T1012")
        request = urllib.request.Request(url + URL, data=body, method="POST", headers={
            "content-type": "application/json", "x-cloudledger-signature": send_webhook.sign(body, SECRET)})
        with urllib.request.urlopen(request, timeout=10) as r:
            assert (r.status, json.loads(r.read())) == (202, {"accepted": True, "duplicate": False})
        (writer,) = writer_pids(proc.pid)
        assert worker_owner._process_alive(writer)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        deadline = time.time() + 10
        while worker_owner._process_alive(writer) and time.time() < deadline:
            time.sleep(0.05)
        assert not worker_owner._process_alive(writer)
    assert stored() == [("evt_T1012_created", "webhook", "ticket.created", "pending", 0)]


def test_webhook_writer_answers_each_batch_and_survives_a_bad_line(lab):
    """webhook_writer.py 单独运行(docstring 里的命令):一行一批,一批回一行;坏的一行回 error,接着读下一行。"""
    payload = json.dumps({"data": {"ticket_id": "T1012"}})
    batch = json.dumps([["evt_demo", "webhook", "ticket.created", payload]])
    r = run(["webhook_writer.py"], lab, input=f"{batch}\n{batch}\nnot json\n[[1, 2]]\n")
    assert (r.returncode, r.stderr) == (0, "")
    assert [json.loads(line) for line in r.stdout.splitlines()] == [
        {"new": [True]}, {"new": [False]},
        {"error": "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"},
        {"error": "ValueError: not enough values to unpack (expected 4, got 2)"}]
    assert rows("SELECT event_id, ticket_id, status FROM events") == [("evt_demo", "T1012", "pending")]


@pytest.mark.parametrize("where, why", [("nowhere/events.db", "目录 {dir} 不存在"), (".", "这是一个目录,不是文件")])
def test_webhook_writer_with_an_unusable_events_db_says_why_and_answers_no_batch(lab, tmp_path, where, why):
    """单独运行时 EVENTS_DB 指错了:一行原因、退出码 1,喂进去的那一批没有回「写好了」,也没建出目录或文件。"""
    path = tmp_path / where
    batch = json.dumps([["evt_demo", "webhook", "ticket.created", json.dumps({"data": {"ticket_id": "T1012"}})]])
    r = run(["webhook_writer.py"], {**lab, "EVENTS_DB": str(path)}, input=batch + "\n")
    reason = why.format(dir=path.parent)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"事件库打不开:EVENTS_DB={path.resolve()}({reason})\n")
    assert not (tmp_path / "nowhere").exists()
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_webhook_writer_demo_command_copied_from_the_file_works(lab):
    """学员从 webhook_writer.py 文件开头照抄那条 echo 命令(源文件里的样子,不是 help() 渲染后的):
    docstring 是 raw 字符串,源文件里写的就是 \\",抄下来照样能喂进去(不是 raw 的话源文件里是 \\\\",只得到
    JSONDecodeError)。"""
    line = next(l for l in (LAB / "webhook_writer.py").read_text().splitlines() if l.lstrip().startswith("echo "))
    echo, pipe = line.strip().split(" | ")
    assert pipe == "DATABASE_URL= EVENTS_DB=/tmp/writer-demo.db uv run python webhook_writer.py"
    batch = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, check=True).stdout
    # 学员设着 DATABASE_URL(README 建议写进 .env):命令开头的 DATABASE_URL= 让演示照样写进 SQLite 临时库,不进真的
    # 事件表(没有它的话,演示事件进了 PostgreSQL,worker 去给 T1012 起草)。照命令设环境变量,临时库换成 lab 的
    assignments = dict(a.split("=", 1) for a in pipe.split(" uv run ")[0].split())
    assert assignments == {"DATABASE_URL": "", "EVENTS_DB": "/tmp/writer-demo.db"}
    env = {**lab, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/not-this-one", **assignments,
           "EVENTS_DB": lab["EVENTS_DB"]}
    r = run(["webhook_writer.py"], env, input=batch + batch)  # 同一批喂两次:文件里说第二次是 false
    assert (r.returncode, r.stdout, r.stderr) == (0, '{"new": [true]}\n{"new": [false]}\n', "")
    assert rows("SELECT event_id, ticket_id, status FROM events") == [("evt_demo", "T1012", "pending")]


@pytest.mark.parametrize("event, detail", [
    ({"id": "e" * 201, "type": "ticket.created", "data": {"ticket_id": "T1"}},
     "id must be a non-empty string (at most 200 characters)"),
    ({"id": 1012, "type": "ticket.created", "data": {"ticket_id": "T1"}},
     "id must be a non-empty string (at most 200 characters)"),
    ({"id": "e1", "type": 1, "data": {"ticket_id": "T1"}}, "type must be a string"),
    ({"id": "e1", "type": "ticket.created", "data": {"ticket_id": "T" * 65}},
     "data.ticket_id must be a string of letters, digits, _ or - (at most 64)"),
    ({"id": "e1", "type": "ticket.created", "data": "T1012"},
     "data.ticket_id must be a string of letters, digits, _ or - (at most 64)"),
])
def test_over_long_or_wrongly_typed_fields_are_rejected_with_400_and_nothing_stored(client, event, detail):
    """长度上限和类型:id 最多 200 个字符,ticket_id 最多 64 个;刚好超出一个就拒,什么都不存。"""
    body = json.dumps(event).encode()
    r = post(client, body, send_webhook.sign(body, SECRET))
    assert (r.status_code, r.json()) == (400, {"detail": detail})
    assert stored() == []


@pytest.mark.parametrize("leave_out, seconds_ahead, detail", [
    ("webhook-timestamp", 0, "bad signature header"),
    ("webhook-id", 0, "bad signature header"),
    (None, 301, "timestamp too far in the future"),
])
def test_standard_webhooks_without_id_or_timestamp_or_from_the_future_is_rejected_and_nothing_stored(
        client, monkeypatch, leave_out, seconds_ahead, detail):
    body = body_for()
    # 签名本身是对的(未来的时间戳也照样签):拒它的是缺了的头、或者时间
    headers = standard_headers(body, SECRET.encode(), ts=frozen_clock(monkeypatch) + seconds_ahead)
    headers.pop(leave_out, None)
    r = client.post(URL, content=body, headers=headers)
    assert (r.status_code, r.json()) == (400, {"detail": detail})
    assert stored() == []


RESERVED = ("id must not start with <, no-message-id:, message-id-sha1:, cron: "
            "(those are the ids of mail and cron events)")


def test_ids_of_mail_and_cron_events_are_refused_so_a_signed_request_cannot_take_them(client, lab):
    """三个来源共用 event_id 这一个唯一键。邮件和定时扫描的 id 从 webhook 来一律 400、什么都不存;信和提醒照常入队。
    不然一个签名对的请求拿一封信的 Message-ID 当 id,回 202,那封信来时成了 duplicate(IMAP 上标了已读,不建工单);
    拿 cron:stale:T1007:<今天> 当 id,那天 T1007 的提醒就不再入队。"""
    import cron_jobs
    import email_poller

    sample = LAB / "samples" / "01_utf8_plain.eml"
    raw = sample.read_bytes()
    mail_id = email_poller.parse(raw)["message_id"]
    no_id = email_poller.parse((LAB / "samples" / "08_no_message_id.eml").read_bytes())["message_id"]
    cron_id = cron_jobs.stale_event_id("T1007", store.now()[:10])
    assert (mail_id[0], no_id.split(":")[0], cron_id) == (
        "<", "no-message-id", f"cron:stale:T1007:{store.now()[:10]}")  # 真的是这两个程序会用的 id
    for event_id in (mail_id, no_id, cron_id, "message-id-sha1:0123", "cron:report"):
        for kind in ("ticket.created", "ticket.closed"):  # 不处理的类型也一样先查 id
            body = body_for("T1041", event_id=event_id, kind=kind)
            r = post(client, body, send_webhook.sign(body, SECRET))
            assert (event_id, r.status_code, r.json()) == (event_id, 400, {"detail": RESERVED})
    assert stored() == []
    mail = run(["email_poller.py", "--eml", str(sample)], lab)
    assert (mail.returncode, mail.stderr, mail.stdout.splitlines()[-1]) == (
        0, "", "本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0")
    assert rows("SELECT event_id, source FROM events") == [(mail_id, "email")]


def test_a_body_that_trickles_in_too_slowly_gets_408_nothing_stored_and_the_service_still_stops(lab):
    """上游发了请求头,请求体却停在半路(它那台机器没了、连接没关,或者一个字节一个字节地挤):WEBHOOK_BODY_TIMEOUT_S 里
    没收完就回 408,什么都不存。不然这个请求一直挂着,关服务(SIGTERM)时 uvicorn 等它,服务停不下来。"""
    import socket

    body = body_for("T1012")
    env = {**lab, "WEBHOOK_SECRET": SECRET, "WEBHOOK_BODY_TIMEOUT_S": "1"}
    with webhook_server(env) as (proc, base_url):
        port = int(base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall((f"POST {URL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          f"X-CloudLedger-Signature: {send_webhook.sign(body, SECRET)}\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:20])
            started = time.monotonic()
            answer = conn.recv(65536).decode()
            waited = time.monotonic() - started
            while not answer.endswith("}") and (more := conn.recv(65536).decode()):  # 头和体可能分两次到
                answer += more
            proc.terminate()  # 连接还开着:服务照样停得下来(uvicorn 收拾完以后照收到的信号退出)
            assert proc.wait(timeout=10) in (0, -signal.SIGTERM)
        assert answer.startswith("HTTP/1.1 408 "), answer
        assert answer.endswith('{"detail":"body not received within 1 seconds"}'), answer
        assert 0.5 < waited < 5
    assert stored() == []


def test_an_upstream_that_hangs_up_mid_body_gets_one_line_not_a_traceback_and_nothing_is_stored(lab):
    """上游发了一半的请求体就断开(它那边超时了,稍后会重发):什么都不记、什么都不存,服务照常收下
    一个。uvicorn 的日志里没有一整段 traceback(Exception in ASGI application … ClientDisconnect),盯着日志报警的
    不会以为服务出错了。真的 uvicorn,真的 TCP 连接。"""
    import socket

    body = body_for("T1012")
    with webhook_server({**lab, "WEBHOOK_SECRET": SECRET}) as (proc, base_url):
        port = int(base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall((f"POST {URL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          f"X-CloudLedger-Signature: {send_webhook.sign(body, SECRET)}\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:20])
            time.sleep(0.5)  # 让服务端读到这 20 个字节、等着后面的
        time.sleep(0.5)
        assert stored() == []
        assert deliver(base_url, body_for("T1041")) == (202, {"accepted": True, "duplicate": False})
    assert proc.stderr.read().decode() == ""
    assert stored() == [("evt_T1041_created", "webhook", "ticket.created", "pending", 0)]
