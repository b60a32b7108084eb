"""get_llm():按 LLM_MODEL、LLM_BASE_URL、LLM_API_KEY、LLM_EXTRA_BODY 建一个 ChatOpenAI(任何 OpenAI 兼容服务)。

没有 LLM_API_KEY 时交出离线模型(llm_offline.py)。agent.py 的 draft 节点调用它;整体时限见 llm_deadline.py,
错误分类和备用模型(LLM_FALLBACK_*)见 llm_errors.py。
"""
import json
from functools import lru_cache, partial
from urllib.parse import urlsplit

import config


def get_llm(temperature: float = 0):
    """按当前环境变量返回模型;同样的设置只建一次(ChatOpenAI 里有连接池,没必要每张工单新建)。"""
    return _build(temperature, *llm_settings())


@lru_cache(maxsize=8)
def _build(temperature, api_key, model, base_url, extra_body, fallback_model, fallback_url, fallback_key, timeout,
           retries, primary_share):
    # 模型的库到要起草时才导入(这里):收件箱的 list、accept 和空队列的 worker 用不上它们,启动省下半秒多
    if not api_key:
        from llm_offline import OfflineChatModel, _announce_offline

        _announce_offline()
        return OfflineChatModel()
    import openai
    from langchain_openai import ChatOpenAI

    import llm_deadline
    from llm_errors import TRANSIENT_ERRORS, BackupFailed, _chat_classes

    extra = json.loads(extra_body)  # llm_settings() 检查过了

    def chat(cls, name: str, url: str, key: str, share: float = 1.0):
        # 自己给 HTTP 客户端(openai 的默认设置),为挂上整体时限的两个钩子;本机的模型服务(Ollama、vLLM 开在 127.0.0.1)
        # 不走终端里设的代理(http_proxy / all_proxy):代理没开时每次起草都会是 APIConnectionError
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


def llm_settings() -> tuple:
    """模型的各项设置,检查过的;不对就以 SystemExit 退出,说明是哪一项。"""
    extra_body = config.value("LLM_EXTRA_BODY")
    try:
        # NaN、Infinity:Python 的 json 认,可发请求时编不成合法 JSON,每个事件都失败、重试到进死信
        parsed = json.loads(extra_body, parse_constant=_not_json)
    except ValueError:
        raise SystemExit(f"配置错误:LLM_EXTRA_BODY 不是合法 JSON:{extra_body}") from None
    if not isinstance(parsed, dict):  # 它的键要并进请求体:[1]、"x" 这种合法 JSON 也不行
        raise SystemExit(f"配置错误:LLM_EXTRA_BODY 应该是 JSON 对象({{…}}):{extra_body}")
    api_key, base_url = api_key_setting("LLM_API_KEY"), config.value("LLM_BASE_URL")
    share = config.value("LLM_PRIMARY_SHARE")  # 没配备用模型时用不上,写错了也照样说出来
    fallback_model = config.value("LLM_FALLBACK_MODEL")
    fallback_url = config.value("LLM_FALLBACK_BASE_URL") or base_url
    fallback_key = api_key_setting("LLM_FALLBACK_API_KEY")
    if api_key and fallback_model and not fallback_key:
        if _origin(fallback_url) != _origin(base_url):
            # 主服务的 key 不能发给另一家:泄露了不说,对方回 401,错误信息还会让人去查一个没问题的 LLM_API_KEY
            raise SystemExit(f"配置错误:LLM_FALLBACK_BASE_URL={fallback_url!r} 和 LLM_BASE_URL 不是同一个服务,"
                             "要另设 LLM_FALLBACK_API_KEY(不会把 LLM_API_KEY 发给别的服务)")
        fallback_key = api_key  # 同一个服务的另一个模型:用同一个 key
    return (
        api_key,
        config.value("LLM_MODEL"),
        base_url,
        extra_body,
        fallback_model,
        fallback_url,
        fallback_key,
        config.value("LLM_TIMEOUT_S"),
        config.value("LLM_MAX_RETRIES"),
        share if fallback_model else 1.0,
    )


def api_key_setting(name: str) -> str:
    """API key 要放进 HTTP 头,只能是英文半角的可见字符:全角字符、空格或换行要到发请求时才出错,还像暂时性错误一样
    被重试到死信,所以启动时就查。出错时只说第几个字符,不打印 key 本身(会进日志)。"""
    key = config.get(name)
    if bad := next((i for i, ch in enumerate(key, 1) if not "!" <= ch <= "~"), 0):
        raise SystemExit(f"配置错误:{name} 的第 {bad} 个字符不是英文半角的字母、数字或符号(全角字符、空格或换行?):"
                         "API key 里只有这些;重新从模型服务的控制台复制一遍")
    return key


def _origin(url: str) -> tuple:
    """网址里决定「是哪个服务」的部分:协议、主机、端口(路径不算,/v1 和没有 /v1 是同一个服务)。"""
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}[parts.scheme]


def _not_json(name: str):
    raise ValueError(f"{name} 不是 JSON")
