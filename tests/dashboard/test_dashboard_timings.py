"""Layer timings on the reader side: the analytics of dashboard/analytics/timing.py on hand-made cases (exact
numbers), the TimingRing of a WatchedRun, and the sources that read timings (a real redis-server, a JSON-lines
trace)."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.analytics import timing
from moe_monitor.dashboard.live.timings import TimingRing
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.dashboard.sources.trace import TraceSource
from tests.support import synthfill

NAN = np.nan


def _rec(step: int, rank: int, world: int = 2, layers: int = 2, run: str = "t", instance: str = "",
         scale: float = 1.0) -> core.TimingRecord:
    base = np.arange(1, layers + 1, dtype=np.float32) * 1e-3 * scale
    return core.TimingRecord(run=run, rank=rank, world_size=world, step=step, time_s=1.7e9 + step,
                             dispatch_s_L=base, compute_s_L=2 * base, combine_s_L=base, layer_s_L=5 * base + rank * 1e-4,
                             instance=instance)


# ------------------------------------------------------------------------------------------ analytics
def _hand_made():
    """One step, two ranks, one layer. rank 0: dispatch 1, compute 4, combine 1, layer 6 (nothing overlapped);
    rank 1: dispatch 2, compute 2, combine 2, layer 5 (1 s of min(compute 2, comm 4) hidden: overlap 0.5)."""
    d = np.array([[[1.0], [2.0]]])
    c = np.array([[[4.0], [2.0]]])
    b = np.array([[[1.0], [2.0]]])
    lay = np.array([[[6.0], [5.0]]])
    return d, c, b, lay


def test_alltoall_share_overlap_and_wait_exact():
    d, c, b, lay = _hand_made()
    share = timing.alltoall_share(d, b, lay)
    assert share.dispatch == pytest.approx(3 / 11) and share.combine == pytest.approx(3 / 11)
    assert share.total == pytest.approx(6 / 11)
    np.testing.assert_allclose(share.dispatch_L, [3 / 11])
    cells = timing.overlap_cells(d, c, b, lay)
    np.testing.assert_allclose(cells[0, :, 0], [0.0, 0.5])
    overlap_L, overall = timing.overlap(d, c, b, lay)
    assert overall == pytest.approx(0.25) and overlap_L[0] == pytest.approx(0.25)
    # straggler wait: the layer's time is its slowest rank's (6); minus each rank's own compute
    np.testing.assert_allclose(timing.straggler_wait(c, lay)[0, :, 0], [2.0, 4.0])
    np.testing.assert_allclose(timing.wait_per_rank(c, lay), [2.0, 4.0])
    assert timing.step_moe_time(lay)[0] == 6.0
    summary = timing.summarise(d, c, b, lay)
    assert (summary.layer_mean_s, summary.layer_p99_s) == (6.0, 6.0)


def test_overlap_is_clipped_and_nan_is_not_measured():
    # layer shorter than max(compute, comm): raw overlap > 1, clipped to 1; compute 0: undefined (NaN)
    d, c, b, lay = (np.array([[[1.0, 1.0, NAN]]]), np.array([[[4.0, 0.0, 1.0]]]), np.array([[[1.0, 1.0, 1.0]]]),
                    np.array([[[3.0, 2.0, 5.0]]]))
    cells = timing.overlap_cells(d, c, b, lay)
    assert cells[0, 0, 0] == 1.0 and np.isnan(cells[0, 0, 1]) and np.isnan(cells[0, 0, 2])
    share = timing.alltoall_share(d, b, lay)
    np.testing.assert_allclose(share.dispatch_L[:2], [1 / 3, 1 / 2])
    assert np.isnan(share.dispatch_L[2]) and share.combine_L[2] == pytest.approx(1 / 5)
    assert share.dispatch == pytest.approx(2 / 5)  # the unmeasured cell's layer time is left out of its sum
    empty = np.full((2, 2, 3), NAN)
    assert np.isnan(timing.summarise(empty, empty, empty, empty).overlap)
    assert np.isnan(timing.step_moe_time(empty)).all()


def test_fit_line_exact():
    fit = timing.fit_line([1, 2, 3, NAN], [2, 4, 7, 9])
    assert fit.n == 3
    assert fit.slope == pytest.approx(2.5) and fit.intercept == pytest.approx(-2 / 3)
    assert fit.r2 == pytest.approx(75 / 76)
    assert np.isnan(timing.fit_line([1, 1], [1, 2]).slope)
    assert timing.fit_line([1, 2], [3, 5]).r2 == pytest.approx(1.0)


def test_before_after_exact():
    step_T = np.arange(10)
    layer_s_T = np.array([9, 9, 3, 4, 5, 1, 2, 3, 9, 9], dtype=float)
    eta_T = np.array([0, 0, 0.5, 0.5, 0.8, 0.9, 0.9, NAN, 0, 0])
    result = timing.before_after(step_T[::-1], layer_s_T[::-1], eta_T[::-1], change_step=5, steps=3)
    assert (result.layer_s_before, result.layer_s_after) == (4.0, 2.0)
    assert result.eta_before == pytest.approx(0.6) and result.eta_after == pytest.approx(0.9)
    assert (result.steps_before, result.steps_after) == (3, 3)
    assert result.layer_change_ratio == pytest.approx(-0.5)
    # before: 3, 4, 5 (variance 1); after: 1, 2, 3 (variance 1): half-width 1.96 * sqrt(1/3 + 1/3)
    assert result.layer_s_halfwidth == pytest.approx(1.96 * np.sqrt(2 / 3))
    lo, hi = result.layer_change_interval
    assert (lo, hi) == pytest.approx(((-2 - 1.96 * np.sqrt(2 / 3)) / 4, (-2 + 1.96 * np.sqrt(2 / 3)) / 4))
    # eta before: 0.5, 0.5, 0.8 (variance 0.03); after: 0.9, 0.9 (its NaN left out; variance 0)
    assert result.eta_halfwidth == pytest.approx(1.96 * np.sqrt(0.03 / 3))
    early = timing.before_after(step_T, layer_s_T, eta_T, change_step=0, steps=3)
    assert np.isnan(early.layer_s_before) and early.steps_before == 0
    assert all(np.isnan(early.layer_change_interval))
    with pytest.raises(ValueError):
        timing.before_after(step_T, layer_s_T[:3], eta_T, 5, 3)


def test_max_gpu_load_per_step():
    loads_TLG = np.array([[[1, 3], [2, 2]], [[0, 0], [5, 1]]], dtype=float)
    np.testing.assert_array_equal(timing.max_gpu_load_per_step(loads_TLG), [5.0, 5.0])


# ------------------------------------------------------------------------------------------ the ring
def test_timing_ring_keeps_the_window_and_refuses_what_does_not_fit():
    ring = TimingRing(3)
    for step in range(5):
        for rank in range(2):
            ring.add(_rec(step, rank))
    view = ring.aligned([1, 2, 3, 4])
    assert view.has_T.tolist() == [False, True, True, True]  # step 1 fell out with the window
    assert view.layer_TRL.shape == (4, 2, 2) and np.isnan(view.layer_TRL[0]).all()
    np.testing.assert_allclose(view.layer_TRL[3, 1], [5e-3 + 1e-4, 10e-3 + 1e-4], rtol=1e-6)
    for bad in (_rec(4, 1), _rec(0, 0), _rec(9, 0, world=3), _rec(9, 0, layers=3)):
        with pytest.raises(ValueError):
            ring.add(bad)
    assert ring.records == 10


def test_watched_run_counts_a_bad_timing_and_restarts_drop_the_ring(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "wt", steps=6, num_layers=2, num_experts=8, gpus=2, world_size=2, instance="a")
    pipe = client.pipeline()
    for step in range(6):
        for rank in range(2):
            pipe.xadd(core.timings_key("wt"), core.encode_timing(_rec(step, rank, run="wt", instance="a")))
    pipe.xadd(core.timings_key("wt"), core.encode_timing(_rec(5, 1, run="wt", instance="a")))  # a duplicate
    pipe.execute()
    watched = WatchedRun(RedisSource(client, redis_url, "wt", 50), 50)
    watched.tick()
    assert watched.window is not None and watched.window.size == 6
    assert watched.timings.records == 12 and watched.bad_records == 1
    assert "arrived twice" in watched.last_error
    assert watched.timings.aligned(np.arange(6)).has_T.all()


# ------------------------------------------------------------------------------------------ sources
def test_redis_source_reads_timings_incrementally_and_counts_a_bad_entry(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "rt", steps=10, num_layers=2, num_experts=8, gpus=2, world_size=2)
    key = core.timings_key("rt")
    for step in range(10):
        for rank in range(2):
            client.xadd(key, core.encode_timing(_rec(step, rank, run="rt")))
    bad = core.encode_timing(_rec(10, 0, run="rt"))
    bad["layer"] = b"\x00" * 3  # wrong byte length
    client.xadd(key, bad)
    source = RedisSource(client, redis_url, "rt", window_steps=100)
    batch = source.poll(1000)
    assert len(batch.timings) == 20 and batch.bad_records == 1 and "timing entry" in batch.last_error
    assert [(t.step, t.rank) for t in batch.timings[:3]] == [(0, 0), (0, 1), (1, 0)]  # oldest first
    client.xadd(key, core.encode_timing(_rec(11, 1, run="rt")))
    again = source.poll(1000)
    assert [(t.step, t.rank) for t in again.timings] == [(11, 1)] and again.bad_records == 0
    assert source.poll(1000).timings == []


def test_redis_source_timing_backlog_is_the_window(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "rb", steps=2, num_layers=2, num_experts=8, gpus=2, world_size=2)
    for step in range(30):
        for rank in range(2):
            client.xadd(core.timings_key("rb"), core.encode_timing(_rec(step, rank, run="rb")))
    batch = RedisSource(client, redis_url, "rb", window_steps=5).poll(1000)
    assert [t.step for t in batch.timings] == [25, 25, 26, 26, 27, 27, 28, 28, 29, 29]


def test_trace_source_yields_timing_lines(tmp_path):
    meta = synthfill.make_meta("tr", 2, 8, 2, world_size=2)
    lines = [json.dumps({"kind": "meta", "meta": core.encode_meta(meta)})]
    rng = np.random.default_rng(0)
    for step in range(3):
        for rank in range(2):
            rec = core.StepRecord(run="tr", rank=rank, world_size=2, step=step, time_s=time.time(), phase="decode",
                                  tokens=8, counts_LE=synthfill.skewed_counts(rng, 2, 8, 8))
            lines.append(core.trace_line("step", core.encode_step(rec)))
            lines.append(core.trace_line("timing", core.encode_timing(_rec(step, rank, run="tr"))))
    lines.append('{"kind": "timing", "v": 1}')
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    batch = TraceSource(str(path)).poll(100)
    assert len(batch.steps) == 6 and len(batch.timings) == 6 and batch.bad_records == 1
    watched = WatchedRun(TraceSource(str(path)), 10)
    watched.tick()
    assert watched.timings.aligned([0, 1, 2]).has_T.all()


def test_a_change_within_noise_says_so():
    from moe_monitor.dashboard.views.whatif.apply import change_line

    rng = np.random.default_rng(0)
    step_T = np.arange(128)
    noisy = 1e-3 * (1 + 0.3 * rng.standard_normal(128))  # the same distribution either side of step 64
    line = change_line(timing.before_after(step_T, noisy, np.full(128, 0.8), 64, 64))
    assert "within noise: the interval holds no change" in line and "95% interval" in line
    faster = change_line(timing.before_after(step_T, np.where(step_T < 64, 2e-3, 1e-3) + noisy * 0.01,
                                             np.full(128, 0.8), 64, 64))
    assert "faster, beyond noise" in faster
    one_each = change_line(timing.before_after(np.arange(2), np.array([1e-3, 2e-3]), np.ones(2), 1, 64))
    assert one_each.startswith("MoE time per step: too few timed steps")
