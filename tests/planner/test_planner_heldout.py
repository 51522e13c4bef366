"""Held-out scoring: fit on some workloads, score on another (leave-one-out over the 12 DeepSeek-V3 files),
and drift: fit on windows 0..t-1, score on window t. Measure: per held-out file, mean over the 58 MoE
layers of max/mean GPU load; then mean and worst across files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moe_monitor.planner.api import plan
from moe_monitor.planner.eplb_ref import eplb_global
from moe_monitor.planner.loads import layer_imbalance
from moe_monitor.planner.synthetic import drifting_windows

DATA = Path(__file__).resolve().parents[1] / "data" / "sglang_deepseek_v3"


def load_all():
    files = sorted(DATA.glob("*.json"))
    c = np.array([json.loads(f.read_text())["logical_count"] for f in files], dtype=float)
    return c[:, c[0].sum(1) > 0]


def test_leave_one_out_default_meets_its_goal_and_beats_eplb():
    """The default (no policy), as `moe-monitor plan` runs it: mean <= 1.03, worst <= 1.08."""
    C = load_all()
    G, R = 32, 32
    ours, eplb = [], []
    for k in range(0, C.shape[0], 2):           # every other held-out file keeps the test fast
        train = np.delete(C, k, axis=0)
        ours.append(layer_imbalance(C[k], plan(train, G, R).layout_LP, G).mean())
        eplb.append(layer_imbalance(C[k], eplb_global(train.sum(0), G, R), G).mean())
    ours, eplb = np.array(ours), np.array(eplb)
    assert ours.mean() <= 1.03 and ours.max() <= 1.08
    assert eplb.mean() > 1.12
    assert (ours < eplb).all()


def test_drift_next_window():
    c = drifting_windows(windows=8, layers=12, seed=5)
    G, R = 32, 32
    ours, eplb = [], []
    for t in (5, 6, 7):
        ours.append(layer_imbalance(c[t], plan(c[:t], G, R, policy="robust", decay=0.6).layout_LP, G).mean())
        eplb.append(layer_imbalance(c[t], eplb_global(c[:t].sum(0), G, R), G).mean())
    assert np.mean(ours) < np.mean(eplb)
