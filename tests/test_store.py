"""store.py 自己的几条出错路径:业务库建不了、PostgreSQL 单独连得上但连接池连不上。"""
import threading
import time

import pytest
from conftest import run, tcp_proxy

import store


def test_a_business_database_in_a_missing_directory_names_the_setting_and_creates_nothing(any_lab, tmp_path):
    """原来是「数据库暂时用不了(OperationalError: unable to open database file),稍后再运行…」:
    稍后再运行也没用,要改的是 BIZ_DB。"""
    path = (tmp_path / "missing" / "cloudledger.db").resolve()
    r = run(["store.py"], {**any_lab, "BIZ_DB": str(path)})
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"业务库打不开:BIZ_DB={path}(目录 {path.parent} 不存在)\n")
    assert not path.parent.exists()
    assert list(tmp_path.rglob("*.building")) == []


def first_connection_only(seen: dict) -> bool:
    return seen["relayed"] == 0


@pytest.mark.parametrize("then", ["close", "silent"])
def test_a_pool_that_cannot_connect_after_the_probe_did_stops_in_time_and_says_why(pg_lab, monkeypatch, then):
    """单独连一次是通的,连接池的连接却一个都连不上(服务器太忙、连接数满了,或者接上了却不回话):
    PG_CONNECT_TIMEOUT_S 秒后一行说明原因退出,连接池关掉、后台线程都停了,不会在后台接着重连。"""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(pg_lab["DATABASE_URL"])
    monkeypatch.setattr(store, "PG_CONNECT_TIMEOUT_S", 1)
    with tcp_proxy(params.get("host") or "127.0.0.1", int(params.get("port") or 5432), first_connection_only, then) \
            as (port, seen):
        url = make_conninfo("", **{**params, "host": "127.0.0.1", "port": str(port)})
        before = set(threading.enumerate())
        started = time.monotonic()
        try:
            store.open_pg_pool(url, True)
        except SystemExit as e:
            stopped, message = time.monotonic() - started, e.code
        else:
            raise AssertionError("连接池一个连接都没连上,open_pg_pool 却没有退出")
        left = [t.name for t in threading.enumerate() if t not in before and not t.name.startswith("proxy-")]
    assert message == ("连不上 DATABASE_URL 指的 PostgreSQL:连接池 1 秒内没有连上"
                       "(单独连一次是通的:服务器太忙,或者连接数满了)")
    assert stopped < 4, f"{stopped:.1f} 秒才退出"
    assert left == []  # 连接池的调度线程和 worker 线程都停了
    assert seen["relayed"] == 1 and seen["refused"] >= 1, seen  # 单独连的那次通了,连接池真的去连过、被拒了
