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
from functools import lru_cache, partial
from urllib.parse import urlsplit

import openai

import config
import llm_deadline
from llm_offline import OfflineChatModel, _announce_offline
from llm_pii import mask_pii


DEFAULT_MODEL = "deepseek-flash"          # 课文用的模型;换服务时改 LLM_MODEL
DEFAULT_BASE_URL = "https://api.deepseek.com"
LLM_TIMEOUT_S = 60                        # 秒(0.1–3600);一次模型调用最长等多久,超时算暂时性错误
LLM_MAX_RETRIES = 2                       # 次(0–10);客户端自己对 429/超时/连接错误/5xx 做的快速重试(带退避)


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
    share = llm_deadline.primary_share()  # 没配备用模型时用不上,写错了也照样说出来
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
        client = openai.DefaultHttpxClient(event_hooks={"request": [partial(llm_deadline._within_deadline, share=share)],
                                                        "response": [partial(llm_deadline._response_within_deadline, share=share)]},
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
                if (budget := llm_deadline._budget.get()) is not None and budget.ends_at <= time.monotonic():
                    raise
                what = f"{type(e).__name__}: {e}"
                share = llm_deadline.primary_share()
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
