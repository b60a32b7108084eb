"""邮件模糊测试:把样例邮件截断、改坏字节、删行、重复邮件头,和一封好邮件一起交给轮询。

轮询从不崩:坏邮件被报告、跳过(退出码 1),好邮件照样变成工单和事件。
"""
import contextlib
import io
import re
import tempfile
import uuid
from pathlib import Path

import pytest
from conftest import LAB, new_lab, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import email_poller
import store_sqlite

pytestmark = pytest.mark.slow  # 模糊测试:默认的 uv run pytest 不跑,.ci/run 用 -m slow 跑

SAMPLES = sorted((LAB / "samples").glob("*.eml"))


def good_mail(message_id: str) -> bytes:
    return (f"From: li.na@example.com\nSubject: =?utf-8?B?5Y+R56Wo5oqs5aS0?=\nMessage-ID: <{message_id}>\n"
            "Content-Type: text/plain; charset=utf-8\n\n发票抬头写错了,麻烦重开。\n").encode()


@st.composite
def mutated(draw) -> bytes:
    raw = bytearray(draw(st.sampled_from(SAMPLES)).read_bytes())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "flip", "delete_lines", "repeat_header", "insert"]))
        if kind == "truncate":
            del raw[draw(st.integers(0, len(raw))):]
        elif kind == "flip" and raw:
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] = draw(st.integers(0, 255))
        elif kind == "delete_lines":
            lines = bytes(raw).split(b"\n")
            a = draw(st.integers(0, len(lines)))
            raw = bytearray(b"\n".join(lines[:a] + lines[a + draw(st.integers(1, 5)):]))
        elif kind == "repeat_header":
            raw = bytearray(b"Content-Type: multipart/mixed; boundary=\"x\"\nFrom: \n" + bytes(raw))
        else:
            i = draw(st.integers(0, len(raw)))
            raw[i:i] = draw(st.binary(min_size=1, max_size=50))
    return bytes(raw)


SUMMARY = re.compile(r"本次收取 (\d+) 封:新工单 (\d+),重复 (\d+),跳过 (\d+),无法解析 (\d+),存储失败 (\d+)")


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(bad=st.lists(mutated(), min_size=1, max_size=3))
def test_mutated_and_truncated_mail_never_crashes_the_poller_and_good_mail_is_still_stored(lab, bad):
    # 每个例子一套新库(lab 只在整个测试开始时建一次):前面例子存下的工单、事件不会改变后面例子的结果,
    # hypothesis 缩小失败的例子时也能原样重现
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        new_lab(Path(folder), mp.setenv)
        try:
            case = Path(folder) / "mail"
            case.mkdir()
            good_id = f"{uuid.uuid4().hex}@example.com"
            for i, raw in enumerate(bad):
                (case / f"bad_{i}.eml").write_bytes(raw)
            (case / "zz_good.eml").write_bytes(good_mail(good_id))
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = email_poller.main(["--eml", str(case)])
            assert rows("SELECT status, source FROM events WHERE event_id = ?", (f"<{good_id}>",)) == [
                ("pending", "email")]
        finally:
            store_sqlite.close_connections()
    lines, problems = out.getvalue().splitlines(), err.getvalue().splitlines()
    counts = SUMMARY.fullmatch(lines[-1])
    assert counts, lines[-1]
    total, tickets, duplicates, skipped, broken, failed = map(int, counts.groups())
    # 每封邮件都有下落:好的一封成了工单,其余的各归一类;坏邮件每封在 stderr 上一行,退出码 1;没有存储失败
    assert (total, failed, tickets + duplicates + skipped + broken) == (len(bad) + 1, 0, total)
    assert tickets >= 1
    assert (len(lines) - 1, len(problems), code) == (total - broken, broken, 1 if broken else 0), err.getvalue()
