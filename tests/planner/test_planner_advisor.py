"""The rebalance advisor, its simulator and staleness curves (planner.advisor / simulate / staleness).

- the simulator's arithmetic on small hand-computed cases (exact numbers);
- migration counts only expert copies a GPU did not hold before;
- schedule JSON round trip; bad schedules refused with one clear message;
- the advisor never schedules a change whose predicted gain is below its migration time;
- moe-monitor advise / simulate / staleness end to end (in this process, and as the real command) on a small
  generated trace;
- property: simulate never crashes on small arbitrary schedules and counts, costs finite and >= 0.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moe_monitor import core
from moe_monitor.planner.advisor import (
    advise,
    initial_layout,
    periodic_schedule,
    predicted_gain_seconds,
    static_schedule,
)
from moe_monitor.planner.io import load_trace_steps
from moe_monitor.planner.repair import experts_copied
from moe_monitor.planner.schedule import Change, Schedule, load_schedule, schedule_from_json
from moe_monitor.planner.simulate import CostModel, simulate
from moe_monitor.planner.staleness import staleness
from moe_monitor.planner.synthetic import drifting_windows
from tests.support.cli import BOTH, in_process
from tests.support.properties import property_settings

# 0.5 s per token-slot; one expert copy = 1e9 bytes over 32 Gb/s = 0.25 s
HAND_COST = CostModel(seconds_per_token_slot=0.5, link_gbps=32.0, bytes_per_expert=10 ** 9)


def test_simulator_hand_case_exact():
    """1 layer, 2 experts on 2 GPUs. Step 0 under A=[0,1]: loads (3,1), excess 1. From step 1 B=[1,0]: GPU 0
    holds expert 1 and GPU 1 expert 0, both new: 2 copies. Step 1 loads (1,3): excess 1; step 2 (5,1): 2."""
    counts = np.array([[[3, 1]], [[3, 1]], [[1, 5]]], dtype=float)
    res = simulate(counts, [(0, [[0, 1]]), (1, [[1, 0]])], HAND_COST, gpus=2)
    assert res.straggler_s_T.tolist() == [0.5, 0.5, 1.0]
    assert res.moves_C.tolist() == [0, 2] and res.change_steps_C.tolist() == [0, 1]
    assert res.migration_s_C.tolist() == [0.0, 0.5]
    assert res.straggler_s == 2.0 and res.migration_s == 0.5 and res.total_s == 2.5
    # balanced step time: (4 + 4 + 6) tokens / 3 steps / 2 GPUs x 0.5 s
    assert res.step_seconds == pytest.approx(14 / 12, abs=1e-15)
    s = res.summary()
    assert s["total_lost_steps"] == pytest.approx(2.5 / (14 / 12)) and s["changes"] == 1 and s["moves"] == 2


def test_simulator_even_split_over_replicas_and_two_layers():
    """Layer 0: slots [0,1 | 0,0] -> expert 0 has 3 replicas: GPU 0 = 6/3 + 3 = 5, GPU 1 = 2 x 6/3 = 4,
    excess 0.5. Layer 1: [0,1 | 1,1] with counts (0, 9): GPU 0 = 3, GPU 1 = 6, excess 1.5."""
    counts = np.array([[[6, 3], [0, 9]]], dtype=float)
    res = simulate(counts, [(0, [[0, 1, 0, 0], [0, 1, 1, 1]])], HAND_COST, gpus=2)
    assert res.straggler_s_T.tolist() == [(0.5 + 1.5) * 0.5]
    assert res.migration_s == 0.0 and res.moves == 0


def test_changes_after_the_trace_are_not_charged():
    counts = np.ones((2, 1, 2))
    res = simulate(counts, [(0, [[0, 1]]), (5, [[1, 0]])], HAND_COST, gpus=2)
    assert res.moves == 0 and res.migration_s == 0.0 and res.ignored_changes == 1


@pytest.mark.parametrize("after, moves", [
    ([[1, 0, 3, 2]], 0),        # slots swapped within each GPU: every GPU holds what it held
    ([[0, 2, 1, 3]], 2),        # GPU 0 gains expert 2, GPU 1 gains expert 1
    ([[3, 2, 1, 0]], 4),        # all four experts land on the other GPU
])
def test_migration_counts_only_copies_a_gpu_did_not_hold(after, moves):
    before = [[0, 1, 2, 3]]
    counts = np.ones((3, 1, 4))
    res = simulate(counts, [(0, before), (1, after)], HAND_COST, gpus=2)
    assert res.moves_C.tolist() == [0, moves]
    assert res.migration_s == moves * 0.25


def test_migration_with_replicas_drops_are_free():
    """[0,1 | 0,2] -> [0,1 | 2,0]: same sets, 0 copies; -> [0,1 | 1,2]: GPU 1 gains expert 1 (1 copy) and
    drops its replica of expert 0 (free); back to [0,1 | 0,2]: GPU 1 gains expert 0 again (1 copy)."""
    counts = np.ones((4, 1, 3))
    sched = [(0, [[0, 1, 0, 2]]), (1, [[0, 1, 2, 0]]), (2, [[0, 1, 1, 2]]), (3, [[0, 1, 0, 2]])]
    res = simulate(counts, sched, HAND_COST, gpus=2)
    assert res.moves_C.tolist() == [0, 0, 1, 1]
    assert res.migration_s == 0.5


def _small_trace(steps=400, layers=3, experts=16, seed=3, drift=0.05):
    return drifting_windows(windows=steps, layers=layers, experts=experts, sigma=0.9, drift=drift,
                            tokens=4096, seed=seed)


def test_schedule_json_round_trip(tmp_path):
    c = _small_trace()
    sched = advise(c, 4, 4, every=50, window=100, horizon_steps=400,
                   cost=CostModel(link_gbps=8000.0))
    assert len(sched.changes) > 1                      # the case is meant to schedule changes
    doc = json.loads(json.dumps(sched.to_json(), allow_nan=False))
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    for back in (schedule_from_json(doc), load_schedule(path)):
        assert back.gpus == 4 and back.policy == "advisor" and back.steps == sched.steps
        for a, b in zip(sched.changes, back.changes):
            assert np.array_equal(a.layout_LP, b.layout_LP)
            assert (a.moves, a.predicted_gain_s, a.predicted_migration_s, a.reason) == \
                   (b.moves, b.predicted_gain_s, b.predicted_migration_s, b.reason)
        assert simulate(c, back).total_s == simulate(c, sched).total_s
    # a bare layout (SGLang's export) is a static schedule
    (tmp_path / "l.json").write_text(json.dumps({"physical_to_logical_map": sched.changes[0].layout_LP.tolist()}))
    static = load_schedule(tmp_path / "l.json", gpus=4)
    assert static.steps == [0] and static.policy == "static"


LAY = [[0, 1, 2, 3]]


@pytest.mark.parametrize("doc, gpus, message", [
    ([1, 2], 2, "must be an object"),
    ({"changes": []}, 2, "no changes"),
    ({"x": 1}, 2, "neither 'changes' nor 'physical_to_logical_map'"),
    ({"changes": [{"step": 0, "physical_to_logical_map": LAY}]}, None, "pass --gpus"),
    ({"changes": [{"step": 3, "physical_to_logical_map": LAY}]}, 2, "first change must be at step 0"),
    ({"changes": [{"step": 0, "physical_to_logical_map": LAY}, {"step": 0, "physical_to_logical_map": LAY}]}, 2,
     "not after the previous"),
    ({"changes": [{"step": 0, "physical_to_logical_map": LAY}, {"step": 2, "physical_to_logical_map": LAY * 2}]}, 2,
     "2 layers, the first change has 1"),
    ({"changes": [{"step": 0, "physical_to_logical_map": [[0, 1, 2]]}]}, 2, "do not split evenly over 2 GPUs"),
    ({"changes": [{"step": 0, "physical_to_logical_map": [[0, 1.5, 2, 3]]}]}, 2, "whole expert ids"),
    ({"changes": [{"step": 0, "physical_to_logical_map": [[0, True, 2, 3]]}]}, 2, "whole expert ids"),
    ({"changes": [{"step": 0, "physical_to_logical_map": [[0, 1], [2]]}]}, 2, "same slots in every layer"),
    ({"changes": [{"step": "0", "physical_to_logical_map": LAY}]}, 2, "step must be a whole number"),
    ({"changes": [{"step": 0}]}, 2, "must be an object with 'step' and 'physical_to_logical_map'"),
    ({"changes": [{"step": 0, "physical_to_logical_map": LAY, "moves": -1}]}, 2, "moves must be a whole number"),
    ({"changes": [{"step": 0, "physical_to_logical_map": LAY, "predicted_gain_s": "a"}]}, 2, "finite number"),
    ({"schedule_version": 9, "changes": [{"step": 0, "physical_to_logical_map": LAY}]}, 2, "schedule_version"),
    ({"gpus": 0, "changes": [{"step": 0, "physical_to_logical_map": LAY}]}, None, "gpus must be a whole number"),
])
def test_bad_schedules_are_refused_with_one_message(doc, gpus, message):
    with pytest.raises(ValueError, match=message) as info:
        schedule_from_json(doc, gpus)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("layout, message", [
    ([[0, 1, 2, 3]] * 2, "schedule has 2 layers, the trace has 1"),
    ([[0, 1, 2, 4]], "outside 0..3"),
    ([[0, 0, 2, 3]], "expert 1 has no slot"),
])
def test_schedules_that_do_not_fit_the_trace_are_refused(layout, message):
    with pytest.raises(ValueError, match=message):
        simulate(np.ones((2, 1, 4)), [(0, layout)], gpus=2)


@pytest.mark.parametrize("link_gbps", [4.0, 40.0, 400.0, 8000.0, 8e5])
def test_advisor_never_schedules_a_change_that_does_not_pay(link_gbps):
    c = _small_trace(seed=7)
    cost = CostModel(link_gbps=link_gbps)
    sched = advise(c, 4, 4, every=40, window=120, horizon_steps=300, cost=cost)
    for prev, ch in zip(sched.changes, sched.changes[1:]):
        assert ch.moves == experts_copied(prev.layout_LP, ch.layout_LP, 4) > 0
        assert ch.predicted_migration_s == pytest.approx(cost.migration_seconds(ch.moves))
        assert ch.predicted_gain_s > ch.predicted_migration_s
        recent = c[max(0, ch.step - 120):ch.step]
        assert ch.predicted_gain_s == pytest.approx(
            predicted_gain_seconds(recent, prev.layout_LP, ch.layout_LP, 4, 300, cost))
    if link_gbps == 4.0:                              # a copy costs more than any gain here
        assert len(sched.changes) == 1


def test_policies_share_the_initial_layout_and_are_causal():
    c = _small_trace(seed=2)
    init = initial_layout(c, 4, 4, window=100)
    per = periodic_schedule(c, 4, 4, every=100, window=100, initial_LP=init)
    assert per.steps == [0, 100, 200, 300] and np.array_equal(per.changes[0].layout_LP, init)
    # a decision at t sees only steps < t: changing later steps changes nothing before them
    c2 = c.copy()
    c2[250:] = c2[250:, :, ::-1]
    per2 = periodic_schedule(c2, 4, 4, every=100, window=100, initial_LP=init)
    assert all(np.array_equal(a.layout_LP, b.layout_LP) for a, b in zip(per.changes[:3], per2.changes[:3]))
    a1 = advise(c, 4, 4, initial_LP=init, every=50, window=100, cost=CostModel(link_gbps=8000.0))
    a2 = advise(c2, 4, 4, initial_LP=init, every=50, window=100, cost=CostModel(link_gbps=8000.0))
    early = [ch.step for ch in a1.changes if ch.step <= 250]
    assert early == [ch.step for ch in a2.changes if ch.step <= 250]
    assert simulate(c, static_schedule(init, 4)).moves == 0


def test_staleness_curve_shapes_and_values():
    counts = np.array([[[3, 1]], [[2, 2]], [[1, 3]], [[0, 0]]], dtype=float)
    curve = staleness(counts, 2, layout_LP=[[0, 1]], fitted_at=1)
    assert curve.fit_steps_F.tolist() == [1] and curve.imbalance_FD.shape == (1, 3)
    assert curve.imbalance_FD[0, :2].tolist() == [1.0, 1.5] and math.isnan(curve.imbalance_FD[0, 2])
    assert curve.fits_D.tolist() == [1, 1, 0]
    c = _small_trace(steps=200)
    fitted = staleness(c, 4, 4, fit_window=50, fit_every=50)
    assert fitted.fit_steps_F.tolist() == [50, 100, 150] and fitted.imbalance_FD.shape == (3, 150)
    assert np.isnan(fitted.imbalance_FD[2, 50:]).all() and np.isfinite(fitted.mean_D).all()
    # drift: the layouts age, late deltas score worse than fresh ones
    assert fitted.mean_D[100:].mean() > fitted.mean_D[:10].mean()
    phases = ["prefill" if t % 3 == 0 else "decode" for t in range(200)]
    by = staleness(c, 4, 4, fit_window=50, phases_T=phases)
    assert set(by) == {"decode", "prefill"}
    pre = by["prefill"].imbalance_FD[0]                           # fitted at 50: steps 51, 54, ... are prefill
    assert np.isfinite(pre[1::3]).all() and np.isnan(pre[0::3]).all() and np.isnan(pre[2::3]).all()
    with pytest.raises(ValueError, match="one label per step"):
        staleness(c, 4, 4, phases_T=["decode"])


def test_load_trace_steps_reads_traces_and_counts(tmp_path):
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 9, size=(5, 2, 8))
    lines = []
    for step in range(5):
        for rank in range(2):                                    # ranks are summed
            rec = core.StepRecord(run="adv", rank=rank, world_size=2, step=step, time_s=1.0 + step,
                                  phase="decode", tokens=8, counts_LE=counts[step].astype(np.int32))
            lines.append(core.trace_line("step", core.encode_step(rec)))
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    assert np.array_equal(load_trace_steps(tmp_path / "t.jsonl"), 2 * counts)
    (tmp_path / "c.json").write_text(json.dumps({"logical_count": counts.tolist()}))
    assert np.array_equal(load_trace_steps(tmp_path / "c.json"), counts)
    (tmp_path / "one.json").write_text(json.dumps({"logical_count": counts[0].tolist()}))
    with pytest.raises(ValueError, match="per-step counts"):
        load_trace_steps(tmp_path / "one.json")


@pytest.mark.parametrize("_run", BOTH)
def test_cli_advise_simulate_staleness_end_to_end(tmp_path, _run):
    c = _small_trace(steps=300, seed=4)
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"logical_count": c.tolist()}))
    sched = tmp_path / "schedule.json"
    r = _run("advise", "--trace", trace, "--gpus", 4, "--redundant", 4, "--every", 50, "--window", 100,
             "--horizon", 300, "--link-gbps", 8000, "--out", sched)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {sched}: changes=")
    doc = json.loads(sched.read_text())
    back = load_schedule(sched)
    assert back.policy == "advisor" and doc["gpus"] == 4 and len(back.changes) > 1
    out = tmp_path / "result.json"
    r = _run("simulate", "--trace", trace, "--schedule", sched, "--link-gbps", 8000, "--out", out)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())["summary"]
    want = simulate(c, back, CostModel(link_gbps=8000.0)).summary()
    assert got["total_lost_s"] == pytest.approx(want["total_lost_s"]) and got["moves"] == want["moves"]
    # an SGLang-style layout, held static (gpus from the command line)
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps({"physical_to_logical_map": back.changes[0].layout_LP.tolist()}))
    r = _run("simulate", "--trace", trace, "--schedule", lay, "--gpus", 4)
    assert r.returncode == 0, r.stderr and "changes=0" in r.stdout
    r = _run("staleness", "--trace", trace, "--gpus", 4, "--redundant", 4, "--window", 100,
             "--out", tmp_path / "curve.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "curve.json").read_text())["fit_steps"] == [100, 200]
    r = _run("plan", "--load", trace, "--gpus", 4, "--redundant", 4, "--out", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, message", [
    (["simulate", "--trace", "{trace}", "--schedule", "{bad}"], "first change must be at step 0"),
    (["simulate", "--trace", "{trace}", "--schedule", "{sched}", "--link-gbps", "0"], "positive"),
    (["simulate", "--trace", "{trace}"], "required"),
    (["advise", "--trace", "{trace}", "--gpus", "3", "--redundant", "4", "--out", "{out}"], "split evenly"),
    (["advise", "--trace", "{trace}", "--gpus", "4", "--redundant", "4", "--every", "0", "--out", "{out}"],
     "every must be"),
    (["staleness", "--trace", "{trace}", "--gpus", "4", "--out", "{out}"], "--redundant"),
    (["advise", "--trace", "{missing}", "--gpus", "4", "--redundant", "4", "--out", "{out}"], "no such file"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, message):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"logical_count": _small_trace(steps=20).tolist()}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpus": 4, "changes": [{"step": 5, "physical_to_logical_map": [list(range(16))] * 3}]}))
    sched = tmp_path / "s.json"
    sched.write_text(json.dumps({"gpus": 4, "changes": [{"step": 0, "physical_to_logical_map": [list(range(16))] * 3}]}))
    paths = {"trace": trace, "bad": bad, "sched": sched, "out": tmp_path / "o.json", "missing": tmp_path / "nope.json"}
    r = in_process(*[a.format(**paths) for a in args])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert not (tmp_path / "o.json").exists()


@st.composite
def sim_cases(draw):
    experts = draw(st.integers(1, 4))
    gpus = draw(st.integers(1, 3))
    least = -(-experts // gpus)
    per_gpu = draw(st.integers(least, max(3, least)))
    slots, layers = gpus * per_gpu, draw(st.integers(1, 2))
    steps = draw(st.integers(1, 5))

    def layout():
        rows = []
        for _ in range(layers):
            extra = draw(st.lists(st.integers(0, experts - 1), min_size=slots - experts, max_size=slots - experts))
            rows.append(draw(st.permutations(list(range(experts)) + extra)))
        return rows

    n_changes = draw(st.integers(1, 3))
    later = sorted(draw(st.sets(st.integers(1, 7), min_size=n_changes - 1, max_size=n_changes - 1)))
    sched = [(s, layout()) for s in [0, *later]]
    count = st.one_of(st.integers(0, 10 ** 6), st.floats(0, 1e9, allow_nan=False), st.sampled_from([0.0, 1e-30]))
    counts = np.array(draw(st.lists(count, min_size=steps * layers * experts, max_size=steps * layers * experts)),
                      dtype=float).reshape(steps, layers, experts)
    cost = CostModel(seconds_per_token_slot=draw(st.floats(1e-12, 1.0)), link_gbps=draw(st.floats(1e-3, 1e6)),
                     bytes_per_expert=draw(st.integers(1, 10 ** 10)))
    return counts, sched, gpus, cost


@property_settings()
@given(sim_cases())
def test_simulate_never_crashes_and_costs_are_finite_non_negative(case):
    counts, sched, gpus, cost = case
    try:
        res = simulate(counts, Schedule(gpus=gpus, changes=tuple(Change(s, np.array(l)) for s, l in sched)), cost)
    except ValueError as exc:   # only a layer whose counts sum below the planner's floor (1e-30 > x > 0)
        assert "below the planner's limit" in str(exc)
        return
    for x in (*res.straggler_s_T, *res.migration_s_C, res.total_s, res.step_seconds):
        assert math.isfinite(x) and x >= 0
    assert res.total_s == pytest.approx(res.straggler_s + res.migration_s)
    assert res.moves_C[0] == 0 and (res.moves_C >= 0).all()
    assert json.dumps(res.to_json(), allow_nan=False)
