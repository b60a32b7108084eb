"""agent.py 的 draft 节点怎样问模型要一份 Draft:每个模型对象只包一次 with_structured_output(每张工单都包要多花几毫秒),
在整体时限里调用,按真正回答的模型记 token 用量,把拒答、不是 Draft 格式的回答都变成一行说得清的错误(worker 照常退避再试)。
课文的 draft() 一行 invoke 就完;真模型会拒答、会交回格式不对的参数,每次调用也要花钱记账,这些放在这里,
draft() 里留下课文的那几步。"""
import time

from langchain_core.callbacks import UsageMetadataCallbackHandler
from langchain_core.exceptions import ModelRefusalError
from langchain_core.runnables.config import merge_configs
from pydantic import BaseModel, ValidationError

import store_events
from llm_deadline import deadline


_structured: dict[int, tuple] = {}


def structured(llm, tool: dict):
    """llm.with_structured_output(tool, method="function_calling"),每个模型对象只包一次(每张工单都包要多花几毫秒)。
    回答是工具的参数(dict),没调工具时是 None。不用 include_raw=True:它多包一层 RunnableParallel,每次调用都新开
    线程池,一张工单多花约 4 ms;用量由 ask() 里的 UsageMetadataCallbackHandler 收集。"""
    if id(llm) not in _structured:  # 连 llm 一起存着,它就不会被回收、id 也不会被别的对象重用
        _structured[id(llm)] = (llm, llm.with_structured_output(tool, method="function_calling"))
    return _structured[id(llm)][1]


def not_a_draft(error: ValidationError) -> ValueError:
    """「模型没有按 Draft 格式回答:哪一项:哪里不对」,一行,不带模型的原话(pydantic 的错误有好几行)。"""
    problems = ";".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in error.errors())
    return ValueError(f"模型没有按 Draft 格式回答:{problems}")


def ask(model, prompt: str, schema: type[BaseModel], ticket_id: str, config) -> dict:
    """用 structured() 包好的模型起草一次,交回校验过的 schema(Draft)字段;拒答、格式不对都抛 ValueError。"""
    usage = UsageMetadataCallbackHandler()  # 按真正回答的模型(主模型或备用模型)累计 token
    started = time.monotonic()
    try:
        with deadline():  # 重试、备用模型加在一起也不能让这张工单一直占着处理线程
            # merge_configs:节点自己的回调(追踪)也带上;只给 {"callbacks": [usage]} 会把它们整个换掉
            args = model.invoke(prompt, merge_configs(config, {"callbacks": [usage]}))
    except ModelRefusalError as e:  # 模型拒答:回答里是一段 refusal,没有调 Draft 工具;和格式不对一样,退避后再试
        raise ValueError(f"模型拒绝起草:{str(e).splitlines()[0] if str(e) else '(没说原因)'}") from None
    except ValidationError as e:  # 工具参数是合法 JSON 却不是对象([1, 2]):langchain 建回答消息时就通不过
        raise not_a_draft(e) from None
    finally:
        # 在 draft 节点里记账:每一行对应一次真实的模型调用;格式不对的回答也花了钱,所以在 finally 里。
        # 用时是这次起草的整段(重试、换备用模型都算在里面):show 一张工单时看慢在哪
        took_ms = round((time.monotonic() - started) * 1000)
        for model, u in usage.usage_metadata.items():
            store_events.record_usage(config["configurable"].get("event_id"), ticket_id, model,
                                      u.get("input_tokens", 0), u.get("output_tokens", 0), took_ms)
    if args is None:  # ChatOpenAI 把解析不了的工具参数放进 invalid_tool_calls,解析器看到的就是「没调工具」
        raise ValueError("模型没有按 Draft 格式回答:回答里没有能用的 Draft 工具调用(只回了一段话,或者工具参数不是完整的 JSON)")
    try:
        return schema.model_validate(args).model_dump(exclude_none=True)  # 没提问时草稿里不带 question / candidates
    except ValidationError as e:  # 调了 Draft 工具,但参数不合规则(类别不在列表里、少了字段……)
        raise not_a_draft(e) from None
