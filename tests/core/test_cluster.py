"""One URL for a single Redis or a Redis Cluster, against a real cluster (demo/localcluster.py: 3 masters
+ 3 replicas of redis-server on loopback, with a password) and the session's single redis-server: core.connect
tells them apart; a collector publishes through the cluster and the dashboard reads every step exactly; two runs
land on different shards; a master SIGKILLed mid-run fails over to its replica while the collector and the
dashboard carry on, and every step that does not arrive is counted."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import redis
import torch
from redis.cluster import RedisCluster, key_slot

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor, attach
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource, read_runs
from moe_monitor.demo.localcluster import LocalCluster
from tests.support.tiny_models import build
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster
PASSWORD = "cluster-pass"
RUN_KEYS = (core.meta_key, core.steps_key, core.gpu_key, core.layouts_key, core.health_key, core.timings_key)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = LocalCluster(tmp_path_factory.mktemp("cluster"), password=PASSWORD)
    yield nodes
    nodes.stop()


def _ids(step: int, layer: int) -> torch.Tensor:
    """The routing of one step and layer, a function of both: int [3 tokens, 2] over 8 experts."""
    base = (step * 3 + layer * 5) % 8
    return torch.tensor([[base, (base + 1) % 8], [(base + 3) % 8, base], [(step + layer) % 8, (base + 6) % 8]])


def _expected_LE(step: int) -> np.ndarray:
    """What the collector counts for _ids(step, 0) and _ids(step, 1): int64 [2 layers, 8 experts]."""
    counts = np.zeros((2, 8), dtype=np.int64)
    for layer in range(2):
        np.add.at(counts[layer], _ids(step, layer).reshape(-1).numpy(), 1)
    return counts


def _window_steps(watched: WatchedRun) -> dict[int, np.ndarray]:
    """The dashboard's window as {step: counts int64 [L, E]} (ranks summed)."""
    window = watched.window
    if window is None:
        return {}
    slots = window.ordered_slots()
    return {int(step): window.counts_CLE[slot].astype(np.int64) for step, slot in zip(window.step_C[slots], slots)}


def _run_on_another_shard(cluster: LocalCluster, run: str) -> str:
    """The first name shard-0, shard-1, ... whose keys live on another master than run's."""
    taken = cluster.master_of(core.steps_key(run))
    for i in range(100):
        name = f"shard-{i}"
        if cluster.master_of(core.steps_key(name)) != taken:
            return name
    raise AssertionError("no run name on another shard")


# ---------------------------------------------------------------------- (a) one URL, two kinds of server
def test_connect_tells_a_cluster_from_a_single_redis(cluster, redis_url):
    """The same kind of redis:// URL: a cluster node gives a RedisCluster (every key readable through any node's
    URL), a single Redis a redis.Redis; nothing is decided before the first command."""
    in_cluster, single = core.connect(cluster.url), core.connect(redis_url)
    assert in_cluster.cluster is None and single.cluster is None  # lazy: nothing sent yet
    for name in ("a", "b", "c", "d"):
        in_cluster.set(core.meta_key(name), name.encode())
    single.set(core.meta_key("a"), b"a")
    assert in_cluster.cluster is True and isinstance(in_cluster.resolve(), RedisCluster)
    assert single.cluster is False and type(single.resolve()) is redis.Redis
    other = core.connect(cluster.url_of(cluster.ports[-1]))  # any node's URL reaches every shard
    assert [other.get(core.meta_key(name)) for name in "abcd"] == [b"a", b"b", b"c", b"d"]
    assert "cluster-pass" not in repr(other) and "cluster" in repr(other)
    in_cluster.delete(*[core.meta_key(name) for name in "abcd"])  # RedisCluster splits a DEL over slots


def test_a_client_made_while_its_node_is_down_speaks_cluster_once_it_is_up(cluster):
    """A dashboard or collector started before its Redis: commands fail like against any unreachable Redis (a
    ConnectionError, nothing decided), and once the node answers the same client is a cluster client."""
    port = cluster.replicas()[0]
    cluster.kill(port)
    try:
        client = core.connect(cluster.url_of(port), timeout_s=0.5, retries=0)
        with pytest.raises(redis.exceptions.ConnectionError):
            client.get(core.meta_key("late"))
        assert client.cluster is None
    finally:
        cluster.restart(port)
        cluster.wait_ready()
    client.set(core.meta_key("late"), b"up")  # a replica's URL: the write goes to the slot's master
    assert client.cluster is True and core.connect(cluster.url).get(core.meta_key("late")) == b"up"
    client.delete(core.meta_key("late"))


# ---------------------------------------------------------------------- (b) collector -> cluster -> dashboard
def test_collectors_publish_through_the_cluster_and_the_dashboard_reads_every_step(cluster):
    """A transformers model (attach) and an engine-style monitor publish two runs on two shards through one
    node's URL; WatchedRun over a RedisSource from the same URL reads every step with its exact counts."""
    model = build("olmoe")
    first = "cluster-model"
    second = _run_on_another_shard(cluster, first)
    for run in (first, second):  # a run's keys share one slot (core.run_key's hash tag)
        assert len({key_slot(key(run).encode()) for key in RUN_KEYS}) == 1
    assert cluster.master_of(core.steps_key(first)) != cluster.master_of(core.steps_key(second))

    monitor = attach(model, redis_url=cluster.url, run=first)
    engine = ExpertLoadMonitor(2, 8, 2, redis_url=cluster.url, run=second, nvml=False)
    per_step_LE, before = [], np.zeros_like(monitor.counts())
    with torch.no_grad():
        for step in range(12):
            model(input_ids=torch.randint(3, 90, (2, 3 + step % 4)))
            now = monitor.counts()
            per_step_LE.append(now - before)
            before = now
            for layer in range(2):
                engine.record(layer, _ids(step, layer))
            engine.end_step("decode")
    monitor.close()
    engine.close()
    assert monitor.stats()["published_steps"] == 12 and engine.stats()["published_steps"] == 12

    reader = core.connect(cluster.url, timeout_s=1.0)
    assert {name for name, _ in read_runs(reader).runs} >= {first, second}
    for run, expected in ((first, per_step_LE), (second, [_expected_LE(s) for s in range(12)])):
        watched = WatchedRun(RedisSource(reader, cluster.url, run, window_steps=64), window_steps=64)
        assert wait_until(lambda w=watched: w.tick() and w.steps_read == 12, timeout_s=10)
        got = _window_steps(watched)
        assert sorted(got) == list(range(12)) and watched.bad_records == 0 and watched.missed_steps == 0
        for step, counts_LE in enumerate(expected):
            np.testing.assert_array_equal(got[step], counts_LE)
        assert watched.source.health().reachable and watched.source.meta().run == run


# ---------------------------------------------------------------------- (c) failover mid-run
@pytest.fixture
def failover_cluster(tmp_path):
    nodes = LocalCluster(tmp_path, password=PASSWORD)
    yield nodes
    nodes.stop()


class _Dashboard(threading.Thread):
    """Ticks a WatchedRun every 50 ms (the page's refresh) and keeps every tick's source health."""

    def __init__(self, watched: WatchedRun):
        super().__init__(daemon=True)
        self.watched, self.healths, self.stop = watched, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.watched.tick()
            self.healths.append(self.watched.source.health())
            time.sleep(0.05)


@pytest.mark.parametrize("stall", [False, True], ids=["sigkill", "sigstop"])
def test_failover_mid_run_loses_only_counted_in_flight_steps(failover_cluster, stall):
    """SIGKILL of the master that holds the run's slot while the model runs 400 steps at 100 steps/s (or SIGSTOP:
    a master that accepts connections and answers nothing, like a host gone): its replica takes over; no step of
    the model raises or waits for it; the steps ended during the failover land after it, in step order; no write
    waits longer than a single Redis's bound (no command retried one by one against the silent node); the
    dashboard fails ticks softly and reads on; every step is either read with its exact counts or counted (the
    collector's dropped count, the dashboard's missed steps)."""
    cluster, run, total, timeout_s = failover_cluster, "failover", 400, 0.5
    mon = ExpertLoadMonitor(2, 8, 2, redis_url=cluster.url, run=run, nvml=False, redis_timeout_s=timeout_s)
    source = RedisSource(core.connect(cluster.url, timeout_s=0.5, retries=1), cluster.url, run, window_steps=512)
    dashboard = _Dashboard(WatchedRun(source, window_steps=512))
    ended_at, slowest, failures = [0.0] * total, [0.0], []

    def model() -> None:
        try:
            for step in range(total):
                started = time.monotonic()
                for layer in range(2):
                    mon.record(layer, _ids(step, layer))
                mon.end_step("decode")
                ended_at[step] = time.monotonic()
                slowest[0] = max(slowest[0], ended_at[step] - started)
                time.sleep(max(0.0, 0.01 - (ended_at[step] - started)))
        except BaseException as exc:  # what would have reached the model's thread
            failures.append(exc)

    dashboard.start()
    model_thread = threading.Thread(target=model, daemon=True)
    try:
        model_thread.start()
        assert wait_until(lambda: dashboard.watched.steps_read >= 50, timeout_s=15)
        killed_at = time.monotonic()
        old, new = cluster.kill_master_of(core.steps_key(run), stall=stall)
        promoted_at = time.monotonic()
        model_thread.join(30)
        assert not model_thread.is_alive() and not failures and mon.step == total
        assert slowest[0] < 1.0  # the failover took seconds; no step waited for it
        mon.close()
        watched = dashboard.watched
        counted = lambda: watched.steps_read + watched.missed_steps + watched.dropped_steps  # noqa: E731
        assert wait_until(lambda: counted() >= total, timeout_s=15), (counted(), watched.gap_note)
    finally:
        dashboard.stop.set()
        dashboard.join(5)
        mon.close()
    stats = mon.stats()
    assert stats["queued_steps"] == 0 and stats["published_steps"] + stats["dropped_steps"] == total
    assert stats["sinks"]["redis"]["failures"] >= 1, stats  # the collector did meet the failover
    assert stats["sinks"]["redis"]["max_write_s"] <= 2 * timeout_s + 0.5, stats  # as test_faults bounds it
    live = core.connect(cluster.url_of(new))  # cluster.url may name the node that failed
    stream = [core.decode_step(f).step for _, f in live.xrange(core.steps_key(run))]
    # a batch the old master ran and passed on but never answered is written again (docs/wire.md, Duplicates;
    # the readers skip it): the first landing of each step is in step order
    firsts = list(dict.fromkeys(stream))
    assert firsts == sorted(firsts)  # what was retried landed in step order

    got = _window_steps(watched)
    for step, counts_LE in got.items():
        np.testing.assert_array_equal(counts_LE, _expected_LE(step), err_msg=f"step {step}")
    lost = sorted(set(range(total)) - set(got))
    assert watched.steps_read == len(got) and counted() == total, (len(got), watched.missed_steps, lost)
    assert all(ended_at[step] < killed_at for step in lost), "a step ended after the kill was lost"
    after_kill = [step for step in range(total) if ended_at[step] >= killed_at]
    during = [step for step in after_kill if ended_at[step] <= promoted_at]
    assert during and set(after_kill) <= set(got)  # queued during the failover, landed after it
    failed_ticks = [h for h in dashboard.healths if not h.reachable]  # soft: said in the health, nothing raised
    assert all(h.error for h in failed_ticks) and dashboard.healths[-1].reachable
    assert "the source failed" not in watched.last_error
    assert old != new and cluster.master_of(core.steps_key(run)) == new
