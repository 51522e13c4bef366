"""scripts.gpu_check on a machine without CUDA: it says so and skips; the cost-model section's grid, timing,
errors and fit run end to end on the CPU with a tiny expert (the CUDA events are the only part left out)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_monitor.core.costmodel import ModelDims, TimeModel
from moe_monitor.core.hardware import GPU_PROFILES
from scripts import gpu_costmodel

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelDims(64, 32, 3, weight_bytes=2.0, act_bytes=2.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_without_cuda_it_says_so_and_skips(tmp_path, monkeypatch, capsys):
    r = subprocess.run([sys.executable, "-m", "scripts.gpu_check"], cwd=ROOT, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)}, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stdout and "Traceback" not in r.stderr, r.stderr
    lines = [json.loads(line) for line in (tmp_path / gpu_costmodel.OUT_NAME).read_text().splitlines()]
    assert lines == [{"check": "costmodel", "skipped": "no CUDA device"}]
    from scripts import gpu_check
    monkeypatch.delenv("OUT", raising=False)
    assert gpu_check.main(["--costmodel-only"]) == 2
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.parametrize("grouped", [True, False])
def test_the_grid_on_the_cpu(tmp_path, monkeypatch, grouped):
    if not grouped:
        def refuse(*args, **kwargs):
            raise RuntimeError("not on this device")
        monkeypatch.setattr(torch, "_grouped_mm", refuse)
    lines = gpu_costmodel.run_grid("cpu", "bf16", TINY, GPU_PROFILES["H100 SXM"], experts=(1, 4), tokens=(1, 8, 64),
                                   reps=2, device_name="cpu")
    cells, summary = lines[:-1], lines[-1]
    assert [(c["experts"], c["tokens_per_expert"]) for c in cells] == [(e, t) for e in (1, 4) for t in (1, 8, 64)]
    assert all(c["measured_s"] > 0 and c["predicted_s"] > 0 for c in cells)
    assert cells[0]["rows_per_expert"] == 16
    assert summary["method"] == "torch._grouped_mm" if grouped else summary["method"].startswith("loop of torch.matmul")
    assert summary["cells"] == 6 and 0 <= summary["median_rel_error"] <= summary["p90_rel_error"]
    assert "fit" in summary
    gpu_costmodel.emit(lines, str(tmp_path))
    back = [json.loads(line) for line in (tmp_path / gpu_costmodel.OUT_NAME).read_text().splitlines()]
    assert len(back) == 7 and back[-1]["check"] == "costmodel_summary"


def test_prediction_and_errors():
    model = TimeModel(TINY, GPU_PROFILES["H100 SXM"], gpus=1)
    fixed = model.profile.overhead_s  # once per layer, however many experts
    one = gpu_costmodel.predicted_s(model, 1, 8) - fixed
    assert one > 0 and gpu_costmodel.predicted_s(model, 4, 8) - fixed == pytest.approx(4 * one)
    q = gpu_costmodel.quantiles([0.1, -0.2, 0.3, -0.05])
    assert q["cells"] == 4 and q["median_rel_error"] == pytest.approx(0.15) and q["median_signed_error"] == 0.025
    assert gpu_costmodel.quantiles([])["median_rel_error"] is None


def test_a_crashing_check_is_a_fail_line_and_the_next_one_runs(monkeypatch, capsys):
    from scripts import gpu_check
    monkeypatch.setattr(gpu_check, "FAILED", [])
    ran = []

    def cuda_graph():
        raise RuntimeError("no graphs here")

    def after():
        ran.append("after")
        gpu_check.check("after", True)

    for run in (cuda_graph, after):
        gpu_check.section(run)
    out = capsys.readouterr().out
    assert "FAIL cuda_graph RuntimeError: no graphs here" in out and "PASS after" in out
    assert ran == ["after"] and gpu_check.FAILED == ["cuda_graph"]
