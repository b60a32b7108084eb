"""基准用的「空」webhook:同一个路径、同一个 uvicorn 设置,什么都不验、不存,只回 202。

这个文件不单独运行;bench/webhook.py 用 `python -m uvicorn bench.bare_app:app` 把它起起来,当作比较的基线。
回的 JSON 和真 webhook 一样长,免得响应大小不同影响比较。
"""
from fastapi import FastAPI

app = FastAPI(title="bare 202")


@app.post("/hooks/cloudledger", status_code=202)
async def receive():
    return {"accepted": True, "duplicate": False}
