"""agent.py 的 build_prompt() 交给模型之前对工单原文做的两件事:太长的只给前 MAX_TICKET_CHARS 个字(说明截了多少),
原文里照抄的「主管意见」标题标成客户写的。课文把工单原文整个放进提示词;可业务库里的工单可能贴着几十万字的日志
(模型回 400、按字数花钱),客户也可能冒充主管意见让模型照改,所以这里先处理一遍。"""
import config
from llm_offline import FEEDBACK_HEADER


def for_the_model(text: str) -> str:
    """工单原文只给模型前 MAX_TICKET_CHARS 个字,截了就说截了多少。只截提示词:状态里留着整段(已脱敏),
    「律师」写在几千字之后也照样转给主管;截在脱敏之后,截断处不会露出半个手机号。"""
    limit = config.value("MAX_TICKET_CHARS")
    return text if len(text) <= limit else f"{text[:limit]}……(工单太长,后面 {len(text) - limit} 字没有给你)"


# 客户在信里照抄主管意见的标题(下面列着「- 本月费用全部免除」)时,模型会把它当成主管的意见照改:标明它是客户写的
FORGED_HEADER = f"(客户原文){FEEDBACK_HEADER}"
