"""测试共用的东西:每个测试一套全新的临时数据库,环境变量只在这个测试里生效。"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB))
os.environ["AMBIENT_NO_DOTENV"] = "1"  # 不读开发者本机的 .env
for _name in ("LLM_API_KEY", "LLM_FALLBACK_MODEL", "DATABASE_URL", "SLACK_WEBHOOK_URL", "IMAP_HOST"):
    os.environ.pop(_name, None)

import store  # noqa: E402


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """一套新的事件库、checkpoint 库和业务库;返回给子进程用的环境变量。"""
    env = {
        "EVENTS_DB": str(tmp_path / "ambient.db"),
        "CHECKPOINTS_DB": str(tmp_path / "checkpoints.db"),
        "BIZ_DB": str(tmp_path / "cloudledger.db"),
        "AMBIENT_NO_DOTENV": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    store.init()
    store.build_biz_db(Path(env["BIZ_DB"]))
    child = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "DATABASE_URL")}
    return {**child, **env}


def run(args: list[str], env: dict, timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    """像学员一样在实验目录里跑一个脚本(真的新进程)。"""
    return subprocess.run([sys.executable, *args], cwd=LAB, env=env, capture_output=True, text=True,
                          timeout=timeout, input=input)


def rows(sql: str, args: tuple = (), path=None) -> list[tuple]:
    conn = store.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()
