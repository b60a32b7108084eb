"""bench/ 的脚本不是测试(它们量速度,见 README「性能与可靠性」);这里只查它们拒绝写错的参数:说清楚、退出码 2、什么都没跑。"""
import pytest
from conftest import run


@pytest.mark.parametrize("script, args, message", [
    ("bench/webhook.py", ["--requests", "-1", "--rounds", "1"], "argument --requests: 要是正整数,不是 '-1'"),
    ("bench/webhook.py", ["--requests", "5", "--rounds", "0"], "argument --rounds: 要是正整数,不是 '0'"),
    ("bench/webhook.py", ["--rounds", "x"], "argument --rounds: 要是正整数,不是 'x'"),
    ("bench/worker.py", ["--part", "b", "--rounds", "-1", "--db", "sqlite"], "argument --rounds: 要是正整数,不是 '-1'"),
    ("bench/startup.py", ["--rounds", "0"], "argument --rounds: 要是正整数,不是 '0'"),
    ("bench/inbox_web.py", ["--items", "0"], "argument --items: 要是正整数,不是 '0'"),
])
def test_a_bench_given_zero_or_negative_rounds_or_requests_refuses_before_measuring_anything(lab, script, args,
                                                                                             message):
    """0 和负数在量之前就被拒绝:0 不会被悄悄换成默认值(--rounds 0 跑 7 轮),负数不会算出 nan 的比值、旁边还打 ✓,
    -1 个请求不会是 ZeroDivisionError。"""
    r = run([script, *args], lab)
    name = script.split("/")[1]
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"usage: {name} ") and r.stderr.endswith(f"{name}: error: {message}\n"), r.stderr


OFFLINE_NOTICE = ("[llm] 没有设置 LLM_API_KEY,使用离线模型 offline-cloudledger:按关键词分类、按模板起草,不联网、不花钱。"
                  "设置 LLM_API_KEY 后自动换成真模型。\n")  # 准备数据时 worker 起草 1,000 条


def test_the_inbox_web_bench_times_both_pages_against_inbox_list_in_one_run(lab):
    """bench/inbox_web.py 冒烟:表里是基线和两种页面,各有 p50、比基线和目标;页面不对(没有「待处理 N」)就停下。"""
    r = run(["bench/inbox_web.py", "--items", "60", "--requests", "3", "--rounds", "1"], lab, timeout=300)
    assert (r.returncode, r.stderr) == (0, OFFLINE_NOTICE), r.stdout + r.stderr
    table = [line.split(" | ") for line in r.stdout.splitlines() if line.startswith("| ")]
    assert [row[0].removeprefix("| ") for row in table] == ["请求", "inbox.py list(新进程,列出全部)",
                                                           "GET /(列表页,50 条)", "GET /tickets/W0030(工单页)"]
    assert [row[4] for row in table[2:]] == ["p50 ≤ 100 ms"] * 2
    assert "准备:60 条待办" in r.stdout
    assert r.stdout.rstrip().endswith("60 条待办;1 轮,每轮每种页面 3 次、inbox.py list 3 次")


def test_the_startup_bench_times_every_command_against_both_baselines_in_one_run(lab):
    """bench/startup.py 跑一轮:表里每个命令一行(两个基线在前),每个命令都真的跑成了(有一个失败,它就带着那个命令的输出停下,退出码 1)。"""
    r = run(["bench/startup.py", "--rounds", "1"], lab, timeout=300)
    assert (r.returncode, r.stderr) == (0, ""), r.stdout + r.stderr
    table = [line.split(" | ")[0].removeprefix("| ") for line in r.stdout.splitlines() if line.startswith("| ")]
    assert table == ["命令", "python -c pass", "import langgraph.checkpoint.sqlite", "worker.py --once(空队列)",
                     "inbox.py list", "inbox.py accept T1012", "inbox.py edit T1012 …", "inbox.py ignore T1012"]
    assert r.stdout.rstrip().endswith("1 轮;每轮各命令轮着跑一次,每次一份新拷贝的实验环境")
