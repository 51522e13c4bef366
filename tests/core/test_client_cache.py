"""The shared clients per URL are bounded: 300 distinct URLs typed against one real redis-server leave at most
the bound of connections open (CLIENT LIST), and an evicted client is never closed under a command in flight."""
from __future__ import annotations

import threading

import pytest

from moe_monitor import core
from moe_monitor.core.clientcache import MAX_SHARED_CLIENTS, ClientCache, shared_client
from tests.support.waiting import wait_until


def probes_open(redis_server, prefix: str) -> int:
    """Connections the server has open whose CLIENT SETNAME starts with prefix."""
    return sum(1 for client in redis_server.client().client_list() if client["name"].startswith(prefix))


def url_variant(redis_server, i: int, prefix: str) -> str:
    """The i-th distinct URL of the test server: its 16 databases, each under many client names."""
    return f"redis://127.0.0.1:{redis_server.port}/{i % 16}?client_name={prefix}{i}"


def test_300_urls_leave_at_most_the_bound_open(redis_server, redis_url):
    cache = ClientCache(MAX_SHARED_CLIENTS)
    for i in range(300):
        assert cache.get(url_variant(redis_server, i, "probe"), timeout_s=2.0).ping()
    assert len(cache) == MAX_SHARED_CLIENTS
    assert probes_open(redis_server, "probe") <= MAX_SHARED_CLIENTS
    cache.clear()
    assert probes_open(redis_server, "probe") == 0


def test_the_most_recent_urls_stay_and_the_same_url_is_the_same_client(redis_server, redis_url):
    cache = ClientCache(4)
    first = cache.get(url_variant(redis_server, 0, "keep"), timeout_s=2.0)
    for i in range(1, 10):
        cache.get(url_variant(redis_server, i, "keep"), timeout_s=2.0).ping()
        assert cache.get(url_variant(redis_server, 0, "keep"), timeout_s=2.0) is first  # used: never evicted
    assert len(cache) == 4
    assert cache.get(url_variant(redis_server, 0, "keep"), timeout_s=5.0) is not first  # other timeout, other client
    cache.clear()


def test_an_evicted_client_still_works_for_whoever_holds_it(redis_server, redis_url):
    cache = ClientCache(2)
    held = cache.get(url_variant(redis_server, 0, "held"), timeout_s=2.0)
    held.set("k", b"v")
    for i in range(1, 5):
        cache.get(url_variant(redis_server, i, "held"), timeout_s=2.0).ping()
    assert probes_open(redis_server, "held0") == 0  # evicted: its idle connection was closed
    assert held.get("k") == b"v"  # and it connects again for its next command
    cache.clear()


def test_eviction_never_cuts_a_command_in_flight(redis_server, redis_url):
    cache = ClientCache(1)
    busy = cache.get(url_variant(redis_server, 0, "busy"), timeout_s=10.0, retries=0)  # no retry to hide a cut
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(busy.blpop(["queue"], timeout=5)))
    waiter.start()
    pusher = core.connect(redis_url, timeout_s=2.0)
    try:
        assert wait_for_blocked(pusher)
        cache.get(url_variant(redis_server, 1, "busy"), timeout_s=2.0).ping()  # evicts `busy` mid-BLPOP
        pusher.rpush("queue", b"job")
        waiter.join(10)
    finally:
        pusher.close()
    assert got == [(b"queue", b"job")]  # the blocked command got its answer, no ConnectionError
    cache.clear()


def wait_for_blocked(client, seconds: float = 5.0) -> bool:
    """True once the server reports one client blocked (the BLPOP is in flight)."""
    return wait_until(lambda: int(client.info("clients").get("blocked_clients", 0)) == 1, seconds)


def test_a_bad_url_is_not_cached():
    cache = ClientCache(2)
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        cache.get("redis://127.0.0.1:6379/0?bogus=1")
    assert len(cache) == 0


def test_the_shared_cache_is_bounded(redis_server, redis_url):
    for i in range(MAX_SHARED_CLIENTS + 20):
        shared_client(url_variant(redis_server, i, "shared"), timeout_s=2.0).ping()
    assert probes_open(redis_server, "shared") <= MAX_SHARED_CLIENTS


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        ClientCache(0)
