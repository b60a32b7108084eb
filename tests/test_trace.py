"""按工单追踪(agent_trace.py):一张工单的 worker 运行、每轮重写和最后的处理在 Langfuse 里是同一个 session;
模型调用带 token 用量;发出去的都打过码;Langfuse 挂了或很慢时事件照常处理、退出最多多等 2 秒;没设 key 时不导入 langfuse。
Langfuse 由本机的一个 HTTP 接收端代替:SDK 用 OTLP/HTTP 把 span 发到 {LANGFUSE_HOST}/api/public/otel/v1/traces。"""
import base64
import gzip
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import LAB, cli, imported_at_exit, rows, run
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import agent_trace
import store

OFFLINE = ("[llm] 没有设置 LLM_API_KEY,使用离线模型 offline-cloudledger:按关键词分类、按模板起草,不联网、不花钱。"
           "设置 LLM_API_KEY 后自动换成真模型。\n")
TRACE_TROUBLE = "[trace] 追踪出了问题,事件照常处理(这个进程里之后的追踪问题不再说):"


class Receiver:
    """代替 Langfuse 的接收端:记下每个 POST 的路径、头和(解压后的)请求体,回 200。delay 秒:先等这么久再回答。"""

    def __init__(self, delay: float = 0.0):
        self.posts: list[tuple[str, dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                time.sleep(delay)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[dict]:
        """收到的每个 span:name、trace(trace id)和 attrs(属性名 → 值)。"""
        found = []
        for _path, _headers, body in self.posts:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                        found.append({"name": span.name, "trace": span.trace_id.hex(), "attrs": attrs})
        return found


@pytest.fixture
def langfuse(lab, monkeypatch):
    """一个接收端,和指向它的三项设置(测试进程里、lab 的环境变量里都有)。public key 每个测试不同:SDK 按它缓存客户端。"""
    receiver = Receiver()
    keys = {"LANGFUSE_PUBLIC_KEY": f"pk-lf-{receiver.server.server_address[1]}", "LANGFUSE_SECRET_KEY": "sk-lf-test",
            "LANGFUSE_HOST": receiver.url, "INBOX_USER": "zhou"}
    for k, v in keys.items():
        monkeypatch.setenv(k, v)
    lab.update(keys)
    yield receiver
    for client in agent_trace._clients.values():  # 接收端还开着:发完剩下的,测试进程退出时不再等它
        client.shutdown()
    agent_trace._clients.clear()
    receiver.server.shutdown()


def add(ticket_id: str, source: str = "webhook") -> str:
    event_id = f"evt_{ticket_id}_created"
    assert store.add_event(event_id, source, "ticket.created",
                           json.dumps({"id": event_id, "type": "ticket.created", "data": {"ticket_id": ticket_id}}))
    return event_id


def result(r: subprocess.CompletedProcess) -> tuple:
    return r.returncode, r.stdout, r.stderr


def roots(spans: list[dict]) -> list[tuple]:
    """每个 trace 的根(LangGraph 这次运行):(session, user, 事件 id, 来源, 这次运行交给图的是什么),按发出的先后。"""
    return [(s["attrs"].get("session.id"), s["attrs"].get("user.id"),
             json.loads(s["attrs"]["langfuse.trace.metadata.event_id"]),
             json.loads(s["attrs"]["langfuse.trace.metadata.source"]),
             sorted(json.loads(s["attrs"]["langfuse.observation.input"])))
            for s in spans if s["attrs"].get("langfuse.observation.metadata.is_langchain_root") == "true"]


def test_a_tickets_worker_run_redraft_and_accept_are_one_session_with_the_models_token_usage(langfuse, lab):
    add("T1008")
    add("T1022", source="email")
    worker = cli(["worker.py", "--once"], lab)
    assert (worker.returncode, worker.stdout, worker.stderr) == (
        0, "evt_T1008_created → waiting_human\nevt_T1022_created → waiting_human\n", OFFLINE)
    respond = cli(["inbox.py", "respond", "T1008", "先说清楚换绑要准备的材料"], lab)
    assert (respond.returncode, respond.stderr) == (0, OFFLINE)
    for ticket in ("T1008", "T1022"):
        assert result(cli(["inbox.py", "accept", ticket], lab)) == (0, f"{ticket} → sent\n", "")
    assert agent_trace.flush()

    spans = langfuse.spans()
    graph_run, resume = ["kind", "ticket_id"], ["goto", "graph", "resume", "update"]
    assert roots(spans) == [
        ("T1008", None, "evt_T1008_created", "webhook", graph_run),
        ("T1022", None, "evt_T1022_created", "email", graph_run),
        ("T1008", "zhou", "evt_T1008_created", "webhook", resume),  # respond:重写一版,又停在收件箱
        ("T1008", "zhou", "evt_T1008_created", "webhook", resume),
        ("T1022", "zhou", "evt_T1022_created", "email", resume),
    ]
    # 每个 span 都带着它那张工单的 session:Langfuse 里点开 T1008 的 session,三次运行的每一步都在
    by_trace = {}
    for s in spans:
        by_trace.setdefault(s["trace"], set()).add((s["attrs"].get("session.id"), s["attrs"].get("user.id", "")))
    assert sorted(map(sorted, by_trace.values())) == [[("T1008", "")], [("T1008", "zhou")], [("T1008", "zhou")],
                                                      [("T1022", "")], [("T1022", "zhou")]]
    # 模型调用是 generation,带着 token 用量:和 llm_usage(日报算成本用的)记的一样
    usage = [(s["attrs"]["session.id"], s["attrs"]["langfuse.observation.model.name"],
              json.loads(s["attrs"]["langfuse.observation.usage_details"]))
             for s in spans if s["attrs"].get("langfuse.observation.type") == "generation"]
    recorded = rows("SELECT ticket_id, model, input_tokens, output_tokens FROM llm_usage ORDER BY id")
    assert usage == [(t, m, {"input": i, "output": o, "total": i + o}) for t, m, i, o in recorded]
    assert len(usage) == 3  # T1008 起草、重写,T1022 起草
    secret = base64.b64encode(f"{lab['LANGFUSE_PUBLIC_KEY']}:sk-lf-test".encode()).decode()
    assert {(path, headers["authorization"]) for path, headers, _ in langfuse.posts} == {
        ("/api/public/otel/v1/traces", f"Basic {secret}")}


def test_phone_numbers_and_emails_leave_only_masked(langfuse, lab):
    """T1008 的正文里有两个手机号,T1022 有一个邮箱;人 respond 的意见、edit 的回复里也写了号码(edit 的回复是发给客户的原文,
    发件箱里照原样)。发给 Langfuse 的所有内容(属性、名字、说明)里都只有打过码的样子。"""
    add("T1008")
    add("T1022")
    assert cli(["worker.py", "--once"], lab).returncode == 0
    assert cli(["inbox.py", "respond", "T1008", "让客户打 13755556666 找周老师"], lab).returncode == 0
    reply = "您好,发票以后发到 caiwu.xie@example.com,有问题请拨 13755556666 或写信到 kf.zhou@cloudledger.cn。"
    assert result(cli(["inbox.py", "edit", "T1022", reply], lab)) == (0, "T1022 → sent\n", "")
    assert cli(["inbox.py", "accept", "T1008"], lab).returncode == 0
    assert agent_trace.flush()

    exported = b"".join(body for _, _, body in langfuse.posts)
    unmasked = ["13812345678", "13900001111", "caiwu.xie@example.com", "13755556666", "kf.zhou@cloudledger.cn"]
    assert [pii for pii in unmasked if pii.encode() in exported] == []
    texts = [json.dumps(json.loads(v), ensure_ascii=False) if v[:1] in "{[\"" else v
             for s in langfuse.spans() for v in s["attrs"].values() if isinstance(v, str)]
    shown = ["138****5678", "139****1111", "c***@example.com", "137****6666", "k***@cloudledger.cn"]
    assert [m for m in shown if not any(m in t for t in texts)] == []  # 文字确实发出去了,只是打了码
    assert rows("SELECT body FROM outbox WHERE ticket_id = 'T1022'") == [(reply,)]


def free_port() -> int:
    """一个现在没人听的端口:连上去就是 connection refused,像 Langfuse 挂了。"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_workers(*envs: dict) -> list[dict]:
    """同时起几个 worker.py --once(一样的机器负载下比):每个的 to_line(打出事件那一行用了几秒)、after_line(那之后到
    进程退出又用了几秒)和 result。"""
    start, timings = time.monotonic(), [{} for _ in envs]

    def watch(env: dict, timing: dict) -> None:
        proc = subprocess.Popen([sys.executable, "worker.py", "--once"], cwd=LAB, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = proc.stdout.readline()
        printed = time.monotonic()
        out, err = proc.communicate(timeout=60)
        timing.update(to_line=printed - start, after_line=time.monotonic() - printed,
                      result=(proc.returncode, line + out, err))

    watchers = [threading.Thread(target=watch, args=(env, timing)) for env, timing in zip(envs, timings)]
    for w in watchers:
        w.start()
    for w in watchers:
        w.join()
    return timings


@pytest.mark.parametrize("trouble", ["down", "slow"])
def test_a_langfuse_that_is_down_or_slow_neither_fails_the_event_nor_holds_the_worker(lab, tmp_path, monkeypatch,
                                                                                       trouble):
    """连不上(端口没人听)或者很慢(收下请求、10 秒才回答)的 Langfuse:事件照常进收件箱,worker 说一行。和同时在跑、
    Langfuse 好好的另一个 worker 比:打出事件那一行不晚 2 秒以上(导出在后台线程里,不挡着跑图),那之后到退出也最多多等 2 秒。"""
    add("T1012")
    other = {**lab, "EVENTS_DB": str(tmp_path / "other.db"), "CHECKPOINTS_DB": str(tmp_path / "other-checkpoints.db")}
    with monkeypatch.context() as m:  # 另一套事件库,同一张工单
        m.setenv("EVENTS_DB", other["EVENTS_DB"])
        store.init()
        add("T1012")
    healthy, slow = Receiver(), Receiver(delay=10) if trouble == "slow" else None
    keys = {"LANGFUSE_SECRET_KEY": "sk-lf-a"}
    good, bad = timed_workers(
        {**lab, **keys, "LANGFUSE_PUBLIC_KEY": "pk-lf-good", "LANGFUSE_HOST": healthy.url},
        {**other, **keys, "LANGFUSE_PUBLIC_KEY": "pk-lf-bad",
         "LANGFUSE_HOST": slow.url if slow else f"http://127.0.0.1:{free_port()}"})
    assert good["result"] == (0, "evt_T1012_created → waiting_human\n", OFFLINE)
    assert healthy.spans()
    returncode, out, err = bad["result"]
    assert (returncode, out) == (0, "evt_T1012_created → waiting_human\n")
    assert rows("SELECT status FROM events") == rows("SELECT status FROM events", path=other["EVENTS_DB"]) == [
        ("waiting_human",)]
    said = err.removeprefix(OFFLINE + TRACE_TROUBLE)
    if slow:
        assert said == "退出前 1 秒内没把 trace 发完,剩下的不等了\n", err
        assert slow.posts  # 请求确实发出去了,是对面慢
        slow.server.shutdown()
    else:  # 第一次连不上时 OpenTelemetry 的那句(英文),只说一次
        assert said.count("\n") == 1 and "Connection refused" in said, err
    assert bad["to_line"] < good["to_line"] + 2, (bad, good)
    assert bad["after_line"] < good["after_line"] + 2, (bad, good)
    healthy.server.shutdown()


def test_without_the_keys_langfuse_is_not_imported(lab):
    add("T1012")
    at_exit = imported_at_exit("langfuse", "agent_trace")
    r = run([*at_exit, "worker.py", "--once"], lab)
    assert (r.returncode, r.stdout, r.stderr) == (0, "evt_T1012_created → waiting_human\n['agent_trace']\n", OFFLINE)
    r = run([*at_exit, "inbox.py", "accept", "T1012"], lab)
    assert (r.returncode, r.stdout, r.stderr) == (0, "T1012 → sent\n['agent_trace']\n", "")


@pytest.mark.parametrize("given, missing", [
    (["LANGFUSE_PUBLIC_KEY"], "LANGFUSE_SECRET_KEY、LANGFUSE_HOST"),
    (["LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"], "LANGFUSE_HOST"),
    (["LANGFUSE_HOST"], "LANGFUSE_PUBLIC_KEY、LANGFUSE_SECRET_KEY"),
])
def test_only_some_of_the_three_settings_is_a_configuration_error(lab, given, missing):
    """只设了一部分:worker 和收件箱一启动就说缺哪几项,什么都不动。不会以为在追踪其实没有,也不会发到 SDK 默认的云服务。"""
    add("T1012")
    values = {"LANGFUSE_PUBLIC_KEY": "pk-lf-a", "LANGFUSE_SECRET_KEY": "sk-lf-a",
              "LANGFUSE_HOST": "http://127.0.0.1:3000"}
    env = {**lab, **{name: values[name] for name in given}}
    problem = f"配置错误:设了 {'、'.join(given)},还缺 {missing}:追踪要三项都设(都不设就不追踪)\n"
    assert result(cli(["worker.py", "--once"], env)) == (1, "", problem)
    assert result(cli(["inbox.py", "accept", "T1012"], env)) == (1, "", problem)
    assert rows("SELECT status, attempts FROM events") == [("pending", 0)]


def test_masked_walks_what_langchain_and_langgraph_hand_over():
    """mask 收到的是 LangChain 的消息、LangGraph 的 Command、字典和列表:每一段文字都打码,结构留着(Langfuse 照样显示)。"""
    from langchain_core.messages import HumanMessage
    from langgraph.types import Command

    data = {"messages": [HumanMessage("电话 13812345678")], "resume": Command(resume={"args": "a.b@example.com"}), "n": 3}
    out = agent_trace.masked(data=data)
    assert out["messages"][0]["content"] == "电话 138****5678"
    assert out["resume"]["resume"] == {"args": "a***@example.com"}
    assert out["n"] == 3
    assert "13812345678" not in json.dumps(out) and "a.b@example.com" not in json.dumps(out)


def test_error_messages_in_the_trace_are_masked_too(langfuse, lab, monkeypatch):
    """节点出错时 trace 里记着异常的消息(status_message,mask 管不到它):消息里带着的号码也打了码。"""
    add("T1022")
    assert cli(["worker.py", "--once"], lab).returncode == 0

    def broken(ticket_id, body, *_args):
        raise RuntimeError(f"发件箱写不进去:{body}")

    monkeypatch.setattr(store, "record_reply", broken)
    r = cli(["inbox.py", "edit", "T1022", "您好,请拨 13755556666 找我们。"], lab)
    said = "发件箱写不进去:您好,请拨 137****6666 找我们。"
    assert result(r) == (1, "", f"T1022 处理失败(RuntimeError: {said}),已交回 worker 续跑\n")
    assert agent_trace.flush()
    assert b"13755556666" not in b"".join(body for _, _, body in langfuse.posts)  # 属性里、span 的状态说明里都没有
    errors = [(s["name"], s["attrs"]["langfuse.observation.status_message"]) for s in langfuse.spans()
              if s["attrs"].get("langfuse.observation.level") == "ERROR"]
    assert errors == [("send", said), ("LangGraph", said)]


def test_keys_without_the_sdk_installed_say_so_once_and_run_untraced(langfuse, lab, monkeypatch):
    """设了三项、却没装 Langfuse 的 SDK(uv sync 没加 --extra tracing,也不是开发环境):事件照常处理,说一行怎么装。"""
    monkeypatch.setitem(sys.modules, "langfuse", None)  # import langfuse 抛 ImportError,像没装一样
    monkeypatch.setattr(agent_trace, "_complained", threading.Lock())
    add("T1012")
    add("T1041")
    r = cli(["worker.py", "--once"], lab)
    assert result(r) == (0, "evt_T1012_created → waiting_human\nevt_T1041_created → waiting_human\n",
                         TRACE_TROUBLE + "设了 LANGFUSE_* 却没装 Langfuse 的 SDK,不追踪;要追踪先 uv sync --extra tracing\n"
                         + OFFLINE)
    assert agent_trace._clients == {} and langfuse.posts == []
