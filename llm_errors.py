"""llm.py 的错误分类和备用模型:哪些模型错误是暂时性的(值得重试、值得切备用模型,TRANSIENT_ERRORS),哪些要人去修;
describe() 把错误写成 last_error 里给人看的一行(类型、原文、先查什么、修好后怎么办,打过码);配了 LLM_FALLBACK_MODEL 时
主模型和备用模型用的 ChatOpenAI 子类。课文的 worker 只会「失败就重试」,可 401 换了 key 才会好、404 永远不会好,
备用模型配错了也不该把事件送进死信,所以这些区分单独放在这里,worker.py 和 inbox.py 共用。"""
import sys
import time
from functools import lru_cache

import openai

import config
import llm_deadline
from llm_pii import mask_pii


class RequestTimeoutError(openai.APIStatusError):
    """模型服务回 408(请求超时)。openai 自己会重试它(和 409、429、5xx 一样),却没有给它单独的异常类;
    我们用的 ChatOpenAI 子类把它换成这个类:with_fallbacks 才认得出它是暂时性的,last_error 里也有个说得清的名字(见 _chat_classes)。"""


REQUEST_TIMEOUT = 408
# 暂时性错误:限流、超时(客户端的和服务端回的 408)、冲突(409)、连不上、服务端 5xx。只有这些值得快速重试、值得切备用模型;
# openai 客户端自己快速重试的也正是这几种。400/401/403/404/422 不在里面:换个时间、换个模型也不会变好。
TRANSIENT_ERRORS = (openai.RateLimitError, openai.APITimeoutError, openai.APIConnectionError,
                    openai.InternalServerError, openai.ConflictError, RequestTimeoutError)


# 这几种重试解决不了,要人去修;last_error 里说清楚先查什么、修好后怎么办({then}):事件进了死信就是运行放回它的命令,
# 还在队列里(401/402/403 走退避:换了 key、充了值就好,别把积压悄悄烧成死信)就什么都不用做。400/404/413/422 直接死信(agent.is_permanent)。
RETRIES = "它会自动再试,不用放回"
BAD_REQUEST = "模型服务说请求不对:检查 LLM_MODEL、LLM_EXTRA_BODY,或者 MAX_TICKET_CHARS 对这个模型太大,修好后{then}"
HINTS = {
    openai.AuthenticationError: "模型服务拒绝了 API key:检查 LLM_API_KEY,修好后{then}",
    openai.PermissionDeniedError: "模型服务拒绝访问(余额、权限或地区):处理好后{then}",
    openai.NotFoundError: "模型服务说找不到:多半是 LLM_MODEL 或 LLM_BASE_URL 写错了,修好后{then}",
    openai.BadRequestError: BAD_REQUEST,
    openai.UnprocessableEntityError: BAD_REQUEST,
}
# openai 没有单独的异常类、只认得出状态码的两种
STATUS_HINTS = {
    # DeepSeek(默认的服务)余额不足回 402:和 401/403 一样走退避,充上值就接着跑,不用放回
    402: "模型服务说余额不足:充值后{then}",
    # 请求体太大(模型服务或中间的代理限制了大小):同样的请求再发多少次都一样,worker 直接死信
    413: "模型服务说请求太大:调小 MAX_TICKET_CHARS(或者放宽代理的请求大小限制),修好后{then}",
}
REQUEST_TOO_LARGE = 413


def status_of(error: Exception) -> int | None:
    """模型服务回的 HTTP 状态码;不是 HTTP 错误(连不上、超时、我们自己判的)时是 None。"""
    return getattr(error, "status_code", None) if isinstance(error, openai.APIStatusError) else None


def rejects_request(error: Exception) -> bool:
    """模型服务说请求不对(400/404/422)或太大(413,没有单独的异常类):换个时间再发也一样,直接死信(agent.is_permanent)。"""
    return (isinstance(error, (openai.BadRequestError, openai.NotFoundError, openai.UnprocessableEntityError))
            or status_of(error) == REQUEST_TOO_LARGE)


def describe(error: Exception, *, requeue: str | None = None) -> str:
    """写进 last_error、打印给人看的错误:类型名 + 原文(+ 怎么修),打过码。worker 和收件箱共用。
    requeue:事件进了死信时,把它放回队列的命令(store_events.requeue_dead_command,带着这个事件号:不带事件号的
    --requeue-dead 会把别的死信也都放回去,比如工单不存在的那些,再死一遍、有的还再调一次模型);
    None:还在队列里(401 退避中、收件箱交回 worker),说它会自动再试 —— 那个命令只放回死信,对它什么都不做。"""
    text = f"{type(error).__name__}: {error}"
    hint = next((h for cls, h in HINTS.items() if isinstance(error, cls)), None) or STATUS_HINTS.get(status_of(error))
    hint = hint and hint.format(then=f"运行 {requeue}" if requeue else RETRIES)
    if hint is None and isinstance(error, TRANSIENT_ERRORS) and (backup := config.get("LLM_FALLBACK_MODEL")):
        # with_fallbacks 两个都失败时抛的是主模型的错误:说一声备用模型也试过了
        hint = f"备用模型 {backup} 也没有成功,稍后自动再试"
    if isinstance(error, openai.APIConnectionError) and (note := proxy_note(error)):
        hint = f"{hint}{note}" if hint else note.removeprefix(";")
    return mask_pii(f"{text}({hint})" if hint else text, keep=(requeue, *getattr(error, "kept", ())))


def proxy_note(error: openai.APIConnectionError) -> str:
    """连不上的那个请求走了终端里设的代理时,说是哪个代理(config.proxy_note);没走代理(本机的服务、NO_PROXY)时是空串。"""
    try:
        url = str(error.request.url)
    except (AttributeError, RuntimeError):  # 没带请求的错误(少见)
        return ""
    return "" if config.on_this_machine(url) else config.proxy_note(url)


class BackupFailed(Exception):
    """备用模型出了不是暂时性的错误。只在 with_fallbacks 里面用,不会传到 worker。"""


@lru_cache(maxsize=1)
def _chat_classes(chat_openai: type) -> tuple[type, type, type]:
    """真模型用的 ChatOpenAI 子类:没配备用模型时用的、配了时主模型和备用模型用的
    (langchain_openai 要到用真模型时才导入,所以子类也在这时才建)。"""

    class ClassifiedChatOpenAI(chat_openai):
        # langchain_openai 把认得的 openai 错误换成自己的类(OpenAIRateLimitError……),408 它也不认得:这里补上
        # 它还把消息里有「exceeds the context window」的任何错误(503、413……)都换成 OpenAIAPIContextOverflowError:
        # 没有状态码的 APIError,分不出暂时性的(不切备用模型)和永久的(413 不进死信)。这种换回 openai 本来的错误
        def _generate(self, *args, **kwargs):
            try:
                return super()._generate(*args, **kwargs)
            except openai.APIError as e:
                original = e.__cause__ if isinstance(e.__cause__, openai.APIStatusError) else e
                if status_of(original) == REQUEST_TIMEOUT:
                    raise RequestTimeoutError(original.message, response=original.response, body=original.body) from e
                if original is not e and not isinstance(e, openai.APIStatusError):
                    raise original from None
                raise

    class PrimaryChatOpenAI(ClassifiedChatOpenAI):
        def _generate(self, *args, **kwargs):
            try:
                return super()._generate(*args, **kwargs)
            except TRANSIENT_ERRORS as e:
                # 备用模型接下了,事件照常成功:不说一声的话,主模型坏了一整天也没人知道(中间件笔记:失败的调用也要留痕)。
                # 整体时限已经用完时备用模型的请求发不出去(_within_deadline),也就不说「换备用模型」
                if (budget := llm_deadline._budget.get()) is not None and budget.ends_at <= time.monotonic():
                    raise
                what = f"{type(e).__name__}: {e}"
                share = config.value("LLM_PRIMARY_SHARE")
                if budget is not None and budget.cut and budget.ends_for(share) <= time.monotonic():
                    # 是留给它的那一份时限到了(挂住、429 让等很久):「Request timed out.」会让人以为只是一次超时
                    what = f"用完了留给它的时限(LLM_DEADLINE_S 的 LLM_PRIMARY_SHARE={share:g})"
                print(mask_pii(f"[llm] 主模型 {self.model_name} 出错(暂时性的):{what};"
                               f"这次换备用模型 {config.get('LLM_FALLBACK_MODEL')}"), file=sys.stderr, flush=True)
                raise

    class BackupChatOpenAI(ClassifiedChatOpenAI):
        def _generate(self, *args, **kwargs):
            try:
                return super()._generate(*args, **kwargs)
            except TRANSIENT_ERRORS:
                raise
            except openai.APIStatusError as e:
                print(mask_pii(f"[llm] 备用模型 {self.model_name} 出错,不是暂时性的:{type(e).__name__}: {e}"
                               "(检查 LLM_FALLBACK_MODEL、LLM_FALLBACK_BASE_URL、LLM_FALLBACK_API_KEY);"
                               "这次按主模型的错误处理"), file=sys.stderr, flush=True)
                raise BackupFailed(str(e)) from e

    return ClassifiedChatOpenAI, PrimaryChatOpenAI, BackupChatOpenAI
