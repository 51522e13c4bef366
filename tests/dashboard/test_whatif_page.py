"""The What-if page rendered by streamlit.testing.v1.AppTest against a real redis-server filled by the real
collector (tests/support/realfill.py). Expected numbers come from the raw stream entries, re-planned here through
planner.api.plan on fit windows built with plain loops; the download is checked byte for byte
(Streamlit names a media file by a hash of its bytes)."""
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.runtime.memory_media_file_storage import _calculate_file_id
from streamlit.testing.v1 import AppTest

from moe_monitor import core
from moe_monitor.dashboard.views.whatif.controls import STATE_KEY, WhatIfState
from moe_monitor.planner.api import plan
from moe_monitor.planner.edits import add_replica
from moe_monitor.planner.io import load_counts
from moe_monitor.planner.repair import experts_copied
from tests.support.apptest import app_test, open_page

APP = str(Path(__file__).resolve().parents[2] / "moe_monitor" / "dashboard" / "app.py")
RUN = "whatif-run"
STEPS = 30


@pytest.fixture(scope="module")
def filled(redis_server):
    from tests.support.realfill import fill_with_collector

    redis_server.client().flushdb()
    fill_with_collector(redis_server.url, RUN, steps=STEPS)
    return redis_server.url


def stream(url: str):
    """(meta, per-step counts [T, L, E] in step order, ranks summed) straight from Redis."""
    client = core.connect(url, timeout_s=2.0)
    meta = core.decode_meta(client.get(core.meta_key(RUN)))
    steps: dict[int, np.ndarray] = {}
    for _, fields in client.xrange(core.steps_key(RUN)):
        rec = core.decode_step(fields)
        steps[rec.step] = steps.get(rec.step, 0) + rec.counts_LE.astype(np.int64)
    return meta, np.stack([steps[s] for s in sorted(steps)])


def expected(url: str, redundant: int, policy: str = "auto") -> dict:
    """The page's defaults: score on the newest max(1, min(64, T // 4)) steps, fit on the steps before
    them, summed into up to 16 contiguous windows."""
    meta, counts = stream(url)
    n_score = max(1, min(64, len(counts) // 4))
    fit, score = counts[:-n_score], counts[-n_score:]
    chunks = np.array_split(np.arange(len(fit)), min(16, len(fit)))
    fit_WLE = np.stack([fit[c].sum(0) for c in chunks]).astype(float)
    p2l, G = meta.layout.physical_to_logical_map, meta.layout.gpus
    eta = []
    for l, row in enumerate(p2l):  # balancedness of the current layout, window-summed score loads
        load = np.zeros(G)
        for p, e in enumerate(row):
            load[p // (len(row) // G)] += score[:, l, e].sum() / row.count(e)
        if load.sum() > 0:
            eta.append(load.mean() / load.max())
    planned = plan(fit_WLE, G, redundant, policy=policy)
    return {"meta": meta, "score_LE": score.sum(0), "eta_current": float(np.mean(eta)), "planned": planned,
            "fit_WLE": fit_WLE}


def page(url, monkeypatch) -> AppTest:
    monkeypatch.setenv("REDIS_URL", url)
    at = app_test().run()
    open_page(at, "page_files/whatif.py")
    assert not at.exception, at.exception
    return at


def downloaded(at) -> str:
    """The file id of the download button's media (a hash of its bytes)."""
    (button,) = at.get("download_button")
    return Path(button.proto.url).stem


def served(text: str) -> str:
    return _calculate_file_id(text.encode(), "application/json", "expert_layout.json")


def layout_text(layout_LP) -> str:
    return json.dumps({"physical_to_logical_map": np.asarray(layout_LP).tolist()})


MOVES = "moves (expert copies onto GPUs)"      # the page's moves metric


def metric(at, label: str):
    return next(m for m in at.metric if m.label == label)


def test_page_plans_scores_and_offers_the_layout(filled, monkeypatch):
    at = page(filled, monkeypatch)
    want = expected(filled, redundant=4)          # E=8, G=4: R=4 is the first R > 0 that fits
    assert at.selectbox(key="whatif_r").value == 4
    assert f"vs current {want['eta_current']:.3f}" in metric(at, "balancedness (score window)").delta
    assert any(f"Policy {want['planned'].policy} · 0 manual edit(s)" in c.value for c in at.caption)
    assert downloaded(at) == served(layout_text(want["planned"].layout_LP))
    assert not at.get("plotly_chart")              # every chart is Vega-Lite
    charts = [json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]
    assert len(charts) == 3, charts                # before/after bars, budget curve, placement staleness
    assert any("current vs what-if" in t for t in charts) and any("Replica budget" in t for t in charts)
    traffic = [df.value for df in at.dataframe if "metric" in df.value.columns]  # beside the policies table
    assert len(traffic) == 1 and list(traffic[0]["metric"])[0] == "GPUs touched per token"
    assert any("Knee at R =" in c.value for c in at.caption)
    assert any(c.value.startswith("In time: no GPU profile") for c in at.caption)  # the collector declared none
    assert not at.error


def test_change_r_and_policy_replans(filled, monkeypatch):
    at = page(filled, monkeypatch)
    at.selectbox(key="whatif_r").set_value(0).run()
    at.selectbox(key="whatif_policy").set_value("eplb").run()
    assert not at.exception, at.exception
    want = expected(filled, redundant=0, policy="eplb")
    text = layout_text(want["planned"].layout_LP)
    assert downloaded(at) == served(text) and len(json.loads(text)["physical_to_logical_map"][0]) == 8
    assert any("Policy eplb" in c.value for c in at.caption)


def test_gpu_lists_experts_add_replica_and_undo(filled, monkeypatch):
    at = page(filled, monkeypatch)
    want = expected(filled, redundant=4)
    planned, G = want["planned"].layout_LP, 4
    layer = int(at.selectbox(key="whatif_layer").value)
    S = planned.shape[1] // G
    target = 0
    expert = next(e for e in range(8) if e not in planned[layer, :S])          # not on GPU 0 yet
    at.number_input(key="whatif_gpu").set_value(target).run()
    assert any(s.value.startswith(f"Experts on GPU {target} (layer {layer}") for s in at.subheader)
    listed = at.dataframe[0].value
    assert sorted(listed["expert"]) == sorted(planned[layer, :S].tolist())
    at.number_input(key="whatif_expert").set_value(expert)
    at.number_input(key="whatif_target").set_value(target)
    at.button(key="whatif_add").click().run()
    assert not at.exception, at.exception
    assert any(f"+ replica of expert {expert} on GPU {target}" in s.value for s in at.success)
    edited = add_replica(planned, want["score_LE"], layer, expert, target, G)
    assert expert in edited[layer, :S]
    assert downloaded(at) == served(layout_text(edited))
    assert any("1 manual edit(s)" in c.value for c in at.caption)
    assert metric(at, MOVES).value == f"{experts_copied(want['meta'].layout.physical_to_logical_map, edited, G):,}"
    at.button(key="whatif_undo").click().run()
    assert downloaded(at) == served(layout_text(planned))
    assert at.button(key="whatif_undo").disabled
    state = at.session_state[STATE_KEY]            # the page's one state object holds the edit session
    assert isinstance(state, WhatIfState) and state.target.layer == layer
    assert state.sessions[state.target.plan_key].num_edits == 0


def test_impossible_edit_says_why(filled, monkeypatch):
    at = page(filled, monkeypatch)
    layer = int(at.selectbox(key="whatif_layer").value)
    planned = expected(filled, redundant=4)["planned"].layout_LP
    at.number_input(key="whatif_expert").set_value(int(planned[layer, 0]))   # already on GPU 0
    at.number_input(key="whatif_target").set_value(0)
    at.button(key="whatif_add").click().run()
    assert any("Cannot add: GPU 0 already holds expert" in e.value for e in at.error)


def test_move_budget_repairs_the_current_layout(filled, monkeypatch):
    from moe_monitor.planner.repair import repair_curve

    at = page(filled, monkeypatch)
    want = expected(filled, redundant=4)
    current = np.asarray(want["meta"].layout.physical_to_logical_map)
    full = int(metric(at, MOVES).value.replace(",", ""))
    assert full == experts_copied(current, want["planned"].layout_LP, 4)   # a full re-plan, counted the same way
    assert "copied onto a GPU that did not hold that expert" in metric(at, MOVES).help
    at.number_input(key="whatif_moves").set_value(2).run()
    assert not at.exception, at.exception
    repaired, curve = repair_curve(want["fit_WLE"], current, 4, 2)
    assert downloaded(at) == served(layout_text(repaired))
    shown = int(metric(at, MOVES).value.replace(",", ""))
    # one definition of a move: the page's metric, the repair's curve and its budget agree
    assert shown == experts_copied(current, repaired, 4) == curve[-1][0] <= 2 < full
    assert at.selectbox(key="whatif_r").disabled and at.selectbox(key="whatif_policy").disabled
    assert len(at.get("vega_lite_chart")) == 4     # + the moves-vs-imbalance curve
    assert any(c.value.startswith(f"Move budget 2: {shown} moves used") for c in at.caption)
    assert any("Policy repair of the current layout (<= 2 moves)" in c.value for c in at.caption)
    assert "for R = 0:" in metric(at, "best possible with R (lower bound)").help   # the repair keeps R = 0
    at.number_input(key="whatif_moves").set_value(0).run()         # back to the full re-plan
    assert downloaded(at) == served(layout_text(want["planned"].layout_LP))


def test_trace_of_the_run_loads_in_the_planner(filled, tmp_path):
    from moe_monitor.collectors import record_trace

    path = tmp_path / "run.jsonl"
    record_trace(filled, RUN, str(path))
    windows = load_counts(path)
    _, counts = stream(filled)
    assert windows.shape == (16, *counts.shape[1:]) and windows.sum() == counts.sum()
    assert (windows.sum(0) == counts.sum(0)).all()


def test_a_flat_replica_budget_is_said_not_drawn_and_a_replan_says_it_is_not_the_advisor(redis_url, monkeypatch):
    from tests.support import synthfill

    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key("even"), core.encode_meta(synthfill.make_meta("even", 2, 8, gpus=4)))
    counts = np.full((2, 8), 64, dtype=np.int32)  # every expert alike: no replica can lower the imbalance
    for step in range(40):
        client.xadd(core.steps_key("even"), core.encode_step(core.StepRecord(
            run="even", rank=0, world_size=1, step=step, time_s=1000.0 + step, phase="decode", tokens=64,
            counts_LE=counts)))
    client.zadd(core.RUNS_KEY, {"even": 1040.0})
    at = page(redis_url, monkeypatch)
    assert any(c.value.startswith("Flat: every R from 0 to 8 plans to a mean imbalance of 1.000-1.000")
               for c in at.caption), [c.value for c in at.caption]
    assert not [c for c in at.get("vega_lite_chart") if "Replica budget" in c.proto.spec]
    planner = [c.value for c in at.caption if "not the advisor's" in c.value]  # the re-plan copies, the advisor not
    assert len(planner) == 1 and "moe-monitor advise" in planner[0], planner
