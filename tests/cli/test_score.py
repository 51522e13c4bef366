"""moe-monitor score: the real command on the shipped sample and on generated [T, L, E] JSON, its figures
checked against core.steptails and against a case worked out by hand."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor.cli import main
from moe_monitor.core.steptails import step_tails
from moe_monitor.planner.io import load_trace_steps
from tests.support.cli import child
from tests.support.livesteps import G, counts_steps, publish

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "moe_monitor" / "traces" / "samples" / "demo.parquet"


def score(capsys, *args) -> tuple[int, str, str]:
    rc = main(["score", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def write_counts(path: Path, counts_TLE) -> Path:
    path.write_text(json.dumps({"logical_count": np.asarray(counts_TLE).tolist()}))
    return path


def write_layout(path: Path, layout_LP) -> Path:
    path.write_text(json.dumps({"physical_to_logical_map": np.asarray(layout_LP).tolist()}))
    return path


def test_sample_trace_matches_steptails():
    """The installed command on the shipped demo trace (180 steps x 4 layers x 256 experts, 32 GPUs)."""
    r = child("score", "--load", SAMPLE, "--gpus", 32, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    counts = load_trace_steps(SAMPLE)
    want = step_tails(counts, np.tile(np.arange(256), (4, 1)), 32, "even").to_json()
    assert got["steps"] == 180 == counts.shape[0] and got["dispatch"] == "even"
    for key in ("per_step_imbalance", "window_imbalance", "ideal_fraction", "expert_skew_p99", "expert_skew"):
        assert got[key] == pytest.approx(want[key]), key
    assert got["per_step_imbalance"]["p50"] <= got["per_step_imbalance"]["p99"] <= got["per_step_imbalance"]["max"]


def test_sample_trace_human_text(capsys):
    rc, out, err = score(capsys, "--load", SAMPLE, "--gpus", 32, "--dispatch", "round_robin")
    assert rc == 0, err
    assert out.startswith("180 steps x 4 layers, 32 GPUs, 256 slots, dispatch round_robin")
    assert "per-step imbalance" in out and "ideal fraction" in out


def test_hand_computed_case(tmp_path, capsys):
    """E = 4 experts, G = 2 GPUs, contiguous: step 0 [3, 1, 0, 0] puts GPU loads [4, 0] (imbalance 2, skew
    3 / 2 on GPU 0), step 1 [1, 1, 1, 1] puts [2, 2] (imbalance 1, skew 1). Window [6, 2]: 6 / 4."""
    src = write_counts(tmp_path / "c.json", [[[3, 1, 0, 0]], [[1, 1, 1, 1]]])
    rc, out, err = score(capsys, "--load", src, "--gpus", 2, "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["steps"] == 2 and got["slots"] == 4
    assert got["per_step_imbalance"] == pytest.approx({"p50": 1.5, "p99": 1.99, "max": 2.0})
    assert got["window_imbalance"] == pytest.approx(6 / 4)
    assert got["ideal_fraction"] == pytest.approx(0.75)
    assert got["expert_skew_p99"] == pytest.approx(1.495)


def test_replicated_layout_even_vs_lp(tmp_path, capsys):
    """Expert 0 on both GPUs (layout [0 1 2 | 0 3 3]), counts [4, 2, 0, 0]: even splits expert 0 2 / 2, GPU
    loads [4, 2] (imbalance 4 / 3); lp moves one more token of it to GPU 1: [3, 3], imbalance 1."""
    src = write_counts(tmp_path / "c.json", [[[4, 2, 0, 0]]] * 3)
    lay = write_layout(tmp_path / "l.json", [[0, 1, 2, 0, 3, 3]])
    rc, out, err = score(capsys, "--load", src, "--layout", lay, "--gpus", 2, "--json")
    assert rc == 0, err
    assert json.loads(out)["per_step_imbalance"]["max"] == pytest.approx(4 / 3)
    rc, out, err = score(capsys, "--load", src, "--layout", lay, "--gpus", 2, "--dispatch", "lp", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["dispatch"] == "lp" and got["per_step_imbalance"]["max"] == pytest.approx(1.0, abs=1e-3)
    assert got["ideal_fraction"] == pytest.approx(1.0, abs=1e-3)


def test_generated_counts_match_steptails(tmp_path, capsys):
    rng = np.random.default_rng(3)
    counts = rng.multinomial(512, rng.dirichlet(np.full(32, 0.3), size=3), size=(12, 3))  # [12, 3, 32]
    counts[:, 0] = 0                                                                    # a dense layer
    layout = np.stack([np.concatenate([rng.permutation(32), rng.choice(32, 8, replace=False)]) for _ in range(3)])
    src = write_counts(tmp_path / "c.json", counts)
    lay = write_layout(tmp_path / "l.json", layout)
    for policy in ("even", "round_robin", "lp", "ideal"):
        rc, out, err = score(capsys, "--load", src, "--layout", lay, "--gpus", 8, "--dispatch", policy, "--json")
        assert rc == 0, err
        got = json.loads(out)
        want = step_tails(counts, layout, 8, policy).to_json()
        assert got["per_step_imbalance"] == pytest.approx(want["per_step_imbalance"]), policy
        assert got["window_imbalance"] == pytest.approx(want["window_imbalance"])
        assert got["per_layer"]["p99"][0] is None                                     # the dense layer
    assert got["per_step_imbalance"]["max"] == pytest.approx(1.0)                    # ideal


@pytest.mark.parametrize("counts, layout, gpus, words", [
    ([[[1, -1, 0, 0]]], None, 2, "negative"),
    ("nan", None, 2, "finite"),
    ([[[1, 2, 3, 4]]], None, 3, "do not split evenly"),
    ([[[1, 2, 3, 4]]], [[0, 1, 2, 3], [0, 1, 2, 3]], 2, "layers"),
    ([[[1, 2, 3, 4]]], [[0, 1, 2, 2]], 2, "no slot"),
    ([[1, 2, 3, 4]], None, 2, "one [layers, experts] table has no steps"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, counts, layout, gpus, words):
    src = tmp_path / "c.json"
    if counts == "nan":
        src.write_text('{"logical_count": [[[1, NaN, 0, 0]]]}')
    else:
        write_counts(src, counts)
    args = ["--load", src, "--gpus", gpus]
    if layout is not None:
        args += ["--layout", write_layout(tmp_path / "l.json", layout)]
    rc, out, err = score(capsys, *args)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err


def test_missing_file(tmp_path, capsys):
    rc, _, err = score(capsys, "--load", tmp_path / "none.json", "--gpus", 2)
    assert rc == 2 and "no such file" in err


def test_a_live_run_scores_as_its_counts_file(redis_url, tmp_path, capsys):
    counts = counts_steps(30, seed=4)
    publish(redis_url, "scored", counts)
    rc, out, err = score(capsys, "--redis", redis_url, "--run", "scored", "--dispatch", "lp", "--json")
    assert rc == 0, err
    live = json.loads(out)
    src = write_counts(tmp_path / "c.json", counts.sum(1))                     # ranks summed per step
    rc, out, err = score(capsys, "--load", src, "--gpus", G, "--dispatch", "lp", "--json")
    assert rc == 0, err
    from_file = json.loads(out)
    assert live.pop("time")["missing"] == ["no GPU profile"]                   # the run's metadata has its sizes
    assert from_file.pop("time")["missing"] == ["no model dimensions", "no GPU profile"]
    assert live == from_file and live["steps"] == 30 and live["gpus"] == G
    rc, out, err = score(capsys, "--redis", redis_url, "--run", "scored", "--steps", 12, "--json")
    assert rc == 0 and json.loads(out)["steps"] == 12, err
    rc, _, err = score(capsys, "--redis", redis_url, "--json")
    assert rc == 2 and "--redis URL and --run NAME go together" in err
    rc, _, err = score(capsys, "--redis", redis_url, "--run", "absent", "--json")
    assert rc == 2 and "absent" in err
