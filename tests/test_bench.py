"""bench/ 的脚本不是测试(它们量速度,见 README「性能与可靠性」);这里只查它们拒绝写错的参数:说清楚、退出码 2、什么都没跑。"""
import pytest
from conftest import run


@pytest.mark.parametrize("script, args, message", [
    ("bench/webhook.py", ["--requests", "-1", "--rounds", "1"], "argument --requests: 要是正整数,不是 '-1'"),
    ("bench/webhook.py", ["--requests", "5", "--rounds", "0"], "argument --rounds: 要是正整数,不是 '0'"),
    ("bench/webhook.py", ["--rounds", "x"], "argument --rounds: 要是正整数,不是 'x'"),
    ("bench/worker.py", ["--part", "b", "--rounds", "-1", "--db", "sqlite"], "argument --rounds: 要是正整数,不是 '-1'"),
    ("bench/startup.py", ["--rounds", "0"], "argument --rounds: 要是正整数,不是 '0'"),
])
def test_a_bench_given_zero_or_negative_rounds_or_requests_refuses_before_measuring_anything(lab, script, args,
                                                                                             message):
    """0 和负数在量之前就被拒绝:0 不会被悄悄换成默认值(--rounds 0 跑 7 轮),负数不会算出 nan 的比值、旁边还打 ✓,
    -1 个请求不会是 ZeroDivisionError。"""
    r = run([script, *args], lab)
    name = script.split("/")[1]
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"usage: {name} ") and r.stderr.endswith(f"{name}: error: {message}\n"), r.stderr


def test_the_startup_bench_times_every_command_against_both_baselines_in_one_run(lab):
    """bench/startup.py 跑一轮:表里每个命令一行(两个基线在前),每个命令都真的跑成了(有一个失败,它就带着那个命令的输出停下,退出码 1)。"""
    r = run(["bench/startup.py", "--rounds", "1"], lab, timeout=300)
    assert (r.returncode, r.stderr) == (0, ""), r.stdout + r.stderr
    table = [line.split(" | ")[0].removeprefix("| ") for line in r.stdout.splitlines() if line.startswith("| ")]
    assert table == ["命令", "python -c pass", "import langgraph.checkpoint.sqlite", "worker.py --once(空队列)",
                     "inbox.py list", "inbox.py accept T1012", "inbox.py edit T1012 …", "inbox.py ignore T1012"]
    assert r.stdout.rstrip().endswith("1 轮;每轮各命令轮着跑一次,每次一份新拷贝的实验环境")
