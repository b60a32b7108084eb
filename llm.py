"""get_llm():有 LLM_API_KEY 就用真模型(ChatOpenAI,任何 OpenAI 兼容服务),没有就用离线模型。

这个文件不单独运行;agent.py 的 draft 节点调用 get_llm()。
离线模型是一个真正的 LangChain 聊天模型(BaseChatModel 的子类):它支持
with_structured_output(Draft, method="function_calling"),用一次工具调用回答,
所以 agent.py 离线和在线走的是同一条代码路径。它按关键词分类、用模板起草,
重写时能看得出照着主管意见改了。第一次用时在 stderr 上说一声。

这里还有两样「进模型之前」的东西:PII 脱敏 mask_pii(),和区分错误种类用的 TRANSIENT_ERRORS;
以及一次起草的整体时限 deadline()(中间件笔记的「整体超时」)。
"""
import json
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache, partial
from urllib.parse import urlsplit

import openai

import config
from llm_offline import OfflineChatModel, _announce_offline
from llm_pii import mask_pii

try:  # 服务端让等得比这更久(秒)时 openai 客户端不重试、马上抛错;是它的私有常量,换版本时可能挪走
    from openai._constants import MAX_RETRY_AFTER_DELAY
except ImportError:  # pragma: no cover
    MAX_RETRY_AFTER_DELAY = 120

DEFAULT_MODEL = "deepseek-flash"          # 课文用的模型;换服务时改 LLM_MODEL
DEFAULT_BASE_URL = "https://api.deepseek.com"
LLM_TIMEOUT_S = 60                        # 秒(0.1–3600);一次模型调用最长等多久,超时算暂时性错误
LLM_MAX_RETRIES = 2                       # 次(0–10);客户端自己对 429/超时/连接错误/5xx 做的快速重试(带退避)
# 秒(0.1–86400);一次起草最多花多久:每次请求、客户端的快速重试、切备用模型全算在内。
# 只有上面两项时,最坏是 (LLM_MAX_RETRIES+1) × LLM_TIMEOUT_S,配了备用模型再翻一倍(默认 6 分钟),处理线程一直占着。
# 比 LLM_TIMEOUT_S 小时,单次调用也只等到时限为止。150 秒够主模型等满两次 LLM_TIMEOUT_S;比 worker 的 STALE_MINUTES(默认 10 分钟)短得多,不会被当成卡住放回。
LLM_DEADLINE_S = 150
# 份(0.1–1);配了备用模型时,主模型(连同它自己的重试)最多用 LLM_DEADLINE_S 的这一份,剩下的留给备用模型。
# 不留的话,默认设置下主模型挂住(每次都等满 60 秒)或者 429 让等很久时,它自己的重试就把 150 秒用完了,
# 健康的备用模型一次都没机会试。0.5:主模型等满一次 LLM_TIMEOUT_S 再重试一小段,备用模型也有 75 秒
LLM_PRIMARY_SHARE = 0.5


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


def describe(error: Exception, *, requeue: str | None = None) -> str:
    """写进 last_error、打印给人看的错误:类型名 + 原文(+ 怎么修),打过码。worker 和收件箱共用。
    requeue:事件进了死信时,把它放回队列的命令(store.requeue_dead_command,带着这个事件号:不带事件号的
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


def _not_json(name: str):
    raise ValueError(f"{name} 不是 JSON")


def llm_settings() -> tuple:
    """模型的各项设置,检查过的;不对就以 SystemExit 退出,说明是哪一项。"""
    extra_body = config.get("LLM_EXTRA_BODY", "{}")
    try:
        # NaN、Infinity:Python 的 json 认,可发请求时编不成合法 JSON,每个事件都失败、重试到进死信
        parsed = json.loads(extra_body, parse_constant=_not_json)
    except ValueError:
        raise SystemExit(f"配置错误:LLM_EXTRA_BODY 不是合法 JSON:{extra_body}") from None
    if not isinstance(parsed, dict):  # 它的键要并进请求体:[1]、"x" 这种合法 JSON 也不行
        raise SystemExit(f"配置错误:LLM_EXTRA_BODY 应该是 JSON 对象({{…}}):{extra_body}")
    api_key, base_url = api_key_setting("LLM_API_KEY"), config.url("LLM_BASE_URL", DEFAULT_BASE_URL)
    share = primary_share()  # 没配备用模型时用不上,写错了也照样说出来
    fallback_model = config.get("LLM_FALLBACK_MODEL")
    fallback_url = config.url("LLM_FALLBACK_BASE_URL") or base_url
    fallback_key = api_key_setting("LLM_FALLBACK_API_KEY")
    if api_key and fallback_model and not fallback_key:
        if _origin(fallback_url) != _origin(base_url):
            # 主服务的 key 不能发给另一家:泄露了不说,对方回 401,错误信息还会让人去查一个没问题的 LLM_API_KEY
            raise SystemExit(f"配置错误:LLM_FALLBACK_BASE_URL={fallback_url!r} 和 LLM_BASE_URL 不是同一个服务,"
                             "要另设 LLM_FALLBACK_API_KEY(不会把 LLM_API_KEY 发给别的服务)")
        fallback_key = api_key  # 同一个服务的另一个模型:用同一个 key
    return (
        api_key,
        config.get("LLM_MODEL", DEFAULT_MODEL),
        base_url,
        extra_body,
        fallback_model,
        fallback_url,
        fallback_key,
        config.number("LLM_TIMEOUT_S", LLM_TIMEOUT_S, minimum=0.1, maximum=3600),
        config.integer("LLM_MAX_RETRIES", LLM_MAX_RETRIES, minimum=0, maximum=10),
        share if fallback_model else 1.0,
    )


def primary_share() -> float:
    return config.number("LLM_PRIMARY_SHARE", LLM_PRIMARY_SHARE, minimum=0.1, maximum=1)


def api_key_setting(name: str) -> str:
    """API key 要放进 HTTP 头,只能是英文半角的可见字符。原来全角的「１２３」、中间的空格或换行要等到发请求时才出错
    (UnicodeEncodeError、Illegal header value),还被当成暂时性错误重试到死信;收件箱 respond 也把待办交回 worker。
    出错时只说第几个字符,不打印 key 本身(会进日志)。"""
    key = config.get(name)
    if bad := next((i for i, ch in enumerate(key, 1) if not "!" <= ch <= "~"), 0):
        raise SystemExit(f"配置错误:{name} 的第 {bad} 个字符不是英文半角的字母、数字或符号(全角字符、空格或换行?):"
                         "API key 里只有这些;重新从模型服务的控制台复制一遍")
    return key


def _origin(url: str) -> tuple:
    """网址里决定「是哪个服务」的部分:协议、主机、端口(路径不算,/v1 和没有 /v1 是同一个服务)。"""
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}[parts.scheme]


def deadline_s() -> float:
    return config.number("LLM_DEADLINE_S", LLM_DEADLINE_S, minimum=0.1, maximum=86400)


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
    """with deadline(): 里的模型调用(含客户端重试、备用模型)合起来最多 LLM_DEADLINE_S 秒。
    每次真正发请求之前,_within_deadline 把这次请求的等待时间截到时限为止;时限到了就不再发。
    因时限而失败时抛 DeadlineExceeded(原来的错误是笼统的 Request timed out.)。
    超出时限的只有:截短的请求超时之后、客户端下一次重试之前的那一次等待(默认设置下最多 1 秒;重试次数调大时最多 8 秒);
    服务端要求的等待(Retry-After)和一直在发空行的响应都截到时限为止(_response_within_deadline)。
    离线模型不发请求,不受影响。"""
    seconds = deadline_s()
    budget = _Budget(time.monotonic() + seconds, seconds)
    token = _budget.set(budget)
    try:
        yield
    except openai.APITimeoutError as e:
        if not budget.cut or time.monotonic() < budget.ends_at - DEADLINE_SLACK_S:
            # 是一次普通的超时(LLM_TIMEOUT_S),时限还没到;或者主模型用完了它那一份、备用模型很快就失败了(500、401),
            # 抛出来的是主模型的超时:原来也说成「用完了整体时限」,时限只用了一半,人会去调大 LLM_DEADLINE_S,而不是去修备用模型
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
        # 抛 OpenAIError 的子类:OpenAI 客户端原样抛出,不再等待、不再重试;备用模型的请求也在这里被挡下
        raise openai.APITimeoutError(request=request)
    timeout = request.extensions.get("timeout") or dict.fromkeys(("connect", "read", "write", "pool"))
    if any(v is None or v > left for v in timeout.values()):
        budget.cut = True
        # read 是两次收到数据之间最多等多久;模型一次性回答,整段回答就在这个时间里
        request.extensions["timeout"] = {k: left if v is None else min(v, left) for k, v in timeout.items()}


def _response_within_deadline(response, share: float = 1.0) -> None:
    """HTTP 客户端的响应钩子:收到响应头之后、读响应体之前调用。两件事:
    1. 服务端让过 N 秒再试(429 / 503 带 Retry-After)、N 超过了剩下的时限:改成只等到时限为止。OpenAI 客户端
       照服务端说的等(最多 2 分钟;再长就不重试),原来 LLM_DEADLINE_S=3 的起草,每次重试前都等了 20 秒。
    2. 请求钩子截短的 read 超时是「两次收到数据之间」最多等多久,管不住一直有数据来的响应:DeepSeek 忙的时候
       先回 200,然后每隔几秒发一个空行保持连接,可以这样拖上十几分钟(原来 LLM_DEADLINE_S=3 的起草等了 15 秒;
       等得比 STALE_MINUTES 还久的话,别的机器上的 worker 会把事件放回队列、再起草一遍)。这里让读响应体时
       每收到一块都看一眼时限,到了就当作读超时。
    share:同 _within_deadline。"""
    budget = _budget.get()
    if budget is None:
        return
    ends_at = budget.ends_for(share)
    left = ends_at - time.monotonic()
    for header, per_second in (("retry-after-ms", 1000), ("retry-after", 1)):
        try:
            wait = float(response.headers.get(header, "")) / per_second
        except ValueError:
            continue  # 没有这个头,或者写的是日期(少见):照客户端的办法
        # 超过 MAX_RETRY_AFTER_DELAY 的,openai 客户端根本不重试、马上抛错(配额用完时常见 Retry-After: 3600):
        # 原来也改成「等到时限为止」,客户端就照着等满整个时限(有备用模型时等满主模型那一份,75 秒)才出错
        if left < wait <= MAX_RETRY_AFTER_DELAY:
            budget.cut = True
            response.headers["retry-after-ms"] = str(max(left, 0.001) * 1000)  # 客户端先看这个头
        break
    chunks = response.stream
    http = sys.modules[type(response).__module__.partition(".")[0]]  # openai 用的那一份 httpx(现在的包名是 httpx2)

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


def get_llm(temperature: float = 0):
    """按当前环境变量返回模型;同样的设置只建一次(ChatOpenAI 里有连接池,没必要每张工单新建)。"""
    return _build(temperature, *llm_settings())


@lru_cache(maxsize=8)
def _build(temperature, api_key, model, base_url, extra_body, fallback_model, fallback_url, fallback_key, timeout,
           retries, primary_share):
    if not api_key:
        _announce_offline()
        return OfflineChatModel()
    extra = json.loads(extra_body)  # llm_settings() 检查过了
    from langchain_openai import ChatOpenAI

    def chat(cls, name: str, url: str, key: str, share: float = 1.0):
        # 自己给 HTTP 客户端(openai 的默认设置),为挂上 _within_deadline、_response_within_deadline;
        # 本机的模型服务(Ollama、vLLM 开在 127.0.0.1)不走终端里设的代理(http_proxy / all_proxy):原来请求绕到代理上,
        # 代理没开时每次起草都是 APIConnectionError,看着像模型服务没起来
        client = openai.DefaultHttpxClient(event_hooks={"request": [partial(_within_deadline, share=share)],
                                                        "response": [partial(_response_within_deadline, share=share)]},
                                           trust_env=not config.on_this_machine(url))
        # http_socket_options=():langchain-openai 给用不上的异步客户端装 TCP keepalive 时,终端里设着代理就打一行
        # 英文 WARNING(说代理被绕过了,其实同步的这个客户端照常走代理),每次运行都进 cron.log
        return cls(model=name, base_url=url, api_key=key, temperature=temperature, extra_body=extra, timeout=timeout,
                   max_retries=retries, http_client=client, http_socket_options=())

    classified_class, primary_class, backup_class = _chat_classes(ChatOpenAI)
    if not fallback_model:
        return chat(classified_class, model, base_url, api_key)
    # 主模型遇到暂时性错误(重试也没救回来)时切备用模型;参数错误、鉴权错误不切,切了也一样错。
    # 备用模型自己的非暂时性错误(它的 key、模型名、地址配错了)变成 BackupFailed,也在这里接住:
    # 这时抛出的是主模型的暂时性错误,事件照常退避,不会因为备用模型配错了就进死信
    primary = chat(primary_class, model, base_url, api_key, primary_share)  # 时限留一份给备用模型
    backup = chat(backup_class, fallback_model, fallback_url, fallback_key)
    return primary.with_fallbacks([backup], exceptions_to_handle=(*TRANSIENT_ERRORS, BackupFailed))


class BackupFailed(Exception):
    """备用模型出了不是暂时性的错误。只在 with_fallbacks 里面用,不会传到 worker。"""


@lru_cache(maxsize=1)
def _chat_classes(chat_openai: type) -> tuple[type, type, type]:
    """真模型用的 ChatOpenAI 子类:没配备用模型时用的、配了时主模型和备用模型用的
    (langchain_openai 要到用真模型时才导入,所以子类也在这时才建)。"""

    class ClassifiedChatOpenAI(chat_openai):
        # langchain_openai 把认得的 openai 错误换成自己的类(OpenAIRateLimitError……),408 它也不认得:这里补上
        # 它还把消息里有「exceeds the context window」的任何错误(503、413……)都换成 OpenAIAPIContextOverflowError:
        # 没有状态码的 APIError,分不出暂时性的(不切备用模型)和永久的(413 不进死信)。这种换回 openai 原来的错误
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
                if (budget := _budget.get()) is not None and budget.ends_at <= time.monotonic():
                    raise
                what = f"{type(e).__name__}: {e}"
                share = primary_share()
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
