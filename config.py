"""配置只从这里读:环境变量优先,其次是当前目录的 .env(有就读,没有也行),最后是各模块顶部常量给的默认值。

这个文件不单独运行。每个设置项都列在 .env.example 里,带说明。
读取发生在调用时而不是 import 时,所以测试可以在子进程或 monkeypatch 里随时换设置。
设置 AMBIENT_NO_DOTENV=1 可以完全不读 .env(测试里就是这么做的,免得你本机的 .env 混进来)。
"""
import math
import os
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
_dotenv_loaded = False


def _load_dotenv_once() -> None:
    global _dotenv_loaded
    if _dotenv_loaded:
        return
    _dotenv_loaded = True
    if os.environ.get("AMBIENT_NO_DOTENV") == "1":
        return
    from dotenv import load_dotenv

    load_dotenv(Path.cwd() / ".env", override=False)  # 已经设置的环境变量不会被 .env 覆盖


def get(name: str, default: str = "") -> str:
    """读一个字符串设置;空字符串等同于没设置。"""
    _load_dotenv_once()
    value = os.environ.get(name, "").strip()
    return value if value else default


def number(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """读一个数字设置。不是数字(含 nan、inf)或超出 [minimum, maximum] 时以 SystemExit 退出,说明是哪一项。"""
    raw = get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise SystemExit(f"配置错误:{name}={raw!r} 不是数字")
    if minimum is not None and value < minimum:
        raise SystemExit(f"配置错误:{name}={raw!r} 不能小于 {minimum:g}")
    if maximum is not None and value > maximum:
        raise SystemExit(f"配置错误:{name}={raw!r} 不能大于 {maximum:g}")
    return value


def integer(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = number(name, default, minimum=minimum, maximum=maximum)
    if value != int(value):
        raise SystemExit(f"配置错误:{name}={get(name)!r} 应该是整数")
    return int(value)


def url(name: str, default: str = "", *, secret: bool = False) -> str:
    """读一个 http(s) 网址设置(没设置时是 default,可以为空)。不是 http:// 或 https:// 开头、没有主机名、
    端口不是数字时以 SystemExit 退出,说明是哪一项 —— 不然要等到真的去连时,才报一个像是「对方没开」的错。
    secret=True:网址本身就是密钥(Slack webhook 的路径),错误信息里只露出开头。"""
    raw = get(name, default)
    if not raw:
        return raw
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 —— 端口不是数字、超出范围时这里抛 ValueError
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        problem = "" if ok else "要以 http:// 或 https:// 开头,后面是主机名"
    except ValueError as e:
        problem = str(e)
    if problem:
        shown = raw[:16] + "…" if secret and len(raw) > 16 else raw
        raise SystemExit(f"配置错误:{name}={shown!r} 不是合法的网址({problem})")
    return raw


def path(name: str, default_filename: str) -> Path:
    """文件路径设置;相对路径按当前目录解释,默认放在脚本旁边。"""
    raw = get(name)
    return _resolved(raw, os.getcwd()) if raw else HERE / default_filename


@lru_cache(maxsize=64)
def _resolved(raw: str, cwd: str) -> Path:
    """Path.resolve() 要对路径的每一段做一次 lstat;store 每条语句都要问一次库在哪,
    不缓存的话 worker 处理一个事件有 4% 的时间花在这里(bench/worker.py 采样)。按原值和当前目录缓存。"""
    return (Path(cwd) / Path(raw).expanduser()).resolve()
