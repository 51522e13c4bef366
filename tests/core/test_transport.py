"""Redis URLs as deployments use them: ACL users, passwords, TLS (rediss://), and what a bad URL says."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import redis
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor
from moe_monitor.demo.localredis import RedisServer


def _write_and_read(url: str, run: str) -> list[core.StepRecord]:
    mon = ExpertLoadMonitor(2, 4, 2, redis_url=url, run=run, gpus=2, nvml=False)
    mon.record(0, torch.tensor([[0, 3], [1, 3]]))
    mon.record(1, torch.tensor([[2, 2], [0, 1]]))
    mon.end_step("prefill")
    mon.close()
    assert mon.stats()["published_steps"] == 1, mon.stats()
    client = core.connect(url)
    return [core.decode_step(f) for _, f in client.xrange(core.steps_key(run))]


def test_acl_user_with_password(redis_server, redis_url):
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "moe-writer", "on", ">w-pass", "~moe:*", "+@all")
    try:
        url = f"redis://moe-writer:w-pass@127.0.0.1:{redis_server.port}/0"
        (rec,) = _write_and_read(url, "acl")
        assert rec.counts_LE.tolist() == [[1, 1, 0, 2], [1, 1, 2, 0]]
        assert core.redact(url) == f"redis://moe-writer:***@127.0.0.1:{redis_server.port}/0"
    finally:
        admin.execute_command("ACL", "DELUSER", "moe-writer")


@pytest.fixture
def tls_server(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    server = RedisServer(tmp_path, password="tls-pass", tls_cert_key=(cert, key))
    yield server
    server.stop()


def test_rediss_tls_with_password(tls_server):
    assert tls_server.url.startswith("rediss://")
    (rec,) = _write_and_read(tls_server.url, "tls")
    assert rec.phase == "prefill" and rec.tokens == 2


def test_plain_client_cannot_talk_to_the_tls_port(tls_server):
    plain = tls_server.url.replace("rediss://", "redis://").split("?")[0]
    with pytest.raises(redis.RedisError):
        core.connect(plain, timeout_s=0.5, retries=0).ping()


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", ""])
def test_bad_urls_say_what_is_expected(url):
    with pytest.raises(ValueError, match="redis://, rediss:// or unix://"):
        core.connect(url)


def test_redact_hides_every_password_form():
    assert core.redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert core.redact("rediss://:pw@h:1/0") == "rediss://:***@h:1/0"
    assert core.redact("rediss://u:pw@[::1]:6380/0") == "rediss://u:***@[::1]:6380/0"
    assert core.redact("redis://h:1/0?password=pw&db=2") == "redis://h:1/0?password=***&db=2"
    assert "pw" not in core.redact("redis//:pw@host")
    with pytest.raises(ValueError) as err:
        core.connect("redis//:pw@host")
    assert "pw" not in str(err.value)
