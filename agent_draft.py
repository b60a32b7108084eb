"""agent.py 的 draft 节点怎样问模型要一份 Draft:每个模型对象只包一次 with_structured_output(每张工单都包要多花几毫秒),
在整体时限里调用,按真正回答的模型记 token 用量,把拒答、不是 Draft 格式的回答都变成一行说得清的错误(worker 照常退避再试)。
课文的 draft() 一行 invoke 就完;真模型会拒答、会交回格式不对的参数,每次调用也要花钱记账,这些放在这里,
draft() 里留下课文的那几步。"""
from pydantic import ValidationError


_structured: dict[int, tuple] = {}


def structured(llm, tool: dict):
    """llm.with_structured_output(DRAFT_TOOL, method="function_calling"),每个模型对象只包一次:每张工单都重新包要多花好几毫秒。
    回答是 Draft 工具的参数(dict),没调工具时是 None。
    不用 include_raw=True:那样会多一层 RunnableParallel,每次调用都新开线程池,一张工单多花约 4 ms;
    用量改由回调 UsageMetadataCallbackHandler 收集。"""
    if id(llm) not in _structured:  # 连 llm 一起存着,它就不会被回收、id 也不会被别的对象重用
        _structured[id(llm)] = (llm, llm.with_structured_output(tool, method="function_calling"))
    return _structured[id(llm)][1]


def not_a_draft(error: ValidationError) -> ValueError:
    """「模型没有按 Draft 格式回答:哪一项:哪里不对」,一行;原来的 pydantic 错误有好几行,还带着模型的原话。"""
    problems = ";".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in error.errors())
    return ValueError(f"模型没有按 Draft 格式回答:{problems}")
