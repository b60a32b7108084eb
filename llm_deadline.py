"""llm.py 的整体时限:with deadline(): 里的一次起草(每次请求、客户端的快速重试、切备用模型)合起来最多 LLM_DEADLINE_S 秒,
配了备用模型时主模型只用其中 LLM_PRIMARY_SHARE 这一份。课文的 get_llm() 只有单次请求的超时,最坏要等
(重试次数+1)× 超时,再加上备用模型,一个处理线程就被占好几分钟;这里用 HTTP 客户端的请求钩子和响应钩子把每次等待
(连同服务端的 Retry-After、一直发空行的响应)都截到时限为止。llm.py 建 ChatOpenAI 时挂上这两个钩子,agent.py 的 draft 节点
用 deadline() 包住模型调用。离线模型不发请求,不受影响。"""
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import config


DEADLINE_SLACK_S = 0.1  # 秒;被时限截短的等待到点抛错时,离时限最多差这么多(计时器的粒度)


class DeadlineExceeded(TimeoutError):
    """一次起草用完了 LLM_DEADLINE_S。暂时性错误:worker 按退避稍后再试。"""


@dataclass
class _Budget:
    ends_at: float      # time.monotonic() 的值
    seconds: float      # 整个时限有几秒(ends_at 减去开始的时刻)
    cut: bool = False   # 有请求因为时限被缩短了等待时间,或者干脆没发出去

    def ends_for(self, share: float) -> float:
        """只能用时限的 share 这一份的请求(配了备用模型时的主模型)到什么时候为止。"""
        return self.ends_at - self.seconds * (1 - share)


_budget: ContextVar[_Budget | None] = ContextVar("llm_budget", default=None)


@contextmanager
def deadline():
    """with deadline(): 里的模型调用(含客户端重试、备用模型)合起来最多 LLM_DEADLINE_S 秒,因时限而失败时抛
    DeadlineExceeded。钩子把每次请求的等待、Retry-After 和一直发空行的响应都截到时限为止;超出时限的只有截短的请求
    超时之后、客户端下一次重试之前的那一次等待(默认设置下最多 1 秒)。"""
    seconds = config.value("LLM_DEADLINE_S")
    budget = _Budget(time.monotonic() + seconds, seconds)
    token = _budget.set(budget)
    try:
        yield
    except Exception as e:
        openai = sys.modules.get("openai")  # 离线模型不导入 openai,也就没有它的超时
        if openai is None or not isinstance(e, openai.APITimeoutError):
            raise
        if not budget.cut or time.monotonic() < budget.ends_at - DEADLINE_SLACK_S:
            # 一次普通的超时(LLM_TIMEOUT_S),时限还没到;或者主模型用完了它那一份、备用模型很快就失败了(500、401):
            # 说成「用完了整体时限」的话,人会去调大 LLM_DEADLINE_S,而不是去修备用模型
            raise
        backup = "、切备用模型" if config.get("LLM_FALLBACK_MODEL") else ""
        raise DeadlineExceeded(f"起草用完了整体时限 LLM_DEADLINE_S={seconds:g} 秒(含客户端重试{backup}),"
                               "稍后自动再试") from e
    finally:
        _budget.reset(token)


def _within_deadline(request, share: float = 1.0) -> None:
    """HTTP 客户端的请求钩子:每次真正发出请求之前调用,客户端自己的重试也一样。不在 deadline() 里时什么都不做。
    share:这个模型只能用时限的这一份(配了备用模型时的主模型,见 LLM_PRIMARY_SHARE)。"""
    budget = _budget.get()
    if budget is None:
        return
    left = budget.ends_for(share) - time.monotonic()
    if left <= 0:
        budget.cut = True
        import openai  # 钩子只挂在真模型的 HTTP 客户端上:openai 早已导入

        # 抛 OpenAIError 的子类:OpenAI 客户端原样抛出,不再等待、不再重试;备用模型的请求也在这里被挡下
        raise openai.APITimeoutError(request=request)
    timeout = request.extensions.get("timeout") or dict.fromkeys(("connect", "read", "write", "pool"))
    if any(v is None or v > left for v in timeout.values()):
        budget.cut = True
        # read 是两次收到数据之间最多等多久;模型一次性回答,整段回答就在这个时间里
        request.extensions["timeout"] = {k: left if v is None else min(v, left) for k, v in timeout.items()}


def _response_within_deadline(response, share: float = 1.0) -> None:
    """HTTP 客户端的响应钩子:收到响应头之后、读响应体之前调用。两件事:
    1. 服务端让过 N 秒再试(429 / 503 带 Retry-After)、N 超过了剩下的时限:只等到时限为止。OpenAI 客户端
       照服务端说的等(最多 2 分钟;再长就不重试)。
    2. 请求钩子截短的 read 超时是「两次收到数据之间」最多等多久,管不住一直有数据来的响应:DeepSeek 忙的时候
       先回 200,然后每隔几秒发一个空行保持连接,能拖上十几分钟(比 STALE_MINUTES 还久的话,别的机器上的 worker
       会把事件放回队列、再起草一遍)。这里读响应体时每收到一块都看一眼时限,到了就当作读超时。
    share:同 _within_deadline。"""
    budget = _budget.get()
    if budget is None:
        return
    try:  # 服务端让等得比这更久(秒)时 openai 客户端不重试、马上抛错;是它的私有常量,换版本时可能挪走
        from openai._constants import MAX_RETRY_AFTER_DELAY
    except ImportError:  # pragma: no cover
        MAX_RETRY_AFTER_DELAY = 120
    ends_at = budget.ends_for(share)
    left = ends_at - time.monotonic()
    for header, per_second in (("retry-after-ms", 1000), ("retry-after", 1)):
        try:
            wait = float(response.headers.get(header, "")) / per_second
        except ValueError:
            continue  # 没有这个头,或者写的是日期(少见):照客户端的办法
        # 超过 MAX_RETRY_AFTER_DELAY 的不动:openai 客户端根本不重试、马上抛错(配额用完时常见 Retry-After: 3600);
        # 改成「等到时限为止」的话,客户端反而要等满整个时限才出错
        if left < wait <= MAX_RETRY_AFTER_DELAY:
            budget.cut = True
            response.headers["retry-after-ms"] = str(max(left, 0.001) * 1000)  # 客户端先看这个头
        break
    chunks = response.stream
    http = sys.modules[type(response).__module__.partition(".")[0]]  # openai 用的那一份 httpx(包名是 httpx2)

    class WithinDeadline(http.SyncByteStream):
        def __iter__(self):
            for chunk in chunks:
                if time.monotonic() > ends_at:
                    budget.cut = True
                    raise http.ReadTimeout("整体时限到了,响应还没收完", request=response.request)
                yield chunk

        def close(self) -> None:
            chunks.close()

    response.stream = WithinDeadline()
