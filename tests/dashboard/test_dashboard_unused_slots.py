"""A vLLM layout with -1 (an unused slot) on the live dashboard: an engine record on the layouts stream and an
uploaded layout JSON are read, every page scores them (an unused slot serves nothing), and the What-if scores,
compares, repairs and exports them, writing unused slots back as -1. Real redis-server, the real app."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.runtime.memory_media_file_storage import _calculate_file_id

from moe_monitor import core
from moe_monitor.core.layouts import check_engine_layout, with_unused_as_expert
from moe_monitor.core.loadmodel import gpu_loads
from moe_monitor.dashboard.analytics.answer import hottest_on
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.dashboard.views.sidebar import read_uploaded_layout
from moe_monitor.dashboard.views.whatif.controls import STATE_KEY
from moe_monitor.dashboard.whatif import edits
from moe_monitor.dashboard.whatif import repair as whatif_repair
from moe_monitor.dashboard.whatif import score as whatif_score
from moe_monitor.dashboard.whatif.edits import layout_json
from tests.support.apptest import open_page, run_app
from tests.support.synthfill import fill

RUN, L, E, G = "vllm-unused", 2, 8, 4
# 4 GPUs x 3 slots: expert 0 twice, three slots unused (-1), as vLLM's EPLB writes a map with fewer experts
VLLM_MAP = np.array([[0, 1, -1, 2, 3, 0, 4, 5, -1, 6, 7, -1],
                     [0, 1, 2, 3, -1, 4, 5, -1, 6, 7, 0, -1]])
CHANGE_STEP = 4


@pytest.fixture
def vllm_run(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    totals = fill(client, RUN, steps=40, num_layers=L, num_experts=E, gpus=G)
    client.xadd(core.layouts_key(RUN), core.encode_layout_record(core.LayoutRecord(
        run=RUN, step=CHANGE_STEP, time_s=1.0e9, layout_LP=VLLM_MAP, gpus=G, source="engine")))
    return redis_url, np.stack(totals)


def test_an_engine_record_with_unused_slots_is_a_layout_change_and_scores(vllm_run):
    url, counts_TLE = vllm_run
    watched = WatchedRun(RedisSource(core.connect(url, timeout_s=2.0), url, RUN, 64), 64)
    watched.tick()
    assert watched.bad_records == 0, watched.last_error
    assert [c.step for c in watched.layouts.changes] == [CHANGE_STEP]
    meta = watched.source.meta()
    layout = resolve_layout(meta, L, E, changes=watched.layouts.changes, at_step=watched.window.newest_step)
    assert layout.layout_LP.tolist() == VLLM_MAP.tolist() and layout.slots_per_gpu == 3
    snap = analyse(watched.window, layout, "both")
    padded_c, padded = with_unused_as_expert(counts_TLE, VLLM_MAP, G)
    before = gpu_loads(counts_TLE[:CHANGE_STEP], np.array(meta.layout.physical_to_logical_map), G)
    after = gpu_loads(padded_c[CHANGE_STEP:], padded, G)
    np.testing.assert_allclose(snap.view.loads_TLG, np.concatenate([before, after]), rtol=1e-5)
    hot = hottest_on(counts_TLE[CHANGE_STEP:].sum(0), VLLM_MAP, G, 2, top=10)   # GPU 2: 4, 5, -1 | 5, -1, 6
    assert sorted((h.layer, h.expert) for h in hot) == [(0, 4), (0, 5), (1, 5), (1, 6)]
    assert hot == hottest_on(padded_c[CHANGE_STEP:].sum(0), padded, G, 2, top=10)


def test_pages_and_the_whatif_read_an_engine_layout_with_unused_slots(vllm_run, monkeypatch):
    url, counts_TLE = vllm_run
    at = run_app(url, monkeypatch)
    for page in ("devices", "experts", "whatif"):
        open_page(at, f"page_files/{page}.py")
        assert not at.exception, (page, at.exception)
        assert not at.error, (page, [e.value for e in at.error])
    assert not any("Rebalance advisor: no decision" in c.value for c in at.caption)
    assert any("Rebalance advisor:" in m.value for m in [*at.success, *at.info])   # it decided on the -1 layout
    state = at.session_state[STATE_KEY]
    planned = state.sessions[state.target.plan_key].current     # a full re-plan (R = 4): no unused slot
    assert planned.shape == (L, E + 4) and planned.min() >= 0
    assert _downloaded(at) == _served(layout_json(planned))
    before = state.windows[1]
    score = whatif_score.score(VLLM_MAP, before.score_TLE, G)   # the page's "current": the engine's -1 layout
    padded_c, padded = with_unused_as_expert(before.score_TLE, VLLM_MAP, G)
    assert score.balancedness == pytest.approx(whatif_score.score(padded, padded_c, G).balancedness)
    assert f"vs current {score.balancedness:.3f}" in _metric(at, "balancedness (score window)").delta
    at.number_input(key="whatif_moves").set_value(2).run()          # repair the -1 layout within 2 moves
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    state = at.session_state[STATE_KEY]
    repaired = state.sessions[state.target.plan_key].current
    want = whatif_repair.repair(state.windows[1].fit_WLE, VLLM_MAP, G, 2).layout_LP
    assert repaired.tolist() == want.tolist() and repaired.shape == VLLM_MAP.shape
    assert np.all((repaired < 0).sum(axis=1) >= 1)   # the slots it left unused are -1 again in the export
    check_engine_layout(repaired, E, G, L)
    assert 1 <= whatif_repair.moves_between(VLLM_MAP, repaired, G) <= 2
    assert _downloaded(at) == _served(layout_json(repaired))
    assert "-1" in layout_json(repaired)


def test_uploaded_vllm_and_per_gpu_layouts_are_read():
    rows, gpus, note = read_uploaded_layout(json.dumps({"physical_to_logical_map": VLLM_MAP.tolist()}).encode())
    assert np.array(rows).tolist() == VLLM_MAP.tolist() and gpus is None and "6 unused (-1)" in note
    per_gpu = [[[0, 1], [2, 3, 0], [4, 5], [6, 7]]] * 2
    rows, gpus, note = read_uploaded_layout(json.dumps({"physical_to_logical_map": per_gpu}).encode())
    assert gpus == 4 and rows[0] == (0, 1, -1, 2, 3, 0, 4, 5, -1, 6, 7, -1) and "on 4 GPUs" in note
    with pytest.raises(ValueError, match="lists 4 GPUs, the sidebar says 2"):
        read_uploaded_layout(json.dumps({"physical_to_logical_map": per_gpu}).encode(), 2)
    layout = resolve_layout(None, L, E, gpus=G, uploaded=[list(r) for r in VLLM_MAP])
    assert layout.origin == "uploaded JSON" and layout.layout_LP.tolist() == VLLM_MAP.tolist()
    starved = VLLM_MAP.copy()
    starved[0, 6] = -1
    with pytest.raises(ValueError, match="expert 4 has no slot"):
        resolve_layout(None, L, E, gpus=G, uploaded=[list(r) for r in starved])


def _downloaded(at) -> str:
    """The file id of the download button's media (a hash of its bytes)."""
    (button,) = at.get("download_button")
    return Path(button.proto.url).stem


def _served(text: str) -> str:
    return _calculate_file_id(text.encode(), "application/json", "expert_layout.json")


def _metric(at, label):
    return next(m for m in at.metric if m.label == label)


def test_whatif_edits_fill_unused_slots_first_and_count_moves():
    counts_LE = np.arange(1, L * E + 1, dtype=np.float64).reshape(L, E)
    session = edits.new_session(("k",), VLLM_MAP, G)
    added = edits.apply_action(session, edits.Action("add", 0, 7, 0), counts_LE).current
    assert added[0].tolist() == [0, 1, 7, 2, 3, 0, 4, 5, -1, 6, 7, -1] and added[1].tolist() == VLLM_MAP[1].tolist()
    moved = edits.apply_action(session, edits.Action("move", 0, 4, 2, dst_gpu=3), counts_LE).current
    assert moved[0].tolist() == [0, 1, -1, 2, 3, 0, -1, 5, -1, 6, 7, 4]
    full = edits.apply_action(session, edits.Action("add", 0, 7, 1), counts_LE).current   # GPU 1 has no -1: it
    assert full[0].tolist() == [0, 1, -1, 2, 3, 7, 4, 5, -1, 6, 7, -1]                     # replaces a spare replica
    with pytest.raises(ValueError, match="GPU 3 already holds expert 6"):
        edits.apply_action(session, edits.Action("add", 0, 6, 3), counts_LE)
    with pytest.raises(ValueError, match="GPU 1 holds no replica of expert 4"):
        edits.apply_action(session, edits.Action("move", 0, 4, 1, dst_gpu=0), counts_LE)
    assert whatif_repair.moves_between(VLLM_MAP, added, G) == 1      # expert 7 copied onto GPU 0
    assert whatif_repair.moves_between(VLLM_MAP, moved, G) == 1      # expert 4 onto GPU 3; its old slot empties
    assert whatif_repair.moves_between(added, VLLM_MAP, G) == 0      # emptying a slot copies nothing
    rows = edits.gpu_experts(VLLM_MAP, counts_LE, 0, 0, G)
    assert rows[-1] == {"slot": 2, "expert": -1, "replicas": 0, "tokens": 0.0, "load": 0.0}
    assert json.loads(edits.layout_json(moved))["physical_to_logical_map"] == moved.tolist()


def test_the_advisor_advises_on_a_layout_with_unused_slots():
    from moe_monitor.dashboard.whatif.advice import advice_on_window

    counts_TLE = np.zeros((32, L, E))
    counts_TLE[:, :, 4] = 400.0             # expert 4 hot: GPU 2 (4, 5, -1) is the straggler of layer 0
    counts_TLE += 10.0
    advice = advice_on_window(counts_TLE, VLLM_MAP, G, None)
    assert advice.layout_LP.shape == VLLM_MAP.shape and advice.layout_LP.min() == -1 and advice.moves >= 1
    check_engine_layout(advice.layout_LP, E, G, L)
    assert advice.layout_LP.tolist() != VLLM_MAP.tolist()
