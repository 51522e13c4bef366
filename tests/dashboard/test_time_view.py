"""The Time page and the What-if page's "Apply to the running engine", rendered by streamlit.testing.v1.AppTest
against a real redis-server filled with wire encoders (steps, timings, layout changes exactly as the EP runtime
writes them), and one end-to-end run of the CPU EP runtime (python -m moe_monitor.demo.ep) feeding the page."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.dashboard.views.time import NO_TIMINGS
from tests.support import synthfill
from tests.support.apptest import app_test, open_page

ROOT = Path(__file__).resolve().parents[2]
L, E, G, R = 2, 8, 2, 2


def _timing(run: str, step: int, rank: int, layer_s: float, instance: str = "") -> core.TimingRecord:
    """dispatch 10 %, compute 40 %, combine 10 % of layer_s, every layer alike."""
    lay = np.full(L, layer_s, dtype=np.float32)
    return core.TimingRecord(run=run, rank=rank, world_size=R, step=step, time_s=time.time(),
                             dispatch_s_L=lay * 0.1, compute_s_L=lay * 0.4, combine_s_L=lay * 0.1, layer_s_L=lay,
                             instance=instance)


def fill_run(url: str, run: str, steps: int = 20, timings: bool = True, instance: str = "i0",
             layer_s=lambda step: 1e-3 * (1 + step % 3), follow_load: bool = False) -> core.Redis:
    """A run of synthfill steps and (timings) their layer times: layer_s(step), or (follow_load) 1 ms + 1 us per
    token of the step's busiest GPUs (each layer's, summed over layers; contiguous layout)."""
    client = core.connect(url, timeout_s=2.0)
    counts_T = synthfill.fill(client, run, steps=steps, num_layers=L, num_experts=E, gpus=G, world_size=R,
                              instance=instance)
    if follow_load:
        busiest_T = [float(c.reshape(L, G, E // G).sum(-1).max(-1).sum()) for c in counts_T]
        layer_s = lambda step: 1e-3 + 1e-6 * busiest_T[step]  # noqa: E731
    if timings:
        pipe = client.pipeline()
        for step in range(steps):
            for rank in range(R):
                pipe.xadd(core.timings_key(run), core.encode_timing(_timing(run, step, rank, layer_s(step), instance)))
        pipe.execute()
    return client


def app(url: str, monkeypatch, page: str) -> AppTest:
    monkeypatch.setenv("REDIS_URL", url)
    at = app_test().run()
    assert not at.exception, at.exception
    open_page(at, page)
    return at


def test_time_page_with_timings(redis_url, monkeypatch):
    fill_run(redis_url, "timed")
    at = app(redis_url, monkeypatch, "page_files/time.py")
    charts = at.get("vega_lite_chart")
    assert len(charts) == 5 and not at.get("plotly_chart")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["dispatch / layer time"] == "10.0%" and metrics["combine / layer time"] == "10.0%"
    assert metrics["achieved overlap"] == "0.000"  # layer = dispatch + compute + combine + 40 %: nothing hidden
    assert any("clipped to [0, 1]" in c.value for c in at.caption)
    # layer times that cycle with the step, not the load: no line, and the page says why
    assert not any("Straggler bound on measurements" in md.value for md in at.markdown)
    assert any("do not explain the MoE time here (R² = " in c.value for c in at.caption)
    at.selectbox(key="time_layer").set_value(1).run()
    assert not at.exception and len(at.get("vega_lite_chart")) == 5
    assert not at.error
    assert any(md.value.startswith("**Measured straggler: rank 0**") and "The Overview names GPU " in md.value
               for md in at.markdown)  # every rank alike here: the first of the least waiting


def test_the_measured_straggler_beside_the_overviews_by_one_rule():
    from moe_monitor.dashboard.analytics.timing import measured_straggler
    from moe_monitor.dashboard.views.time import straggler_line

    assert measured_straggler(np.array([3e-3, 1e-3, np.nan])) == 1
    assert measured_straggler(np.array([np.nan, np.nan])) is None
    wait_R = np.array([3e-3, 1e-3, 2e-3])
    agree = straggler_line(wait_R, named=1, gpus=3, in_time=True)
    assert agree == ("**Measured straggler: rank 1**, waiting 1.500 ms less per step than the other ranks' mean. "
                     "The Overview names GPU 1 (predicted by the cost model); they agree.")
    assert straggler_line(wait_R, named=2, gpus=3, in_time=False).endswith(
        "names GPU 2 (by tokens); they differ: the measurement holds what the prediction leaves out "
        "(`moe-monitor calibrate` fits the profile to these timings).")
    assert "ranks (3) are not GPUs (6) here" in straggler_line(wait_R, named=1, gpus=6, in_time=True)
    assert straggler_line(np.full(2, np.nan), 0, 2, True).startswith("No rank's wait was measured")


def test_a_line_of_time_on_load_only_when_it_explains_the_time(redis_url, monkeypatch):
    fill_run(redis_url, "follows", follow_load=True)
    at = app(redis_url, monkeypatch, "page_files/time.py")
    line = next(md.value for md in at.markdown if "Straggler bound on measurements" in md.value)
    assert "2.000 µs per token of max GPU load + 2.000 ms, R² = 1.000" in line   # 1 us + 1 ms in each of 2 layers


def test_time_page_without_timings_is_one_line(redis_url, monkeypatch):
    fill_run(redis_url, "untimed", timings=False)
    at = app(redis_url, monkeypatch, "page_files/time.py")
    assert [i.value for i in at.info] == [NO_TIMINGS]
    assert not at.get("vega_lite_chart") and not at.main.metric and not at.main.caption and not at.main.markdown


def test_time_page_marks_layout_changes(redis_url, monkeypatch):
    client = fill_run(redis_url, "marked")
    change = core.LayoutRecord(run="marked", step=10, time_s=time.time(), layout_LP=np.tile(
        np.arange(E, dtype=np.int32)[::-1], (L, 1)), gpus=G, nodes=1, source="apply", instance="i0")
    client.xadd(core.layouts_key("marked"), core.encode_layout_record(change))
    at = app(redis_url, monkeypatch, "page_files/time.py")
    steps = at.get("vega_lite_chart")[1].proto
    marks = next(d for d in steps.datasets if d.name == "marks")
    rows = pa.ipc.open_stream(marks.data.data).read_all().to_pylist()
    assert rows == [{"x": 10.0, "label": "layout applied"}] and '{"name":"marks"}' in steps.spec.replace(" ", "")


def _whatif(url: str, monkeypatch) -> AppTest:
    return app(url, monkeypatch, "page_files/whatif.py")


APPLY_SECRET = "time-view-test-secret-0123456789"


def test_apply_button_publishes_a_request_not_a_change(redis_url, monkeypatch):
    from moe_monitor.core.layout_requests import decode_layout_request, judge_request

    client = fill_run(redis_url, "live-apply")
    monkeypatch.setenv("MOE_APPLY_RUNS", "live-apply")  # what `moe-monitor dashboard --apply-run` passes
    monkeypatch.setenv("MOE_APPLY_SECRET", APPLY_SECRET)
    at = _whatif(redis_url, monkeypatch)
    at.button(key="whatif_apply").click().run()
    assert not at.exception, at.exception
    assert client.xlen(core.layout_requests_key("live-apply")) == 0  # nothing sent before the confirmation
    assert any("Switch the engine of run **live-apply**" in w.value for w in at.warning)
    at.button(key="whatif_apply_confirm").click().run()
    assert not at.exception, at.exception
    assert any("requested at step 20; waiting for the engine" in i.value for i in at.info)
    entries = client.xrange(core.layout_requests_key("live-apply"))
    assert len(entries) == 1 and client.xlen(core.layouts_key("live-apply")) == 0
    request = decode_layout_request(entries[0][1])
    rec = request.record
    assert (rec.source, rec.step, rec.num_layers, rec.gpus) == ("apply", 20, L, G)
    assert judge_request(request, "live-apply", APPLY_SECRET.encode(), time.time()).ok  # signed, not expired
    state = at.session_state["whatif_state"]
    assert [(r.step, r.nonce, r.request_id) for r in state.requests] == [(20, request.nonce, entries[0][0].decode())]
    np.testing.assert_array_equal(rec.layout_LP, state.apply_target.layout_LP)


def _eta(loads_LG: np.ndarray) -> float:
    per_layer = [row.mean() / row.max() for row in loads_LG if row.max() > 0]
    return float(np.mean(per_layer))


def test_before_after_panel_after_an_applied_change(redis_url, monkeypatch):
    """Steps 0..19, layer time 2 ms per layer before step 10, 1 ms from it; an "apply" change at step 10 to a
    layout that swaps experts between the GPUs. The panel shows the means over the 10 steps either side (up to
    64) and the change with its interval."""
    client = fill_run(redis_url, "applied", layer_s=lambda step: 2e-3 if step < 10 else 1e-3)
    new_LP = np.tile(np.array([0, 4, 1, 5, 2, 6, 3, 7], dtype=np.int32), (L, 1))
    change = core.LayoutRecord(run="applied", step=10, time_s=time.time(), layout_LP=new_LP, gpus=G,
                               nodes=1, source="apply", instance="i0")
    client.xadd(core.layouts_key("applied"), core.encode_layout_record(change))
    counts = {}
    for _, fields in client.xrange(core.steps_key("applied")):
        rec = core.decode_step(fields)
        counts[rec.step] = counts.get(rec.step, 0) + rec.counts_LE.astype(np.int64)

    def loads(counts_LE, layout_LP):
        out = np.zeros((L, G))
        for layer in range(L):
            for slot, expert in enumerate(layout_LP[layer]):
                out[layer, slot // (E // G)] += counts_LE[layer, expert]
        return out

    old_LP = np.tile(np.arange(E), (L, 1))
    eta_before = np.mean([_eta(loads(counts[s], old_LP)) for s in range(0, 10)])
    eta_after = np.mean([_eta(loads(counts[s], new_LP)) for s in range(10, 20)])
    at = _whatif(redis_url, monkeypatch)
    assert any("Layout applied at step 10" in md.value and "10 steps before and the 10 steps after" in md.value
               for md in at.markdown)
    assert any(c.value.startswith("MoE time per step -50.0% (95% interval -50.0% to -50.0%): faster, beyond noise")
               for c in at.caption), [c.value for c in at.caption]
    metrics = {m.label: m for m in at.metric}
    assert metrics["MoE time per step, after"].value == "2.000 ms"  # 2 layers x 1 ms, slowest rank
    assert metrics["MoE time per step, after"].delta == "-50.0%"
    assert metrics["balancedness per step, after"].value == f"{eta_after:.3f}"
    assert metrics["balancedness per step, after"].delta == f"{eta_after - eta_before:+.3f}"
    assert "predicted balancedness" in metrics
    assert client.xlen(core.layout_requests_key("applied")) == 0


@pytest.mark.subprocess
def test_ep_runtime_end_to_end_feeds_the_time_page(redis_url, monkeypatch):
    """The CPU EP runtime (2 ranks, 12 steps, small batches) publishes timings for every step and rank; a
    WatchedRun sees them all and the Time page draws its charts."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "moe_monitor.demo.ep", "--ranks", "2", "--steps", "12", "--seconds", "0",
                           "--batch", "1", "--seq-len", "8", "--redis", redis_url, "--run", "ep-time"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = core.connect(redis_url, timeout_s=2.0)
    watched = WatchedRun(RedisSource(client, redis_url, "ep-time", 100), 100)
    while watched.tick().more:
        pass
    assert watched.window is not None and watched.bad_records == 0, watched.last_error
    steps = watched.window.step_C[watched.window.ordered_slots()]
    assert steps.size == 12
    view = watched.timings.aligned(steps)
    assert view.has_T.all() and view.num_ranks == 2
    assert np.isfinite(view.layer_TRL).all() and np.isfinite(view.compute_TRL).all()
    at = app(redis_url, monkeypatch, "page_files/time.py")
    assert len(at.get("vega_lite_chart")) == 5 and not at.error
