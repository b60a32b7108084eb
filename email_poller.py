r"""收一次客服邮箱:已知客户的新邮件变成业务库里的一张工单 + 事件表里的一行,worker 接着处理。

运行:
    uv run python email_poller.py                        # 收一遍 IMAP 邮箱的未读邮件
    uv run python email_poller.py --eml samples/         # 离线:读 .eml 文件或目录(扩展名不分大小写),不连邮箱
    uv run python email_poller.py --eml samples/11_complaint.eml

环境变量(或 .env):IMAP_HOST、IMAP_USER、IMAP_PASSWORD(邮箱的授权码,不是网页登录密码);可选 IMAP_PORT(默认 993,
IMAP_SSL=0 时 143)、IMAP_SSL(默认 1 = SSL 直连并校验证书;0 = 明文,只给本机测试服务器)、IMAP_CAFILE(私有 CA 证书)、
IMAP_MAILBOX(默认 INBOX)、IMAP_TIMEOUT_S(默认 30 秒)。

crontab(每分钟一次;完整的四条见 crontab.example):
    * * * * * cd /ABSOLUTE/PATH/TO/ambient-agents && /ABSOLUTE/PATH/TO/uv run python email_poller.py >> cron.log 2>&1

输出:每封邮件一行「结果  哪封邮件」(UID 或文件名),最后一行汇总(有读取失败、标已读失败时末尾再加这两项):
    M3f9a1c  UID 101                      # 新工单的工单号
    skip: 不是已知客户  UID 102
    duplicate  UID 103                    # 这封之前收过
    本次收取 3 封:新工单 1,重复 1,跳过 1,无法解析 0,存储失败 0

不丢邮件:取信用 BODY.PEEK,工单和事件都提交了才标 \Seen;存不进去、取不到的保持未读,下次再收。事件 id 就是 Message-ID,
工单是 INSERT OR IGNORE,两个库之间崩了,重跑时补上缺的一半。解析不了的信(包括看得出被截断的)在 stderr 说明原因
(原文先打码),标已读并加星标(\Flagged)留给人看。
退出码:0 全部处理好;1 有邮件没处理好(其余照常)或数据库暂时用不了;2 设置或参数不对;3 连不上邮箱、登录失败或中途断线。
"""
import email
import hashlib
import imaplib
import json
import sys
import unicodedata
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import config
import mail_eml
import mail_headers
import mail_imap
import mail_text
import mail_truncated
import store
import store_biz
import store_errors
import store_events
from mail_imap import MailboxError, SetupError

MAX_BODY_CHARS = 2000        # 字;正文只留前这么多(课文的做法),转发链、签名再长也不进模型
MAX_SUBJECT_CHARS = 200      # 字;主题也进模型(工单原文是「主题:正文」),只留前这么多,别让超长主题绕过上一项
TICKET_HASH_LENGTHS = range(6, 41, 2)  # 工单号 M + sha1(Message-ID) 的前 6 位;和别的邮件撞了再加长,直到不撞
EXIT_OK, EXIT_SOME_FAILED, EXIT_CONFIG, EXIT_MAILBOX = 0, 1, 2, 3


class BrokenMail(Exception):
    """这封邮件解析不了(原因说给人听)。重试也不会好。"""


def text_of(msg: Message) -> str:
    """正文:客户自己写的文字。multipart/alternative 里取纯文本那份,没有或是空的取 HTML 转成的纯文本;
    multipart/mixed 里的几段文字(一段话、一张截图、又一段话)按顺序接起来;附件不算。附着的整封邮件(转发的、
    退信里的原信)只在这封信自己一个字都没写时才用;还是没有字,才用带文件名却没标成 attachment 的文字段
    (有的邮件程序把正文写成「inline; filename=note.txt」)。"""
    return ("\n".join(mail_text.texts(msg, inner=False)) or "\n".join(mail_text.texts(msg, inner=True))
            or "\n".join(mail_text.texts(msg, inner=False, named=True)))


def parse(raw: bytes) -> dict:
    """解析一封邮件。解析不了时抛 BrokenMail,说明原因。"""
    try:
        msg = email.message_from_bytes(raw)
        if not msg.keys():
            raise BrokenMail("没有邮件头,不像一封邮件(文件被截断或损坏?)")
        if reason := mail_truncated.cut_short(msg, raw):
            raise BrokenMail(reason)
        address = mail_headers.sender_address(str(msg.get("From") or ""))
        if "@" not in address:
            raise BrokenMail(mail_headers.masked(
                f"找不到发件人地址(From: {mail_text.header_text(msg.get('From'))!r})"))
        # NUL 之类:PostgreSQL 查客户时报错(每次都「存储失败」),SQLite 却说不是已知客户;两种库都当坏信
        if any(unicodedata.category(c) == "Cc" for c in address):
            raise BrokenMail(mail_headers.masked(
                f"发件人地址里有控制字符(From: {mail_text.header_text(msg.get('From'))!r})"))
        return {
            "message_id": mail_headers.mail_event_id(msg, raw),
            "from": address,
            "subject": mail_text.cut(mail_text.header_text(msg.get("Subject")), MAX_SUBJECT_CHARS) or "(无主题)",
            "body": mail_text.cut(text_of(msg), MAX_BODY_CHARS),
        }
    except BrokenMail:
        raise
    except Exception as e:  # noqa: BLE001 —— email 库在怪邮件上抛什么都有可能;一封坏信不能拖垮其余的
        raise BrokenMail(mail_headers.masked(f"{type(e).__name__}: {e}")) from e


def ticket_candidates(message_id: str) -> list[str]:
    digest = hashlib.sha1(message_id.encode()).hexdigest()
    return ["M" + digest[:n] for n in TICKET_HASH_LENGTHS]


def to_event(mail: dict) -> str:
    """已知客户的邮件:建工单、写事件,返回工单号;不是已知客户返回 skip,收过的返回 duplicate。
    先写工单再写事件:两步之间崩了,重跑时 INSERT OR IGNORE 得到同一个工单号,事件这次补上。事件已经在了就不建工单,
    同一个 Message-ID、内容不同的信不会多出一张没有事件的工单(定时扫描过些天会把它当成久未回复入队)。"""
    customer_id = store_biz.customer_by_email(mail["from"])
    if customer_id is None:
        return "skip: 不是已知客户"
    if store_events.event_exists(mail["message_id"]):
        return "duplicate"
    ticket_id = store_biz.add_mail_ticket(ticket_candidates(mail["message_id"]), customer_id,
                                      mail["subject"], mail["body"], store.now()[:10])
    payload = json.dumps({"id": mail["message_id"], "type": "ticket.created", "data": {"ticket_id": ticket_id}})
    return ticket_id if store.add_event(mail["message_id"], "email", "ticket.created", payload) else "duplicate"


@dataclass
class Outcome:
    source: str   # 哪封邮件:「UID 101」或文件路径
    kind: str     # ticket / skip / duplicate / broken / failed / unreadable(没读到这封信:服务器拒绝、文件读不了)
    text: str     # 打印出来的结果:工单号、skip: 不是已知客户、duplicate,或者出错原因
    database_down: bool = False  # 存储失败是因为数据库暂时用不了:后面的邮件这一轮不收了(每封都会白等一遍)
    unmarked: bool = False  # 处理好了,服务器却不让标已读(STORE 回 NO):下次再收到时是 duplicate

    @property
    def handled(self) -> bool:
        """处理完了(可以在邮箱里标已读)。failed、unreadable 的要保持未读,下次再收。"""
        return self.kind not in ("failed", "unreadable")

    @property
    def problem(self) -> bool:
        """要人知道的结果:退出码 1。除了 unmarked(那一行另外说),结果那一行打到 stderr。"""
        return self.kind in ("broken", "failed", "unreadable") or self.unmarked


def report(outcome: Outcome) -> Outcome:
    """打印一封邮件的结果那一行:「结果  哪封邮件」。出了问题的打到 stderr。"""
    print(f"{outcome.text}  {outcome.source}", file=sys.stderr if outcome.problem else sys.stdout, flush=True)
    return outcome


def handle(raw: bytes, source: str, retry: str = "邮件保持未读,下次再收") -> Outcome:
    """一封邮件走完解析和入库,打印一行,返回结果。retry:存储失败时告诉人这封信接下来会怎样。"""
    try:
        mail = parse(raw)
    except BrokenMail as e:
        outcome = Outcome(source, "broken", f"无法解析:{e}")
    else:
        try:
            result = to_event(mail)
        except store_errors.unavailable_errors() as e:  # PostgreSQL 重启、连接被掐断、SQLite 被锁太久
            outcome = Outcome(source, "failed", f"存储失败,{retry}:{store_errors.unavailable(e)}", database_down=True)
        except Exception as e:  # noqa: BLE001 —— 存不进去(磁盘满、表不对):邮件留着下次再收
            outcome = Outcome(source, "failed", f"存储失败,{retry}:{type(e).__name__}: {e}")
        else:
            kind = "skip" if result.startswith("skip") else "duplicate" if result == "duplicate" else "ticket"
            outcome = Outcome(source, kind, result)
    return report(outcome)


def stops_here(outcome: Outcome, left: int, rest: str) -> bool:
    """这封是因为数据库暂时用不了才没存进去的:这一轮到此为止(后面的每封都会白等一遍),说一声剩下的 left 封怎么办。"""
    if outcome.database_down and left:
        print(f"数据库暂时用不了,这一轮停下:剩下的 {left} {rest}", file=sys.stderr, flush=True)
    return outcome.database_down


def poll_mailbox(s: mail_imap.ImapSettings | None = None) -> list[Outcome]:
    """IMAP 模式的 run_once:收一遍未读邮件,返回每封的结果。连不上、登录失败、中途断开抛 MailboxError。"""
    imap = mail_imap.open_mailbox(s or mail_imap.imap_settings())
    done: list[Outcome] = []
    try:
        typ, data = imap.uid("SEARCH", None, "UNSEEN")
        if typ != "OK":
            raise MailboxError(f"搜索未读邮件失败:{mail_imap.server_words(Exception(data[0]))}")
        uids = (data[0] or b"").split()  # 服务器没回 * SEARCH 这一行时 imaplib 给 [None]:当作没有未读邮件
        for i, uid in enumerate(uids):
            source = f"UID {uid.decode()}"
            imap.untagged_responses.pop("FETCH", None)  # 上一封回 NO 时留下的半截回答,别算到这一封头上
            typ, fetched = imap.uid("FETCH", uid, "(BODY.PEEK[])")  # PEEK:取信不改已读状态
            if typ != "OK":  # 服务器拒绝交出这一封(不是断线):不标已读,下次再收,其他的照常
                done.append(report(Outcome(source, "unreadable", "取信失败,邮件保持未读,下次再收:"
                                                                 f"{mail_imap.server_words(Exception(fetched[0]))}")))
                continue
            raw = mail_imap.fetched_bytes(fetched, uid)
            if raw is None:
                if mail_imap.answered_without_body(fetched, uid):  # 说一声:悄悄跳过的话,它每次都被跳过
                    done.append(report(Outcome(source, "unreadable", "取信失败,邮件保持未读,下次再收:"
                                                                     "服务器回答了这一封,却没有给出信的内容")))
                continue  # 回答里根本没有这一封:这期间被别的客户端删了
            outcome = handle(raw, source)
            done.append(outcome)
            if stops_here(outcome, len(uids) - i - 1, "封这次不收,保持未读,下次再收"):
                break
            if outcome.handled:  # 工单和事件都提交了(或确定跳过、重复、坏信)才标已读
                flags = r"(\Seen \Flagged)" if outcome.kind == "broken" else r"(\Seen)"
                typ, answer = imap.uid("STORE", uid, "+FLAGS", flags)
                if typ != "OK":  # 这一封标不上(不是断线):说一声,后面的信照常收
                    outcome.unmarked = True
                    print(f"{source} 已处理,但标已读失败:{mail_imap.server_words(Exception(answer[0]))};"
                          "下次会再收到它,不会重复建工单", file=sys.stderr, flush=True)
    except BrokenPipeError:  # 标准输出的读端关了(… | head),不是邮箱断线(那是 IMAP4.abort)
        raise  # 交给 config.run():和 --eml 一样退出码 141
    except (imaplib.IMAP4.error, OSError) as e:
        raise MailboxError(f"收信中途出错:{mail_imap.server_words(e)};"
                           f"已处理 {len(done)} 封,没标已读的下次再收") from e
    finally:
        mail_imap.close_quietly(imap)
    return done


def summary(outcomes: list[Outcome]) -> str:
    n = {k: sum(o.kind == k for o in outcomes)
         for k in ("ticket", "duplicate", "skip", "broken", "failed", "unreadable")}
    line = (f"本次收取 {len(outcomes)} 封:新工单 {n['ticket']},重复 {n['duplicate']},跳过 {n['skip']},"
            f"无法解析 {n['broken']},存储失败 {n['failed']}")
    if n["unreadable"]:  # 这两项少见,没有时不占地方
        line += f",读取失败 {n['unreadable']}"
    if unmarked := sum(o.unmarked for o in outcomes):
        line += f",标已读失败 {unmarked}"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = config.ArgumentParser(description="收一次客服邮箱(或离线读 .eml),新邮件变成工单 + 事件")
    # extend:--eml 写了两次时,两次给的都读
    parser.add_argument("--eml", nargs="+", action="extend", metavar="FILE|DIR",
                        help="离线模式:读这些 .eml 文件或目录,不连邮箱")
    args = parser.parse_args(argv)
    try:
        files = mail_eml.eml_files(args.eml) if args.eml else None
        settings = None if files else mail_imap.imap_settings()
        if problem := store_biz.biz_db_problem():
            raise SetupError(problem)
        store.init()
        outcomes = store_files(files) if files else poll_mailbox(settings)
    except SetupError as e:
        print(e, file=sys.stderr)
        return EXIT_CONFIG
    except SystemExit as e:  # config.number / integer 读到不是数字的设置
        if not isinstance(e.code, str):
            raise
        print(e.code, file=sys.stderr)
        return EXIT_CONFIG
    except MailboxError as e:
        print(e, file=sys.stderr)
        return EXIT_MAILBOX
    except store_errors.unavailable_errors() as e:  # 还没开始收信(建表时)就用不了;收信途中的在 handle() 里
        print(f"{store_errors.unavailable(e)},这一轮一封都没有处理,稍后再跑", file=sys.stderr)
        return EXIT_SOME_FAILED
    print(summary(outcomes), flush=True)
    return EXIT_SOME_FAILED if any(o.problem for o in outcomes) else EXIT_OK


# ---- 练习 5:通知 notify_supervisor ----
# 练习 5 要「用邮件离线测试的方法」造一封投诉邮件,就是这里的 --eml;判断「通知」的是 agent.py 的 draft 节点:
#   uv run python email_poller.py --eml samples/11_complaint.eml
def store_files(files: list[Path]) -> list[Outcome]:
    """离线模式的 run_once:每个 .eml 走和 IMAP 邮件一样的 handle()。读不了的文件说一声,其余照常。"""
    done: list[Outcome] = []
    for i, f in enumerate(files):
        try:
            raw = f.read_bytes()
        except OSError as e:  # 存在但读不了:没有权限、磁盘 I/O 错误
            why = f"{e.strerror or e}{mail_eml.link_note(f) if mail_eml.dangling(f) else ''}"
            done.append(report(Outcome(mail_eml.shown(f), "unreadable",
                                       f"读不了这个文件,修好后重跑这条命令:{why}")))
            continue
        done.append(handle(raw, mail_eml.shown(f), retry="修好后重跑这条命令,已经存好的会显示 duplicate"))
        if stops_here(done[-1], len(files) - i - 1, "个文件没有处理,修好后重跑这条命令"):
            break
    return done


if __name__ == "__main__":
    config.run(main, sys.argv[1:])  # … | head 提前关掉输出:退出码 141;Ctrl-C:一行、退出码 130
