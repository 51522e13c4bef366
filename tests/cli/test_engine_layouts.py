"""Layouts engines write (vLLM's -1 for an unused slot, a list per GPU) in score, diagnose and plan --current,
and score and diagnose checking a trace's shape before loading it. Every expected
figure is worked out here with numpy from the counts and the slots, never read back from the code under test."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor.cli import main
from moe_monitor.core.layouts import engine_layout
from moe_monitor.traces.convert import convert


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def write_json(path: Path, payload) -> Path:
    path.write_text(json.dumps(payload))
    return path


def imbalance_by_hand(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int) -> np.ndarray:
    """max/mean GPU load [T, L] under even split, a -1 slot holding nothing."""
    T, L, E = counts_TLE.shape
    per_gpu = layout_LP.shape[1] // gpus
    out = np.zeros((T, L))
    for layer in range(L):
        row = layout_LP[layer]
        replicas = np.bincount(row[row >= 0], minlength=E)
        for t in range(T):
            loads = np.zeros(gpus)
            for slot, expert in enumerate(row):
                if expert >= 0:
                    loads[slot // per_gpu] += counts_TLE[t, layer, expert] / replicas[expert]
            out[t, layer] = loads.max() / loads.mean()
    return out


COUNTS = np.random.default_rng(3).integers(1, 50, size=(6, 2, 6)).astype(float)
PER_GPU = [[[0, 1, 2], [3, 4], [5, 0]], [[5, 4], [3, 2, 1], [0]]]  # 3 GPUs, uneven slots per GPU


def test_score_reads_a_list_per_gpu_and_its_minus_one_padding_alike(tmp_path, capsys):
    counts = write_json(tmp_path / "c.json", {"logical_count": COUNTS.tolist()})
    padded, gpus = engine_layout(PER_GPU)
    assert gpus == 3 and (padded == -1).sum() == 5
    want = imbalance_by_hand(COUNTS, padded, 3)
    for layout in ({"physical_to_logical_map": PER_GPU}, {"physical_to_logical_map": padded.tolist()}):
        path = write_json(tmp_path / "l.json", layout)
        rc, out, err = run(capsys, "score", "--load", counts, "--layout", path, "--gpus", 3, "--json")
        assert rc == 0, err
        got = json.loads(out)
        assert got["unused_slots"] == 5 and got["slots"] == 9
        assert got["per_step_imbalance"]["max"] == pytest.approx(want.max(), rel=1e-9)
        assert got["per_step_imbalance"]["p50"] == pytest.approx(np.percentile(want, 50), rel=1e-9)


def test_score_refuses_a_minus_one_layout_that_leaves_an_expert_out(tmp_path, capsys):
    counts = write_json(tmp_path / "c.json", {"logical_count": COUNTS.tolist()})
    path = write_json(tmp_path / "l.json", {"physical_to_logical_map": [[0, 1, 2, 3, 4, -1]] * 2})
    rc, _, err = run(capsys, "score", "--load", counts, "--layout", path, "--gpus", 3)
    assert rc == 2 and "expert 5 has no slot" in err, err


def test_plan_current_repairs_a_minus_one_layout_and_gives_unused_slots_back(tmp_path, capsys):
    counts = np.ones((2, 6))
    counts[:, 0] = 40  # expert 0 is hot: a repair copies it into an unused slot
    src = write_json(tmp_path / "c.json", {"logical_count": counts.tolist()})
    current = [[0, 1, -1, 2, 3, -1, 4, 5, -1]] * 2
    cur = write_json(tmp_path / "cur.json", {"physical_to_logical_map": current})
    rc, _, err = run(capsys, "plan", "--load", src, "--gpus", 3, "--redundant", 3, "--current", cur, "--moves", 2,
                     "--out", tmp_path / "o.json")
    assert rc == 0, err
    got = np.asarray(json.loads((tmp_path / "o.json").read_text())["physical_to_logical_map"])
    assert got.shape == (2, 9) and got.min() >= -1 and got.max() <= 5
    for row in got:
        assert set(row[row >= 0]) == set(range(6))
        assert (row == 0).sum() >= 2  # the hot expert got a copy
        for gpu in row.reshape(3, 3):
            used = gpu[gpu >= 0]
            assert len(set(used)) == len(used)  # never two copies on one GPU
    assert imbalance_by_hand(counts[None], got, 3).max() < imbalance_by_hand(counts[None], np.asarray(current), 3).max()


def test_commands_that_need_every_slot_say_so(tmp_path, capsys):
    trace = tmp_path / "t.parquet"
    write_json(tmp_path / "c.json", {"logical_count": COUNTS.tolist()})
    convert(str(tmp_path / "c.json"), str(trace), gpus=3)
    layout = write_json(tmp_path / "l.json", {"physical_to_logical_map": PER_GPU})
    rc, _, err = run(capsys, "staleness", "--trace", trace, "--gpus", 3, "--layout", layout, "--out", tmp_path / "o.json")
    assert rc == 2 and "unused (-1)" in err and len(err.strip().splitlines()) == 1, err


def _trace(tmp_path: Path, steps: int, layers: int, experts: int, spoil_last: bool = False) -> Path:
    counts = np.random.default_rng(1).integers(0, 9, size=(steps, layers, experts))
    write_json(tmp_path / "c.json", {"logical_count": counts.tolist()})
    out = tmp_path / "t.jsonl"
    from moe_monitor import core
    from moe_monitor.core.tracefile import open_trace
    convert(str(tmp_path / "c.json"), str(tmp_path / "t.parquet"), gpus=2)
    with open_trace(tmp_path / "t.parquet") as reader:
        lines = [core.trace_line("meta", {"meta": core.encode_meta(reader.meta)})]
        lines += [core.trace_line("step", core.encode_step(rec)) for rec in reader.read_steps(0, steps - 1)]
    if spoil_last:
        lines[-1] = lines[-1].replace('"counts_b64":"', '"counts_b64":"AAAA')
    out.write_text("\n".join(lines) + "\n")
    return out


def test_score_checks_the_shape_before_loading_the_steps(tmp_path, capsys, monkeypatch):
    trace = _trace(tmp_path, steps=200, layers=4, experts=64)
    monkeypatch.setenv("MOE_TRACE_MAX_DECODED_MIB", "1")  # 200 x 4 x 64 cells at 24 B: 1.2 MiB
    rc, _, err = run(capsys, "score", "--load", trace, "--gpus", 2)
    assert rc == 2 and "200 steps x 4 layers x 64 experts" in err and "decode to" in err, err


def test_diagnose_checks_the_plan_size_before_loading_the_steps(tmp_path, capsys):
    trace = _trace(tmp_path, steps=20, layers=4, experts=64, spoil_last=True)
    rc, _, err = run(capsys, "diagnose", "--trace", trace, "--gpus", 2, "--redundant", 65000)
    assert rc == 2 and ("plan too large" in err or "above the planner's limit" in err), err


def test_score_a_layer_without_unused_slots_beside_one_with_them(tmp_path, capsys):
    counts = write_json(tmp_path / "c.json", {"logical_count": COUNTS.tolist()})
    layout = np.array([[0, 1, 2, 3, 4, 5, 0, 1, 2], [5, 4, -1, 3, 2, 1, 0, -1, -1]])
    path = write_json(tmp_path / "l.json", {"physical_to_logical_map": layout.tolist()})
    rc, out, err = run(capsys, "score", "--load", counts, "--layout", path, "--gpus", 3, "--json")
    assert rc == 0, err
    assert json.loads(out)["per_step_imbalance"]["max"] == pytest.approx(imbalance_by_hand(COUNTS, layout, 3).max())


def test_diagnose_repairs_a_layout_whose_gpu_leaves_two_slots_unused(tmp_path, capsys):
    """GPU 2 leaves two slots unused in each layer. One phantom expert in both put it twice on that GPU, and the
    repair held every such layer as it was (0 copies); a phantom per unused slot of a GPU lets the repair fill
    them with copies of the hot expert, and lowers its imbalance below the layout in force's."""
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 50, size=(40, 2, 6))
    counts[:, :, 0] *= 5  # expert 0 is hot
    trace = write_json(tmp_path / "c.json", counts.tolist())
    layout = write_json(tmp_path / "l.json", {"physical_to_logical_map": [[0, 1, 2, 3, 4, 5, -1, -1, 0],
                                                                          [0, 1, 2, 3, 4, 5, 0, -1, -1]]})
    rc, out, err = run(capsys, "diagnose", "--trace", trace, "--layout", layout, "--gpus", 3, "--every", 10, "--json")
    assert rc == 0, err
    got = {c["name"]: c for c in json.loads(out)["candidates"]}
    assert got["ours_repair"]["moves"] > 0, got["ours_repair"]
    assert got["ours_repair"]["per_step_imbalance_p99"] < got["in_force"]["per_step_imbalance_p99"]
    assert any("2 phantom expert(s)" in n for n in json.loads(out)["notes"])
