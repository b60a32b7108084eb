"""bench/ 两个脚本共用的小工具:打印表头信息、中位数和分位数、markdown 表格、峰值内存、临时实验环境。

这个文件不单独运行;bench/webhook.py 和 bench/worker.py 导入它。
"""
import argparse
import os
import platform
import statistics
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# 项目目录放在最前面:bench/worker.py、bench/webhook.py 和项目里的 worker.py、webhook.py 同名,
# import worker 时要拿到项目的那个
if str(ROOT) in sys.path:
    sys.path.remove(str(ROOT))
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # tests/openai_stub.py
os.environ["AMBIENT_NO_DOTENV"] = "1"  # 不读开发者本机的 .env,免得真 key 或真数据库混进基准

# 子进程里不该带过去的设置:真模型的 key、真数据库
FOREIGN_ENV = ("LLM_API_KEY", "LLM_BASE_URL", "LLM_MODEL", "LLM_FALLBACK_MODEL", "LLM_FALLBACK_BASE_URL",
               "LLM_FALLBACK_API_KEY",
               "DATABASE_URL", "EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB", "WEBHOOK_SECRET", "PG_POOL_SIZE",
               "WORKER_CONCURRENCY")
OK, NOT_OK = "✓", "✗"


def mark(ok: bool) -> str:
    return OK if ok else NOT_OK


def print_header(title: str, command: str) -> None:
    """每份结果开头:日期、核数、Python 版本、当前负载(机器是共享的,负载高时数字会偏低)。"""
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# {title}\n")
    print(f"- 日期:{datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"- 机器:nproc = {os.cpu_count()},{platform.machine()},{platform.system()} {platform.release()}")
    print(f"- Python:{sys.version.split()[0]}({sys.executable})")
    print(f"- 开始时负载(1/5/15 分钟):{load}")
    print(f"- 命令:`{command}`\n", flush=True)


def positive_int(text: str) -> int:
    """argparse 的 type:轮数、请求数这类只能是正整数。0 和负数在这里就被拒绝,说一行:不然 0 会被「or 默认值」
    悄悄换掉,负数算出 nan 的比值、旁边还打 ✓,-1 个请求是 ZeroDivisionError 的 traceback。"""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"要是正整数,不是 {text!r}")
    return value


def command_line(script: str) -> str:
    """这次运行的命令,照着能原样再跑一遍(带上参数;设了 TEST_DATABASE_URL 或 DATABASE_URL 的也写出来,值不写:
    两个都认:用 DATABASE_URL 跑的那次,印出来的命令照着敲也测 PostgreSQL)。"""
    prefix = "".join(f"{name}=… " for name in ("TEST_DATABASE_URL", "DATABASE_URL") if os.environ.get(name))
    return " ".join([f"{prefix}uv run python {script}", *sys.argv[1:]])


def clean_env(**extra: str) -> dict:
    """给子进程用的环境:去掉 FOREIGN_ENV,再加上 extra。"""
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    return {**env, "AMBIENT_NO_DOTENV": "1", **extra}


def lab_env(folder: Path) -> dict:
    """一套新的事件库、checkpoint 库、业务库路径(SQLite 文件)。"""
    return {"EVENTS_DB": str(folder / "ambient.db"), "CHECKPOINTS_DB": str(folder / "checkpoints.db"),
            "BIZ_DB": str(folder / "cloudledger.db")}


def use_env(env: dict) -> None:
    """让本进程里的 store/config 用这套设置(config 在调用时才读环境变量)。"""
    for name in FOREIGN_ENV:
        os.environ.pop(name, None)
    os.environ.update(env)


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def percentile(values, q: float) -> float:
    """q 分位(0–100),最近秩法:p99 就是排序后第 ceil(0.99 n) 个。"""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def table(headers: list[str], rows: list[list]) -> None:
    """打印 markdown 表格。数字按类型格式化:float 保留到合适的位数。"""
    def cell(v) -> str:
        if isinstance(v, float):
            return "—" if v != v else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}")
        return str(v)
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(cell(v) for v in row) + " |")
    print(flush=True)


def peak_rss_mb(pid: int) -> float:
    """进程到现在为止的峰值常驻内存(/proc/<pid>/status 的 VmHWM),MiB。"""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
