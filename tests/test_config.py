"""配置:每个设置都在 .env.example 里有说明;.env 有就读、环境变量优先、没有也行。"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (FULL_DISK, LAB, RUN_AS_MAIN, cli, free_port, pg_schema, read_write_role, refused_startup, rows,
                      run, schema_of, webhook_server, write_locked)
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import config
import store
import store_errors
import store_pg
import store_sqlite
import store_upgrade


def test_every_setting_the_code_reads_is_documented_in_env_example():
    read = set()
    for path in LAB.glob("*.py"):
        read |= set(re.findall(r'(?:(?:config|settings)\.(?:get|number|integer|path|url|value)|api_key_setting)'
                               r'\(\s*"([A-Z0-9_]+)"', path.read_text(encoding="utf-8")))
    documented = set(re.findall(r"^([A-Z0-9_]+)=", (LAB / ".env.example").read_text(encoding="utf-8"), re.M))
    assert read and read <= documented, f"没写进 .env.example:{sorted(read - documented)}"
    assert documented <= read | {"IMAP_HOST", "IMAP_USER", "IMAP_PASSWORD", "IMAP_PORT"}, sorted(documented - read)
    assert read <= set(config.SETTINGS), f"没写进 config.SETTINGS:{sorted(read - set(config.SETTINGS))}"


# ---------------------------------------------------------------- 设置表(config.SETTINGS)和写着它的三处
def default_cell(setting: config.Setting) -> str:
    """表格「默认值」一栏该写的:`3`;留空的写「不设」。"""
    return "不设" if setting.default in ("", None) else f"`{setting.default}`"


def unit_cell(setting: config.Setting) -> str:
    """表格「单位(范围)」一栏该写的:秒(0.1–3600)、字(至少 200)、网址;什么都没有的写「—」。"""
    low, high = setting.minimum, setting.maximum
    bounds = f"{low:g}–{high:g}" if low is not None and high is not None else f"至少 {low:g}" if low is not None else ""
    return (f"{setting.unit}({bounds})" if setting.unit and bounds else setting.unit or bounds) or "—"


SETTING_ROW = re.compile(r"^\|\s*`?([A-Z][A-Z0-9_]*)`?\s*\|(.*)\|\s*$", re.M)


def setting_rows(markdown: str) -> tuple[list[str], list[str]]:
    """markdown 里第一格是设置名的四格表格行(`| NAME | 默认值 | 单位(范围) | 说明 |`,名字带不带反引号都行):
    返回 (按出现顺序的名字, 和 config.SETTINGS 对不上的地方)。别的表格(第一格不是设置名、不是四格)不管;
    README 里那张常改设置的小表也用它核对。"""
    names, problems = [], []
    for match in SETTING_ROW.finditer(markdown):
        name, cells = match[1], [c.strip() for c in match[2].split("|")]
        if len(cells) != 3:
            continue
        if name not in config.SETTINGS:
            if name.isupper() and "_" in name:
                problems.append(f"{name}:config.SETTINGS 里没有这一项")
            continue
        names.append(name)
        setting = config.SETTINGS[name]
        expected = [default_cell(setting), unit_cell(setting), setting.meaning]
        if cells != expected:
            problems.append(f"{name}:写的是 {cells},表里是 {expected}")
    return names, problems


def test_the_settings_table_is_consistent_in_itself():
    for name, setting in config.SETTINGS.items():
        assert setting.kind in ("str", "int", "float", "url", "path"), name
        assert setting.meaning and "|" not in setting.meaning and "\n" not in setting.meaning, name
        if setting.kind in ("int", "float"):
            assert setting.default is None or setting.minimum is None or setting.default >= setting.minimum, name
            assert setting.default is None or setting.maximum is None or setting.default <= setting.maximum, name
        else:
            assert (setting.minimum, setting.maximum) == (None, None), name
            assert isinstance(setting.default, str), name
        if setting.kind == "int":
            assert setting.default is None or isinstance(setting.default, int), name
        assert not setting.choices or (setting.kind == "str" and setting.default in setting.choices), name


def test_env_example_lists_every_setting_in_table_order_with_its_default_unit_and_meaning():
    from dotenv import dotenv_values

    text = (LAB / ".env.example").read_text(encoding="utf-8")
    values = dotenv_values(LAB / ".env.example")  # 它自己也要是一份读得懂的 .env
    assert list(values) == list(config.SETTINGS)
    for name, setting in config.SETTINGS.items():
        assert values[name] == ("" if setting.default is None else str(setting.default)), name
        unit = unit_cell(setting)
        comment = f"# {setting.meaning}" if unit == "—" else f"# {unit}:{setting.meaning}"
        assert re.search(f"^{re.escape(comment)}\n{name}=", text, re.M), f"{name} 上面一行应该是:{comment}"


def test_docs_configuration_has_one_row_per_setting_in_table_order():
    names, problems = setting_rows((LAB / "docs" / "configuration.md").read_text(encoding="utf-8"))
    assert problems == []
    assert names == list(config.SETTINGS)


def test_the_settings_rows_in_the_readme_agree_with_the_table():
    text = (LAB / "README.md").read_text(encoding="utf-8")
    names, problems = setting_rows(text)
    assert problems == []
    assert len(names) == len(set(names)), "README 里有设置列了两遍"
    if "docs/configuration.md" in text:  # 链到全表的 README 有一张常改设置的小表
        assert names, "README 链到了 docs/configuration.md,却没有 | NAME | 默认值 | 单位(范围) | 说明 | 格式的设置行"


def test_value_is_the_tables_default_when_a_setting_is_not_set(monkeypatch):
    for name in config.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for name, setting in config.SETTINGS.items():
        expected = config.HERE / setting.default if setting.kind == "path" else setting.default
        assert config.value(name) == expected, name
        assert type(config.value(name)) is type(expected), name


@pytest.mark.parametrize("name, raw, expected", [
    ("MAX_ATTEMPTS", "5", 5),
    ("IMAP_PORT", "143", 143),
    ("STALE_MINUTES", "0.5", 0.5),
    ("LLM_MODEL", "  qwen-plus ", "qwen-plus"),
    ("CHECKPOINT_DURABILITY", "exit", "exit"),
    ("LLM_BASE_URL", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
])
def test_value_reads_a_setting_by_its_kind(monkeypatch, name, raw, expected):
    monkeypatch.setenv(name, raw)
    assert config.value(name) == expected
    assert type(config.value(name)) is type(expected)


def test_value_reads_a_path_setting_relative_to_the_current_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVENTS_DB", "here.db")
    assert config.value("EVENTS_DB") == tmp_path.resolve() / "here.db"


@pytest.mark.parametrize("name, raw, message", [
    ("MAX_ATTEMPTS", "0", "配置错误:MAX_ATTEMPTS='0' 不能小于 1"),
    ("MAX_ATTEMPTS", "2.5", "配置错误:MAX_ATTEMPTS='2.5' 应该是整数"),
    ("WORKER_CONCURRENCY", "257", "配置错误:WORKER_CONCURRENCY='257' 不能大于 256"),
    ("POLL_SECONDS", "0.001", "配置错误:POLL_SECONDS='0.001' 不能小于 0.01"),
    ("LLM_PRIMARY_SHARE", "nan", "配置错误:LLM_PRIMARY_SHARE='nan' 不是数字"),
    ("IMAP_PORT", "70000", "配置错误:IMAP_PORT='70000' 不能大于 65535"),
    ("PG_POOL_SIZE", "0", "配置错误:PG_POOL_SIZE='0' 不能小于 1"),
    ("LLM_BASE_URL", "api.deepseek.com", "配置错误:LLM_BASE_URL='api.deepseek.com' 不是合法的网址"
                                         "(要以 http:// 或 https:// 开头,后面是主机名)"),
    ("SLACK_WEBHOOK_URL", "hooks.slack.com/services/T0/B0/secret", "配置错误:SLACK_WEBHOOK_URL='hooks.slack.com/…' "
                                                                   "不是合法的网址(要以 http:// 或 https:// 开头,后面是主机名)"),
    ("CHECKPOINT_DURABILITY", "fast", "配置错误:CHECKPOINT_DURABILITY='fast',只能是 async、exit、sync 之一"),
])
def test_value_refuses_a_wrong_setting_with_the_same_message_as_the_helpers(monkeypatch, name, raw, message):
    monkeypatch.setenv(name, raw)
    with pytest.raises(SystemExit) as e:
        config.value(name)
    assert str(e.value) == message


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig"])
def test_dotenv_is_read_if_present_and_environment_wins(tmp_path, encoding):
    """utf-8-sig:记事本存的「UTF-8 带 BOM」也一样读,第一行的设置名前面不会多出一个 BOM。"""
    (tmp_path / ".env").write_text("MAX_ATTEMPTS=7\n# 模型名\nLLM_MODEL=from-dotenv\n", encoding=encoding)
    code = f"import sys; sys.path.insert(0, {str(LAB)!r}); import config; print(config.integer('MAX_ATTEMPTS', 3), config.get('LLM_MODEL'))"
    env = {"PATH": "/usr/bin:/bin", "LLM_MODEL": "from-env"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr) == (0, "7 from-env\n", "")
    (tmp_path / ".env").unlink()
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, "3 from-env\n")


NOT_UTF8 = "配置错误:.env 不是 UTF-8 编码({}):用编辑器把它另存为 UTF-8"
UNCLOSED = "配置错误:.env 第 {} 行读不懂:{} 的值以 {} 开头,却没有配对的 {} 结尾(补上它,或者两个都去掉)"
NOT_NAME_VALUE = "配置错误:.env 第 {} 行读不懂:要写成「名字=值」,注释以 # 开头:名字里不能有空格,值用引号括起来时引号后面只能跟 # 注释"
LOOP = object()  # 「.env 是一个绕成圈的符号链接」(见 put_dotenv)
# (退出码, 命令):cwd 不是实验目录(.env 从 cwd 读),所以脚本、样例都写绝对路径
DOTENV_READERS = ((1, ["worker.py", "--once"]), (1, ["store.py"]), (2, ["cron_jobs.py", "report"]),
                  (1, ["inbox.py", "list"]), (2, ["email_poller.py", "--eml", str(LAB / "samples/01_utf8_plain.eml")]),
                  (2, ["send_webhook.py", "T1012"]))


@pytest.mark.parametrize("content, message", [
    pytest.param("MAX_ATTEMPTS=3\n# 最多重试三次\n".encode("gbk"),
                 NOT_UTF8.format("第 2 行有 UTF-8 里不会出现的字节 0xd7,多半是 GBK(中文 Windows 的默认编码)存的"), id="gbk"),
    pytest.param("# 最多重试三次\r\nMAX_ATTEMPTS=3\r\n".encode("utf-16"),
                 NOT_UTF8.format("开头是 UTF-16 的标记:Windows 记事本存成「Unicode」就是这样"), id="utf-16"),
    pytest.param(b'WEBHOOK_SECRET="my-real-secret\nMAX_ATTEMPTS=3\n', UNCLOSED.format(1, "WEBHOOK_SECRET", '"', '"'),
                 id="unclosed-quote"),
    # 读不了的 .env(别的用户建的、权限 600;以 root 跑测试时权限拦不住,用绕成圈的符号链接):一行说读不了、为什么,不是 OSError 的 traceback
    pytest.param(LOOP, "配置错误:.env 读不了(Too many levels of symbolic links)", id="symlink-loop"),
])
def test_a_dotenv_that_cannot_be_read_stops_every_program_with_the_reason_and_changes_nothing(lab, tmp_path, content,
                                                                                             message):
    """读不了的 .env 和别的配置错误一样:各个程序按自己的退出码说一行,什么都没做。不是 UTF-8 的 .env(中文 Windows
    存成 GBK、记事本存成 UTF-16)不让每个程序以 UnicodeDecodeError 的 traceback 结束;读不懂的一行(少了右引号)不是
    只有一句英文 WARNING、那一项悄悄用默认值 —— 那样 send_webhook.py 会拿公开的默认密钥签名发出去。"""
    here = tmp_path / "here"
    here.mkdir()
    put_dotenv(here, content)
    env = {k: v for k, v in lab.items() if k != "AMBIENT_NO_DOTENV"}
    # 真发出去了(或者拿默认值去连了)就不是这一行,而是「发不出去:… 连不上」、退出码 1
    env["WEBHOOK_URL"] = f"http://127.0.0.1:{free_port()}/hooks/cloudledger"
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    tickets = rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"])
    for code, (script, *args) in DOTENV_READERS:
        r = run([str(LAB / script), *args], env, cwd=here)
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message + "\n"), script
    r = run(["-m", "uvicorn", "--app-dir", str(LAB), "webhook:app", "--port", "0"], env, timeout=60, cwd=here)
    assert (r.returncode, r.stdout, r.stderr) == refused_startup(r, message)
    # demo.py 读的是实验目录里的 .env:在一份拷贝里跑
    copy = tmp_path / "lab"
    copy.mkdir()
    for file in (*LAB.glob("*.py"), LAB / "cloudledger_seed.json"):
        shutil.copy(file, copy)
    put_dotenv(copy, content)
    (demo_tmp := tmp_path / "demo-tmp").mkdir()
    r = run([str(copy / "demo.py")], {**env, "TMPDIR": str(demo_tmp)}, cwd=copy)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"演示没有开始:{message}(改好环境变量或 .env 里的这一项再跑)\n")
    assert list(demo_tmp.iterdir()) == []  # 连临时数据目录都没建
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]
    assert rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"]) == tickets  # 邮件没有建工单
    assert [p.name for p in here.iterdir()] == [".env"]
    if content is LOOP:
        assert os.readlink(here / ".env") == ".env"
    else:
        assert (here / ".env").read_bytes() == content


def put_dotenv(directory: Path, content) -> None:
    if content is LOOP:
        (directory / ".env").symlink_to(".env")
    else:
        (directory / ".env").write_bytes(content)


@pytest.mark.parametrize("content, message", [
    ("A=1\nLLM_API_KEY='sk-live-123\nB=2\n", UNCLOSED.format(2, "LLM_API_KEY", "'", "'")),
    # 合法的多行值之后:行号从那一句的第一行算
    ('LLM_EXTRA_BODY="{\n  \\"a\\": 1}"\nexport WEBHOOK_SECRET = "sk-live-123\n',
     UNCLOSED.format(3, "WEBHOOK_SECRET", '"', '"')),
    ("A=1\nMY KEY=sk-live-123\n", NOT_NAME_VALUE.format(2)),
    ("A=1\n\n最多重试 三次\n", NOT_NAME_VALUE.format(3)),  # 注释忘了写 #
    ("LLM_API_KEY='sk-live' 123\n", NOT_NAME_VALUE.format(1)),
])
def test_a_dotenv_line_that_cannot_be_read_is_named_by_number_without_printing_its_value(tmp_path, content, message):
    """值常常是密钥:说第几行、哪一项、错在哪,不引出原文(它会进终端和 cron.log)。"""
    (tmp_path / ".env").write_text(content, encoding="utf-8")
    code = f"import sys; sys.path.insert(0, {str(LAB)!r}); import config; print(config.get('A'))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout, r.stderr) == (1, "", message + "\n")


def test_a_dotenv_that_cannot_be_read_is_refused_on_every_read_not_only_the_first(tmp_path):
    """一个程序接住了第一次的 SystemExit 接着读别的设置,也拿不到默认值。"""
    (tmp_path / ".env").write_bytes("# 最多重试三次\nMAX_ATTEMPTS=7\n".encode("gbk"))
    code = (f"import sys; sys.path.insert(0, {str(LAB)!r}); import config\n"
            "try:\n    config.get('LLM_MODEL')\nexcept SystemExit:\n    print('第一次')\n"
            "print(config.integer('MAX_ATTEMPTS', 3))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "第一次\n", NOT_UTF8.format("第 1 行有 UTF-8 里不会出现的字节 0xd7,多半是 GBK(中文 Windows 的默认编码)存的") + "\n")


@pytest.mark.parametrize("raw, message", [
    ("nan", "配置错误:MAX_ATTEMPTS='nan' 不是数字"),
    ("inf", "配置错误:MAX_ATTEMPTS='inf' 不是数字"),
    ("0", "配置错误:MAX_ATTEMPTS='0' 不能小于 1"),
    ("1e9", "配置错误:MAX_ATTEMPTS='1e9' 不能大于 20"),
    ("2.5", "配置错误:MAX_ATTEMPTS='2.5' 应该是整数"),
])
def test_a_number_that_is_not_finite_out_of_range_or_not_whole_is_a_clear_error(tmp_path, raw, message):
    code = (f"import sys; sys.path.insert(0, {str(LAB)!r}); import config; "
            "print(config.integer('MAX_ATTEMPTS', 3, minimum=1, maximum=20))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "MAX_ATTEMPTS": raw, "AMBIENT_NO_DOTENV": "1"})
    assert (r.returncode, r.stdout, r.stderr) == (1, "", message + "\n")


def test_a_setting_that_is_not_a_number_is_a_clear_error(tmp_path):
    code = f"import sys; sys.path.insert(0, {str(LAB)!r}); import config; config.integer('MAX_ATTEMPTS', 3)"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "MAX_ATTEMPTS": "three", "AMBIENT_NO_DOTENV": "1"})
    assert (r.returncode, r.stderr) == (1, "配置错误:MAX_ATTEMPTS='three' 不是数字\n")


# 像没运行过 uv sync --extra postgres 一样:psycopg 和 psycopg_pool 都 import 不了,然后照常运行那个命令
WITHOUT_PSYCOPG = "import runpy, sys; sys.modules.update(psycopg=None, psycopg_pool=None); " + RUN_AS_MAIN
NO_PG_DEPS = "设置了 DATABASE_URL,但没装 PostgreSQL 的依赖:运行 uv sync --extra postgres"


@pytest.mark.parametrize("command, code", [
    (["store.py"], 1), (["worker.py", "--once"], 1), (["inbox.py", "list"], 1), (["cron_jobs.py", "report"], 2),
    (["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], 2),
])
def test_database_url_without_the_postgres_extra_says_how_to_install_it_and_touches_nothing(lab, command, code):
    before = rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"])
    env = {**lab, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"}
    r = run(["-c", WITHOUT_PSYCOPG, *command], env)
    assert (r.returncode, r.stdout, r.stderr) == (code, "", NO_PG_DEPS + "\n")
    assert rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"]) == before  # 邮件没有先在业务库里建工单
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_the_webhook_without_the_postgres_extra_does_not_start_and_says_why(lab):
    env = {**lab, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"}
    r = run(["-c", WITHOUT_PSYCOPG, "uvicorn", "webhook:app", "--port", "0"], env, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == refused_startup(r, NO_PG_DEPS)
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


PROGRAMS = (["worker.py", "--once"], ["store.py"], ["cron_jobs.py", "report"], ["inbox.py", "list"],
            ["email_poller.py", "--eml", "samples/01_utf8_plain.eml"])


def refused_everywhere(lab: dict, url: str, expected: list[tuple[int, str]]) -> None:
    """PROGRAMS 每个都用这个 DATABASE_URL 跑一遍:(退出码, 标准错误) 和 expected 一一对上,什么都没领、没改。"""
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    for command, (code, message) in zip(PROGRAMS, expected, strict=True):
        r = cli(command, {**lab, "DATABASE_URL": url})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message + "\n"), command
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]


UNREADABLE_URL = "配置错误:DATABASE_URL 读不懂({}):要写成 postgresql://用户@主机:5432/库名"
NO_DATABASE_NAME = ("配置错误:DATABASE_URL 里没有库名:在最后写上,例如 postgresql://用户@主机:5432/库名(不写的话 PostgreSQL "
                    "用和用户同名的库,常常是系统库 postgres,实验的表会建到那里)")
BAD_PORT = "配置错误:DATABASE_URL 里的端口 {!r} 不对:要是 1–65535 之间的整数(PostgreSQL 默认是 5432)"
BAD_HOST = ("配置错误:DATABASE_URL 里的主机 {!r} 不是合法的主机名(只能有英文字母、数字、点和减号):"
            "换成数据库所在机器的名字或 IP 地址")
# 写错了的 URL:一个都不去连。改坏了检查,它们也连不上任何库(端口 1 没人听、主机名解析不了),不会在哪个库里建表
MALFORMED_URLS = [
    ("postgresql://postgres@127.0.0.1:1/", NO_DATABASE_NAME),
    ("host=127.0.0.1 port=1 user=postgres", NO_DATABASE_NAME),
    ("postgresql://postgres@127.0.0.1:543x/walk2", BAD_PORT.format("543x")),
    ("postgresql://postgres@127.0.0.1:99999/walk2", BAD_PORT.format("99999")),
    ("postgresql://postgres@127.0.0.1/walk2?port=0", BAD_PORT.format("0")),
    ("postgresql://用户:密码@数据库主机:5432/库名", BAD_HOST.format("数据库主机")),  # README 里的占位写法原样贴进来
    ("host='db host' port=1 dbname=walk2", BAD_HOST.format("db host")),
    ("postgresql://postgres@127.0.0.1:1/walk2?hostaddr=db", "配置错误:DATABASE_URL 里的 hostaddr='db' 不是 IP 地址"),
    ("host=127.0.0.1,127.0.0.2,127.0.0.3 port=1,2 dbname=walk2",
     "配置错误:DATABASE_URL 里有 3 个主机、2 个端口:端口要么只写一个,要么每个主机一个"),
]


@pytest.mark.parametrize("url, message", [
    ("mysql://app@db/ledger", "配置错误:DATABASE_URL 要以 postgresql:// 开头,现在是 mysql://…"),
    ("notaurl", UNREADABLE_URL.format('missing "=" after "notaurl" in connection info string')),
    # 少了 :// 里的冒号:libpq 把整串原样引出来,密码打成 ***,不跟着进终端和 cron.log(S3cretPw 不原样打印)
    ("postgresql//app:S3cretPw@db/ledger",
     UNREADABLE_URL.format('missing "=" after "postgresql//app:***@db/ledger" in connection info string')),
    ("postgresql://postgres@db host/walk2",
     UNREADABLE_URL.format('unexpected spaces found in "db host", use percent-encoded spaces (%20) instead')),
    *MALFORMED_URLS,
])
def test_a_database_url_that_cannot_be_used_stops_at_once_with_the_reason_and_claims_nothing(lab, url, message):
    """每种都马上停下、一行说是哪一项、为什么:不等 10 秒、不刷屏日志,也不以一个 PoolTimeout 的 traceback 结束。
    端口、主机名写错了是设置不对,不算「数据库暂时用不了」(那样常驻的 worker 会一直重试,cron 退出码 3);没写库名时
    也不连(libpq 会连上和用户同名的库,store.py 就把实验的表建进系统库 postgres)。"""
    refused_everywhere(lab, url, [(1, message), (1, message), (2, message), (1, message), (2, message)])


@pytest.mark.parametrize("url, message", MALFORMED_URLS[:1] + MALFORMED_URLS[2:3] + MALFORMED_URLS[5:6])
def test_a_malformed_database_url_stops_the_resident_worker_and_the_webhook_at_once(lab, url, message):
    """常驻的 worker 遇上「数据库暂时用不了」会一直等着再试:写错了的 URL 不能落到那里。"""
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    env = {**lab, "DATABASE_URL": url, "POLL_SECONDS": "0.2"}
    r = run(["worker.py"], env, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", message + "\n")
    r = run(["-m", "uvicorn", "webhook:app", "--port", "0"], env, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == refused_startup(r, message)
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:5432/walk2",
    "postgres://app:pw@db.example.com/walk2",
    "postgresql://postgres@127.0.0.1:5432/?dbname=walk2",  # libpq 的 dbname= 参数也是库名
    "postgresql://postgres@127.0.0.1:/walk2",  # 空端口:默认的 5432
    "postgresql://postgres@[::1]:5432/walk2",
    "postgresql://postgres@[fe80::1%25eth0]:5432/walk2",
    "postgresql://postgres@db_1:5432/walk2",  # docker compose 的服务名
    "postgresql:///walk2?host=/var/run/postgresql",  # Unix socket
    "postgresql://app@h1:5432,h2:5433/walk2?target_session_attrs=read-write",
    "postgresql://app@h1,h2/walk2",
    "postgresql://app@no-such-host.invalid:5432/walk2",  # 解析不了:DNS 也会出故障,连的时候算「暂时用不了」
    "postgresql://app@127.0.0.1/walk2?hostaddr=127.0.0.1",
    "host=127.0.0.1 port=5432 dbname=walk2",
    "postgresql://app@127.0.0.1/?service=lab",  # 库名在 pg_service.conf 里
])
def test_a_well_formed_database_url_is_not_taken_for_a_setting_error(url):
    assert store_pg.url_problem(url) is None


def test_a_database_url_without_a_name_is_fine_when_pgdatabase_names_it(monkeypatch):
    monkeypatch.setenv("PGDATABASE", "walk2")
    assert store_pg.url_problem("postgresql://postgres@127.0.0.1:5432/") is None
    monkeypatch.delenv("PGDATABASE")
    assert store_pg.url_problem("postgresql://postgres@127.0.0.1:5432/") == NO_DATABASE_NAME


def test_a_database_the_server_refuses_to_open_is_a_setting_error_with_the_servers_reason(lab, pg_url):
    """服务器接了、回了 FATAL(库不存在、用户不存在、密码不对):是设置的问题,等多久都不会好,马上退出、说服务器的原话。"""
    params = conninfo_to_dict(pg_url)
    url = make_conninfo("", **{**params, "dbname": "no_such_lab_db"})
    host, port = params.get("host") or "127.0.0.1", params.get("port") or "5432"
    message = (f'连不上 DATABASE_URL 指的 PostgreSQL:connection failed: connection to server at "{host}", port {port} '
               'failed: FATAL:  database "no_such_lab_db" does not exist')
    refused_everywhere(lab, url, [(1, message), (1, message), (2, message), (1, message), (2, message)])


READ_ONLY = ("DATABASE_URL 指的 PostgreSQL 只能读(ReadOnlySqlTransaction: cannot execute CREATE TABLE in a read-only "
             "transaction):多半连到了备库,或者设了 default_transaction_read_only;换成主库的地址。什么都没做")
NO_CREATE = ("DATABASE_URL 的用户不能建表或改表(InsufficientPrivilege: {reason}):表还没建好,或者这一版程序要给表加列、"
             "加表;请库的所有者(或者有 CREATE 权限的用户)用同一个库和 schema 运行一次 uv run python store.py,再 GRANT SELECT, "
             "INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA <schema> TO <用户>。PostgreSQL 15 起普通用户不能在 public 里建表。"
             "什么都没做")
NO_SCHEMA = ("DATABASE_URL 的 search_path 里没有一个存在的 schema(InvalidSchemaName: no schema has been selected to create "
             "in):先 CREATE SCHEMA(schema 其实在的话,是这个用户没有它的 USAGE 权限:请库的所有者 GRANT USAGE ON SCHEMA "
             "<schema> TO <用户>),或者改掉 options 里的 search_path。什么都没做")


def test_a_read_only_postgres_is_a_setting_error_in_every_program_and_nothing_is_claimed(pg_lab):
    """连到备库(这里用 default_transaction_read_only 模拟):每个程序都当设置不对,一行说只能读、换成主库的地址,
    不是 ReadOnlySqlTransaction 的 traceback;什么都没领。"""
    url = pg_lab["DATABASE_URL"] + "%20-cdefault_transaction_read_only%3Don"
    refused_everywhere(pg_lab, url, [(code, READ_ONLY) for code in (1, 1, 2, 1, 2)])


def pg_rows(url: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def relations(url: str) -> list[str]:
    """url 的 schema 里的表和索引。"""
    return sorted(r[0] for r in pg_rows(url, store_upgrade.PG_OBJECTS))


def test_a_read_write_user_is_told_to_have_the_owner_run_store_py_then_runs_every_program(lab, pg_url):
    """PostgreSQL 15 起普通用户不能在 public 里建表,生产上程序也常用只有读写权限的用户连。表都在时程序启动
    一条 DDL 也不执行:每次启动都执行 CREATE … IF NOT EXISTS 的话,这种用户连建好了的表也用不了。
    表还没建:建表的程序一行说清楚请所有者运行 store.py,schema 里什么都没建;所有者运行一次 store.py、给了读写权限之后,
    webhook 收事件、收信、起草、收件箱 accept、日报都照常,回复进了发件箱。"""
    with pg_schema() as owner_url, read_write_role(owner_url) as (url, grant_read_write):
        schema = schema_of(owner_url)
        no_create = NO_CREATE.format(reason=f"permission denied for schema {schema}")
        biz = f"业务库还没建:{store_errors._safe_url(url)} 里没有表 customers、tickets(先运行 uv run python store.py 建库)"
        for command, (code, message) in zip(PROGRAMS, [(1, biz), (1, no_create), (2, no_create), (1, no_create),
                                                       (2, biz)], strict=True):
            r = cli(command, {**lab, "DATABASE_URL": url})
            assert (r.returncode, r.stdout, r.stderr) == (code, "", message + "\n"), command
        assert relations(owner_url) == []

        r = cli(["store.py"], {**lab, "DATABASE_URL": owner_url})
        assert r.returncode == 0, r.stderr
        assert {"events", "outbox", "checkpoints", "checkpoint_migrations", "tickets"} <= set(relations(owner_url))
        grant_read_write()
        as_user = {**lab, "DATABASE_URL": url}
        r = cli(["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], as_user)
        assert r.returncode == 0, r.stderr
        [(event_id, ticket)] = pg_rows(owner_url, "SELECT event_id, ticket_id FROM events")
        with webhook_server(as_user) as (_, webhook):  # webhook 和它的写库进程也用这个用户
            r = cli(["send_webhook.py", "T1012"], {**as_user, "WEBHOOK_URL": webhook + "/hooks/cloudledger"})
        assert (r.returncode, r.stdout) == (0, "202 {'accepted': True, 'duplicate': False}\n"), r.stderr
        r = cli(["worker.py", "--once"], as_user)
        assert r.returncode == 0, r.stderr
        assert pg_rows(owner_url, "SELECT ticket_id, status FROM events ORDER BY ticket_id") == [
            (ticket, "waiting_human"), ("T1012", "waiting_human")]
        r = cli(["inbox.py", "list"], as_user)
        assert (r.returncode, ticket in r.stdout) == (0, True), r.stderr
        r = cli(["inbox.py", "accept", ticket], as_user)
        assert r.returncode == 0, r.stderr
        for command in (["cron_jobs.py", "report"], ["store.py"]):
            r = cli(command, as_user)
            assert r.returncode == 0, (command, r.stderr)
        assert pg_rows(owner_url, "SELECT event_id, status FROM events ORDER BY ticket_id") == [
            (event_id, "done"), ("evt_T1012_created", "waiting_human")]
        assert pg_rows(owner_url, "SELECT ticket_id, sent_by FROM outbox") == [(ticket, "agent+reviewer")]


def test_a_read_write_user_meeting_a_table_that_needs_an_upgrade_is_told_to_have_the_owner_run_store_py(pg_lab):
    """这一版程序要给表加东西(这里:上一版的事件表没有 waiting_since),只有读写权限的用户加不了:每个程序一行说清楚、
    什么都没领;所有者运行一次 store.py 把表升上去之后,同一个用户照常运行。"""
    owner_url = pg_lab["DATABASE_URL"]
    r = cli(["store.py"], pg_lab)  # checkpoint 的表也建好
    assert r.returncode == 0, r.stderr
    with read_write_role(owner_url) as (url, grant_read_write):
        grant_read_write()
        with store.opened() as conn:
            conn.execute("ALTER TABLE events DROP COLUMN waiting_since")
        schema = schema_of(owner_url)
        refused_everywhere(pg_lab, url, [(code, NO_CREATE.format(reason=f"permission denied for schema {schema}"))
                                         for code in (1, 1, 2, 1, 2)])
        r = cli(["store.py"], pg_lab)
        assert r.returncode == 0, r.stderr
        r = cli(["worker.py", "--once"], {**pg_lab, "DATABASE_URL": url})
        assert r.returncode == 0, r.stderr
        assert rows("SELECT status, attempts FROM events") == [("waiting_human", 1)]


@pytest.mark.parametrize("granted", ["SELECT", None])
def test_a_user_missing_write_rights_is_told_what_to_grant_and_nothing_is_claimed(pg_lab, granted):
    """表都建好了,用户却只被给了 SELECT,或者所有者忘了 GRANT(最常见):每个程序一开始就说缺哪几张表的
    什么权限、GRANT 什么,什么都没领(一点权限都没有时也不说成「表还没建好」)。表都在时启动不执行 DDL,不先查权限的话,
    要到 worker 领事件、cron scan 写事件时才是 InsufficientPrivilege 的 traceback。"""
    owner_url = pg_lab["DATABASE_URL"]
    r = cli(["store.py"], pg_lab)  # checkpoint 的表也建好
    assert r.returncode == 0, r.stderr
    with read_write_role(owner_url) as (url, _):
        import psycopg

        schema, user = schema_of(owner_url), conninfo_to_dict(url)["user"]
        if granted:
            with psycopg.connect(owner_url, autocommit=True) as conn:
                conn.execute(f"GRANT {granted} ON ALL TABLES IN SCHEMA {schema} TO {user}")
        message = (f"DATABASE_URL 的用户 {user} 对表 checkpoint_blobs、checkpoint_migrations、checkpoint_writes、checkpoints、"
                   "customers、events、inbox_seen、invoices、llm_usage、outbox、review_log、tickets 没有读写权限(程序要 SELECT、"
                   f"INSERT、UPDATE、DELETE):请库的所有者执行 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                   f"{schema} TO {user}。什么都没做")
        refused_everywhere(pg_lab, url, [(code, message) for code in (1, 1, 2, 1, 2)])


def test_checkpoint_tables_built_after_the_rights_check_are_checked_again_before_use(pg_lab):
    """init() 查权限时 checkpoint 的表可能还没有(所有者的 store.py 刚好在它之后建好、还没 GRANT):打开 checkpoint 时
    读 checkpoint_migrations 之前再查一次,同样一行说缺哪几张表的权限,不是 InsufficientPrivilege 的 traceback。"""
    owner_url = pg_lab["DATABASE_URL"]
    r = cli(["store.py"], pg_lab)
    assert r.returncode == 0, r.stderr
    with read_write_role(owner_url) as (url, grant_read_write):
        import psycopg

        grant_read_write()
        schema, user = schema_of(owner_url), conninfo_to_dict(url)["user"]
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(f"REVOKE ALL ON {', '.join(store_upgrade.CHECKPOINT_TABLES)} FROM {user}")
        r = run(["-c", "import store_pg; store_pg.open_checkpointer()"], {**pg_lab, "DATABASE_URL": url})
        assert (r.returncode, r.stdout, r.stderr) == (1, "", (
            f"DATABASE_URL 的用户 {user} 对表 checkpoint_blobs、checkpoint_migrations、checkpoint_writes、checkpoints "
            "没有读写权限(程序要 SELECT、INSERT、UPDATE、DELETE):请库的所有者执行 GRANT SELECT, INSERT, UPDATE, DELETE "
            f"ON ALL TABLES IN SCHEMA {schema} TO {user}。什么都没做\n"))


def test_a_user_without_usage_on_the_schema_is_told_to_have_it_granted(pg_lab):
    """schema 在,用户却没有它的 USAGE 权限(自建的 schema 默认不给 PUBLIC):PostgreSQL 当它不在。提示不只叫人
    CREATE SCHEMA(它明明在),也说要 GRANT USAGE。要业务表的程序先说「先运行 store.py」,store.py 再说这一行。"""
    owner_url = pg_lab["DATABASE_URL"]
    with read_write_role(owner_url, usage=False) as (url, grant_read_write):
        grant_read_write()
        biz = f"业务库还没建:{store_errors._safe_url(url)} 里没有表 customers、tickets(先运行 uv run python store.py 建库)"
        refused_everywhere(pg_lab, url, [(1, biz), (1, NO_SCHEMA), (2, NO_SCHEMA), (1, NO_SCHEMA), (2, biz)])


def test_store_py_run_by_a_read_write_user_where_the_business_tables_are_missing_says_so_in_one_line(pg_lab):
    """PostgreSQL 里有事件表和 checkpoint 表,业务表还没有(上一版建的库就是这样):worker 叫人运行 store.py,只有读写
    权限的用户照做时,建业务表那一步和别的建表一样一行说清楚,不是 InsufficientPrivilege 的 traceback;一张表都没建。"""
    owner_url = pg_lab["DATABASE_URL"]
    r = cli(["store.py"], pg_lab)
    assert r.returncode == 0, r.stderr
    with store.opened() as conn:
        conn.execute("DROP TABLE invoices, tickets, customers")
    with read_write_role(owner_url) as (url, grant_read_write):
        grant_read_write()
        r = cli(["store.py"], {**pg_lab, "DATABASE_URL": url})
        reason = f"permission denied for schema {schema_of(owner_url)}"
        assert (r.returncode, r.stdout, r.stderr) == (1, "", NO_CREATE.format(reason=reason) + "\n")
        assert not {"customers", "tickets"} & set(relations(owner_url))


def test_a_read_write_user_waiting_while_the_owner_builds_the_tables_uses_them_instead_of_failing(lab, monkeypatch,
                                                                                                pg_url):
    """所有者的 store.py(或者部署时的迁移任务)正在建表,同时一个只有读写权限的程序启动了:它先看到表还不全,去排队等
    建表的锁;等到时表已经建好。它拿到锁先再看一次,表都在就直接用,不去执行 CREATE … IF NOT EXISTS、被拒绝退出。
    checkpoint 的表也一样。"""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    with pg_schema() as owner_url, read_write_role(owner_url) as (url, grant_read_write):
        monkeypatch.setenv("DATABASE_URL", owner_url)
        user = conninfo_to_dict(url)["user"]
        script = "import store, store_pg; store.init(); store_pg.open_checkpointer()[1].close(); print('好了')"
        with psycopg.connect(owner_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (store_pg.CHECKPOINT_LOCK,))
            with store.transaction() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(?)", (store_pg.SCHEMA_LOCK,))
                proc = subprocess.Popen([sys.executable, "-c", script], cwd=LAB, env={**lab, "DATABASE_URL": url},
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                waiting_for(owner_url, user, "pg_advisory_xact_lock")
                conn.executescript(store.SCHEMA.format(**store.DIALECTS["postgres"]))
                conn.execute(store.ONE_PROCESSING_PER_TICKET)
                # 在同一个事务里给权限(一起提交):放开锁之前就给好,不然等着的程序先看到没权限的表,说缺什么权限
                conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema_of(owner_url)} TO {user}")
            waiting_for(owner_url, user, "pg_try_advisory_lock")
            with psycopg.connect(owner_url, autocommit=True) as setup:
                PostgresSaver(setup).setup()
            grant_read_write()
            holder.execute("SELECT pg_advisory_unlock(%s)", (store_pg.CHECKPOINT_LOCK,))
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out, err) == (0, "好了\n", "")


def waiting_for(url: str, user: str, call: str, timeout_s: float = 30) -> None:
    """等到 user 的连接正在(或刚刚)执行含 call 的语句:它在排队等锁了。"""
    import psycopg

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while not conn.execute("SELECT 1 FROM pg_stat_activity WHERE usename = %s AND query LIKE %s",
                               (user, f"%{call}%")).fetchone():
            assert time.monotonic() < deadline, f"{user} 一直没有执行 {call}"
            time.sleep(0.05)


def test_a_search_path_naming_no_existing_schema_is_explained_by_store_py(lab, pg_url):
    """options 里的 search_path 写错了(schema 不存在):要业务表的程序说「先运行 store.py」,store.py 再一行说清楚
    是 search_path 的事,不是 InvalidSchemaName 的 traceback。"""
    params = conninfo_to_dict(pg_url)
    url = make_conninfo("", **{**params, "options": "-csearch_path=t_no_such_schema"})
    biz = f"业务库还没建:{store_errors._safe_url(url)} 里没有表 customers、tickets(先运行 uv run python store.py 建库)"
    refused_everywhere(lab, url, [(1, biz), (1, NO_SCHEMA), (2, NO_SCHEMA), (1, NO_SCHEMA), (2, biz)])


@pytest.mark.parametrize("query, reason", [
    ("sslmode=bogus", 'connection is bad: invalid sslmode value: "bogus"'),
    ("target_session_attrs=primary-only", 'connection is bad: invalid target_session_attrs value: "primary-only"'),
    ("sslmode=require", 'connection failed: connection to server at "{host}", port {port} failed: server does not '
                        'support SSL, but SSL was required'),
])
def test_a_connection_parameter_libpq_refuses_is_a_setting_error_not_a_temporary_outage(lab, pg_url, query, reason):
    """libpq 按 URL 里的参数就不连(值写错了、要 SSL 而服务器不支持):和库不存在一样,是设置的问题:一行、马上退出。
    不说成「数据库暂时用不了」:那样常驻的 worker 会一直重试,cron 按退出码 3(暂时)退出。"""
    params = conninfo_to_dict(pg_url)
    host, port = params.get("host") or "127.0.0.1", params.get("port") or "5432"
    url = make_conninfo("", **{**params, **dict([query.split("=")])})
    message = f"连不上 DATABASE_URL 指的 PostgreSQL:{reason.format(host=host, port=port)}"
    refused_everywhere(lab, url, [(code, message) for code in (1, 1, 2, 1, 2)])


def test_a_database_server_that_is_not_running_is_temporary_not_a_setting_error(lab):
    """连接被拒(服务器没开、在重启):和用着用着断了一样是「数据库暂时用不了」,各自按自己的规矩说一行;
    cron 的退出码是 3(暂时用不了),不是 2(设置不对):不一律说「连不上」、按设置错误退出。"""
    down = ('数据库暂时用不了(OperationalError: connection failed: connection to server at "127.0.0.1", port 1 failed: '
            "Connection refused)")
    refused_everywhere(lab, "postgresql://postgres@127.0.0.1:1/nowhere", unavailable_everywhere(down))


def unavailable_everywhere(said: str) -> list[tuple[int, str]]:
    """PROGRAMS 各自在「数据库暂时用不了(…)」(said)后面接的话和退出码。"""
    return [(1, f"{said},这一轮停下,下次再跑"),
            (1, f"{said},稍后再运行 uv run python store.py(已经建好的不会重建)"),
            (3, f"{said},没有出日报,稍后再跑"),
            (1, f"{said},这次没有做完;稍后再试,做到一半的下次运行 inbox.py 时会按 checkpoint 更正"),
            (1, f"{said},这一轮一封都没有处理,稍后再跑")]


def full_disk_under(what: str, path: str) -> str:
    return f"数据库暂时用不了(OperationalError: disk I/O error:{what} {path} 所在的磁盘满了或者出错了)"


def test_a_full_disk_under_the_events_database_is_temporary_not_a_setting_error_and_loses_nothing(lab):
    """事件库所在的磁盘满了(FULL_DISK):和 PostgreSQL 没开着一样是「数据库暂时用不了」,说是哪个库;不说成「事件库
    打不开:EVENTS_DB=…(disk I/O error)」、按设置不对退出(邮件轮询、cron 是 2),叫人去查一项没写错的设置。
    事件原样留在队列里,邮件没有建工单,腾出空间后照常。"""
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    tickets = rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"])
    store_sqlite.close_connections()  # 别的进程开着这个库时 -shm 已经在了,打开它用不着写;这里要的是一打开就得写
    full = full_disk_under("事件库", lab["EVENTS_DB"])
    for command, (code, message) in zip(PROGRAMS, unavailable_everywhere(full), strict=True):
        r = run([*FULL_DISK, *command], lab)
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message + "\n"), command
    r = run([*FULL_DISK, "uvicorn", "webhook:app", "--port", "0"], lab, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == refused_startup(r, f"{full},webhook 没有启动:数据库能连上以后再启动")
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]
    assert rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"]) == tickets
    r = cli(["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], lab)  # 腾出空间之后:同一封信照常收下
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.endswith("本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n")


def test_a_new_events_database_someone_keeps_locked_is_temporary_not_a_setting_error(lab, tmp_path):
    """有人开着事务占着一个还不是 WAL 的事件库(新库;或者课文建的库,有人在 sqlite3 里改了东西没提交):换日志模式那一下
    等到 BUSY_TIMEOUT_S 也等不到。这是「数据库暂时用不了」,说是哪个库被占着,不说成「事件库打不开:EVENTS_DB=…
    (database is locked)」、按设置不对退出;没有建表,邮件没有建工单,锁放开后照常。"""
    path = tmp_path / "new-ambient.db"  # lab 的事件库已经是 WAL 了
    env = {**lab, "EVENTS_DB": str(path), "BUSY_TIMEOUT_S": "0.3"}
    tickets = rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"])
    locked = f"数据库暂时用不了(OperationalError: database is locked:事件库 {path} 被别的程序占着太久)"
    with write_locked(path):
        for command, (code, message) in zip(PROGRAMS, unavailable_everywhere(locked), strict=True):
            r = cli(command, env)
            assert (r.returncode, r.stdout, r.stderr) == (code, "", message + "\n"), command
    assert rows("SELECT name FROM sqlite_master", path=path) == []
    assert rows("SELECT COUNT(*) FROM tickets", path=lab["BIZ_DB"]) == tickets
    r = cli(["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.endswith("本次收取 1 封:新工单 1,重复 0,跳过 0,无法解析 0,存储失败 0\n")


def test_a_read_only_events_database_says_what_to_check_and_loses_nothing(lab):
    """事件库文件只能读(别的用户建的、权限 444、只读的文件系统):SQLite 退回只读打开,写的时候才说
    attempt to write a readonly database。这句英文后面接着说要查什么。以 root 跑测试时权限拦不住,
    用 chattr +i(不可改)造一个连 root 都写不了的文件。事件和邮件都原样留着。"""
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    store_sqlite.close_connections()
    said = ("数据库暂时用不了(OperationalError: attempt to write a readonly database:库文件只能读:查一下它的写权限、"
            "是不是在只读的文件系统上、有没有被 chattr +i 锁住)")
    subprocess.run(["chattr", "+i", lab["EVENTS_DB"]], check=True)
    try:
        worker = cli(["worker.py", "--once"], lab)
        scan = cli(["cron_jobs.py", "scan"], lab)
        mail = cli(["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], lab)
        reading = [cli(command, lab) for command in (["cron_jobs.py", "report"], ["inbox.py", "list"], ["store.py"])]
    finally:
        subprocess.run(["chattr", "-i", lab["EVENTS_DB"]], check=True)
    assert (worker.returncode, worker.stdout, worker.stderr) == (1, "", f"{said},这一轮停下,下次再跑\n")
    assert (scan.returncode, scan.stdout, scan.stderr) == (
        3, "", f"{said},scan 没有做完,稍后再跑(同一天重跑不会重复入队)\n")
    assert (mail.returncode, mail.stdout, mail.stderr) == (
        1, "本次收取 1 封:新工单 0,重复 0,跳过 0,无法解析 0,存储失败 1\n",
        f"存储失败,修好后重跑这条命令,已经存好的会显示 duplicate:{said}  samples/01_utf8_plain.eml\n")
    assert [(r.returncode, r.stderr) for r in reading] == [(0, "")] * 3  # 只读的操作照常能用
    assert "队列深度:1 个事件等 worker 处理(pending)\n" in reading[0].stdout
    assert reading[1].stdout == "收件箱是空的\n"
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]


def test_a_full_disk_under_the_checkpoint_database_is_temporary_and_the_reply_is_not_lost(lab):
    """事件库开着(这个测试进程拿着它:-shm 已经在了,别的进程打开它用不着写),checkpoint 库却要写才打得开。
    这是「数据库暂时用不了」,不说成「checkpoint 库打不开:CHECKPOINTS_DB=…(disk I/O error)」(那样常驻的 worker
    当设置不对退出):待办还在收件箱里,发件箱是空的;腾出空间后 accept 照常,回复只发一次。"""
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    assert cli(["worker.py", "--once"], lab).returncode == 0
    full = full_disk_under("checkpoint 库", lab["CHECKPOINTS_DB"])
    r = run([*FULL_DISK, "inbox.py", "accept", "T1012"], lab)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"{full},这次没有做完;稍后再试,做到一半的下次运行 inbox.py "
                                                         "时会按 checkpoint 更正\n")
    store.add_event("evt_T1041_created", "webhook", "ticket.created",
                    '{"id": "evt_T1041_created", "type": "ticket.created", "data": {"ticket_id": "T1041"}}')
    r = run([*FULL_DISK, "worker.py", "--once"], lab)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"{full},这一轮停下,下次再跑\n")
    assert rows("SELECT event_id, status, attempts FROM events ORDER BY event_id") == [
        ("evt_T1012_created", "waiting_human", 1), ("evt_T1041_created", "pending", 0)]
    assert rows("SELECT COUNT(*) FROM outbox") == [(0,)]
    r = cli(["inbox.py", "accept", "T1012"], lab)
    assert (r.returncode, r.stderr) == (0, "")
    assert rows("SELECT ticket_id FROM outbox") == [("T1012",)]


@pytest.mark.parametrize("setting, where, reason", [
    ("EVENTS_DB", "missing/ambient.db", "目录 {dir} 不存在"),
    ("EVENTS_DB", ".", "这是一个目录,不是文件"),
    ("CHECKPOINTS_DB", "missing/checkpoints.db", "目录 {dir} 不存在"),
    # 下面两种也一样说清楚,不是 traceback(名字太长时连「在不在」都问不了)或只有 sqlite3 的 unable to open database file。
    # /proc/1 像只读的文件系统:测试以 root 运行,权限挡不住,它照样不能写
    ("EVENTS_DB", "x" * 300 + ".db", "File name too long"),
    ("EVENTS_DB", "/proc/1/ambient.db", "目录 {dir} 不能写:没有写权限,或者在只读的文件系统上"),
    ("CHECKPOINTS_DB", "/proc/1/checkpoints.db", "目录 {dir} 不能写:没有写权限,或者在只读的文件系统上"),
])
def test_a_database_path_that_cannot_be_opened_names_the_setting_and_changes_nothing(lab, tmp_path, setting, where,
                                                                                     reason):
    """一行说是哪个库、哪一项设置、为什么打不开,不是 sqlite3 的 traceback(unable to open database file)。"""
    path = (tmp_path / where).resolve()
    what = "事件库" if setting == "EVENTS_DB" else "checkpoint 库"
    message = f"{what}打不开:{setting}={path}({reason.format(dir=path.parent)})\n"
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    commands = [(["worker.py", "--once"], 1), (["inbox.py", "list"], 1)]
    if setting == "EVENTS_DB":  # 这几个不碰 checkpoint
        commands += [(["store.py"], 1), (["cron_jobs.py", "report"], 2),
                     (["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], 2)]
    for command, code in commands:
        r = cli(command, {**lab, setting: str(path)})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message), command
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("setting", ["EVENTS_DB", "CHECKPOINTS_DB", "BIZ_DB"])
def test_a_database_path_that_is_a_symlink_loop_is_a_setting_error_and_changes_nothing(lab, tmp_path, setting):
    """库的路径是绕成圈的符号链接:每个程序都当设置不对,一行说是哪一项,不是 pathlib 的 RuntimeError: Symlink loop
    的 traceback。"""
    loop = tmp_path / "loop.db"
    loop.symlink_to(loop)
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    message = f"配置错误:{setting}={str(loop)!r} 是绕成圈的符号链接(指来指去又回到自己),指不到文件\n"
    commands = [(["worker.py", "--once"], 1)]
    if setting != "CHECKPOINTS_DB":  # 这几个不碰 checkpoint;收件箱是空的时 list 只看事件库
        commands += [(["store.py"], 1), (["cron_jobs.py", "scan"], 2)]
    if setting == "EVENTS_DB":
        commands += [(["inbox.py", "list"], 1)]
    for command, code in commands:
        r = cli(command, {**lab, setting: str(loop)})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message), command
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]
    assert loop.is_symlink()


@pytest.mark.parametrize("setting", ["EVENTS_DB", "CHECKPOINTS_DB"])
def test_an_events_or_checkpoint_database_that_is_not_sqlite_is_named_and_left_as_it_was(lab, tmp_path, setting):
    """EVENTS_DB、CHECKPOINTS_DB 指到了不是数据库的文件:一行说是哪个库、哪一项,文件原样不动;不是 sqlite3 的
    traceback(file is not a database)。"""
    notes = tmp_path / "notes.txt"
    notes.write_text("我的笔记,别动\n", encoding="utf-8")
    what = "事件库" if setting == "EVENTS_DB" else "checkpoint 库"
    message = f"{what}打不开:{setting}={notes}(这个文件不是 SQLite 数据库,指错了文件?)\n"
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    commands = [(["worker.py", "--once"], 1), (["inbox.py", "list"], 1)]
    if setting == "EVENTS_DB":
        commands += [(["store.py"], 1), (["cron_jobs.py", "report"], 2),
                     (["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], 2)]
    for command, code in commands:
        r = cli(command, {**lab, setting: str(notes)})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", message), command
    assert notes.read_text(encoding="utf-8") == "我的笔记,别动\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("notes")] == ["notes.txt"]  # 旁边没多出 -wal、-shm
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]


def test_a_business_database_that_is_not_sqlite_is_refused_by_every_command_and_left_as_it_was(lab, tmp_path):
    """BIZ_DB 指到了一个不是数据库的文件(比如手滑指到了笔记):每个要用业务库的命令都说清楚、什么都不做,
    store.py 也不在它上面新建业务库。"""
    notes = tmp_path / "notes.txt"
    notes.write_text("我的笔记,别动\n", encoding="utf-8")
    store.add_event("evt_T1012_created", "webhook", "ticket.created",
                    '{"id": "evt_T1012_created", "type": "ticket.created", "data": {"ticket_id": "T1012"}}')
    problem = f"业务库打不开:BIZ_DB={notes}(这个文件不是 SQLite 数据库,指错了文件?)"
    for command, code, stderr in (  # store.py 也不叫人删掉它:那是笔记
            (["store.py"], 2, f"{problem}。没有动它:让 BIZ_DB 指到业务库(不设就是脚本旁边的 cloudledger.db)\n"),
            (["worker.py", "--once"], 1, problem + "\n"),
            (["email_poller.py", "--eml", "samples/01_utf8_plain.eml"], 2, problem + "\n"),
            (["cron_jobs.py", "scan"], 2, problem + "\n")):
        r = cli(command, {**lab, "BIZ_DB": str(notes)})
        assert (r.returncode, r.stdout, r.stderr) == (code, "", stderr), command
    assert notes.read_text(encoding="utf-8") == "我的笔记,别动\n"
    assert rows("SELECT event_id, status, attempts FROM events") == [("evt_T1012_created", "pending", 0)]


def into_a_closed_pipe(command: list[str], env: dict) -> tuple[int, str]:
    """把 command 的标准输出接到一个读端已经关掉的管道上(… | head -0,head 先走了),返回 (退出码, 标准错误)。"""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen([sys.executable, *command], cwd=LAB, env=env, stdout=write_end, stderr=subprocess.PIPE,
                                text=True)
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("command", [["cron_jobs.py", "report"], ["store.py"], ["worker.py", "--once"]])
def test_output_closed_early_exits_141_quietly_and_loses_nothing(lab, command):
    """cron_jobs.py report | head -1 之类:和 inbox.py 一样安静退出,退出码 141,不是一段 BrokenPipeError 的
    traceback、退出码 1。worker 每个事件先改好状态再打印:第一个做完了,后面的还在队列里,下次照常领。"""
    from test_worker import said_besides_offline_model

    for ticket in ("T1012", "T1022"):
        store.add_event(f"evt_{ticket}_created", "webhook", "ticket.created",
                        json.dumps({"id": f"evt_{ticket}_created", "type": "ticket.created",
                                    "data": {"ticket_id": ticket}}))
    code, err = into_a_closed_pipe(command, lab)
    assert (code, said_besides_offline_model(err)) == (141, [])
    done = [("evt_T1012_created", "waiting_human", 1)] if command[0] == "worker.py" else [("evt_T1012_created", "pending", 0)]
    assert rows("SELECT event_id, status, attempts FROM events ORDER BY event_id") == \
        done + [("evt_T1022_created", "pending", 0)]


def test_ctrl_c_that_a_program_does_not_handle_itself_is_one_line_and_exit_130(capsys):
    """config.run() 是 store.py、cron_jobs.py、email_poller.py、worker.py、inbox.py、demo.py、send_webhook.py 的入口:main() 没有接住的
    Ctrl-C 只说一行「已中断(Ctrl-C)」、退出码 130,不是 KeyboardInterrupt 的 traceback。"""
    def pressed():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stopped:
        config.run(pressed)
    assert (stopped.value.code, capsys.readouterr()) == (130, ("", "已中断(Ctrl-C)\n"))


@pytest.mark.parametrize("program", ["worker.py", "cron_jobs.py", "email_poller.py"])
def test_help_of_every_argparse_program_is_chinese_and_does_nothing(lab, tmp_path, program):
    fresh = tmp_path / "fresh-events.db"
    r = run([program, "--help"], {**lab, "EVENTS_DB": str(fresh)})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.startswith(f"用法:{program} [-h]")
    assert "\n选项:\n  -h, --help " in r.stdout and "显示这段说明并退出" in r.stdout
    assert not re.search(r"usage|options|show this help", r.stdout)
    assert not fresh.exists()


def test_an_argparse_message_without_a_translation_is_kept_whole(capsys):
    import config
    parser = config.ArgumentParser(prog="x.py")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--a", action="store_true")
    group.add_argument("--b", action="store_true")
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--a", "--b"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "用法:x.py [-h] [--a | --b]\nx.py:错误:argument --b: not allowed with argument --a\n"
