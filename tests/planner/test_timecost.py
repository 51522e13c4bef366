"""planner.timecost: chunked GPU times equal the cost model's on all steps at once; the cell cap keeps the newest
steps; the reasons when nothing can be priced."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor.core.costmodel import NO_DIMS, NO_PROFILE, ModelDims, TimeModel, default_nodes, time_model, verdict
from moe_monitor.core.dispatch import DispatchModel
from moe_monitor.core.hardware import GPU_PROFILES
from moe_monitor.planner.timecost import gpu_times_of, time_payload, time_verdict

DIMS = ModelDims(7168, 2048, 3, 1.0, 2.0)


def _case(steps=40, seed=0):
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rng.gamma(0.5, 20.0, size=(1, 3, 16)), size=(steps, 3, 16)).astype(float)
    layout = np.stack([np.concatenate([rng.permutation(16), rng.choice(16, 4, replace=False)]) for _ in range(3)])
    return counts, layout


@pytest.mark.parametrize("policy", ["even", "round_robin", "lp", "ideal"])
def test_chunked_times_equal_the_whole(monkeypatch, policy):
    counts, layout = _case()
    model = TimeModel(DIMS, GPU_PROFILES["H100 SXM"], gpus=4)
    monkeypatch.setattr(DispatchModel, "steps_per_chunk", property(lambda self: 7))
    got = gpu_times_of(counts, layout, 4, policy, model)
    want = model.gpu_times(DispatchModel(layout, 16, 4, policy).slot_loads(counts))
    np.testing.assert_allclose(got.total_s, want.total_s)
    np.testing.assert_allclose(got.active_slots, want.active_slots)
    found, steps = time_verdict(counts, layout, 4, policy, model)
    assert steps == 40 and found == verdict(want, ridge_tokens=model.ridge_tokens)


def test_cell_cap_keeps_the_newest_steps():
    counts, layout = _case()
    model = TimeModel(DIMS, GPU_PROFILES["H200"], gpus=4)
    cut = gpu_times_of(counts, layout, 4, "even", model, max_cells=3 * 4 * 10)
    np.testing.assert_allclose(cut.total_s, gpu_times_of(counts[-10:], layout, 4, "even", model).total_s)
    payload = time_payload(counts, layout, 4, "even", model)
    assert payload["steps"] == 40 and payload["steps_left_out"] == 0


def test_reasons_and_nodes():
    h100 = GPU_PROFILES["H100 SXM"]
    assert time_model(None, None, 8) == [NO_DIMS, NO_PROFILE] and time_model(DIMS, None, 8) == [NO_PROFILE]
    assert time_model(None, h100, 8) == [NO_DIMS]
    assert (default_nodes(32, h100), default_nodes(8, h100), default_nodes(4, h100), default_nodes(12, h100)) == (
        4, 1, 1, 1)
    model = time_model(DIMS, h100, 32)
    assert isinstance(model, TimeModel) and model.nodes == 4
    counts, layout = _case()
    off = time_payload(counts, layout, 4, "even", [NO_PROFILE], "give --gpu-profile")
    assert off == {"available": False, "reason": NO_PROFILE, "missing": [NO_PROFILE], "hint": "give --gpu-profile"}
