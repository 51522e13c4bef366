"""The private redis-server takes a port of its own, even when another server takes the free port first, and
one that cannot start says why."""
from __future__ import annotations

import itertools

import pytest

from moe_monitor.demo import localredis
from moe_monitor.demo.localredis import RedisServer


def test_a_port_taken_before_redis_binds_it_is_passed_over(tmp_path, monkeypatch):
    squatter = RedisServer(tmp_path)
    real_free_port = localredis.free_port
    ports = itertools.chain([squatter.port], iter(real_free_port, None))  # the first "free" port is taken
    monkeypatch.setattr(localredis, "free_port", lambda: next(ports))
    squatter.client().set("whose", "squatter")
    try:
        mine = RedisServer(tmp_path)
        try:
            assert mine.port != squatter.port
            assert int(mine.client().info("server")["process_id"]) == mine.proc.pid
            assert mine.client().get("whose") is None
        finally:
            mine.stop()
        assert squatter.client().get("whose") == b"squatter"
    finally:
        squatter.stop()


def test_a_server_that_exits_is_reported_with_its_exit_code(tmp_path):
    missing = str(tmp_path / "no-such-cert.pem")
    with pytest.raises(RuntimeError, match=r"did not start in 5 tries \(it exited with code \d+\)"):
        RedisServer(tmp_path, tls_cert_key=(missing, missing))
