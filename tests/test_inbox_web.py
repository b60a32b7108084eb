"""收件箱网页的 HTTP 一面:列表和工单页、四种处理走 inbox.resume()、409 / 404 / 400 / 413 / 422、Agent Inbox 的接口、
门(本机、登录、别的网站)。真的 uvicorn、真的 HTTP(conftest.serving);浏览器里的点击见 test_inbox_web_browser.py。"""
import base64
import json
import re
import subprocess
import sys
from html import unescape

import httpx
import pytest
from fastapi.testclient import TestClient
from conftest import LAB, cli, free_port, rows, serving
from test_inbox import everything, queue, state

import inbox_seen
import inbox_web
import inbox_web_access
import store
from agent import opened_graph, thread_of

EDITED = "您好,发票已经按新抬头重开,请查收邮箱。"


@pytest.fixture
def web(any_lab):
    """课文的四张工单等在收件箱里(T1010 是通知主管的),网页开在一个随机端口上;返回 httpx 客户端。"""
    queue("T1012", "T1041", "T1003", "T1010")
    with serving(inbox_web.app) as url, httpx.Client(base_url=url, timeout=30) as client:
        client.lab = any_lab  # 命令行收件箱(cli)用同一套库
        yield client


def fingerprint(ticket_id: str) -> str:
    with opened_graph() as graph:
        return inbox_seen.item_fingerprint(graph.get_state(thread_of(ticket_id)).interrupts[0].value)


def post(client, ticket_id: str, action: str, text: str | None = None, shown: str | None = "current", **headers):
    form = {"action": action, **({"text": text} if text is not None else {})}
    if shown:
        form["draft_fingerprint"] = fingerprint(ticket_id) if shown == "current" else shown
    return client.post(f"/tickets/{ticket_id}", data=form, headers=headers)


def error_of(r: httpx.Response) -> str:
    """错误页上给人看的那一句。"""
    return r.text.split('id="error">', 1)[1].split("</p>", 1)[0]


def test_the_list_shows_the_count_and_one_row_per_item_oldest_first_with_the_notice_badge(web):
    r = web.get("/")
    assert r.status_code == 200
    assert "<title>待处理 4 · CloudLedger 收件箱</title>" in r.text
    assert [part.split('"')[0] for part in r.text.split('data-ticket="')[1:]] == ["T1012", "T1041", "T1003", "T1010"]
    t1010 = r.text.split('data-ticket="T1010"')[1].split("</tr>")[0]
    assert '<span class="badge">通知主管</span>' in t1010 and "工单提到「投诉到」" in t1010


def test_accept_from_a_form_sends_the_draft_records_the_reviewer_and_goes_back_to_the_list(web):
    draft = state("T1012")["draft"]["reply"]
    r = post(web, "T1012", "accept")
    assert (r.status_code, r.headers["location"]) == (303, "/?done=T1012&outcome=sent")
    assert rows("SELECT status FROM events WHERE ticket_id = 'T1012'") == [("done",)]
    assert rows("SELECT ticket_id, body FROM outbox") == [("T1012", draft)]
    assert rows("SELECT ticket_id, action, final, reviewer FROM review_log") == [
        ("T1012", "accept", draft, inbox_seen.viewer())]


def test_a_form_answering_a_draft_that_was_rewritten_meanwhile_gets_409_and_changes_nothing(web):
    shown = fingerprint("T1041")
    assert cli(["inbox.py", "respond", "T1041", "先道歉"], web.lab).returncode == 0  # 命令行先 respond:草稿换了
    before = everything("T1041")
    r = post(web, "T1041", "accept", shown=shown)
    assert r.status_code == 409
    assert error_of(r) == "T1041 在你打开页面之后被别人改过(重写了草稿或换了说明),这次没有处理;刷新页面看看现在的版本"
    assert everything("T1041") == before and rows("SELECT COUNT(*) FROM outbox") == [(0,)]


def test_a_form_for_an_item_the_cli_decided_meanwhile_gets_409_naming_who_decided(web):
    shown = fingerprint("T1012")
    assert cli(["inbox.py", "ignore", "T1012"], {**web.lab, "INBOX_USER": "bob"}).returncode == 0
    before = everything("T1012")
    r = post(web, "T1012", "accept", shown=shown)
    assert (r.status_code, error_of(r)) == (409, "T1012 已经由 bob 处理了(ignore),这次没有动")
    assert everything("T1012") == before


def test_an_unknown_ticket_gets_404_for_the_page_and_for_an_answer(web):
    page = web.get("/tickets/T7777")
    assert (page.status_code, error_of(page)) == (404, "T7777 不在收件箱里,事件表和 checkpoint 里也没有它")
    before = everything("T1012")
    r = post(web, "T7777", "accept", shown=None)
    assert (r.status_code, error_of(r)) == (404, "T7777 不在收件箱里(已经处理过,或者还没轮到 worker)")
    assert everything("T1012") == before


@pytest.mark.parametrize("action, text, status, message", [
    ("edit", "   ", 400, "edit 要填改好的回复全文,不能是空的;什么都没有改"),
    ("respond", "", 400, "respond 要填给 Agent 的意见,不能是空的;什么都没有改"),
    ("edit", "长" * 2001, 413, "edit 的文字有 2001 个字,最多 2000 个(INBOX_MAX_TEXT_CHARS);什么都没有改"),
    ("edit", "您好\x1b[2J", 400, "edit 的文字里有控制字符 \\x1b,客户那边看到的会是乱码;删掉再试"),
    ("approve", None, 400, "不认识的处理:&#39;approve&#39;,只能是 accept / edit / respond / ignore"),
])
def test_bad_text_or_action_gets_a_clear_status_and_changes_nothing(web, action, text, status, message):
    before = everything("T1041")
    r = post(web, "T1041", action, text)
    assert (r.status_code, error_of(r)) == (status, message)
    assert everything("T1041") == before


def test_an_action_the_item_does_not_allow_gets_400_and_changes_nothing(web):
    before = everything("T1010")
    r = post(web, "T1010", "edit", "照样发")
    assert r.status_code == 400
    assert error_of(r) == "T1010 是通知类待办,Agent 没有起草回复,不能 edit;只能 ignore(看过即可)"
    assert everything("T1010") == before
    assert 'data-action="ignore"' in web.get("/tickets/T1010").text
    assert 'data-action="accept"' not in web.get("/tickets/T1010").text


def test_a_finished_ticket_page_shows_the_decision_the_reviewer_and_a_word_diff(web):
    first = state("T1012")["draft"]["reply"]
    assert cli(["inbox.py", "edit", "T1012", EDITED], {**web.lab, "INBOX_USER": "carol"}).returncode == 0
    page = web.get("/tickets/T1012").text
    decision = page.split('id="decision">')[1].split("</section>")[0]
    (decided,) = rows("SELECT created_at FROM review_log")[0]
    assert f"<b>edit</b> · carol · {decided}" in decision
    diff = decision.split('id="diff">')[1].split("</p>")[0]
    assert diff.startswith("您好,<del>")  # 两版开头相同的「您好,」不标
    assert text_of(re.sub(r"<ins>.*?</ins>", "", diff)) == first  # 去掉加的就是第一版
    assert text_of(re.sub(r"<del>.*?</del>", "", diff)) == EDITED  # 去掉删的就是发出的
    assert "data-action=" not in page


def text_of(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", html))


def test_history_lists_recent_decisions_with_reviewer_and_whether_the_text_changed(web):
    assert cli(["inbox.py", "edit", "T1012", EDITED], {**web.lab, "INBOX_USER": "dan"}).returncode == 0
    assert post(web, "T1003", "ignore").status_code == 303
    page = web.get("/history").text
    table = [[text_of(cell).strip() for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
             for row in re.findall(r"<tr data-ticket=.*?</tr>", page, re.S)]
    when = dict(rows("SELECT ticket_id, created_at FROM review_log"))
    assert table == [["T1003", "ignore", inbox_seen.viewer(), str(when["T1003"]), "没改"],
                     ["T1012", "edit", "dan", str(when["T1012"]), "改过"]]


def test_the_api_lists_items_as_human_interrupts(web):
    r = web.get("/api/inbox")
    assert r.status_code == 200
    items = r.json()
    assert [(i["ticket_id"], i["event_id"]) for i in items] == [(t, f"evt_{t}_created") for t in
                                                                ("T1012", "T1041", "T1003", "T1010")]
    with opened_graph() as graph:
        assert [i["interrupt"] for i in items] == [graph.get_state(thread_of(i["ticket_id"])).interrupts[0].value
                                                   for i in items]
    assert [store.parse_time(i["waiting_since"]) for i in items] == [
        store.parse_time(w) for w, in rows("SELECT waiting_since FROM events ORDER BY received_at, event_id")]


def test_an_edit_posted_as_agent_inbox_would_sends_the_edited_text(web):
    item = web.get("/api/inbox").json()[0]["interrupt"]
    answer = {"type": "edit", "args": {**item["action_request"], "args": {**item["action_request"]["args"],
                                                                         "reply": EDITED}}}
    r = web.post("/api/tickets/T1012", json=answer)
    assert (r.status_code, r.json()) == (200, {"ticket_id": "T1012", "outcome": "sent", "new_draft": None, "note": None,
                                            "answered": False})
    assert rows("SELECT ticket_id, body FROM outbox") == [("T1012", EDITED)]
    assert rows("SELECT action, final, reviewer FROM review_log") == [("edit", EDITED, inbox_seen.viewer())]


def test_a_response_posted_as_agent_inbox_would_redrafts_and_keeps_the_item(web):
    r = web.post("/api/tickets/T1041", json={"type": "response", "args": "语气再软一点,先道歉"})
    assert r.status_code == 200 and r.json()["outcome"] is None
    assert r.json()["new_draft"] == state("T1041")["draft"]["reply"]
    assert state("T1041")["feedback"] == ["语气再软一点,先道歉"]
    assert rows("SELECT status FROM events WHERE ticket_id = 'T1041'") == [("waiting_human",)]


@pytest.mark.parametrize("body", [
    {"type": "approve"}, {"args": "x"}, "accept", [1, 2],
])
def test_a_malformed_api_body_gets_422_and_changes_nothing(web, body):
    before = everything("T1012")
    r = web.post("/api/tickets/T1012", json=body)
    assert r.status_code == 422 and r.json()["detail"]
    assert everything("T1012") == before


def test_an_api_answer_with_a_stale_if_match_gets_409(web):
    before = everything("T1012")
    r = web.post("/api/tickets/T1012", json={"type": "accept"}, headers={"If-Match": "0" * 64})
    assert r.status_code == 409 and r.json()["detail"].startswith("T1012 在你打开页面之后被别人改过")
    assert everything("T1012") == before


def test_an_api_edit_without_a_reply_gets_400_and_changes_nothing(web):
    before = everything("T1012")
    r = web.post("/api/tickets/T1012", json={"type": "edit", "args": {"action": "send_reply", "args": {}}})
    assert (r.status_code, r.json()) == (400, {"detail": "edit 要填改好的回复全文,不能是空的;什么都没有改"})
    assert everything("T1012") == before


@pytest.mark.parametrize("headers, message", [
    ({"Origin": "http://evil.example"}, "别的网站(http://evil.example)发来的请求不能改收件箱,什么都没有动"),
    ({"Sec-Fetch-Site": "cross-site"}, "别的网站发来的请求(Sec-Fetch-Site: cross-site)不能改收件箱,什么都没有动"),
])
def test_a_cross_site_post_gets_403_and_changes_nothing(web, headers, message):
    before = everything("T1012")
    r = post(web, "T1012", "accept", **headers)
    assert (r.status_code, error_of(r)) == (403, message)
    assert everything("T1012") == before
    same_site = post(web, "T1012", "accept", Origin=str(web.base_url).rstrip("/"), **{"Sec-Fetch-Site": "same-origin"})
    assert same_site.status_code == 303


def login(name: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


@pytest.mark.parametrize("headers", [{}, login("alice", "wrong"), login("mallory", "pw1"), {"Authorization": "Basic !!"}])
def test_with_users_set_a_missing_or_wrong_login_gets_401_and_changes_nothing(lab, monkeypatch, headers):
    queue("T1012")
    monkeypatch.setenv("INBOX_WEB_USERS", "alice:pw1,bob:pw2")
    before = everything("T1012")
    with serving(inbox_web.app) as url, httpx.Client(base_url=url) as client:
        for r in (client.get("/", headers=headers), client.post("/tickets/T1012", data={"action": "accept"}, headers=headers),
                  client.get("/api/inbox", headers=headers)):
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith('Basic realm="CloudLedger inbox"')
        assert everything("T1012") == before
        ok = client.post("/tickets/T1012", data={"action": "accept"}, headers=login("bob", "pw2"))
    assert ok.status_code == 303
    assert rows("SELECT action, reviewer FROM review_log") == [("accept", "bob")]


def test_without_users_a_client_from_another_machine_gets_403(lab):
    queue("T1012")
    before = everything("T1012")
    inbox_web.app.state.users = {}  # 不走 lifespan:没设 INBOX_WEB_USERS 时它就是这样
    client = TestClient(inbox_web.app, base_url="http://inbox.example", client=("203.0.113.9", 50000))
    try:
        for r in (client.get("/"), client.post("/tickets/T1012", data={"action": "accept"})):
            assert r.status_code == 403
            assert error_of(r) == ("这个收件箱只回答本机的请求(你来自 203.0.113.9);"
                                   "要给同事用,设 INBOX_WEB_USERS 开登录")
    finally:
        inbox_web.state.close()
    assert everything("T1012") == before


def test_more_than_fifty_items_are_paged_and_a_missing_checkpoint_is_listed_with_what_is_wrong(lab):
    from test_inbox import copy_ticket

    copy_ticket("T1012", *[f"X{n:03}" for n in range(55)])
    queue(*[f"X{n:03}" for n in range(55)])
    with opened_graph() as graph:
        graph.checkpointer.delete_thread(thread_of("X054")["configurable"]["thread_id"])
    with serving(inbox_web.app) as url, httpx.Client(base_url=url) as client:
        first, second = client.get("/").text, client.get("/?page=2").text
    assert "<title>待处理 55 · CloudLedger 收件箱</title>" in first and "第 1 / 2 页" in first
    assert first.count("<tr data-ticket=") == 50 and second.count("<tr data-ticket=") == 5
    broken = second.split('data-ticket="X054"')[1].split("</tr>")[0]
    assert "checkpoint 库里找不到:多半指错了库;库确实丢了就运行 uv run python inbox.py restart X054" in broken


def inbox_web_process(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "uvicorn", "inbox_web:app", "--port", str(free_port())], cwd=LAB,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_server_says_on_start_that_it_wants_a_login(lab):
    """起服务时的那一行(进程本身是要测的:控制台)。"""
    proc = inbox_web_process({**lab, "INBOX_WEB_USERS": "alice:pw1,bob:pw2"})
    try:
        assert proc.stdout.readline() == "收件箱网页:要登录(HTTP Basic,INBOX_WEB_USERS 里 2 个账号:alice、bob)\n"
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_the_server_refuses_to_start_on_a_malformed_users_setting_and_says_which_part(lab):
    proc = inbox_web_process({**lab, "INBOX_WEB_USERS": "alice:pw1,bob"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and out == ""
    assert "配置错误:INBOX_WEB_USERS 的「bob:…」这一段要写成 名字:密码(逗号隔开几个人)" in err
    assert rows("SELECT COUNT(*) FROM events") == [(0,)]


def test_with_max_redrafts_used_up_the_page_has_no_respond_button_and_a_respond_gets_400(lab, monkeypatch):
    """MAX_REDRAFTS 和命令行一样算:起草时是 0,这条待办就不能 respond,页面上没有那个按钮,硬交也是 400。"""
    monkeypatch.setenv("MAX_REDRAFTS", "0")
    queue("T1041")
    before = everything("T1041")
    with serving(inbox_web.app) as url, httpx.Client(base_url=url) as client:
        page = client.get("/tickets/T1041").text
        r = post(client, "T1041", "respond", "先道歉")
    assert re.findall(r'<form [^>]*data-action="(\w+)"', page) == ["accept", "edit", "ignore"]
    assert (r.status_code, error_of(r)) == (400, "T1041 起草时 MAX_REDRAFTS=0,没有按意见重写这一项,不能 respond;"
                                                 "现在可以:accept / edit / ignore")
    assert everything("T1041") == before


def test_a_question_item_shows_its_candidates_as_choices_and_a_chosen_one_is_the_answer(lab):
    """提问类待办(agent_question.py):列表里标「提问」,工单页上每张候选一个选项;点一张、交 respond,Agent 照它起草,
    之后是普通的审核待办,accept 发出点名这张发票的回复。accept 不能直接用在提问上(400)。"""
    queue("T1042")
    with serving(inbox_web.app) as url, httpx.Client(base_url=url) as client:
        listing = client.get("/").text.split('data-ticket="T1042"')[1].split("</tr>")[0]
        page = client.get("/tickets/T1042").text
        refused = post(client, "T1042", "accept")
        before = everything("T1042")
        answered = client.post("/tickets/T1042", data={"action": "respond", "choice": "INV-2026-0121", "text": "",
                                                      "draft_fingerprint": fingerprint("T1042")})
        redrafted = client.get(answered.headers["location"]).text
        sent = post(client, "T1042", "accept")
    assert '<span class="badge">提问</span>' in listing
    assert re.findall(r'name="choice" value="([\w-]+)"', page) == ["INV-2026-0121", "INV-2026-0120", "INV-2026-0119"]
    assert re.findall(r'<form [^>]*data-action="(\w+)"', page) == ["respond", "ignore"]
    assert refused.status_code == 400 and before[1:3] == ([], [])  # 发件箱、review_log 都还是空的
    assert (answered.status_code, answered.headers["location"]) == (303, "/tickets/T1042?redrafted=2")
    assert "已按回答起草,下面是草稿" in redrafted and "问答 1" in redrafted
    assert sent.status_code == 303
    (body,), = rows("SELECT body FROM outbox WHERE ticket_id = 'T1042'")
    assert "INV-2026-0121" in body
    assert rows("SELECT action, feedback FROM review_log") == [
        ("accept", json.dumps([state("T1042")["feedback"][0]], ensure_ascii=False))]
    assert state("T1042")["feedback"][0].endswith(" 回答:INV-2026-0121")


@pytest.mark.parametrize("users, message", [
    ("alice:pw1,alice:pw2", "配置错误:INBOX_WEB_USERS 里 alice 出现了两次"),
    (":pw1", "配置错误:INBOX_WEB_USERS 的「…:…」这一段要写成 名字:密码(逗号隔开几个人)"),
    ("bob:", "配置错误:INBOX_WEB_USERS 的「bob:…」这一段要写成 名字:密码(逗号隔开几个人)"),
])
def test_a_malformed_users_setting_names_the_part_that_is_wrong(monkeypatch, users, message):
    monkeypatch.setenv("INBOX_WEB_USERS", users)
    with pytest.raises(SystemExit) as stop:
        inbox_web_access.users()
    assert str(stop.value) == message


def test_a_client_address_that_is_not_an_ip_is_not_taken_for_loopback(lab):
    queue("T1012")
    inbox_web.app.state.users = {}
    client = TestClient(inbox_web.app, client=("localhost.evil.example", 50000))  # 代理没给地址时也可能是名字
    try:
        r = client.get("/")
    finally:
        inbox_web.state.close()
    assert r.status_code == 403


def test_the_list_says_how_long_each_item_has_waited(lab):
    queue("T1012", "T1041", "T1003")
    for ticket_id, minutes in (("T1012", -50 * 60), ("T1041", -3 * 60), ("T1003", -5)):
        rows("UPDATE events SET waiting_since = ? WHERE ticket_id = ? RETURNING 1", (store.minutes_from_now(minutes), ticket_id))
    with serving(inbox_web.app) as url, httpx.Client(base_url=url) as client:
        page = client.get("/").text
    waited = [re.findall(r"<td>(.*?)</td>", row)[-1] for row in re.findall(r"<tr data-ticket=.*?</tr>", page, re.S)]
    assert waited == ["2.1 天", "3.0 小时", "5 分钟"]
