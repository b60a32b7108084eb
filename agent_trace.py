"""按工单追踪(课文「上线以后盯什么」:trace 按一个事件组织,session id 用工单号):设了 LANGFUSE_PUBLIC_KEY、
LANGFUSE_SECRET_KEY 和 LANGFUSE_HOST 时,worker 跑图、收件箱恢复图的每一次运行都经 Langfuse 的 LangChain 回调记成
一个 trace。同一张工单的起草、每轮重写、发送在 Langfuse 里是同一个 session(工单号);收件箱恢复的 trace 的 user 是处理
它的人;metadata 里有事件 id 和触发来源(webhook / email / cron);模型调用带着 token 用量。课文只说了该怎么组织,
这里补上接法和接上以后不能变坏的三件事:没设 key 时不导入 langfuse,一点时间都不花;Langfuse 挂了或很慢时事件照常处理,
进程退出时最多多等 FLUSH_TIMEOUT_S 秒;发出去的文字都按 llm_pii.mask_pii 打过码,模型没见过的号码(人 edit 时敲进去的、
状态里别的)不出这台机器。
"""
import atexit
import dataclasses
import functools
import logging
import sys
import threading

import config
import store
from llm import api_key_setting
from llm_pii import mask_pii

# 秒;进程退出时等还没发出的 trace 最多这么久:Langfuse 挂了、很慢时不拖住 crontab 每分钟跑的命令。
# 比承诺的 2 秒少,留给线程收尾和解释器退出;Langfuse 好好的时候,这时只剩最后一批 span,本机几毫秒就发完
FLUSH_TIMEOUT_S = 1
KEYS = ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST")  # 三项都设了才追踪

_lock = threading.Lock()
_clients: dict[tuple, object] = {}  # (public key, secret key, 地址) → Langfuse 客户端;一个进程建一次
_complained = threading.Lock()  # 拿到它的那一次说一行,之后不再说


def settings() -> tuple[str, str, str] | None:
    """三项都设了:(public key, secret key, 地址);都没设:None(不追踪)。只设了一部分是配置错误,以 SystemExit 退出:
    不会以为在追踪、其实什么都没发,也不会在没说好发到哪时把工单发给 Langfuse 的云服务(SDK 的默认地址)。"""
    values = (api_key_setting("LANGFUSE_PUBLIC_KEY"), api_key_setting("LANGFUSE_SECRET_KEY"),
              config.value("LANGFUSE_HOST"))
    if not any(values):
        return None
    if missing := [name for name, v in zip(KEYS, values) if not v]:
        given = "、".join(name for name, v in zip(KEYS, values) if v)
        raise SystemExit(f"配置错误:设了 {given},还缺 {'、'.join(missing)}:追踪要三项都设(都不设就不追踪)")
    return values


def check_settings() -> None:
    """跑图之前查一遍(agent_run.check_settings 调用):只设了一部分时启动就退出。"""
    settings()


def traced(cfg: dict, *, reviewer: str | None = None) -> dict:
    """给跑图用的 config(agent.thread_of 的)加上 Langfuse 的回调和 trace 的属性;没设 key 时原样返回,不导入 langfuse。
    session id 已经在 cfg 的 metadata 里(工单号);这里加上事件 id、触发来源,恢复时加上处理的人(reviewer)。
    没装 Langfuse 的 SDK、建不起客户端时说一行、照常跑,不追踪。"""
    keys = settings()
    if keys is None:
        return cfg
    event_id = cfg["configurable"].get("event_id")
    metadata = {**cfg.get("metadata", {}), "event_id": event_id or "", "source": source_of(event_id)}
    if reviewer:
        metadata["langfuse_user_id"] = reviewer
    try:
        client(*keys)
        handler = handler_class()(public_key=keys[0])  # 每次运行一个:几个处理线程不共用它记着的运行
    except ImportError:
        complain("设了 LANGFUSE_* 却没装 Langfuse 的 SDK,不追踪;要追踪先 uv sync --extra tracing")
        return cfg
    except Exception as e:  # noqa: BLE001 —— 追踪出了问题也不能让事件失败
        complain(f"没法接上 Langfuse({type(e).__name__}: {e})")
        return cfg
    return {**cfg, "metadata": metadata, "callbacks": [*(cfg.get("callbacks") or []), handler]}


def source_of(event_id: str | None) -> str:
    """事件是从哪来的:events.source(webhook / email / cron)。"""
    if not event_id:
        return ""
    with store.opened() as conn:
        row = conn.execute("SELECT source FROM events WHERE event_id = ?", (event_id,)).fetchone()
    return row["source"] if row else ""


def client(public_key: str, secret_key: str, host: str):
    """这组 key 的 Langfuse 客户端,第一次用到时建。用自己的 TracerProvider(不动全局的 OpenTelemetry 设置,也不装它
    退出时等 30 秒的 atexit);SDK 自己退出时那一次 flush 换成 flush_at_exit:最多等 FLUSH_TIMEOUT_S 秒。"""
    with _lock:
        if (keys := (public_key, secret_key, host)) in _clients:
            return _clients[keys]
        from langfuse import Langfuse
        from opentelemetry.sdk.trace import TracerProvider

        lf = Langfuse(public_key=public_key, secret_key=secret_key, base_url=host.rstrip("/"), mask=masked,
                      tracer_provider=TracerProvider(shutdown_on_exit=False))
        if lf._resources is not None:  # SDK 的 atexit 会等到发完为止(连不上时按它的超时一次次重试)
            atexit.unregister(lf._resources.shutdown)
        if not _clients:
            quiet_export_errors()
            atexit.register(flush_at_exit)
        _clients[keys] = lf
        return lf


@functools.cache
def handler_class():
    """Langfuse 的 LangChain 回调,只改一处:出错、停在 interrupt 时记下的说明(异常的消息、交给收件箱的条目)先打码。
    mask 管的是输入、输出和 metadata,管不到它;它还会成为 OpenTelemetry span 的状态说明,一起发出去。"""
    from langfuse.langchain import CallbackHandler

    class MaskedCallbackHandler(CallbackHandler):
        def _get_error_level_and_status_message(self, error):
            level, message = super()._get_error_level_and_status_message(error)
            return level, mask_pii(message)

    return MaskedCallbackHandler


def flush(timeout: float = FLUSH_TIMEOUT_S) -> bool:
    """把还没发出的 trace 发出去,最多等 timeout 秒;发完了是 True。在另一个线程里发:连不上、很慢时这里不跟着等。"""
    with _lock:
        clients = list(_clients.values())
    if not clients:
        return True
    sender = threading.Thread(target=lambda: [c.flush() for c in clients], name="langfuse-flush", daemon=True)
    sender.start()
    sender.join(timeout)
    return not sender.is_alive()


def flush_at_exit() -> None:
    if not flush():
        complain(f"退出前 {FLUSH_TIMEOUT_S:g} 秒内没把 trace 发完,剩下的不等了")


def masked(*, data, **_kwargs):
    """Langfuse 的 mask:trace 里的输入、输出、metadata 发出去之前,每一段文字都过一遍 mask_pii。
    状态里的工单原文进图之前就打过码;人 edit 的回复(发给客户的原文)、别的客户端交来的回答在这里打。"""
    if isinstance(data, str):
        return mask_pii(data)
    if isinstance(data, dict):
        return {str(k): masked(data=v) for k, v in data.items()}
    if isinstance(data, (list, tuple, set)):
        return [masked(data=v) for v in data]
    if data is None or isinstance(data, (bool, int, float)):
        return data
    if hasattr(data, "model_dump"):  # LangChain 的消息、pydantic 模型
        return masked(data=data.model_dump(mode="json"))
    if dataclasses.is_dataclass(data) and not isinstance(data, type):  # LangGraph 的 Command、Interrupt
        return {f.name: masked(data=getattr(data, f.name)) for f in dataclasses.fields(data)}
    return mask_pii(str(data))


class _OneLine(logging.Filter):
    """导出失败时 OpenTelemetry 和 SDK 的日志(每次重试一行)只留第一句,由 complain 说一行,一个进程只说一次。"""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            complain(record.getMessage().splitlines()[0][:300])
        return False


def quiet_export_errors() -> None:
    for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk.trace.export",
                 "opentelemetry.sdk._shared_internal", "langfuse"):
        logging.getLogger(name).addFilter(_OneLine())


def complain(message: str) -> None:
    if _complained.acquire(blocking=False):
        print(f"[trace] 追踪出了问题,事件照常处理(这个进程里之后的追踪问题不再说):{message}", file=sys.stderr, flush=True)
