"""The What-if page's pure parts: click -> edit -> layout and undo (dashboard.whatif.edits), moves between
layouts (planner.repair.experts_copied), window selection and scoring (dashboard.whatif.score), the sample ring,
and the planner's trace loader. Expected values are recomputed here with plain loops."""
import json

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.samples import SampleRing
from moe_monitor.dashboard.whatif import edits
from moe_monitor.dashboard.whatif import score as whatif_score
from moe_monitor.planner.io import load_counts
from moe_monitor.planner.repair import experts_copied
from moe_monitor.planner.windows import split_windows

# 2 layers, 8 experts, 4 GPUs, R = 4 -> 3 slots per GPU; experts 0 and 1 have two replicas
LAYOUT = np.array([[0, 1, 2, 3, 4, 0, 5, 6, 1, 7, 2, 3],
                   [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]])
COUNTS = np.array([[90, 40, 10, 5, 30, 20, 8, 2], [10, 10, 10, 10, 10, 10, 10, 100]], dtype=float)
G = 4


def loads_by_loop(layout, counts, gpus):
    """[L, G] loads: each slot gets count / replicas of its expert."""
    out = np.zeros((len(layout), gpus))
    for l, row in enumerate(layout):
        row = list(row)
        for p, e in enumerate(row):
            out[l, p // (len(row) // gpus)] += counts[l][e] / row.count(e)
    return out


def gpu_set(layout, layer, gpu):
    S = len(layout[layer]) // G
    return set(int(e) for e in layout[layer][gpu * S:(gpu + 1) * S])


@pytest.mark.parametrize("event, want", [
    ({"selection": {edits.GPU_PARAM: [{"gpu": 2}]}}, 2),                   # st.vega_lite_chart's event
    ({edits.GPU_PARAM: [{"gpu": 1}, {"gpu": 3}]}, 1),                       # its "selection" part; shift-click: first
    ({"selection": {edits.GPU_PARAM: [{"gpu": [3]}]}}, 3),                  # a point selection's store form
    ({"selection": {edits.GPU_PARAM: [{"gpu": 2.0}]}}, 2),
    ({"selection": {edits.GPU_PARAM: []}}, None), ({"selection": {edits.GPU_PARAM: {}}}, None),  # cleared
    (None, None), ({}, None),
    ({"selection": {edits.GPU_PARAM: [{"gpu": 9}]}}, None),                 # outside 0..G-1
    ({"selection": {edits.GPU_PARAM: [{"gpu": 1.5}]}}, None),               # not a GPU
    ({"selection": {edits.GPU_PARAM: [{"gpu": "GPU x"}]}}, None),
    ({"selection": {edits.EXPERT_PARAM: [{"expert": 2}]}}, None),           # another chart's selection
])
def test_clicked_gpu(event, want):
    assert edits.clicked_gpu(event, G) == want


def test_clicked_expert_reads_the_expert_field():
    assert edits.clicked_expert({"selection": {edits.EXPERT_PARAM: [{"expert": 7}]}}, 8) == 7
    assert edits.clicked_expert({"selection": {edits.EXPERT_PARAM: [{"label": "e7 (x2)"}]}}, 8) is None


def test_click_add_replica_then_undo():
    session = edits.new_session(("k",), LAYOUT, G)
    gpu_click = {"selection": {edits.GPU_PARAM: [{"gpu": 3}]}}
    target = edits.clicked_gpu(gpu_click, G)
    action = edits.Action("add", 1, 7, target)          # hot expert 7 of layer 1 gets a second replica
    edited = edits.apply_action(session, action, COUNTS)
    new = edited.current
    assert edited.num_edits == 1 and edited.log == (action.describe(),)
    assert 7 in gpu_set(new, 1, target) and list(new[1]).count(7) == 2
    assert sorted(set(new[1])) == list(range(8)) and new.shape == LAYOUT.shape
    assert (new[0] == LAYOUT[0]).all() and (new[1] != LAYOUT[1]).sum() == 1
    assert experts_copied(LAYOUT, new, G) == 1                # expert 7's weights copied onto the target GPU
    before, after = loads_by_loop(LAYOUT, COUNTS, G)[1], loads_by_loop(new, COUNTS, G)[1]
    assert after.max() / after.mean() < before.max() / before.mean()
    with pytest.raises(ValueError):
        new[0, 0] = 3  # layouts in the history are read-only
    back = edits.undo(edited)
    assert back.num_edits == 0 and (back.current == LAYOUT).all()
    with pytest.raises(ValueError, match="nothing to undo"):
        edits.undo(back)


def test_click_move_and_refused_edits_leave_session_unchanged():
    session = edits.new_session(("k",), LAYOUT, G)
    moved = edits.apply_action(session, edits.Action("move", 0, 4, 1, 2), COUNTS).current
    assert 4 not in gpu_set(moved, 0, 1) and 4 in gpu_set(moved, 0, 2)
    assert sorted(moved[0]) == sorted(LAYOUT[0])  # a swap: the same slots, only places changed
    assert experts_copied(LAYOUT, moved, G) == 2  # expert 4 onto GPU 2, the swapped expert onto GPU 1
    for bad, msg in ((edits.Action("add", 0, 0, 0), "already holds"),
                     (edits.Action("move", 0, 4, 0, 2), "holds no replica"),
                     (edits.Action("move", 0, 4, 1, None), "destination"),
                     (edits.Action("swap", 0, 4, 1, 2), "unknown edit")):
        with pytest.raises(ValueError, match=msg):
            edits.apply_action(session, bad, COUNTS)
    assert session.num_edits == 0 and (session.current == LAYOUT).all()


def test_gpu_experts_rows():
    rows = edits.gpu_experts(LAYOUT, COUNTS, 0, 1, G)
    assert [r["slot"] for r in sorted(rows, key=lambda r: r["slot"])] == [3, 4, 5]
    for r in rows:
        reps = list(LAYOUT[0]).count(r["expert"])
        assert r["expert"] == LAYOUT[0, r["slot"]] and r["replicas"] == reps
        assert r["load"] == pytest.approx(COUNTS[0, r["expert"]] / reps)
    assert [r["load"] for r in rows] == sorted((r["load"] for r in rows), reverse=True)
    with pytest.raises(ValueError, match="GPU 4"):
        edits.gpu_experts(LAYOUT, COUNTS, 0, 4, G)


def test_experts_copied_against_sets():
    rng = np.random.default_rng(1)
    a = np.stack([rng.permutation(12) % 8 for _ in range(3)])
    for b in (a, np.stack([rng.permutation(12) % 8 for _ in range(3)]), np.stack([rng.permutation(16) % 8 for _ in range(3)])):
        want = sum(len(set(b[l].reshape(G, -1)[g]) - set(a[l].reshape(G, -1)[g])) for l in range(3) for g in range(G))
        assert experts_copied(a, b, G) == want
    assert experts_copied(a, a, G) == 0


def test_layout_json_is_sglang_loadable():
    text = edits.layout_json(LAYOUT)
    assert set(json.loads(text)) == {"physical_to_logical_map"}
    rows = core.parse_layout_json(text)
    assert rows == LAYOUT.tolist() and all(len(r) == 8 + 4 for r in rows)
    core.Layout(gpus=G, nodes=1, physical_to_logical_map=rows).validate(2, 8)


def test_fit_and_score_steps_hold_out_overlap_and_minutes():
    t = np.arange(100) * 6.0                                    # a step every 6 s
    fit, score, overlap = whatif_score.fit_and_score_steps(t, 10, 30)
    assert list(score) == list(range(90, 100)) and list(fit) == list(range(60, 90)) and not overlap
    fit, score, overlap = whatif_score.fit_and_score_steps(t, 10, 30, hold_out=False)
    assert list(fit) == list(range(70, 100)) and overlap
    fit, _, _ = whatif_score.fit_and_score_steps(t, 10, 1.0, unit="minutes")  # 60 s before step 89 (t=534)
    assert list(fit) == list(range(79, 90))
    fit, score, overlap = whatif_score.fit_and_score_steps(t[:5], 10, 30)      # too few steps to hold out
    assert list(score) == list(range(5)) and list(fit) == list(range(5)) and overlap
    with pytest.raises(ValueError, match="unit"):
        whatif_score.fit_and_score_steps(t, 10, 30, unit="hours")


def test_split_windows_and_score_by_loop():
    rng = np.random.default_rng(0)
    steps = rng.integers(0, 50, size=(37, 2, 8))
    win = split_windows(steps)
    assert win.shape == (16, 2, 8) and win.sum() == steps.sum() and (win[0] == steps[:3].sum(0)).all()
    s = whatif_score.score(LAYOUT, steps, G)
    per_sum = loads_by_loop(LAYOUT, steps.sum(0), G)
    assert np.allclose(s.imbalance_sum_L, per_sum.max(1) / per_sum.mean(1))
    step3 = loads_by_loop(LAYOUT, steps[3], G)
    assert np.allclose(1.0 / s.eta_step_TL[3], step3.max(1) / step3.mean(1))
    assert s.balancedness == pytest.approx(np.mean(per_sum.mean(1) / per_sum.max(1)))


def _rec(step, rank, counts, sample=None, phase="decode"):
    return core.StepRecord(run="r", rank=rank, world_size=2, step=step, time_s=float(step), phase=phase,
                           tokens=int(counts.sum()), counts_LE=counts.astype(np.int32), sample_ids_LNK=sample)


def test_sample_ring_keeps_newest_steps():
    ring = SampleRing(capacity=3)
    for step in range(5):
        for rank in range(2):
            ring.add(_rec(step, rank, np.ones((2, 8)), np.full((2, 4, 2), step, dtype=np.int16)))
    ring.add(_rec(9, 0, np.ones((2, 8))))                      # no sample: ignored
    assert len(ring) == 3 and ring.rows([0, 1]) is None
    rows = ring.rows([3, 4])
    assert rows.shape == (2, 16, 2) and sorted(set(rows.ravel().tolist())) == [3, 4]


def _trace_lines(counts_by_step, meta=True):
    lines = []
    if meta:
        m = core.RunMeta(run="r", model_name="m", layer_names=["a", "b"], num_experts=8, top_k=2, hidden_size=4,
                         moe_intermediate_size=4, dtype_bytes=2, layout=core.Layout(4, 1, core.contiguous_layout(2, 8)))
        lines.append(core.trace_line("meta", {"meta": core.encode_meta(m)}))
    for step, ranks in counts_by_step:
        for rank, counts in enumerate(ranks):
            lines.append(core.trace_line("step", core.encode_step(_rec(step, rank, counts))))
    return lines


def test_trace_loader_sums_ranks_and_splits_windows(tmp_path):
    rng = np.random.default_rng(3)
    steps = {s: [rng.integers(0, 9, (2, 8)) for _ in range(2)] for s in range(40)}
    lines = _trace_lines(sorted(steps.items(), key=lambda kv: -kv[0]))  # out of order on purpose
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    got = load_counts(path)
    per_step = np.stack([steps[s][0] + steps[s][1] for s in range(40)])
    assert got.shape == (16, 2, 8) and got.sum() == per_step.sum()
    assert (got[0] == per_step[:3].sum(0)).all() and (got[-1] == per_step[-2:].sum(0)).all()
    (tmp_path / "run.json").write_text("\n".join(lines))      # a trace named .json is sniffed
    assert (load_counts(tmp_path / "run.json") == got).all()
    repeated = lines[:5] + lines[3:]                            # a retried write repeats two records
    (tmp_path / "repeated.jsonl").write_text("\n".join(repeated) + "\n")
    assert (load_counts(tmp_path / "repeated.jsonl") == got).all()


@pytest.mark.parametrize("bad, msg", [
    ("not json", "do not decode (line at byte {offset}: trace line is not JSON"),
    (json.dumps({"kind": "step", "v": 1}), "do not decode (line at byte {offset}: missing field 'L')"),
    (core.trace_line("step", core.encode_step(_rec(7, 0, np.ones((3, 8))))), "counts are [3, 8], the run has [2, 8]"),
])
def test_trace_loader_bad_lines(tmp_path, bad, msg):
    lines = _trace_lines([(0, [np.ones((2, 8))])])
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines + [bad]) + "\n")
    with pytest.raises(ValueError) as err:
        load_counts(path)
    msg = msg.format(offset=len(("\n".join(lines) + "\n").encode()))  # the bad line starts after the good ones
    assert msg in str(err.value) and "bad.jsonl" in str(err.value)
    (tmp_path / "empty.jsonl").write_text("\n".join(_trace_lines([])) + "\n")
    with pytest.raises(ValueError, match="no step lines"):
        load_counts(tmp_path / "empty.jsonl")


def test_plan_cli_reads_a_trace(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    rng = np.random.default_rng(5)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(_trace_lines([(s, [rng.integers(0, 9, (2, 8))]) for s in range(20)])) + "\n")
    out = tmp_path / "layout.json"
    r = subprocess.run([sys.executable, "-m", "moe_monitor", "plan", "--load", str(path), "--gpus", "4", "--redundant", "4",
                        "--out", str(out)], cwd=root, env=dict(os.environ),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = core.parse_layout_json(out.read_text())
    core.Layout(gpus=4, nodes=1, physical_to_logical_map=rows).validate(2, 8)
    assert len(rows[0]) == 12
    path.write_text("garbage\n")
    r = subprocess.run([sys.executable, "-m", "moe_monitor", "plan", "--load", str(path), "--gpus", "4", "--redundant", "4",
                        "--out", str(out)], cwd=root, env=dict(os.environ),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "t.jsonl: holds no metadata and no step line: not a trace" in r.stderr
