"""The load test's short version (bench.scale), through the real code paths, into a single Redis and a 3-master
Redis Cluster (demo/localcluster.py): simulated DeepSeek-V3-shaped ranks in 2 processes writing through
collectors.sinks.RedisSink (bench.harness.loadgen), the aggregator as its CLI (`moe-monitor aggregate`), the
dashboard's reader (RedisSource + WatchedRun). Every rank-step is written, every step aggregated exactly once with
all its ranks and the very counts the ranks generated, no rank-step missing, and the dashboard reads the aggregate
feed. Correctness only: no timed assertion (waits are generous for a loaded 2-core machine)."""
from __future__ import annotations

import numpy as np
import pytest

from bench import routing
from bench.harness import loadgen
from bench.harness.aggregator import caught_up, progress, start_aggregator, stop_aggregator
from bench.harness.probes import DashboardProbe
from bench.harness.scale import runs_on_masters
from moe_monitor import core
from moe_monitor.dashboard.live.watched import AGGREGATE, WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.demo.localcluster import LocalCluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.subprocess  # rank processes (bench.loadgen) and the aggregator CLI
RANKS, RATE, SECONDS, PROCESSES, TOKENS = 32, 10.0, 6.0, 2, 64
STEPS = int(RATE * SECONDS)
WINDOW = 600


@pytest.fixture(scope="module")
def expected_SLE() -> np.ndarray:
    """int64 [pool steps, L, E]: what the ranks' counts sum to at step k (row k % pool steps), drawn as loadgen
    draws each rank's pool (the same seeds: rank r's pool is the same in every process)."""
    config = loadgen.LoadConfig(url="redis://unused", run="x", ranks=RANKS, steps_per_s=RATE, seconds=SECONDS,
                                tokens_per_rank=TOKENS)
    base_LE = routing.popularity_LE(config.num_layers, config.num_experts, seed=config.seed)
    pools = [routing.rank_pool(r, config.pool_steps, TOKENS, base_LE, config.top_k, config.sample_tokens,
                               config.rank_spread, config.seed) for r in range(RANKS)]
    return np.stack([pool.counts_SLE for pool in pools]).sum(axis=0, dtype=np.int64)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = LocalCluster(tmp_path_factory.mktemp("scalecluster"), masters=3, replicas=0)
    yield nodes
    nodes.stop()


def load_aggregate_and_watch(url: str, run: str, tmp_path, expected_SLE: np.ndarray) -> core.AutoClient:
    """The short load with the aggregator and the dashboard's reader; asserts everything but what is particular to
    the target. Returns a client of the target (the caller closes it)."""
    # a deadline far past any stall of a loaded machine: every step waits for all its ranks (none written short)
    aggregator = start_aggregator(url, run, tmp_path / "aggregator.log", options=["--deadline-s", "30"])
    client = core.connect(url, timeout_s=10.0)
    try:
        probe = DashboardProbe(url, run, WINDOW, start_at=STEPS // 3, every_s=0.5)
        report = loadgen.run_load(url, run, RANKS, RATE, SECONDS, PROCESSES, TOKENS, instance_prefix=f"t-{run}")
        # the writers: every rank-step landed
        assert report.ok, report.summary()
        assert (report.written, report.failed, len(report.processes)) == (RANKS * STEPS, 0, PROCESSES)

        # the aggregator: caught up, every step written with every rank, nothing missing, late or twice
        def done() -> bool:
            state = progress(client, run)
            return caught_up(client, run) and state.get("steps_written") == str(STEPS) \
                and state.get("pending_steps") == "0"

        assert wait_until(done, timeout_s=90.0, every_s=0.2), (progress(client, run),
                                                                (tmp_path / "aggregator.log").read_text()[-2000:])
        state = progress(client, run)
        for name in ("rank_steps_missing", "late_records", "duplicates", "bad_records", "stale_records", "too_old"):
            assert state.get(name) == "0", (name, state)
        assert state.get("last_step") == str(STEPS - 1), state
        records = [core.decode_aggregate(fields) for _, fields in client.xrange(core.aggregate_key(run))]
        assert sorted(rec.step for rec in records) == list(range(STEPS))  # each step exactly once
        for rec in records:
            assert not rec.late and rec.world_size == RANKS and rec.phase == "decode"
            assert rec.ranks_R.tolist() == list(range(RANKS)) and rec.missing_ranks.size == 0
            assert rec.tokens == RANKS * TOKENS and rec.tokens_R.tolist() == [TOKENS] * RANKS
            assert (rec.counts_LE.sum(axis=1) == RANKS * TOKENS * routing.TOP_K).all()
            np.testing.assert_array_equal(rec.counts_LE, expected_SLE[rec.step % len(expected_SLE)])

        # the bench's dashboard probe read the aggregate feed while the steps arrived
        figures = probe.stop()
        assert figures.error == "" and figures.cold_ms is not None, figures
        assert figures.feed == AGGREGATE and figures.bad_records == 0, figures

        # the dashboard's reader, fresh: the aggregate feed with exactly those steps and counts
        reader = core.connect(url, timeout_s=10.0)
        watched = WatchedRun(RedisSource(reader, url, run, WINDOW), WINDOW)

        def read_all() -> bool:
            watched.tick()
            window = watched.window
            return window is not None and window.size == STEPS and not (watched.last_tick and watched.last_tick.more)

        assert wait_until(read_all, timeout_s=60.0, every_s=0.1), (watched.feed, watched.last_error)
        window = watched.window
        assert window is not None
        assert watched.feed == AGGREGATE and watched.aggregates_read == STEPS and watched.steps_read == RANKS * STEPS
        assert watched.bad_records == 0 and watched.missed_steps == 0, watched.last_error
        slots = window.ordered_slots()
        assert window.step_C[slots].tolist() == list(range(STEPS))
        assert (window.ranks_C[slots] == RANKS).all() and (window.tokens_C[slots] == RANKS * TOKENS).all()
        for slot in slots:
            step = int(window.step_C[slot])
            np.testing.assert_array_equal(window.counts_CLE[slot], expected_SLE[step % len(expected_SLE)])
        reader.close()
        return client
    except BaseException:
        client.close()
        raise
    finally:
        stop_aggregator(aggregator)


def test_single_redis_every_step_written_aggregated_once_and_read_from_the_aggregate(redis_url, tmp_path,
                                                                                     expected_SLE):
    client = load_aggregate_and_watch(redis_url, "scale-single", tmp_path, expected_SLE)
    assert client.cluster is False
    client.close()


def test_three_master_cluster_the_same_and_runs_on_three_masters(cluster, tmp_path, expected_SLE):
    run = "scale-cluster"
    client = load_aggregate_and_watch(cluster.url, run, tmp_path, expected_SLE)
    assert client.cluster is True
    # every key of the run (one hash slot) on one master
    port = cluster.master_of(core.steps_key(run))
    assert {cluster.master_of(key) for key in (core.aggregate_key(run), core.meta_key(run),
                                               core.aggregator_key(run) + ":state")} == {port}
    client.close()
    # the scaling runs: names that hash to the 3 masters, one each
    runs = runs_on_masters(cluster.master_of, "scale-split", 3)
    assert sorted(p for _, p in runs) == cluster.masters()
    assert all(cluster.master_of(core.steps_key(name)) == p for name, p in runs)
