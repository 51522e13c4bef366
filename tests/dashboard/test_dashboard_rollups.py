"""Hours of history: the aggregator's rollups (core.RollupRecord, 1 s / 60 s buckets, entry id = bucket start in
ms) read by dashboard.sources.rollups.RollupSource from a real redis-server (written with core.encode_rollup +
XADD), folded into a bucket window (one row per bucket, its counts the bucket's sum), analysed as the pages do,
and a page rendered in Streamlit's AppTest at a rollup resolution, saying which resolution it shows. Expected
numbers are recomputed here from the buckets' own fields."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.analytics.rollups import eta_quantiles, per_step_stats
from moe_monitor.dashboard.live.buckets import BucketWindow
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.layout_changes import LayoutChange, LayoutHistory
from moe_monitor.dashboard.live.rollups import RollupRun, span_text, timed_layouts
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.dashboard.sources.rollups import RollupSource, available_resolutions
from tests.support import synthfill
from tests.support.apptest import open_page, run_app

L, E, GPUS = 3, 16, 4
RUN = "roll-run"


def bucket(start_s: int, resolution_s: int = 60, steps: int = 20, seed: int = 0, run: str = RUN) -> core.RollupRecord:
    """A bucket as the aggregator writes it: `steps` steps of skewed counts summed, their per-(step, layer)
    balancedness histogram and busiest / mean GPU loads under the contiguous layout over GPUS GPUs."""
    rng = np.random.default_rng(seed + start_s)
    counts_SLE = rng.gamma(0.4, 30.0, size=(steps, L, E)).astype(np.int64)
    loads_SLG = counts_SLE.reshape(steps, L, GPUS, E // GPUS).sum(axis=3).astype(np.float64)
    eta_SL = loads_SLG.mean(axis=2) / np.maximum(loads_SLG.max(axis=2), 1e-9)
    phases = np.array([steps // 4, steps - steps // 4, 0, 0, 0])
    return core.RollupRecord(
        run=run, resolution_s=resolution_s, start_s=start_s, steps=steps, tokens=int(counts_SLE.sum()) // 2,
        steps_by_phase=phases, counts_LE=counts_SLE.sum(axis=0), gpus=GPUS, eta_hist_B=core.eta_histogram(eta_SL),
        max_load_sum=float(loads_SLG.max(axis=2).mean(axis=1).sum()),
        mean_load_sum=float(loads_SLG.mean(axis=2).mean(axis=1).sum()), max_load_peak=float(loads_SLG.max()),
        missing_rank_steps=1 if start_s % 7 == 0 else 0)


def write_rollups(client, records: list[core.RollupRecord], run: str = RUN) -> None:
    pipe = client.pipeline(transaction=False)
    for rec in records:
        pipe.xadd(core.rollup_key(run, rec.resolution_s), core.encode_rollup(rec), id=f"{rec.start_s * 1000}-0")
    pipe.execute()


def newest_start(resolution_s: int = 60) -> int:
    return int(time.time()) // resolution_s * resolution_s - resolution_s


def test_rollup_source_reads_the_newest_span_by_ms_ids_then_forwards(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    end = newest_start(1)
    write_rollups(client, [bucket(end - 119 + i, 1, steps=2) for i in range(120)])
    source = RollupSource(client, RUN, 1, 60, page_entries=7)
    first = source.poll()
    assert [r.start_s for r in first.rollups] == list(range(end - 59, end + 1)) and not first.more
    assert source.poll().rollups == []
    write_rollups(client, [bucket(end + 1, 1, steps=2), bucket(end + 2, 1, steps=2)])
    assert [r.start_s for r in source.poll().rollups] == [end + 1, end + 2]
    assert [r.start_s for r in source.read_range((end - 10) * 1000, (end - 8) * 1000).rollups] == \
        [end - 10, end - 9, end - 8]
    capped = RollupSource(client, RUN, 1, 3600, max_entries=50, page_entries=20)
    parts = [capped.poll()]
    while parts[-1].more:
        parts.append(capped.poll())
    assert [len(p.rollups) for p in parts] == [50, 50, 22]  # bounded per poll, nothing lost or read twice
    assert available_resolutions(client, RUN) == (1,)
    with pytest.raises(ValueError):
        RollupSource(client, RUN, 5, 60)
    with pytest.raises(ValueError):
        source.read_range(10, 5)


def test_bad_rollup_entries_are_counted_not_raised(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(synthfill.make_meta(RUN, L, E, GPUS)))
    start = newest_start()
    good = [bucket(start - 60 * i) for i in range(5, 0, -1)]
    write_rollups(client, good[:3])
    key = core.rollup_key(RUN, 60)
    client.xadd(key, {"v": 1, "res": 60, "junk": b"\x00"}, id=f"{(start - 170) * 1000}-0")
    client.xadd(key, core.encode_rollup(dataclasses.replace(good[3], resolution_s=1, start_s=start - 165)),
                id=f"{(start - 165) * 1000}-0")  # a 1 s bucket in the 60 s stream
    client.xadd(key, core.encode_rollup(dataclasses.replace(good[3], start_s=start - 600,
                                                            counts_LE=np.ones((L + 1, E), dtype=np.int64))),
                id=f"{(start - 160) * 1000}-0")  # counts of another shape than the run's
    write_rollups(client, good[3:])
    live = WatchedRun(RedisSource(client, redis_url, RUN, 50), 50)
    live.tick()
    rolled = RollupRun(live, RollupSource(client, RUN, 60, 3600))
    rolled.tick()
    assert rolled.rollups_read == 5 and rolled.rollup_bad == 3 and rolled.notes().bad_records == 3
    assert "counts are (4, 16)" in rolled.notes().last_error
    assert rolled.window is not None and rolled.window.size == 5 and not rolled.read_error
    client.xadd(key, core.encode_rollup(good[-1]), id=f"{(start + 1) * 1000}-0")  # the same bucket again
    rolled.tick()
    assert rolled.rollup_bad == 4 and "arrived twice" in rolled.notes().last_error and rolled.window.size == 5


def test_bucket_window_rows_are_the_sums_and_the_per_step_stats_come_from_the_buckets():
    start = newest_start()
    buckets = [bucket(start - 60 * i, steps=10 + i) for i in range(8, 0, -1)]
    window = BucketWindow(6, L, E, 60)  # a ring of 6 buckets: the 2 oldest leave
    for rec in buckets:
        window.add_bucket(rec)
    kept = buckets[2:]
    layout = resolve_layout(synthfill.make_meta(RUN, L, E, GPUS), L, E)
    snap = analyse(window, layout, "both")
    assert snap is not None and snap.resolution_s == 60 and snap.view.num_steps == 6
    assert list(snap.view.step_T) == [b.start_s for b in kept]
    np.testing.assert_array_equal(snap.view.counts_sum_LE, np.sum([b.counts_LE for b in kept], axis=0))
    np.testing.assert_array_equal(snap.view.steps_T, [b.steps for b in kept])
    # loads per step: each bucket's summed loads over its steps (contiguous layout, 4 experts per GPU)
    loads_TLG = np.stack([b.counts_LE.reshape(L, GPUS, E // GPUS).sum(axis=2) / b.steps for b in kept])
    np.testing.assert_allclose(snap.loads_TG, loads_TLG.max(axis=1), rtol=1e-5)
    span_s = kept[-1].start_s - kept[0].start_s + 60
    assert snap.steps_per_s == pytest.approx(sum(b.steps for b in kept) / span_s)
    assert snap.tokens_per_s == pytest.approx(sum(b.tokens for b in kept) / span_s)
    merged = core.merge_rollups(kept, 3600, 0)
    ps = snap.per_step
    assert ps is not None and ps.steps == merged.steps
    assert ps.eta_p50 == pytest.approx(merged.eta_quantile(0.5)) and ps.eta_tail == pytest.approx(merged.eta_quantile(0.01))
    assert ps.eta_p50_T[2] == pytest.approx(kept[2].eta_quantile(0.5))
    assert ps.busiest_mean == pytest.approx(merged.max_load_sum / merged.steps)
    assert ps.busiest_peak == pytest.approx(merged.max_load_peak)
    assert ps.missing_rank_steps == merged.missing_rank_steps
    assert snap.x_T.dtype.kind == "M" and str(snap.x_T[0]).startswith(time.strftime("%Y", time.gmtime(kept[0].start_s)))
    assert snap.unit.endswith("bucket mean") and snap.row_name == "1-minute bucket"
    with pytest.raises(ValueError, match="arrived twice"):
        window.add_bucket(kept[-1])
    with pytest.raises(ValueError, match="older than the window"):
        window.add_bucket(buckets[0])
    with pytest.raises(ValueError, match="a 1 s bucket"):
        window.add_bucket(dataclasses.replace(kept[-1], resolution_s=1))


def test_eta_quantiles_match_the_wire_rule_and_empty_buckets_are_nan():
    rng = np.random.default_rng(3)
    hist_TB = rng.integers(0, 5, size=(7, core.ETA_BINS))
    hist_TB[4] = 0
    for q in (0.0, 0.01, 0.5, 0.99, 1.0):
        got = eta_quantiles(hist_TB, q)
        for t in range(7):
            want = core.eta_quantile(hist_TB[t], q)
            assert (np.isnan(got[t]) and np.isnan(want)) or got[t] == pytest.approx(want)
    stats = per_step_stats(hist_TB, np.array([3, 0, 2, 2, 0, 1, 1]), np.ones(7), np.ones(7) / 2, np.arange(7.0))
    assert np.isnan(stats.busiest_mean_T[1]) and stats.imbalance_T[0] == pytest.approx(2.0)
    assert stats.busiest_peak == 6.0 and stats.steps == 9


def test_layout_changes_are_dated_by_their_bucket():
    history = LayoutHistory()
    p2l = np.tile(np.arange(E), (L, 1))
    history.add(LayoutChange.of(120, p2l[:, ::-1], GPUS, 1, "engine", time_s=1_700_000_075.5, instance="c"))
    mapped = timed_layouts(history, 60)
    assert [c.step for c in mapped.changes] == [1_700_000_040] and mapped.changes[0].source == "engine"
    assert span_text(6 * 3600) == "6 h" and span_text(600) == "10 min" and span_text(90) == "90 s"


def fill_run_with_rollups(client, hours: int = 6) -> tuple[list[core.RollupRecord], int]:
    """A live run (metadata, a few per-rank steps, listed in moe:runs) whose aggregator wrote `hours` of 1-minute
    rollups, plus three entries that do not decode."""
    synthfill.fill(client, RUN, steps=6, num_layers=L, num_experts=E, gpus=GPUS)
    start = newest_start()
    buckets = [bucket(start - 60 * i, steps=20) for i in range(hours * 60 - 1, -1, -1)]
    write_rollups(client, buckets[:-3])
    key = core.rollup_key(RUN, 60)
    for i, junk in enumerate(({"v": 1}, {"v": 7, "res": 60}, {"v": 1, "res": 60, "start": 5})):
        client.xadd(key, junk, id=f"{(start - 150 + i) * 1000}-0")
    write_rollups(client, buckets[-3:])
    client.zadd(core.RUNS_KEY, {RUN: time.time()})
    return buckets, 3


def test_pages_at_a_rollup_resolution_say_so_and_count_bad_entries(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    buckets, bad = fill_run_with_rollups(client)
    at = run_app(redis_url, monkeypatch)
    assert any("full resolution: last 600 steps" in c.value for c in at.caption)
    assert at.sidebar.radio(key="resolution").options == ["steps (full resolution)", "1-minute rollups"]
    at.sidebar.radio(key="resolution").set_value("1-minute rollups").run()
    assert not at.exception, at.exception
    steps = sum(b.steps for b in buckets)
    line = f"1-minute rollups: last 6 h, 360 buckets of {steps:,} steps"
    assert any(line in c.value and "360 buckets in window" in c.value for c in at.caption), [c.value for c in at.caption]
    assert any(f"Skipped {bad} bad record(s)" in w.value for w in at.warning)
    assert any("rank-step(s) missing" in w.value for w in at.warning)
    merged = core.merge_rollups(buckets, 3600, 0)
    labels = {m.label: m.value for m in at.metric}
    assert labels["per-step balancedness, median"] == f"{merged.eta_quantile(0.5):.3f}"
    assert labels["busiest GPU per step, peak"] == f"{merged.max_load_peak:,.0f}"
    assert len(at.get("vega_lite_chart")) == 4  # the answer, the per-GPU bars, what the bucket sums hide (2)
    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    assert any(line in c.value for c in at.caption) and len(at.get("vega_lite_chart")) == 5
    assert any("Per-1-minute bucket vs window-sum imbalance" in md.value for md in at.markdown)
    open_page(at, "page_files/time.py")  # layer timings need single steps
    assert not at.exception, at.exception
    open_page(at, "page_files/experts.py")
    assert not at.exception and any(line in c.value for c in at.caption)
    at.sidebar.number_input(key="span_hours").set_value(2).run()
    assert not at.exception and any("1-minute rollups: last 2 h, 120 buckets" in c.value for c in at.caption)
