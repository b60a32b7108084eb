"""命令要多久才开始干活:收件箱的 list、accept、edit、ignore 和空队列上的 worker.py --once,各是一个新进程。

运行:
    uv run python bench/startup.py            # 每个命令 9 轮,取中位数
    uv run python bench/startup.py --rounds 3 # 冒烟

你会看到一张表:每个命令的中位数(秒)、比 `python -c pass` 多出的时间、是「只导入 LangGraph 的 SQLite saver」的几倍、
目标和 ✓/✗(没达到也是退出码 0:量成了;某个命令失败才是 1,带着它的输出)。两个基线在同一次运行里量:`python -c pass` 是 Python 自己启动的时间,`python -c "import
langgraph.checkpoint.sqlite"` 是读 checkpoint 起码要导入的东西。每一轮把各个命令轮着跑一遍(机器忙闲的变化均摊到
每个命令上),每次都在一份新拷贝的实验环境里跑(accept 之后待办就没了)。模型是离线的,不设 LLM_API_KEY。
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

# (名字, 参数, 目标秒数;None 是基线)。收件箱里等着的是 T1012 的草稿
COMMANDS = [
    ("python -c pass", ["-c", "pass"], None),
    ("import langgraph.checkpoint.sqlite", ["-c", "import langgraph.checkpoint.sqlite"], None),
    ("worker.py --once(空队列)", ["worker.py", "--once"], 1.0),
    ("inbox.py list", ["inbox.py", "list"], 0.5),
    ("inbox.py accept T1012", ["inbox.py", "accept", "T1012"], 1.0),
    ("inbox.py edit T1012 …", ["inbox.py", "edit", "T1012", "您好,已为您处理。"], 1.0),
    ("inbox.py ignore T1012", ["inbox.py", "ignore", "T1012"], 1.0),
]


def prepare(folder: Path, env: dict) -> None:
    """在 folder 里建好三个库,T1012 的草稿等在收件箱里(和课文练习 1 一样:store.py、一个事件、worker.py --once)。"""
    run(["store.py"], env)
    common.use_env(env)
    import store

    payload = json.dumps({"type": "ticket.created", "data": {"ticket_id": "T1012"}})
    store.add_event("evt_T1012_created", "webhook", "ticket.created", payload)
    run(["worker.py", "--once"], env)


def run(args: list[str], env: dict) -> float:
    """跑一个命令,返回墙钟时间(秒);失败就带着它的输出停下。"""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, *args], cwd=common.ROOT, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} 退出码 {r.returncode}:\n{r.stdout}{r.stderr}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description="量命令的启动时间")
    parser.add_argument("--rounds", type=common.positive_int, default=9, help="每个命令跑几轮(默认 9)")
    args = parser.parse_args()
    common.print_header("命令的启动时间", common.command_line("bench/startup.py"))
    times: dict[str, list[float]] = {name: [] for name, _, _ in COMMANDS}
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template"
        template.mkdir()
        prepare(template, common.clean_env(**common.lab_env(template)))
        for r in range(args.rounds):
            for i, (name, argv, _) in enumerate(COMMANDS):
                folder = Path(tmp) / f"r{r}-{i}"
                shutil.copytree(template, folder)
                times[name].append(run(argv, common.clean_env(**common.lab_env(folder))))
                shutil.rmtree(folder)
    bare = common.median(times[COMMANDS[0][0]])
    saver = common.median(times[COMMANDS[1][0]])
    rows = []
    for name, _, target in COMMANDS:
        took = common.median(times[name])
        ok = target is None or took <= target
        rows.append([name, took, took - bare, took / saver, "基线" if target is None else f"≤ {target:g} 秒",
                     "" if target is None else common.mark(ok)])
    common.table(["命令", "中位数(秒)", "减去 python -c pass", "÷ 导入 saver", "目标", ""], rows)
    print(f"{args.rounds} 轮;每轮各命令轮着跑一次,每次一份新拷贝的实验环境")
    return 0


if __name__ == "__main__":
    sys.exit(main())
