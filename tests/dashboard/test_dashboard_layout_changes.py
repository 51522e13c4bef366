"""The reader side of layout changes: the step window's per-row layouts (only the rows whose layout changed are
recomputed), the watched run's bounded history and its defences (bad records, collector restarts, changes
that arrive before their steps), the sources, the markers of the time-axis figures and the Overview's line."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor
from moe_monitor.core.loadmodel import gpu_weights, weighted_loads
from moe_monitor.dashboard.figures import experts as expert_figures
from moe_monitor.dashboard.figures import gpu as gpu_figures
from moe_monitor.dashboard.figures import load as load_figures
from moe_monitor.dashboard.live import window as window_module
from moe_monitor.dashboard.live.layout import in_force_note, resolve_layout
from moe_monitor.dashboard.live.layout_changes import (
    LayoutChange,
    LayoutHistory,
    change_from_record,
    change_marks,
    in_force,
)
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.live.window import StepWindow
from moe_monitor.dashboard.sources.base import Batch
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.dashboard.sources.trace import TraceSource
from tests.support.apptest import open_page, run_app
from tests.support.assembled import add_rank
from tests.support.listsource import ListSource
from tests.support.synthfill import make_meta

CONTIGUOUS = [[0, 1, 2, 3]]
SWAPPED = np.array([[0, 2, 1, 3]])  # GPU 0: experts 0, 2; GPU 1: experts 1, 3


def _step(step, counts, instance="", t=None):
    return core.StepRecord(run="w", rank=0, world_size=1, step=step, time_s=float(step if t is None else t),
                           phase="decode", tokens=1, counts_LE=np.asarray(counts, dtype=np.int32), instance=instance)


def _layout(step, map_LP, instance="", gpus=2, source="engine"):
    return core.LayoutRecord(run="w", step=step, time_s=100.0 + step, layout_LP=np.asarray(map_LP),
                             gpus=gpus, source=source, instance=instance)


def _change(step, map_LP, source="engine"):
    return LayoutChange.of(step, map_LP, 2, 1, source, 100.0 + step)


def test_each_step_uses_the_layout_in_force_and_only_changed_rows_are_recomputed(monkeypatch):
    computed = []

    def counting(counts_TLE, weights_LEG):
        computed.append(counts_TLE.shape[0])
        return weighted_loads(counts_TLE, weights_LEG)

    monkeypatch.setattr(window_module, "weighted_loads", counting)
    window = StepWindow(8, 1, 4)
    for step in range(6):
        add_rank(window, _step(step, [[1, 2, 4, 8]]))
    window.view("both", CONTIGUOUS, 2)
    assert computed == [6]
    base = LayoutChange.of(0, CONTIGUOUS, 2, 1, "run metadata")
    schedule = (base, _change(3, SWAPPED))
    view = window.view("both", CONTIGUOUS, 2, schedule=schedule)
    np.testing.assert_allclose(view.loads_TLG[:, 0], [[3, 12]] * 3 + [[5, 10]] * 3)
    assert computed == [6, 3]  # the rows from step 3 on, not the window
    add_rank(window, _step(6, [[1, 0, 0, 0]]))
    view = window.view("both", CONTIGUOUS, 2, schedule=schedule)
    assert computed == [6, 3, 1] and view.loads_TLG[-1, 0].tolist() == [1, 0]
    schedule = (*schedule, _change(5, [[3, 2, 1, 0]], "apply"))  # GPU 0: experts 3, 2
    view = window.view("both", CONTIGUOUS, 2, schedule=schedule)
    np.testing.assert_allclose(view.loads_TLG[:, 0], [[3, 12]] * 3 + [[5, 10]] * 2 + [[12, 3], [0, 1]])
    assert computed == [6, 3, 1, 2]
    window.view("both", CONTIGUOUS, 2, schedule=schedule)
    assert computed == [6, 3, 1, 2]  # nothing changed: nothing recomputed
    np.testing.assert_allclose(window.view("both", CONTIGUOUS, 2).loads_TLG[:, 0], [[3, 12]] * 6 + [[1, 0]])


def test_cached_loads_equal_a_full_recompute_under_changing_schedules():
    rng = np.random.default_rng(7)
    window = StepWindow(12, 2, 6)
    base = [list(range(6)) + [0, 1]] * 2
    maps = [np.array([rng.permutation(6).tolist() + rng.integers(0, 6, 2).tolist() for _ in range(2)])
            for _ in range(4)]  # every expert once, two of them twice
    schedule: tuple[LayoutChange, ...] = ()
    for step in range(30):
        add_rank(window, _step(step, rng.integers(0, 50, size=(2, 6))))
        if step % 7 == 3:
            schedule = (*schedule, LayoutChange.of(step + int(rng.integers(-3, 3)), maps[step % 4], 2, 1, "engine"))
            schedule = tuple(sorted(schedule, key=lambda c: c.step))
        view = window.view("both", base, 2, schedule=schedule)
        for t, step_id in enumerate(view.step_T):
            used = in_force(schedule, int(step_id))
            map_LP = base if used is None else used.layout_LP
            want = weighted_loads(window.counts_CLE[view.slots_T[t]][None], gpu_weights(map_LP, 6, 2))[0]
            np.testing.assert_allclose(view.loads_TLG[t], want, rtol=1e-6)


def test_history_is_sorted_bounded_and_replaces_a_repeated_step():
    history = LayoutHistory(max_changes=3)
    for step in (5, 1, 9, 5):
        history.add(_change(step, SWAPPED if step != 9 else [[3, 2, 1, 0]]))
    assert [c.step for c in history.changes] == [1, 5, 9]
    history.add(_change(12, SWAPPED))
    assert [c.step for c in history.changes] == [5, 9, 12] and history.forgotten == 1
    assert in_force(history.changes, 4) is None and in_force(history.changes, 10).step == 9
    assert _change(3, SWAPPED).key == _change(8, SWAPPED.tolist()).key != _change(3, [[3, 2, 1, 0]]).key
    with pytest.raises(ValueError):
        _change(3, SWAPPED).layout_LP[0, 0] = 1  # read-only


def test_change_from_record_checks_the_fit():
    assert change_from_record(_layout(3, SWAPPED), 1, 4).layout_LP.tolist() == SWAPPED.tolist()
    for rec, message in ((_layout(3, [[0, 1, 1, 3]]), "every expert 0..3"), (_layout(3, SWAPPED, gpus=3), "split"),
                         (_layout(-1, SWAPPED), "layout step"), (_layout(2**62, SWAPPED), "layout step"),
                         (_layout(3, SWAPPED, source="x"), "unknown layout source"),
                         (_layout(3, [0, 2, 1, 3]), "2-D")):
        with pytest.raises(ValueError, match=message):
            change_from_record(rec, 1, 4)
    with pytest.raises(ValueError, match="layout has 1 layers, the model has 2"):
        change_from_record(_layout(3, SWAPPED), 2, 4)


def test_watched_run_keeps_the_history_and_counts_bad_layout_records():
    meta = make_meta("w", 1, 4, gpus=2)
    batches = [
        Batch(layouts=[_layout(2, SWAPPED, instance="a")]),                       # before any step: waits
        Batch(steps=[_step(s, [[1, 2, 4, 8]], "a") for s in range(4)],
              layouts=[_layout(3, [[0, 1, 1, 3]], "a"),                           # expert 2 missing: bad
                       _layout(3, [[0, 1, 2, 3, 0, 1, 2, 3]], "a", gpus=4),       # another GPU count: bad
                       _layout(9, [[3, 2, 1, 0]], "b")]),                         # its collector: unknown yet
    ]
    watched = WatchedRun(ListSource(batches, meta), window_steps=16)
    watched.tick()
    assert watched.window is None and len(watched.layouts) == 0 and watched.bad_records == 0
    watched.tick()
    assert [c.step for c in watched.layouts.changes] == [2] and watched.bad_records == 2
    assert "layout change from step 3" in watched.last_error and "4 GPUs" in watched.last_error
    layout = resolve_layout(meta, 1, 4, changes=watched.layouts.changes, at_step=watched.window.newest_step)
    snap = analyse(watched.window, layout, "both")
    np.testing.assert_allclose(snap.loads_TG, [[3, 12], [3, 12], [5, 10], [5, 10]])
    assert snap.step_marks() == [(2.0, "engine rebalanced")] and snap.time_marks() == [(2.0, "engine rebalanced")]
    # collector "b" restarts the run (step ids from 0 again): "a"'s change is forgotten, "b"'s waiting one applies
    watched.source.batches.append(Batch(steps=[_step(0, [[1, 0, 0, 0]], "b", t=50.0)],
                                        layouts=[_layout(4, SWAPPED, "a")]))
    watched.tick()
    assert watched.restarts == 1 and [c.step for c in watched.layouts.changes] == [9]
    assert watched.skipped_old_records == 1 and watched.bad_records == 2


def test_bad_layout_entries_in_redis_and_trace_files_are_bad_records(redis_server, redis_url, tmp_path):
    client = redis_server.client()
    meta = make_meta("bad", 1, 4, gpus=2)
    client.set(core.meta_key("bad"), core.encode_meta(meta))
    client.xadd(core.steps_key("bad"), core.encode_step(core.StepRecord(
        run="bad", rank=0, world_size=1, step=0, time_s=1.0, phase="decode", tokens=1,
        counts_LE=np.array([[1, 2, 4, 8]], dtype=np.int32))))
    good = core.encode_layout_record(core.LayoutRecord(run="bad", step=0, time_s=1.0,
                                                       layout_LP=SWAPPED, gpus=2))
    client.xadd(core.layouts_key("bad"), {"v": 1, "L": 70000})
    client.xadd(core.layouts_key("bad"), {**good, "map": b"\xff" * 16})
    client.xadd(core.layouts_key("bad"), good)
    watched = WatchedRun(RedisSource(client, redis_url, "bad", 16), 16)
    watched.tick()
    # the 0xff map decodes (every slot -1, vLLM's unused slot) but leaves every expert without a slot
    assert watched.bad_records == 2 and "expert 0 has no slot" in watched.last_error and len(watched.layouts) == 1
    watched.tick()
    assert watched.bad_records == 2  # read once, after the last id seen
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([core.trace_line("meta", {"meta": core.encode_meta(meta)}),
                               core.trace_line("layout", {**good, "gpus": 3}),
                               json.dumps({"kind": "layout", "map_b64": "!"}),
                               core.trace_line("layout", good)]) + "\n")
    batch = TraceSource(str(path)).poll(100)
    assert batch.bad_records == 2 and len(batch.layouts) == 1 and batch.layouts[0].step == 0


def test_time_axis_figures_mark_each_change_in_view():
    marks = [(12.0, "engine rebalanced"), (20.0, "layout applied")]
    step_T, loads_TG, eta_TL = np.arange(10, 30), np.ones((20, 2)), np.full((20, 3), 0.5)
    figures = [load_figures.load_bands(step_T, loads_TG, "tokens", marks),
               load_figures.gpu_time_heatmap(step_T, loads_TG, "tokens", marks),
               load_figures.eta_over_time(step_T, eta_TL, marks),
               load_figures.layer_eta_heatmap(step_T, eta_TL, marks),
               expert_figures.expert_time_heatmap(step_T, np.ones((20, 4), dtype=np.int64), 0, marks)]
    for chart in figures:  # a dashed rule and its label per change: rows of the chart's "marks" dataset
        assert chart.data["marks"].to_dict("list") == {"x": [12.0, 20.0], "label": ["engine rebalanced",
                                                                                   "layout applied"]}
        rules = [layer for layer in chart.spec["layer"] if layer.get("data") == {"name": "marks"}]
        assert [layer["mark"]["type"] for layer in rules] == ["rule", "text"]
        assert rules[0]["encoding"]["x"]["field"] == "x" and rules[1]["encoding"]["text"] == {"field": "label"}
    assert load_figures.load_bands(step_T, loads_TG, "tokens").data["marks"].empty
    rows = [{"time_s": 100.0 + i, "gpu_utilization_percent": 50} for i in range(5)]
    panels = gpu_figures.nvml_charts(rows, np.arange(100.0, 105.0), np.ones(5), "GPU 0", [(102.0, "engine rebalanced")])
    assert all(p.data["marks"].to_dict("list") == {"x": [-2.0], "label": ["engine rebalanced"]} for p in panels)
    schedule = (LayoutChange.of(0, CONTIGUOUS, 2, 1, "run metadata"), _change(3, SWAPPED), _change(40, SWAPPED))
    assert [(m.step, m.time_s, m.label) for m in change_marks(schedule, np.array([1, 2, 5, 6]),
                                                               np.array([10.0, 20.0, 50.0, 60.0]))] == [
        (3, 50.0, "engine rebalanced")]  # the first step at or after it; the change at 40 is not in view yet


def test_the_overview_line_says_which_layout_is_in_force():
    meta = make_meta("w", 1, 4, gpus=2)
    plain = resolve_layout(meta, 1, 4)
    assert in_force_note(plain) == ("**Layout in force:** run metadata (2 GPUs, 2 slots/GPU), for every step in "
                                    "the window.")
    changes = (_change(3, SWAPPED), _change(9, [[3, 2, 1, 0]], "apply"))
    at_5 = resolve_layout(meta, 1, 4, changes=changes, at_step=5)
    assert at_5.since_step == 3 and at_5.origin == "engine rebalance at step 3"
    note = in_force_note(at_5)
    assert note.startswith("**Layout in force:** engine rebalance since step 3, issued ")
    assert "2 layout change(s) published by the run; the latest (layout applied from step 9) has no step yet" in note
    at_1 = resolve_layout(meta, 1, 4, changes=changes, at_step=1)
    assert in_force_note(at_1).startswith("**Layout in force:** run metadata, since the start (2 GPUs")
    hidden = resolve_layout(meta, 1, 4, gpus=4, changes=changes)
    assert "hides the run's 2 published layout change(s)" in in_force_note(hidden)


def test_overview_and_devices_pages_show_the_change(redis_server, redis_url, monkeypatch):
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run="pages-relayout", gpus=2, nvml=False, sample_tokens=0)
    for step in range(8):
        if step == 4:
            mon.publish_layout([[2, 3, 0, 1], [1, 0, 3, 2]])
        for layer in range(2):
            mon.record(layer, torch.tensor([[0], [1], [step % 4]]))
        mon.end_step("decode")
    mon.close()
    at = run_app(redis_url, monkeypatch)
    lines = [md.value for md in at.markdown if md.value.startswith("**Layout in force:**")]
    assert len(lines) == 1 and "engine rebalance since step 4" in lines[0], lines
    assert any("layout: engine rebalance at step 4" in c.value for c in at.caption)
    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    marked = []
    for chart in at.get("vega_lite_chart"):
        marks = [d for d in chart.proto.datasets if d.name == "marks"]
        rows = pa.ipc.open_stream(marks[0].data.data).read_all().to_pylist() if marks else []
        if rows:
            marked.append(rows)
            assert '{"name": "marks"}' in json.dumps(json.loads(chart.proto.spec))
    assert marked == [[{"x": 4.0, "label": "engine rebalanced"}]] * 4  # the four time charts of Devices


def test_rebalance_health_of_a_run_counts_each_pair_of_layouts_once():
    """rebalances_of (every tick of a live page) gives planner.rebalances' figures, remembering the expert
    copies of each (before, after) pair of layouts by their keys instead of recounting them."""
    from moe_monitor.dashboard.live import layout_changes
    from moe_monitor.planner.rebalances import rebalance_health

    meta = core.RunMeta(run="r", model_name="m", layer_names=["l0"], num_experts=4, top_k=1, hidden_size=8,
                        moe_intermediate_size=4, dtype_bytes=1, layout=core.Layout(2, 1, [[0, 1, 2, 3]]))
    swapped, back = np.array([[0, 2, 1, 3]]), np.array([[0, 1, 2, 3]])
    changes = [LayoutChange.of(5, swapped, 2, 1, "engine", time_s=100.0),
               LayoutChange.of(9, back, 2, 1, "engine", time_s=700.0)]
    layout_changes._MOVES_MEMO.clear()
    got = layout_changes.rebalances_of(meta, changes, now_s=1000.0)
    want = rebalance_health([(c.time_s, c.layout_LP, c.gpus, c.source) for c in changes], 1000.0,
                            initial_LP=np.array(meta.layout.physical_to_logical_map), expert_bytes=3 * 8 * 4)
    assert got == want and got.moves == 4 and got.bytes_moved == 4 * 96
    assert len(layout_changes._MOVES_MEMO) == 2               # initial -> swapped, swapped -> back
    assert layout_changes.rebalances_of(meta, changes, now_s=1000.0) == got and len(layout_changes._MOVES_MEMO) == 2
    assert layout_changes.rebalances_of(meta, [], now_s=1000.0).changes == 0
