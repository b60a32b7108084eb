"""bench/ 的脚本不是测试(它们量速度,见 README「性能与可靠性」);这里只查它们拒绝写错的参数:说清楚、退出码 2、什么都没跑。"""
import pytest
from conftest import run


@pytest.mark.parametrize("script, args, message", [
    ("bench/webhook.py", ["--requests", "-1", "--rounds", "1"], "argument --requests: 要是正整数,不是 '-1'"),
    ("bench/webhook.py", ["--requests", "5", "--rounds", "0"], "argument --rounds: 要是正整数,不是 '0'"),
    ("bench/webhook.py", ["--rounds", "x"], "argument --rounds: 要是正整数,不是 'x'"),
    ("bench/worker.py", ["--part", "b", "--rounds", "-1", "--db", "sqlite"], "argument --rounds: 要是正整数,不是 '-1'"),
])
def test_a_bench_given_zero_or_negative_rounds_or_requests_refuses_before_measuring_anything(lab, script, args,
                                                                                             message):
    """0 和负数在量之前就被拒绝:0 不会被悄悄换成默认值(--rounds 0 跑 7 轮),负数不会算出 nan 的比值、旁边还打 ✓,
    -1 个请求不会是 ZeroDivisionError。"""
    r = run([script, *args], lab)
    name = script.split("/")[1]
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"usage: {name} ") and r.stderr.endswith(f"{name}: error: {message}\n"), r.stderr
