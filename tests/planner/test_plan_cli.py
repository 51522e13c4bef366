"""The CLI contract: moe-monitor plan --load FILE --gpus G --redundant R [...] --out OUT.json, in this process
(tests/support/cli.py) but for one run of the real `python -m moe_monitor plan`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moe_monitor.planner.loads import check_layout, layer_imbalance
from moe_monitor.planner.synthetic import drifting_windows, skewed_counts
from tests.support.cli import child, in_process

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "sglang_deepseek_v3"


def run(*args):
    return in_process("plan", *args)


def test_real_json_global(tmp_path):
    out = tmp_path / "out.json"
    src = DATA / "prefill_in1024.json"
    r = run("--load", src, "--gpus", 32, "--redundant", 32, "--out", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    lay = np.array(d["physical_to_logical_map"])
    assert lay.shape == (61, 288)
    check_layout(lay, 256, 32)
    c = np.array(json.loads(src.read_text())["logical_count"])
    imb = layer_imbalance(c, lay, 32)
    np.testing.assert_allclose(imb, d["predicted_imbalance"], atol=1e-5)
    assert (np.array(d["predicted_imbalance"]) >= np.array(d["lower_bound_imbalance"]) - 1e-6).all()
    assert np.array(d["replica_counts"]).sum(1).tolist() == [288] * 61


def test_hierarchical_flags(tmp_path):
    out = tmp_path / "h.json"
    r = run("--load", DATA / "decode_in500out1500.json", "--gpus", 32, "--redundant", 32,
            "--nodes", 4, "--groups", 8, "--out", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert len(d["off_node_token_share"]) == 61 and d["policy"] == "hierarchical"
    assert len(d["group_floor_imbalance"]) == 61


def test_windowed_json_and_pt(tmp_path):
    c = drifting_windows(windows=4, layers=5, experts=64, seed=1)
    c[:, 0] = 0                                  # a dense layer
    js = tmp_path / "w.json"
    js.write_text(json.dumps({"logical_count": c.tolist()}))
    import torch
    pt = tmp_path / "w.pt"
    torch.save(torch.tensor(c), pt)
    outs = []
    for src in (js, pt):
        out = tmp_path / (src.stem + src.suffix[1:] + ".json")
        r = run("--load", src, "--gpus", 8, "--redundant", 8, "--decay", 0.7, "--out", out)
        assert r.returncode == 0, r.stderr
        d = json.loads(out.read_text())
        lay = np.array(d["physical_to_logical_map"])
        check_layout(lay, 64, 8)
        assert d["policy"] == "robust" and d["layers_with_traffic"][0] is False
        outs.append(lay)
    assert (outs[0] == outs[1]).all()


class Payload:
    """A class a .pt may name: unpickling it would run code of the file's choosing."""


def test_pt_with_pickled_objects_is_refused(tmp_path):
    """weights_only=True: a .pt that needs arbitrary unpickling (an object of some class) is an error with
    one line, and nothing of it runs."""
    import torch
    pt = tmp_path / "unsafe.pt"
    torch.save({"logical_count": torch.zeros(2, 4), "extra": Payload()}, pt)
    r = run("--load", pt, "--gpus", 2, "--redundant", 0, "--out", tmp_path / "o.json")
    assert r.returncode == 2 and "weights-only" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_pt_dict_and_eplb_policy(tmp_path):
    import torch
    pt = tmp_path / "c.pt"
    torch.save({"logical_count": torch.tensor(skewed_counts(layers=3, experts=32))}, pt)
    r = run("--load", pt, "--gpus", 4, "--redundant", 4, "--policy", "eplb", "--out", tmp_path / "o.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o.json").read_text())["policy"] == "eplb"


def test_repair_from_current(tmp_path):
    c = skewed_counts(layers=3, experts=32, seed=9)
    src = tmp_path / "c.json"
    src.write_text(json.dumps({"logical_count": c.tolist()}))
    cur = tmp_path / "cur.json"
    cur.write_text(json.dumps({"physical_to_logical_map": [list(range(32)) + [0, 8, 16, 24]] * 3}))
    r = run("--load", src, "--gpus", 4, "--redundant", 4, "--current", cur, "--moves", 6,
            "--out", tmp_path / "o.json")
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "o.json").read_text())
    assert d["moves_used"] <= 6 and d["moves_vs_imbalance"][0]["moves"] == 0


BAD = [
    ("notjson.json", "{not json", "not valid JSON"),
    ("nokey.json", '{"counts": [[1, 2]]}', "no 'logical_count'"),
    ("ragged.json", '{"logical_count": [[1, 2], [3]]}', "rectangular"),
    ("neg.json", '{"logical_count": [[1, -2, 3, 4]]}', "negative"),
    ("one_d.json", '{"logical_count": [1, 2, 3, 4]}', "2-D or 3-D"),
    ("bad.pt", "not a torch file", "weights-only"),
    ("x.csv", "1,2", "unknown file type"),
]


@pytest.mark.parametrize("name,text,msg", BAD)
def test_bad_input_exits_2_with_one_line(tmp_path, name, text, msg):
    f = tmp_path / name
    f.write_text(text)
    r = run("--load", f, "--gpus", 2, "--redundant", 0, "--out", tmp_path / "o.json")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args,msg", [
    (["--gpus", 32, "--redundant", 3], "split evenly"),
    (["--gpus", 32, "--redundant", 32, "--nodes", 4], "go together"),
    (["--gpus", 32, "--redundant", 32, "--nodes", 3, "--groups", 8], "split evenly"),
    (["--gpus", "x", "--redundant", 0], "invalid int"),
])
def test_bad_arguments_exit_2(tmp_path, args, msg):
    r = run("--load", DATA / "prefill_in512.json", *args, "--out", tmp_path / "o.json")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr


def test_dashboard_planner_never_imports_torch():
    code = ("import sys, moe_monitor.planner, moe_monitor.planner.api, moe_monitor.planner.io,"
            " moe_monitor.planner.edits, moe_monitor.planner.traffic, moe_monitor.planner.budget,"
            " moe_monitor.planner.repair;"
            " bad = [m for m in ('torch', 'streamlit', 'pynvml') if m in sys.modules]; print(bad);"
            " sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# Bad input found by the "never down, never wrong" issue: each answered with one "error: ..." line and exit 2.
# Run in-process through moe_monitor.cli.main (the same code as moe-monitor plan, minus the interpreter start).

def cli(capsys, *args) -> tuple[int, list[str]]:
    from moe_monitor.cli import main

    rc = main(["plan", *(str(a) for a in args)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.strip().splitlines()


BAD_VALUES = [
    ("sum_inf.json", '{"logical_count": [[1e308, 1e308, 1, 1]]}', "sum to inf, above the planner's limit of 1e+30"),
    ("sum_huge.json", '{"logical_count": [[1e30, 1e30, 1, 1]]}', "sum to 2e+30, above the planner's limit of 1e+30"),
    ("strings.json", '[["1", "2"]]', "numbers only, found str '1' at [0][0]"),
    ("bools.json", '[[true, false]]', "numbers only, found bool True at [0][0]"),
    ("mixed_bool.json", '{"logical_count": [[1, 2], [3, true]]}', "numbers only, found bool True at [1][1]"),
    ("nulls.json", '[[null, 1]]', "numbers only, found NoneType"),
    ("objects.json", '[[{"a": 1}, 1]]', "numbers only, found dict"),
    ("huge_int.json", "[[1" + "0" * 400 + ", 1]]", "float range"),
    ("long_int.json", "[[1" + "0" * 5000 + ", 1]]", "not valid JSON"),
    ("deep.json", "[" * 100_000, "nested too deeply"),
    ("four_d.json", "[[[[1, 2]]]]", "deeper than 3 levels"),
    ("tiny.json", "[[1e-31, 0], [1, 1]]", "[0] sum to 1e-31, below the planner's limit of 1e-30"),
    ("nan.json", "[[NaN, 1]]", "NaN or infinite"),
]


@pytest.mark.parametrize("name,text,msg", BAD_VALUES)
def test_bad_values_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, name, text, msg):
    f = tmp_path / name
    f.write_text(text)
    out = tmp_path / "o.json"
    rc, lines = cli(capsys, "--load", f, "--gpus", 2, "--redundant", 0, "--out", out)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], lines
    assert not out.exists()


def test_not_utf8_json_is_one_line(tmp_path, capsys):
    f = tmp_path / "latin1.json"
    f.write_bytes(b'{"logical_count": [[1, 2]], "note": "caf\xe9"}')
    rc, lines = cli(capsys, "--load", f, "--gpus", 2, "--redundant", 0, "--out", tmp_path / "o.json")
    assert rc == 2 and len(lines) == 1 and "not UTF-8" in lines[0], lines


@pytest.mark.parametrize("args,msg", [
    (["--gpus", 2, "--redundant", 0, "--recent", 0], "--recent"),
    (["--gpus", 2, "--redundant", 0, "--recent", -3], "--recent"),
    (["--gpus", 2, "--redundant", 0, "--decay", 0], "decay must be in (0, 1]"),
    (["--gpus", 256, "--redundant", 65280], "plan too large"),
    (["--gpus", 1, "--redundant", 70000], "above the planner's limit of 65536"),
    (["--gpus", 2, "--redundant", 10 ** 30], "above the planner's limit of 65536"),
])
def test_out_of_range_arguments_exit_2(tmp_path, capsys, args, msg):
    out = tmp_path / "o.json"
    rc, lines = cli(capsys, "--load", DATA / "prefill_in512.json", *args, "--out", out)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], lines
    assert not out.exists()


def test_recent_is_checked_for_windowed_input_too(tmp_path, capsys):
    src = tmp_path / "w.json"
    src.write_text(json.dumps(drifting_windows(windows=3, layers=2, experts=8, seed=0).tolist()))
    rc, lines = cli(capsys, "--load", src, "--gpus", 2, "--redundant", 0, "--recent", 0, "--out", tmp_path / "o.json")
    assert rc == 2 and "--recent" in lines[0]


def test_layout_json_is_strict(tmp_path):
    from moe_monitor.planner.io import write_json

    out = tmp_path / "o.json"
    with pytest.raises(ValueError, match="NaN or infinite"):
        write_json(out, {"physical_to_logical_map": [[0, 1]], "predicted_balancedness": [float("inf")]})
    assert not out.exists()


def _torch_tensors():
    import torch
    return {
        "sparse_coo": (lambda: torch.tensor([[1.0, 0], [0, 2]]).to_sparse(), "sparse_coo tensor"),
        "sparse_csr": (lambda: torch.tensor([[1.0, 0], [0, 2]]).to_sparse_csr(), "sparse_csr tensor"),
        "meta": (lambda: torch.empty(2, 4, device="meta"), "meta tensor"),
        "quantized": (lambda: torch.quantize_per_tensor(torch.tensor([[1.0, 2], [3, 4]]), 0.1, 0, torch.quint8),
                      "quantized tensor"),
        "bool": (lambda: torch.tensor([[True, False]]), "torch.bool tensor"),
        "complex": (lambda: torch.tensor([[1 + 2j, 3]]), "torch.complex64 tensor"),
        "nested": (lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]), "nested tensor"),
    }


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "meta", "quantized", "bool", "complex", "nested"])
@pytest.mark.parametrize("wrapped", [False, True])
def test_pt_tensors_without_plain_numbers_are_one_line(tmp_path, capsys, kind, wrapped):
    import warnings

    import torch
    make, msg = _torch_tensors()[kind]
    with warnings.catch_warnings():  # beta / deprecation notices of torch itself
        warnings.simplefilter("ignore")
        tensor = make()
    pt = tmp_path / f"{kind}.pt"
    torch.save({"logical_count": tensor} if wrapped else tensor, pt)
    rc, lines = cli(capsys, "--load", pt, "--gpus", 2, "--redundant", 0, "--out", tmp_path / "o.json")
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], lines


def test_pt_half_and_int_tensors_still_plan(tmp_path, capsys):
    import torch
    c = (skewed_counts(layers=2, experts=8, seed=3) * 1000 / skewed_counts(layers=2, experts=8, seed=3).max()).round()
    for dtype in (torch.float16, torch.int32):
        pt = tmp_path / f"{dtype}.pt".replace("torch.", "")
        torch.save(torch.tensor(c).to(dtype), pt)
        rc, lines = cli(capsys, "--load", pt, "--gpus", 2, "--redundant", 0, "--out", tmp_path / "o.json")
        assert rc == 0, lines


def test_huge_plans_fail_fast_in_a_subprocess(tmp_path):
    """The issue's example: --gpus 256 --redundant 65280 tried to allocate 7.6 GiB; now one line, at once."""
    r = child("plan", "--load", DATA / "prefill_in512.json", "--gpus", 256, "--redundant", 65280, "--out",
              tmp_path / "o.json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "plan too large" in r.stderr, r.stderr
