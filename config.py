"""配置:每个设置在下面的 SETTINGS 里声明一次(名字、类型、默认值、范围、单位、一句话说明),value(name) 按它读、按它检查。

读的顺序:环境变量优先,其次是当前目录的 .env(有就读,没有也行),最后是表里的默认值。读取发生在调用时而不是
import 时,所以测试可以在子进程或 monkeypatch 里随时换设置;AMBIENT_NO_DOTENV=1 时完全不读 .env(测试就这么做,
免得你本机的 .env 混进来)。.env 要存成 UTF-8(带不带 BOM 都行)。不是 UTF-8、或者有一行 python-dotenv 读不懂
(比如引号没配对)时,第一次读设置就以 SystemExit("配置错误:…") 退出,说是哪一行:不会有哪一项悄悄变回默认值。
.env.example 和 docs/configuration.md 按这张表的顺序列出每一项(tests/test_config.py 核对)。
这里还有 worker.py、cron_jobs.py、email_poller.py 共用的命令行解析器 ArgumentParser:argparse 的提示换成中文。
"""
import argparse
import encodings.idna
import io
import ipaddress
import math
import os
import re
import signal
import sys
import urllib.request
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Setting:
    """一个设置项。kind 是读法:"str" 原样(去掉两头空白),"int" / "float" 是数字,在 [minimum, maximum] 里
    (None = 不限),"url" 是 http(s) 网址,"path" 是文件路径(default 是脚本旁边的文件名)。
    default 为 None:没设置时 value() 给 None,由用的地方决定(IMAP_PORT 跟着 IMAP_SSL 走)。
    secret:值是密钥,报错时不整个打印。choices:只能是其中之一。"""
    kind: str
    default: str | int | float | None
    minimum: float | None = None
    maximum: float | None = None
    unit: str = ""
    meaning: str = ""
    secret: bool = False
    choices: tuple[str, ...] = ()


SETTINGS: dict[str, Setting] = {
    # ---- 模型(llm.py)
    "LLM_API_KEY": Setting("str", "", secret=True,
                           meaning="模型服务的 API key;不设就用离线模型(按关键词分类、按模板起草,不联网、不花钱)"),
    "LLM_MODEL": Setting("str", "deepseek-flash", meaning="模型名;默认是课文用的模型"),
    "LLM_BASE_URL": Setting("url", "https://api.deepseek.com", unit="网址", meaning="OpenAI 兼容服务的地址"),
    "LLM_EXTRA_BODY": Setting("str", "{}", unit="JSON 对象",
                              meaning='原样并进每个请求体的额外参数,例如 {"thinking": {"type": "disabled"}}'),
    "LLM_TIMEOUT_S": Setting("float", 60, minimum=0.1, maximum=3600, unit="秒",
                             meaning="一次模型调用最多等多久;超时算暂时性错误"),
    "LLM_MAX_RETRIES": Setting("int", 2, minimum=0, maximum=10, unit="次",
                               meaning="客户端对 429/408/409/超时/连接错误/5xx 的快速重试(带退避);400/401/403/404 不重试"),
    "LLM_DEADLINE_S": Setting("float", 150, minimum=0.1, maximum=86400, unit="秒",
                              meaning="一次起草最多花多久(请求、快速重试、切备用模型全算在内);150 够主模型等满两次"
                                      " LLM_TIMEOUT_S,又远短于 STALE_MINUTES"),
    "LLM_FALLBACK_MODEL": Setting("str", "", meaning="备用模型:主模型暂时性错误(重试后仍失败)时切过去;不设就没有"),
    "LLM_FALLBACK_BASE_URL": Setting("url", "", unit="网址", meaning="备用模型的服务地址;不设时和 LLM_BASE_URL 相同"),
    "LLM_FALLBACK_API_KEY": Setting("str", "", secret=True,
                                    meaning="备用模型的 API key;不设时用 LLM_API_KEY,但只限同一个服务(协议、主机、端口相同)"),
    "LLM_PRIMARY_SHARE": Setting("float", 0.5, minimum=0.1, maximum=1, unit="份",
                                 meaning="配了备用模型时,主模型(连同它的重试)最多用 LLM_DEADLINE_S 的这一份;0.5 给备用模型"
                                         "也留下 75 秒"),
    "LLM_PRICE_PER_1K_TOKENS": Setting("float", 0.002, minimum=0, unit="元/千 token",
                                       meaning="日报估算成本用的均价;按课文「一次起草约 0.0015 元」(六七百个 token)反推"),
    # ---- webhook(webhook.py、send_webhook.py)
    "WEBHOOK_SECRET": Setting("str", "dev-secret-change-me", secret=True,
                              meaning="webhook 和 send_webhook.py 共用的签名密钥,上线前一定要换;以 whsec_ 开头时按"
                                      " Standard Webhooks 的 base64 解码"),
    "WEBHOOK_URL": Setting("url", "http://127.0.0.1:8139/hooks/cloudledger", unit="网址",
                           meaning="send_webhook.py 发到哪"),
    "WEBHOOK_BODY_TIMEOUT_S": Setting("float", 30, minimum=0.1, maximum=3600, unit="秒",
                                      meaning="webhook 等一个请求体最多多久;停在半路的请求到时回 408,服务停得下来"),
    # ---- 数据库(store.py)
    "EVENTS_DB": Setting("path", "ambient.db", unit="文件",
                         meaning="事件库(events、outbox、review_log、llm_usage);相对路径按当前目录解释"),
    "CHECKPOINTS_DB": Setting("path", "checkpoints.db", unit="文件",
                              meaning="LangGraph 的 checkpoint 库;设了 DATABASE_URL 时只用来从这里搬"),
    "BIZ_DB": Setting("path", "cloudledger.db", unit="文件",
                      meaning="业务库(customers、tickets);不存在时用种子数据建一个"),
    "BUSY_TIMEOUT_S": Setting("float", 30, minimum=0, maximum=3600, unit="秒",
                              meaning="库被别的进程锁着时最多等多久,等不到就说「数据库暂时用不了」(PostgreSQL 上是"
                                      " lock_timeout)"),
    "DATABASE_URL": Setting("str", "", secret=True,
                            meaning="设成 postgresql://用户@主机:5432/库 就把事件表、checkpoint 和业务表都放进"
                                    " PostgreSQL;不设是 SQLite"),
    "PG_POOL_SIZE": Setting("int", 10, minimum=1, unit="个",
                            meaning="每个 PostgreSQL 连接池最多几个连接;一个进程最多三个池"),
    "PG_IDLE_CHECK_S": Setting("float", 5, minimum=0, maximum=86400, unit="秒",
                               meaning="闲了这么久的连接借出前先确认还连着(0 = 每次都查):服务器重启后不白白失败一次,"
                                       "忙时不多一次往返"),
    # ---- worker(worker.py、agent.py)
    "MAX_ATTEMPTS": Setting("int", 3, minimum=1, maximum=20, unit="次", meaning="暂时性失败最多试几次,之后进死信"),
    "BACKOFF_BASE_MINUTES": Setting("float", 1, minimum=0, maximum=1440, unit="分钟",
                                    meaning="第 n 次失败后等 BASE × 2^n 分钟再试(练习 3);上限让 BASE × 2^20 仍算得出时间"),
    "STALE_MINUTES": Setting("float", 10, minimum=0, maximum=525600, unit="分钟",
                             meaning="别的机器上的 worker 手里的事件 processing 超过这么久算卡住,放回队列;本机进程死了的"
                                     "马上放回"),
    "POLL_SECONDS": Setting("float", 2, minimum=0.01, maximum=3600, unit="秒", meaning="常驻模式下没事件时隔多久再看"),
    "WORKER_CONCURRENCY": Setting("int", 1, minimum=1, maximum=256, unit="个",
                                  meaning="一个 worker 同时处理几个事件(--concurrency 覆盖);每个是一个线程"),
    "CHECKPOINT_DURABILITY": Setting("str", "async", choices=("async", "exit", "sync"),
                                     meaning="checkpoint 什么时候写:async 每个节点之后(和课文一样),exit 停下时写一次,"
                                             "sync 写完才走下一个节点"),
    "MAX_REDRAFTS": Setting("int", 3, minimum=0, unit="次",
                            meaning="每张工单最多按意见重写、按提问的回答再起草几次(每次都再调一次模型)"),
    "MAX_TICKET_CHARS": Setting("int", 4000, minimum=200, unit="字",
                                meaning="工单原文最多给模型几个字,超过的不进提示词;邮件建的工单本来不到 2201 字"),
    "INBOX_USER": Setting("str", "", meaning="谁在用收件箱;不设是「登录名@主机名」,共用一个系统账号的几个人各设一个名字"),
    "INBOX_WEB_USERS": Setting("str", "", secret=True,
                               meaning="收件箱网页的账号,写成 alice:密码1,bob:密码2;设了就要 HTTP Basic 登录,"
                                       "不设只回答本机的请求"),
    "INBOX_MAX_TEXT_CHARS": Setting("int", 2000, minimum=1, unit="字",
                                    meaning="edit 的回复、respond 的意见最多几个字;草稿本来不到 150 字,更长的多半是多粘贴了一段"),
    # ---- 追踪(agent_trace.py)
    "LANGFUSE_PUBLIC_KEY": Setting("str", "", meaning="Langfuse 项目的 public key(pk-lf-…);和下面两项都设了才按工单追踪,"
                                                      "都不设就不追踪、不导入 langfuse"),
    "LANGFUSE_SECRET_KEY": Setting("str", "", secret=True, meaning="Langfuse 项目的 secret key(sk-lf-…)"),
    "LANGFUSE_HOST": Setting("url", "", unit="网址",
                             meaning="Langfuse 的地址,例如本机 docker compose 起的 http://localhost:3000;不设就不追踪,"
                                     "不会默认发到云服务"),
    # ---- 邮件(email_poller.py)
    "IMAP_HOST": Setting("str", "", meaning="IMAP 服务器,例如 imap.qq.com;不设时 email_poller.py 说明缺什么并退出"),
    "IMAP_USER": Setting("str", "", meaning="邮箱地址"),
    "IMAP_PASSWORD": Setting("str", "", secret=True, meaning="邮箱的授权码(不是登录密码)"),
    "IMAP_PORT": Setting("int", None, minimum=1, maximum=65535, unit="端口",
                         meaning="IMAP 端口;不设时按 IMAP_SSL:993,IMAP_SSL=0 时 143"),
    "IMAP_SSL": Setting("str", "1", meaning="1 = SSL 直连并校验服务器证书;0 = 明文 IMAP,只给本机测试服务器用"),
    "IMAP_MAILBOX": Setting("str", "INBOX", meaning="收哪个文件夹"),
    "IMAP_CAFILE": Setting("str", "", unit="文件", meaning="额外信任的 CA 证书文件(邮件服务器用私有 CA 时;只在 IMAP_SSL=1 时用)"),
    "IMAP_TIMEOUT_S": Setting("float", 30, minimum=0.1, maximum=3600, unit="秒",
                              meaning="连接和每条 IMAP 命令最多等多久;crontab 每分钟跑一次,卡住的进程不能越积越多"),
    # ---- 定时任务(cron_jobs.py)
    "STALE_DAYS": Setting("int", 20, minimum=0, maximum=36500, unit="天",
                          meaning="开了这么多天还没回复的工单该跟进(课文的 20 天);正好 20 天前建的也算"),
    "INBOX_ALERT_HOURS": Setting("float", 24, minimum=0, unit="小时",
                                 meaning="收件箱的待办等了超过这么久,日报里标出来;24 约是一个工作日"),
    "REPORT_MAX_DEAD_LINES": Setting("int", 20, minimum=1, unit="条",
                                     meaning="日报最多列出几条死信,其余的只说还有几条:几百条积压时日报和 Slack 消息不会太长"),
    "REPORT_RECENT_DAYS": Setting("float", 7, minimum=1, maximum=365, unit="天",
                                  meaning="日报另算最近这么多天的 edit 率,和之前的比:只看全部历史时,变化被旧记录冲淡"),
    "EDIT_RISE_ALERT_POINTS": Setting("float", 20, minimum=0, maximum=100, unit="百分点",
                                      meaning="最近的 edit 率比之前高出这么多,日报在那一类后面提醒"),
    "SLACK_WEBHOOK_URL": Setting("url", "", unit="网址", secret=True,
                                 meaning='有就把日报 POST 过去({"text": …});路径就是密钥,报错时只露出开头'),
    "SLACK_TIMEOUT_S": Setting("float", 10, minimum=0.1, maximum=3600, unit="秒",
                               meaning="Slack 最多等多久(连接、发送、读完回答加在一起);crontab 里的任务不能挂住"),
}
_dotenv_loaded = False
_dotenv_problem = ""  # .env 读不懂时的那句说明(见 _load_dotenv_once)


def _load_dotenv_once() -> None:
    """第一次读设置时读一次 .env。.env 读不懂(不是 UTF-8、有一行写错了)时以 SystemExit("配置错误:…") 退出,
    之后每次读设置都再退出一次:哪个程序都不会拿默认值接着跑(写错的 WEBHOOK_SECRET 不会变回公开的默认密钥)。"""
    global _dotenv_loaded, _dotenv_problem
    if _dotenv_problem:
        raise SystemExit(_dotenv_problem)
    if _dotenv_loaded:
        return
    _dotenv_loaded = True
    if os.environ.get("AMBIENT_NO_DOTENV") == "1":
        return
    try:
        data = (Path.cwd() / ".env").read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # 没有 .env 也行
        return
    except OSError as e:  # 没有读权限(别的用户建的、权限 600)、符号链接绕成了圈
        _dotenv_problem = f"配置错误:.env 读不了({e.strerror or e})"
        raise SystemExit(_dotenv_problem) from None
    try:
        text = data.decode("utf-8")  # 开头的 BOM(记事本存的「UTF-8 带 BOM」)python-dotenv 会去掉
    except UnicodeDecodeError as e:
        _dotenv_problem = f"配置错误:.env 不是 UTF-8 编码({_not_utf8(data, e)}):用编辑器把它另存为 UTF-8"
        raise SystemExit(_dotenv_problem) from None
    from dotenv import load_dotenv
    from dotenv.parser import parse_stream

    # python-dotenv 读不懂的行只用英文 WARNING 说一句,那一项就当没写(少了右引号时,后面几行也一起吞掉)
    if bad := next((b.original for b in parse_stream(io.StringIO(text)) if b.error), None):
        blank = bad.string[:len(bad.string) - len(bad.string.lstrip())]  # 它从前面的空行算起;说写错的那一行
        line = bad.line + blank.count("\n")
        _dotenv_problem = f"配置错误:.env 第 {line} 行读不懂:{_unparsable(bad.string)}"
        raise SystemExit(_dotenv_problem)
    load_dotenv(stream=io.StringIO(text), override=False)  # 已经设置的环境变量不会被 .env 覆盖


def _not_utf8(data: bytes, error: UnicodeDecodeError) -> str:
    """.env 不是 UTF-8 时,括号里说看着像什么。"""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "开头是 UTF-16 的标记:Windows 记事本存成「Unicode」就是这样"
    line = data[:error.start].count(b"\n") + 1
    try:
        data.decode("gbk")
        guess = ",多半是 GBK(中文 Windows 的默认编码)存的"
    except UnicodeDecodeError:
        guess = ""
    return f"第 {line} 行有 UTF-8 里不会出现的字节 0x{data[error.start]:02x}{guess}"


def _unparsable(statement: str) -> str:
    """python-dotenv 读不懂的那一句错在哪。不引出原文:值常常是密钥,不能跟着进终端和 cron.log。"""
    first = statement.strip().splitlines()[0] if statement.strip() else ""
    name, eq, value = first.partition("=")
    name = name.strip().removeprefix("export ").strip()
    quote = value.strip()[:1]
    if eq and quote in ("'", '"') and quote not in value.strip()[1:]:
        return f"{name} 的值以 {quote} 开头,却没有配对的 {quote} 结尾(补上它,或者两个都去掉)"
    return "要写成「名字=值」,注释以 # 开头:名字里不能有空格,值用引号括起来时引号后面只能跟 # 注释"


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


def integer(name: str, default: int | None, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
    value = number(name, default, minimum=minimum, maximum=maximum)
    if value is not None and value != int(value):
        raise SystemExit(f"配置错误:{name}={get(name)!r} 应该是整数")
    return value if value is None else int(value)


def hide_password(text: str) -> str:
    """打印用:去掉网址、连接串里的密码 —— URL 的「用户:密码@」、key=value 写法的 password=…。text 也可以是一句报错:
    libpq 说连接串写错了(比如少了 :// 里的冒号)时会把整串原样引出来,密码不能跟着进终端和 cron.log。"""
    text = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s\"]+)", r"\1***", text)
    return re.sub(r"(^|[/\s\"])([^:/@\s\"]+):(?!//)[^@\s\"]*@", r"\1\2:***@", text)


def url(name: str, default: str = "", *, secret: bool = False) -> str:
    """读一个 http(s) 网址设置(没设置时是 default,可以为空)。写错时以 SystemExit 退出,说明是哪一项,不用等到真的
    去连时才报一个像是「对方没开」的错。secret=True:网址本身就是密钥(Slack webhook 的路径),报错时只露出开头。"""
    raw = get(name, default)
    if not raw:
        return raw
    # urlsplit 悄悄删掉网址里的制表符和换行(WHATWG 的规矩),httpx 却拒收:在这里拦下,是「配置错误」,而不是真的去发时
    # 的「连不上」。空格和别的 ASCII 控制字符也不能有(主机名里的 \x80 这类由 hostname_problem 说得更准)
    if bad := next((c for c in raw if c.isspace() or c < " " or c == "\x7f"), None):
        shown = raw[:16] + "…" if secret and len(raw) > 16 else hide_password(raw)
        raise SystemExit(f"配置错误:{name}={shown!r} 不是合法的网址(里面有空白或控制字符 {bad!r},多半是复制时带进来的)")
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 —— 端口不是数字、超出范围时这里抛 ValueError
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        problem = "" if ok else "要以 http:// 或 https:// 开头,后面是主机名"
        if ok and (bad_host := hostname_problem(parts.hostname)):
            problem = "主机名" + bad_host
    except ValueError as e:
        problem = str(e)
    if problem:
        shown = raw[:16] + "…" if secret and len(raw) > 16 else hide_password(raw)  # 网址里的密码不进终端和 cron.log
        raise SystemExit(f"配置错误:{name}={shown!r} 不是合法的网址({problem})")
    return raw


def on_this_machine(url: str) -> bool:
    """网址指的是不是本机(localhost、127.x、::1):发给本机的请求不走代理。"""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def proxy_note(url: str) -> str:
    """httpx 发这个网址时会走环境变量里的代理(http_proxy / https_proxy / all_proxy,NO_PROXY 里没排除它)的话,
    说一句是哪个代理:代理没开、不通时报的也是「连不上」,光看错误以为是对方的问题。不走代理时是空串。"""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return ""
    return f";这个请求走的是环境变量里的代理 {hide_password(proxy)}:代理没开或不通时也是这样,不走代理就把主机加进 NO_PROXY"


def hostname_problem(host: str) -> str:
    """主机名编不成 idna 时说明原因,编得出来时是空串。a..b、.a、超过 63 个字符的一段、U+0080 这样的字符在读设置时拦下,
    不然要到真的去连时才是 UnicodeError 的 traceback(worker 还把它当暂时性错误,每次用掉一次尝试)。"""
    try:
        host.encode("idna")
        return ""
    except UnicodeError:
        pass
    for label in re.split("[.\u3002\uff0e\uff61]", host):  # idna 认的四种点
        try:
            encodings.idna.nameprep(label)
        except UnicodeError:
            return f"有域名里不允许的字符:{label!r}"
    return "有一段是空的(连着两个点、以点开头)或者超过 63 个字符"


def path(name: str, default_filename: str) -> Path:
    """文件路径设置;相对路径按当前目录解释,默认放在脚本旁边。"""
    raw = get(name)
    if not raw:
        return HERE / default_filename
    try:
        return _resolved(raw, os.getcwd())
    except RuntimeError:  # Python 3.11 的 resolve() 遇到绕成圈的符号链接抛它
        raise SystemExit(f"配置错误:{name}={raw!r} 是绕成圈的符号链接(指来指去又回到自己),指不到文件") from None


@lru_cache(maxsize=64)
def _resolved(raw: str, cwd: str) -> Path:
    """Path.resolve() 要对路径的每一段做一次 lstat;store 每条语句都要问一次库在哪,
    不缓存的话 worker 处理一个事件有 4% 的时间花在这里(bench/worker.py 采样)。按原值和当前目录缓存。"""
    return (Path(cwd) / Path(raw).expanduser()).resolve()


def value(name: str) -> str | int | float | Path | None:
    """按 SETTINGS 读一个设置:没设置时是表里的默认值,不对时以 SystemExit("配置错误:…") 退出,说明是哪一项。"""
    setting = SETTINGS[name]
    if setting.kind == "int":
        return integer(name, setting.default, minimum=setting.minimum, maximum=setting.maximum)
    if setting.kind == "float":
        return number(name, setting.default, minimum=setting.minimum, maximum=setting.maximum)
    if setting.kind == "url":
        return url(name, setting.default, secret=setting.secret)
    if setting.kind == "path":
        return path(name, setting.default)
    text = get(name, setting.default)
    if setting.choices and text not in setting.choices:
        raise SystemExit(f"配置错误:{name}={text!r},只能是 {'、'.join(setting.choices)} 之一")
    return text


# argparse(Python 3.11)的英文错误 → 中文。整句匹配;没列到的(更新的 Python 改了措辞)原样留着,意思不丢
_ARGPARSE_ERRORS = [
    (r"unrecognized arguments: (.*)", r"不认识的参数:\1"),
    (r"the following arguments are required: (.*)", r"缺少参数:\1"),
    (r"argument (.+?): invalid int value: (.*)", r"\1 要的是整数,不是 \2"),
    (r"argument (.+?): invalid float value: (.*)", r"\1 要的是数字,不是 \2"),
    (r"argument (.+?): invalid choice: (.*) \(choose from (.*)\)", r"\1 没有 \2 这一项(可选:\3)"),
    (r"argument (.+?): expected one argument", r"\1 后面要跟一个值"),
    (r"argument (.+?): expected at least one argument", r"\1 后面至少要跟一个值"),
    (r"argument (.+?): ignored explicit argument (.*)", r"\1 不带值,多出了 \2"),
    (r"ambiguous option: (.*) could match (.*)", r"选项 \1 不明确,可能是 \2"),
]


class ArgumentParser(argparse.ArgumentParser):
    """argparse,只是说中文:「用法:」「选项:」,错误是「worker.py:错误:不认识的参数:--bogus」,退出码和 argparse 一样是 2。
    (inbox.py、send_webhook.py 照课文读 sys.argv,用法自己写。)"""

    def __init__(self, **kwargs):
        kwargs["add_help"] = False  # -h 的说明换成中文
        super().__init__(**kwargs)
        self._positionals.title, self._optionals.title = "参数", "选项"
        self.add_argument("-h", "--help", action="help", help="显示这段说明并退出")

    def format_usage(self) -> str:
        return _chinese_usage(super().format_usage())

    def format_help(self) -> str:
        return _chinese_usage(super().format_help())

    def error(self, message: str):
        for english, chinese in _ARGPARSE_ERRORS:
            if re.fullmatch(english, message, flags=re.DOTALL):
                message = re.sub(english, chinese, message, flags=re.DOTALL)
                break
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}:错误:{message}\n")


def _chinese_usage(text: str) -> str:
    return "用法:" + text.removeprefix("usage: ") if text.startswith("usage: ") else text


# ---------------------------------------------------------------- 程序入口
INTERRUPTED = "已中断(Ctrl-C)"

# 进程启动时 SIGINT 是不是本来就被忽略:shell 脚本里用 & 放到后台的程序就是这样(uv run 也照样传下去),终端上的 Ctrl-C
# 是给前台命令的,不该停下它。在导入时读,也就是在任何程序装自己的处理函数之前(worker、收件箱都先导入 config)
SIGINT_IGNORED_AT_START = signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def handle_stop_signals(on_sigint, on_sigterm) -> None:
    """装停止信号的处理函数。SIGINT 本来就被忽略的(见 SIGINT_IGNORED_AT_START)仍然不理,只装 SIGTERM。"""
    signal.signal(signal.SIGTERM, on_sigterm)
    if not SIGINT_IGNORED_AT_START:
        signal.signal(signal.SIGINT, on_sigint)


def quit_quietly_while_importing(message: str) -> None:
    """在慢的导入(openai、LangGraph,慢的机器上要好几秒)之前调用:这期间按 Ctrl-C(或者收到 SIGTERM)说一行 message、
    退出码 130(SIGTERM 是 143),不出 traceback —— 人按 Ctrl-C 多半就落在这几秒里。导入完了 main() 开头调
    interrupts_as_usual() 换回来,之后的 Ctrl-C 是 KeyboardInterrupt,由各个程序自己收拾(见 run())。"""
    def stop(signum, _frame):
        print(message, file=sys.stderr, flush=True)
        os._exit(128 + signum)

    handle_stop_signals(stop, stop)


def interrupts_as_usual() -> None:
    """quit_quietly_while_importing() 之后:Ctrl-C 抛一次 KeyboardInterrupt(interrupt_once),之后的 Ctrl-C 都不理,
    SIGTERM 回到默认的直接结束。程序接住 KeyboardInterrupt 之后要收拾(收件箱把拿走的事件放回该在的地方),只要几毫秒;
    人连按两下、或者 uv run 把发给进程组的 SIGINT 再转发一次时,第二个不打断收拾(不然事件留在 processing)。"""
    handle_stop_signals(interrupt_once, signal.SIG_DFL)


def ignore_stop_signals() -> None:
    """从这里起 Ctrl-C、SIGTERM 都不理,要退出、正在收拾时用。`uv run` 会把发给进程组的信号(终端外的 Ctrl-C、systemd
    停服务、kill -- -PGID)再转发一次:第二次落在收拾途中,收拾断在一半(临时目录没删);落在解释器退出途中,Python 已把
    处理函数换回默认,进程被信号结束(退出码 143 / 130)。SIG_IGN 在退出途中不会被换回来。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def interrupt_once(_signum=None, _frame=None) -> None:
    """停止信号的处理函数:第一次像 Ctrl-C 一样抛 KeyboardInterrupt,之后的都不理(见 ignore_stop_signals)。"""
    ignore_stop_signals()
    raise KeyboardInterrupt


def run(main, *args) -> None:
    """sys.exit(main(*args)),再加两种不该有 traceback 的退出:
    - 看输出的一方提前走了(… | head):照 Python 文档 signal 一节安静退出,退出码 141(和被 SIGPIPE 结束的 cat 一样)。
      stdout 先指到 /dev/null,不然 Python 退出时再冲一次缓冲区,又是一段「Exception ignored」;缓冲区在这里冲,
      写不出去才在这里发现。
    - main() 没接住的 Ctrl-C:一行「已中断(Ctrl-C)」、退出码 130(做到一半的都是没提交的事务)。Ctrl-C 只抛一次
      (interrupt_once),连按两下、uv run 再转发一次的 SIGINT 不会在收拾或退出途中把进程结束(退出码 -2)。
      SIGINT 本来就被忽略(后台跑)时仍然不理;用 handle_stop_signals() 自己装了处理函数的程序(worker、收件箱)这里不动。"""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt_once)
    # 标准输出写进文件(cron 的 >> cron.log 2>&1)时 Python 攒满一块才写,不带缓冲的标准错误就跑到了前面:
    # 日志里说明先于结果。一行一写,两边的行照打印的先后
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        code = main(*args)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        code = 130
    sys.exit(code)
