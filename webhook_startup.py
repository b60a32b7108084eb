"""webhook.py 启动失败时的日志(课文不管这件事):WEBHOOK_SECRET、DATABASE_URL 之类设置写错时,lifespan 以带说明的
SystemExit 退出,Starlette 却把整段 traceback 交给 uvicorn 打印,学员要在几十行里找那一句。这个 ASGI 中间件只换掉
「启动失败」那条消息的内容,日志里就只剩那句说明;程序本身的错照旧带 traceback。"""
import sys


class StartupErrorInOneLine:
    """启动失败是因为设置不对(带说明的 SystemExit)时,uvicorn 的日志里只有那句说明,而不是一整段 traceback:
        ERROR:    配置错误:WEBHOOK_SECRET 是 whsec_,后面没有密钥
        ERROR:    Application startup failed. Exiting.
    Starlette 把 lifespan 里的异常连同 traceback 写进 lifespan.startup.failed 消息,uvicorn 照原样打印;这里只换掉
    这种消息的内容。别的异常是程序的错,照旧带 traceback。"""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def send_reason(message) -> None:
            error = sys.exc_info()[1]  # Starlette 在 except 块里发这条消息,正在处理的就是 lifespan 抛出的异常
            if message["type"] == "lifespan.startup.failed" and isinstance(error, SystemExit) \
                    and isinstance(error.code, str):
                message = {**message, "message": error.code}
            await send(message)

        await self.app(scope, receive, send_reason)
