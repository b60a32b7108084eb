"""一个跑在 127.0.0.1 上的 OpenAI 兼容服务:真 HTTP,真 ChatOpenAI 客户端连它。

只有「模型说的话」是假的(用离线模型的模板写);请求、状态码、延迟、工具调用的格式都是真的。
测试和 bench/ 都用它:能让某个 key 或某个模型返回 401/400/500,能故意慢,能记下收到的每个请求。
"""
import json
import re
import select
import socket
import sys
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # 单独运行(uv run python tests/openai_stub.py)时也找得到 llm.py
from llm_offline import offline_draft  # noqa: E402


REFUSAL = "I'm sorry, I can't help with that."


class OpenAIStub:
    def __init__(self, delay: float = 0.0):
        self.delay = delay                      # 秒;每个请求先等这么久再回答
        self.fail: dict[str, tuple[int, str]] = {}   # 模型名或 "key:<api key>" → (状态码, 错误类型)
        self.fail_times: dict[str, int] = {}    # 同上的键 → 还要失败几次(不在里面就一直失败)
        self.malformed: dict[str, str] = {}     # 模型名 → "text"(不调工具,只回一段话)、"args"(工具参数不合 Draft)、
                                                # "json"(工具参数被截断,不是合法 JSON)、"array"(工具参数是 JSON
                                                # 数组,不是对象)、"refusal"(拒答)或 "empty"(reply 是空白)
        self.multiline = False                  # True:回复草稿分成几行(真模型常这样写)
        self.retry_after: str | None = None     # 失败的回答(fail 里的)带上这个 Retry-After 头(秒)
        self.keepalive: float | None = None     # 秒:像 DeepSeek 忙时那样,先回 200 的头,等 delay 秒的时候每隔这么久
                                                # 发一个空行(请求没超时、连接还活着),最后才发回答
        self.requests: list[dict] = []          # 每个请求:{"model", "body", "headers", "at", "abandoned"}
        self.in_flight: dict[str, list] = defaultdict(list)  # 工单号 → 正在等回答的请求
        self.overlap_pairs: list[tuple] = []    # (先到的, 后到的):同一张工单同时在等回答的两个请求
        self.peak = 0                           # 最多同时有几个请求在等回答(所有工单加起来)
        self.abandoned = 0                      # 客户端在等回答时断开了(worker 被 kill -9)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def overlaps(self) -> list[str]:
        """同一张工单同时有两个活着的起草请求:工单号。两个里有一个后来被放弃了(发它的 worker 被 kill -9)的不算:
        被杀的 worker 在死前刚发出的请求,stub 可能在它死后才读到、才发现断开(机器忙时);这期间活着的 worker 每
        POLL_SECONDS 就把死掉的 worker 手上的事件放回队列、领走、起草,两个请求在 stub 这里重叠了一下,却不是两个
        活着的 worker 在做同一张工单。两个都没被放弃的重叠才是。"""
        return [later["ticket"] for earlier, later in self.overlap_pairs
                if not earlier["abandoned"] and not later["abandoned"]]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _failure_for(self, model: str, key: str) -> tuple[int, str] | None:
        with self.lock:
            for name in (f"key:{key}", model):
                if name in self.fail:
                    left = self.fail_times.get(name)
                    if left is None:
                        return self.fail[name]
                    if left > 0:
                        self.fail_times[name] = left - 1
                        return self.fail[name]
        return None

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # 安静
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                key = self.headers.get("authorization", "").removeprefix("Bearer ")
                prompt = "\n".join(str(m.get("content") or "") for m in body.get("messages", []))
                ticket = (re.search(r"工单 ([A-Za-z0-9_-]+):", prompt) or [None, None])[1]
                request = {"model": body.get("model"), "body": body, "ticket": ticket,
                           "headers": dict(self.headers), "at": time.time(), "abandoned": False}
                with stub.lock:
                    stub.requests.append(request)
                    stub.overlap_pairs += [(other, request) for other in stub.in_flight[ticket]]
                    stub.in_flight[ticket].append(request)
                    stub.peak = max(stub.peak, sum(map(len, stub.in_flight.values())))
                try:
                    if stub.keepalive:
                        return self._keep_alive_then_answer(request, body, key, prompt)
                    if stub.delay and self._client_left(stub.delay):
                        with stub.lock:
                            stub.abandoned += 1
                            request["abandoned"] = True
                        return
                    self._answer(body, key, prompt)
                finally:
                    with stub.lock:
                        stub.in_flight[ticket].remove(request)

            def _client_left(self, seconds: float) -> bool:
                """等 seconds 秒再回答;期间客户端断开(进程被杀,内核关了连接)就返回 True。"""
                deadline = time.time() + seconds
                while (left := deadline - time.time()) > 0:
                    readable, _, _ = select.select([self.connection], [], [], left)
                    if readable:
                        try:
                            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                                return True
                        except OSError:
                            return True
                        time.sleep(min(left, 0.05))  # 有数据但没断开(不该发生):照常等
                return False

            def _keep_alive_then_answer(self, request: dict, body: dict, key: str, prompt: str):
                """先回 200 的头(不带长度,发完就关连接),delay 秒里每 keepalive 秒发一个空行,再发回答的 JSON
                (JSON 前面的空白不影响解析)。客户端中途断开就记下 abandoned。"""
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                ends_at = time.time() + stub.delay
                try:
                    while time.time() < ends_at:
                        self.wfile.write(b"\n")
                        self.wfile.flush()
                        time.sleep(stub.keepalive)
                except OSError:
                    with stub.lock:
                        stub.abandoned += 1
                        request["abandoned"] = True
                    return
                self._answer(body, key, prompt, headers_sent=True)

            def _answer(self, body: dict, key: str, prompt: str, headers_sent: bool = False):
                failure = stub._failure_for(body.get("model", ""), key)
                if failure:
                    status, kind = failure
                    extra = {"retry-after": stub.retry_after} if stub.retry_after else {}
                    return self._send(status, {"error": {"message": f"stub says {kind}", "type": kind, "code": kind}},
                                      extra_headers=extra)
                draft = offline_draft(prompt)
                if stub.multiline:
                    draft = {**draft, "reply": draft["reply"].replace(",", ",\n", 2)}
                tools = body.get("tools") or []
                malformed = stub.malformed.get(body.get("model", ""))
                if malformed == "text":
                    tools = []
                elif malformed == "args":
                    draft = {**draft, "category": "not-a-category"}
                elif malformed == "empty":
                    draft = {**draft, "reply": " \n"}
                arguments = json.dumps(draft, ensure_ascii=False)
                if malformed == "json":
                    arguments = arguments[: len(arguments) // 2]
                elif malformed == "array":  # 合法的 JSON,却不是对象
                    arguments = "[1, 2]"
                message = {"role": "assistant", "content": draft["reply"]}
                if malformed == "refusal":  # OpenAI 的拒答:content 是空的,理由在 refusal 里
                    message, tools = {"role": "assistant", "content": None, "refusal": REFUSAL}, []
                if tools:
                    message = {"role": "assistant", "content": None, "tool_calls": [{
                        "id": "call_stub", "type": "function",
                        "function": {"name": tools[0]["function"]["name"],
                                     "arguments": arguments}}]}
                self._send(200, headers_sent=headers_sent, payload={
                    "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if tools else "stop"}],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": 40, "total_tokens": len(prompt) + 40},
                })

            def _send(self, status: int, payload: dict, headers_sent: bool = False, extra_headers: dict = {}):
                data = json.dumps(payload, ensure_ascii=False).encode()
                if headers_sent:
                    self.wfile.write(data)
                    return
                self.send_response(status)
                for name, value in extra_headers.items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


if __name__ == "__main__":  # 手动试用:uv run python tests/openai_stub.py
    with OpenAIStub() as s:
        print("OpenAI 兼容服务:", s.base_url, flush=True)
        threading.Event().wait()
