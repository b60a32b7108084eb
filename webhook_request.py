"""webhook.py 对坏请求的处理(课文的 receive() 直接 await request.body()、json.loads):请求体超过 1 MiB 回 413,
WEBHOOK_BODY_TIMEOUT_S 秒里没收完回 408,发到一半断开回 400;不是 UTF-8 的 JSON 对象、嵌套太深、整数太长、事件 id
为空 / 带看不见的字符 / 前后有空白 / 冒充邮件和定时任务的 id 时,都回一句说清原因的 400,什么都不存。上游拿到 4xx 就知道
是自己的请求不对,而不是看到 500 一直重试。"""
import asyncio
import json
import sys

from fastapi import HTTPException, Request
from starlette.requests import ClientDisconnect

import config
import store_events

MAX_BODY_BYTES = 1024 * 1024  # 字节;正常的工单通知不到 1 KB,超过 1 MiB 的不读完就拒


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HTTPException(413, f"body larger than {MAX_BODY_BYTES} bytes")
    chunks, size, limit = [], 0, config.value("WEBHOOK_BODY_TIMEOUT_S")
    try:
        async with asyncio.timeout(limit):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise HTTPException(413, f"body larger than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPException(408, f"body not received within {limit:g} seconds") from None
    except ClientDisconnect:
        # 上游发到一半断开(它那边超时了,稍后会重发):没人收这个回答,日志里一行 400 就够,什么都没存;
        # 一整段 traceback 会让盯着日志报警的人以为服务出了错
        raise HTTPException(400, "client disconnected before the whole body arrived") from None
    return b"".join(chunks)


def parse_event(raw: bytes) -> dict:
    if raw.startswith(b"\xef\xbb\xbf"):  # JSON 不许带 BOM(RFC 8259 §8.1);它是 UTF-8,要说清是 BOM
        raise HTTPException(400, "body starts with a byte order mark: send UTF-8 JSON without it")
    try:
        event = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HTTPException(400, "body is not UTF-8 JSON") from None
    except RecursionError:  # 合法的 JSON,只是嵌套了上千层([[[[…]]]])
        raise HTTPException(400, "body is nested too deeply") from None
    except ValueError:  # 是合法的 JSON,但里面的整数超过了 Python 肯转换的位数(int 和 str 互转的上限,默认 4300)
        raise HTTPException(400, f"body has an integer longer than {sys.get_int_max_str_digits()} digits") from None
    if not isinstance(event, dict):
        raise HTTPException(400, "body must be a JSON object with id, type and data.ticket_id")
    if not isinstance(event.get("id"), str) or not 0 < len(event["id"]) <= 200:
        raise HTTPException(400, "id must be a non-empty string (at most 200 characters)")
    if not event["id"].isprintable():
        # JSON 的 \ud800、\u0000 解出来是落不了库的字符(SQLite 编不成 UTF-8,PostgreSQL 的 text 不收 NUL):
        # 放过去的话同一批组提交整批失败,和它一起到的好事件也都回 503
        # 不间断空格、零宽字符这类看不见的也不收(isprintable 为假):事件 id 要在终端、日志里认得出来
        raise HTTPException(400, "id must be printable: no control, invisible or non-ASCII space characters, no unpaired surrogates")
    if event["id"] != event["id"].strip():
        # 空格这类看得见的空白(isprintable 为真):只有空格的 id 在日志里是空的,前后带空格的和不带的成了两个事件
        raise HTTPException(400, "id must not start or end with whitespace")
    if event["id"].startswith(store_events.OTHER_SOURCE_ID_PREFIXES):
        # 三个来源共用一个 event_id 唯一键:签名对的请求拿一封信的 Message-ID 或 cron:stale:… 当 id 的话,
        # 那封信会成了 duplicate(标了已读、不建工单)、那天的提醒不再入队
        raise HTTPException(400, "id must not start with " + ", ".join(store_events.OTHER_SOURCE_ID_PREFIXES)
                   + " (those are the ids of mail and cron events)")
    if not isinstance(event.get("type"), str):
        raise HTTPException(400, "type must be a string")
    return event
