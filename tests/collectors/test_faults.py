"""Faults with real processes: a real redis-server killed, restarted empty, flushed, stalled (SIGSTOP), full
(maxmemory + noeviction), refusing writes (ACL) and behind TLS with a certificate the client does not trust.

In each the model-side loop (ExpertLoadMonitor.record / end_step, small L and E on the CPU) never raises and
never waits: its steps finish while Redis is still down (assertions on behaviour, not timings); no write of
the publisher's sink thread takes longer than the socket timeout allows; what was buffered arrives when Redis
is back (up to queue_steps, the rest dropped and counted exactly); every refusal is visible with its reason
in monitor.stats() and, once Redis takes writes again, in the published health (read back with redis-py).
"""
from __future__ import annotations

import json
import time

import pytest
import redis
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor
from tests.support.redisfaults import FaultyRedis, make_cert
from tests.support.waiting import wait_until

IDS = torch.tensor([[1, 2]])


def _steps(mon: ExpertLoadMonitor, count: int, rate_hz: float) -> None:
    """`count` steps at about rate_hz (the model's side: record one layer, end the step)."""
    period, due = 1.0 / rate_hz, time.monotonic()
    for _ in range(count):
        mon.record(0, IDS)
        mon.end_step("decode")
        due += period
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _steps_within_slots(mon: ExpertLoadMonitor, count: int, rate_hz: float) -> None:
    """`count` steps at about rate_hz, each once the publisher has a host slot free: on a busy machine its thread
    can fall all 256 slots behind, and a step that finds no slot is dropped by design (the model never waits),
    which is not what the queue's tests are about."""
    period, due = 1.0 / rate_hz, time.monotonic()
    for _ in range(count):
        assert wait_until(lambda: len(mon._free_slots) > 0)
        _steps(mon, 1, 1e9)
        due += period
        time.sleep(max(0.0, due - time.monotonic()))


def _records(client, run):
    return [core.decode_step(f) for _, f in client.xrange(core.steps_key(run))]


def _health(client, run):
    return json.loads(client.hget(core.health_key(run), "0"))


def _monitor(url: str, run: str, timeout_s: float = 0.5, **options) -> ExpertLoadMonitor:
    return ExpertLoadMonitor(2, 8, 2, redis_url=url, run=run, nvml=False, sample_tokens=0,
                             redis_timeout_s=timeout_s, **options)


def _write_bound_s(timeout_s: float) -> float:
    """The longest one write may take: connect and read, each bounded by the socket timeout, plus slack."""
    return 2 * timeout_s + 0.5


@pytest.fixture
def server(tmp_path):
    srv = FaultyRedis(tmp_path)
    yield srv
    srv.stop()


def test_outage_buffer_holds_queue_steps_at_a_high_step_rate(server):
    """Redis SIGKILLed while the model runs 400 steps/s, each step once a host slot is free (a step that finds
    none is dropped by design, which is not what the queue is about): the queue fills to exactly queue_steps,
    the rest is dropped and counted exactly, and when Redis comes back (restarted empty on the same port) the
    metadata is written again and the newest queue_steps steps arrive, in order, once each."""
    queue, before, during = 500, 20, 1200
    mon = _monitor(server.url, "outage", queue_steps=queue)
    _steps(mon, before, 400)
    assert wait_until(lambda: mon.stats()["published_steps"] == before)
    server.kill()
    _steps_within_slots(mon, during, 400)
    assert mon.step == before + during
    assert wait_until(lambda: mon.stats()["queued_steps"] + mon.stats()["dropped_steps"] == during
                 and "ConnectionError" in mon.stats()["last_error"])
    stats = mon.stats()
    assert (stats["queued_steps"], stats["dropped_steps"]) == (queue, during - queue), stats
    server.start()
    assert wait_until(lambda: mon.stats()["published_steps"] == before + queue)
    mon.close()
    client = server.client()
    records = _records(client, "outage")
    assert [r.step for r in records] == list(range(before + during - queue, before + during))
    assert records[0].dropped_steps == during - queue and records[-1].dropped_steps == during - queue
    assert client.get(core.meta_key("outage")) is not None  # an empty Redis got the metadata back
    health = _health(client, "outage")
    assert health["dropped_steps"] == during - queue and health["last_error"] == ""
    assert health["sink_failures"] >= 1 and "ConnectionError" in health["last_failure"]
    assert mon.stats()["sinks"]["redis"]["max_write_s"] <= _write_bound_s(0.5)


def test_redis_flushed_under_a_live_collector_gets_the_metadata_back(server):
    """No connection fails (FLUSHALL, or a restart between two batches that the pool reconnects through):
    the next batch finds the metadata missing and the one after writes it again."""
    mon = _monitor(server.url, "flushed")
    _steps(mon, 5, 200)
    client = server.client()
    assert wait_until(lambda: client.get(core.meta_key("flushed")) is not None)
    client.flushall()
    _steps(mon, 5, 50)
    assert wait_until(lambda: client.get(core.meta_key("flushed")) is not None, timeout_s=5.0)
    mon.close()
    assert core.decode_meta(client.get(core.meta_key("flushed"))).run == "flushed"
    assert mon.stats()["dropped_steps"] == 0 and mon.stats()["last_error"] == ""


def test_stalled_redis_never_holds_up_the_model(server):
    """SIGSTOP: connections are accepted, nothing answers. Every write gives up after the socket timeout
    (0.5 s) on the sink's own thread; the model's 300 steps all end while Redis is still stopped; the
    publisher keeps freeing host slots, so nothing is dropped; after SIGCONT every step arrives (a write
    that timed out may have been executed late by the stalled server: a step can arrive twice, readers skip
    the repeat)."""
    mon = _monitor(server.url, "stall")
    _steps(mon, 10, 200)
    assert wait_until(lambda: mon.stats()["published_steps"] == 10)
    server.stall()
    try:
        _steps(mon, 300, 150)
        assert server.stalled(), "the model's steps waited for the stalled Redis"
        assert wait_until(lambda: "TimeoutError" in mon.stats()["last_error"], timeout_s=5.0)
        stats = mon.stats()
        assert stats["steps"] == 310 and stats["dropped_steps"] == 0 and stats["publisher_alive"]
        assert stats["sinks"]["redis"]["max_write_s"] <= _write_bound_s(0.5)
    finally:
        server.resume()
    assert wait_until(lambda: mon.stats()["published_steps"] == 310)
    mon.close()
    client = server.client()
    assert sorted({r.step for r in _records(client, "stall")}) == list(range(310))
    health = _health(client, "stall")
    assert health["dropped_steps"] == 0 and "TimeoutError" in health["last_failure"]
    assert mon.stats()["sinks"]["redis"]["max_write_s"] <= _write_bound_s(0.5)


def test_maxmemory_noeviction_refusals_are_reported_and_buffered(tmp_path):
    """A Redis at maxmemory with noeviction refuses every write (OOM); the collector says why, keeps the
    steps and delivers them once memory is freed, each exactly once."""
    srv = FaultyRedis(tmp_path, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
    try:
        mon = _monitor(srv.url, "oom")
        _steps(mon, 5, 200)
        assert wait_until(lambda: mon.stats()["published_steps"] == 5)
        client = srv.client()
        filler = _fill_to_maxmemory(client)
        _steps(mon, 50, 200)
        assert wait_until(lambda: "OutOfMemoryError" in mon.stats()["last_error"] and mon.stats()["queued_steps"] == 50)
        stats = mon.stats()
        assert "maxmemory" in stats["last_error"] and stats["steps"] == 55 and stats["queued_steps"] == 50
        client.delete(*filler)
        assert wait_until(lambda: mon.stats()["published_steps"] == 55)
        mon.close()
        assert [r.step for r in _records(client, "oom")] == list(range(55))
        health = _health(client, "oom")
        assert health["dropped_steps"] == 0 and "OutOfMemoryError" in health["last_failure"]
    finally:
        srv.stop()


def _fill_to_maxmemory(client) -> list[str]:
    """SET 64 KiB filler values until Redis refuses one, then lower maxmemory 512 KiB below what is used:
    used memory hovers at the limit (a large value is refused for its query buffer while the memory used
    stays just below it), and the collector's small writes must be refused for sure, not now and then."""
    keys: list[str] = []
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for _ in range(1000):
            keys.append(f"fill:{len(keys)}")
            client.set(keys[-1], b"x" * 65536)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - (512 << 10))
    return keys


def test_acl_user_without_write_permission(server):
    """An ACL user that may read but not write: the reason (NOPERM) is in stats(); a wrong password says
    so too; once the user may write, what was buffered arrives and the health tells what happened."""
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">r-pass", "~*", "&*", "+@all", "-@write")
    mon = _monitor(f"redis://reader:r-pass@127.0.0.1:{server.port}/0", "acl")
    wrong = _monitor(f"redis://reader:nope@127.0.0.1:{server.port}/0", "acl-wrong")
    _steps(mon, 8, 200)
    _steps(wrong, 3, 200)
    # the first refusal can come before every step was decoded into the queue (the run's metadata is written
    # first): wait for both, neither changes until the user may write
    assert wait_until(lambda: "NoPermissionError" in mon.stats()["last_error"] and mon.stats()["queued_steps"] == 8)
    assert "no permissions" in mon.stats()["last_error"]
    assert wait_until(lambda: "AuthenticationError" in wrong.stats()["last_error"])
    assert "invalid username-password" in wrong.stats()["last_error"]
    t0 = time.monotonic()
    wrong.close(timeout_s=0.3)
    assert time.monotonic() - t0 < 2 and wrong.stats()["dropped_steps"] == 3
    admin.execute_command("ACL", "SETUSER", "reader", "+@write")
    assert wait_until(lambda: mon.stats()["published_steps"] == 8)
    mon.close()
    assert [r.step for r in _records(admin, "acl")] == list(range(8))
    assert "NoPermissionError" in _health(admin, "acl")["last_failure"]
    assert admin.exists(core.meta_key("acl"))


def test_tls_server_with_a_certificate_the_client_does_not_trust(tmp_path):
    """rediss:// to a server whose certificate is not signed by the CA the client trusts: every connect is
    refused with the TLS verification reason; the model goes on; close() does not wait; the same server
    with the right CA takes the steps (the server itself was fine)."""
    cert, key = make_cert(tmp_path, "server")
    other, _ = make_cert(tmp_path, "other")
    srv = FaultyRedis(tmp_path, tls=(cert, key, cert))
    try:
        bad_url = f"rediss://127.0.0.1:{srv.port}/0?ssl_ca_certs={other}"
        mon = _monitor(bad_url, "tls-bad")
        _steps(mon, 20, 200)

        def refused_and_all_queued() -> bool:  # the 20th step may still be on its way to the queue
            stats = mon.stats()
            verify = "CERTIFICATE_VERIFY_FAILED" in stats["last_error"] or "certificate verify failed" in \
                stats["last_error"]
            return verify and stats["queued_steps"] == 20

        assert wait_until(refused_and_all_queued), mon.stats()
        stats = mon.stats()
        assert stats["steps"] == 20 and stats["queued_steps"] == 20 and stats["published_steps"] == 0
        assert stats["sinks"]["redis"]["max_write_s"] <= _write_bound_s(0.5)
        t0 = time.monotonic()
        mon.close(timeout_s=0.3)
        assert time.monotonic() - t0 < 2 and mon.stats()["dropped_steps"] == 20
        good = _monitor(srv.url, "tls-good")
        _steps(good, 3, 200)
        good.close()
        assert good.stats()["published_steps"] == 3
        assert [r.step for r in _records(srv.client(), "tls-good")] == [0, 1, 2]
    finally:
        srv.stop()
