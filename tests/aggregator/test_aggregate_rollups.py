"""The aggregator's 1 s and 60 s rollups against a real redis-server: each bucket sums exactly the aggregated steps
whose time falls in it, with per-step balancedness under the layout in force at each step; explicit ids make a
bucket written once (a successor rebuilds the open minute from the aggregate stream); retention trims."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import redis

from moe_monitor import core
from moe_monitor.aggregator import AggregateOptions, Aggregator
from moe_monitor.core.loadmodel import balancedness, gpu_loads
from tests.support import aggregates as support
from tests.support.aggregates import aggregates, drive, publish, rank_record

L, E, GPUS, WORLD = 4, 16, 4, 4
META_MAP = [[*range(E), 0, 1, 2, 3]] * L  # 20 slots on 4 GPUs: experts 0-3 replicated
CHANGED_MAP = [[*range(E - 1, -1, -1), 15, 14, 13, 12]] * L
CHANGE_STEP = 12


def options(**change) -> AggregateOptions:
    return support.options(**{"deadline_s": 0.2, "log_every_s": 60.0, **change})


def write_meta_and_change(client, run: str) -> None:
    meta = core.RunMeta(run=run, model_name="tiny", layer_names=[f"l{i}" for i in range(L)], num_experts=E, top_k=2,
                        hidden_size=0, moe_intermediate_size=0, dtype_bytes=2, world_size=WORLD,
                        layout=core.Layout(gpus=GPUS, nodes=1, physical_to_logical_map=META_MAP))
    client.set(core.meta_key(run), core.encode_meta(meta))
    change = core.LayoutRecord(run=run, step=CHANGE_STEP, time_s=time.time(),
                               layout_LP=np.array(CHANGED_MAP), gpus=GPUS, instance="c")
    client.xadd(core.layouts_key(run), core.encode_layout_record(change))


def publish_steps(client, run: str, times: list[float], skip: tuple[int, int] | None = None) -> None:
    """Step s at times[s] from every rank (one layer idle on every fifth step; (step, rank) `skip` left out)."""
    records = []
    for step, t in enumerate(times):
        for rank in range(WORLD):
            if (step, rank) == skip:
                continue
            counts = np.random.default_rng(step * 10 + rank).integers(0, 60, (L, E))
            if step % 5 == 0:
                counts[1] = 0
            records.append(rank_record(run, step, rank, counts, WORLD, time_s=t, tokens=8))
    publish(client, records)


def rollups(client, run: str, resolution_s: int) -> list[tuple[bytes, core.RollupRecord]]:
    return [(i, core.decode_rollup(f)) for i, f in client.xrange(core.rollup_key(run, resolution_s))]


def minutes_ago(n: int) -> float:
    return math.floor(time.time() / 60) * 60 - 60.0 * n


def test_rollups_hold_exactly_the_steps_of_their_bucket_under_the_layout_in_force(redis_url):
    client = core.connect(redis_url)
    write_meta_and_change(client, "roll")
    base = minutes_ago(2)
    times = [base + 0.3 * s for s in range(24)]  # 6.9 s: seconds base .. base + 6
    publish_steps(client, "roll", times, skip=(7, 2))
    agg = Aggregator(redis_url, "roll", options(), log=lambda _: None)
    assert drive([agg], lambda: len(rollups(client, "roll", 60)) == 1)
    steps = aggregates(client, "roll")
    assert len(steps) == 24 and not any(s.late for s in steps)
    seconds = rollups(client, "roll", 1)
    assert [r.start_s for _, r in seconds] == [int(base) + k for k in range(7)]
    for entry_id, bucket in seconds:
        assert entry_id == f"{bucket.start_s * 1000}-0".encode()
        mine = [s for s in steps if bucket.start_s <= s.time_s < bucket.start_s + 1]
        assert bucket.steps == len(mine) and (bucket.counts_LE == sum(s.counts_LE for s in mine)).all()
        loads = np.stack([gpu_loads(s.counts_LE, np.array(CHANGED_MAP if s.step >= CHANGE_STEP else META_MAP), GPUS)
                          for s in mine])
        eta = balancedness(loads)
        assert (bucket.eta_hist_B == core.eta_histogram(eta)).all()
        if any(s.step >= CHANGE_STEP for s in mine):  # the change matters: the metadata's layout reads otherwise
            before = balancedness(np.stack([gpu_loads(s.counts_LE, np.array(META_MAP), GPUS) for s in mine]))
            assert not np.allclose(np.nan_to_num(before), np.nan_to_num(eta))
        assert bucket.eta_hist_B.sum() == np.count_nonzero(loads.max(-1) > 0)  # steps x layers with traffic
        for q in (0.5, 0.99):
            direct = float(np.quantile(eta[np.isfinite(eta)], q, method="inverted_cdf"))
            assert bucket.eta_quantile(q) - 1 / core.ETA_BINS < direct <= bucket.eta_quantile(q) + 1e-9
        assert bucket.max_load_sum == pytest.approx(loads.max(-1).mean(-1).sum())
        assert bucket.mean_load_sum == pytest.approx(loads.mean(-1).mean(-1).sum())
        assert bucket.max_load_peak == pytest.approx(loads.max()) and bucket.gpus == GPUS
        assert bucket.missing_rank_steps == sum(s.missing_ranks.size for s in mine)
        assert bucket.tokens == sum(s.tokens for s in mine)
    (_, minute), = rollups(client, "roll", 60)
    assert minute.steps == 24 and minute.missing_rank_steps == 1
    assert (minute.counts_LE == sum(s.counts_LE for s in steps)).all()
    assert minute.eta_hist_B.sum() == 24 * L - 5  # five steps with one idle layer
    agg.close()


def test_a_late_rank_counts_in_its_seconds_bucket(redis_url):
    client = core.connect(redis_url)
    base = minutes_ago(2)
    publish_steps(client, "lateroll", [base + 0.5], skip=(0, 3))
    agg = Aggregator(redis_url, "lateroll", options(rollup_grace_s=1.5), log=lambda _: None)
    assert drive([agg], lambda: agg.counters.steps_written == 1)
    publish(client, [rank_record("lateroll", 0, 3, np.ones((L, E)), WORLD, time_s=base + 0.6, tokens=8)])
    assert drive([agg], lambda: len(rollups(client, "lateroll", 60)) == 1)
    (_, second), = rollups(client, "lateroll", 1)
    assert second.steps == 1 and second.missing_rank_steps == 1 and second.late_rank_steps == 1
    assert (second.counts_LE == sum(s.counts_LE for s in aggregates(client, "lateroll"))).all()
    agg.close()


def test_a_bucket_is_written_once_and_a_successor_rebuilds_the_open_minute(redis_url):
    client = core.connect(redis_url)
    base = minutes_ago(3)
    times = [base + 5 + 0.5 * s for s in range(80)]  # 40 s of steps
    publish_steps(client, "once", times)
    first = Aggregator(redis_url, "once", options(rollup_grace_s=30.0), log=lambda _: None)
    assert drive([first], lambda: first.counters.steps_written == 80)
    written_first = rollups(client, "once", 1)  # the seconds 30 s behind the newest step closed, by data time
    assert 5 <= len(written_first) < 40 and rollups(client, "once", 60) == []
    top = written_first[-1][0]
    with pytest.raises(redis.ResponseError, match="equal or smaller"):
        client.xadd(core.rollup_key("once", 1), {"v": 1}, id=top)  # Redis refuses a bucket written before
    first.abandon()
    lines: list[str] = []
    second = Aggregator(redis_url, "once", options(), log=lines.append)
    assert drive([second], lambda: len(rollups(client, "once", 60)) == 1, timeout_s=15)
    assert any("80 aggregates replayed" in line for line in lines)
    seconds = rollups(client, "once", 1)
    starts = [r.start_s for _, r in seconds]
    assert starts == sorted(set(starts)) and len(starts) == 40
    assert [i for i, _ in seconds[:len(written_first)]] == [i for i, _ in written_first]  # kept, not written again
    assert sum(r.steps for _, r in seconds) == 80
    (_, minute), = rollups(client, "once", 60)
    assert minute.steps == 80 and (minute.counts_LE == sum(s.counts_LE for s in aggregates(client, "once"))).all()
    assert int(client.hget(core.aggregator_key("once") + ":state", "buckets_1s")) == 40
    second.close()


def test_retention_trims_old_buckets(redis_url):
    client = core.connect(redis_url)
    base = minutes_ago(5)
    times = [base + 10.0 * s for s in range(24)]  # 4 minutes of sparse steps
    publish_steps(client, "keep", times)
    agg = Aggregator(redis_url, "keep", options(retention_1s_s=25, retention_60s_s=60), log=lambda _: None)
    assert drive([agg], lambda: agg.rollups.counters.buckets_60s == 4)
    seconds = [r.start_s for _, r in rollups(client, "keep", 1)]
    minutes = [r.start_s for _, r in rollups(client, "keep", 60)]
    newest = int(times[-1])
    assert seconds == [newest - 20, newest - 10, newest]  # 24 written, those older than 25 s trimmed
    assert minutes == [int(base) + 120, int(base) + 180]
    agg.close()
