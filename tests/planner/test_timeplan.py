"""planner.timeplan: the time objective spreads active experts where tokens alone would not, and places
replicas where they cost the least time."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor.core.costmodel import ModelDims, TimeModel
from moe_monitor.core.dispatch import DispatchModel
from moe_monitor.core.hardware import GPU_PROFILES
from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.planner.api import plan
from moe_monitor.planner.timecost import slowest_and_mean_s
from moe_monitor.planner.timeplan import replicate_for_time, time_p99

DSV3_FP8 = ModelDims(7168, 2048, 3, weight_bytes=1.0, act_bytes=2.0)


def _steps(mean_E, steps=80, seed=0):
    rng = np.random.default_rng(seed)
    return rng.poisson(np.broadcast_to(np.asarray(mean_E, dtype=np.float64), (steps, 1, len(mean_E)))).astype(float)


def test_time_objective_spreads_active_experts_that_token_balance_stacks():
    # one hot expert (60 tokens), three warm (20), four idle: by tokens the hot one sits alone with idle ones and
    # the three warm share a GPU (60 / 60 tokens, 1 / 3 weight reads); by time each GPU runs two active experts
    mean_E = [60, 20, 20, 20, 0, 0, 0, 0]
    fit, held = _steps(mean_E, seed=1), _steps(mean_E, seed=2)
    model = TimeModel(DSV3_FP8, GPU_PROFILES["H100 SXM"], gpus=2)
    tokens = plan(fit.sum(0), gpus=2, redundant=0)
    timed = plan(fit.sum(0), gpus=2, redundant=0, objective="time", steps=fit, time_model=model)
    assert timed.objective == "time" and timed.time_p99_s_L is not None
    assert "step_p99_moe_seconds" in timed.summary() and "step_p99_moe_seconds_per_layer" in timed.to_json()
    t_tokens, t_time = time_p99(held, tokens.layout_LP, 2, model), time_p99(held, timed.layout_LP, 2, model)
    assert t_time[0] < t_tokens[0] - 0.8 * model.weight_read_s   # one weight read fewer on the slowest GPU
    active = [(held[:, 0, timed.layout_LP[0, g * 4:(g + 1) * 4]] > 0).sum(1).mean() for g in range(2)]
    assert abs(active[0] - active[1]) < 0.5


def test_replicas_go_to_compute_bound_experts_and_otherwise_where_they_idle():
    model = TimeModel(DSV3_FP8, GPU_PROFILES["H100 SXM"], gpus=4)
    hot = _steps([4000, 10, 10, 10, 10, 10, 10, 0.05])      # far above the ridge: a replica halves its GEMM
    assert replicate_for_time(hot, 9, model, max_replicas=4)[0].tolist() == [2, 1, 1, 1, 1, 1, 1, 1]
    cool = _steps([100, 10, 10, 10, 10, 10, 10, 0.05])       # all memory-bound: the spare goes to the idle one
    assert replicate_for_time(cool, 9, model, max_replicas=4)[0].tolist() == [1, 1, 1, 1, 1, 1, 1, 2]


def test_time_objective_needs_a_model_and_steps():
    counts = np.ones((1, 8))
    with pytest.raises(ValueError, match="dimensions and a GPU profile"):
        plan(counts, gpus=2, redundant=0, objective="time", steps=np.ones((4, 1, 8)))
    model = TimeModel(DSV3_FP8, GPU_PROFILES["H100 SXM"], gpus=2)
    with pytest.raises(ValueError, match="per-step counts"):
        plan(counts, gpus=2, redundant=0, objective="time", time_model=model)


def test_slowest_gpu_follows_the_dispatch_policy():
    model = TimeModel(DSV3_FP8, GPU_PROFILES["H100 SXM"], gpus=2)
    layout_LP = np.array([[0, 1, 0, 2]])            # expert 0 on both GPUs
    steps = np.array([[[1.0, 3.0, 3.0]]])           # round robin: expert 0's one token goes to GPU 0 only
    even = slowest_and_mean_s(steps, layout_LP, 2, "even", model)[0]
    rr = slowest_and_mean_s(steps, layout_LP, 2, "round_robin", model)[0]
    assert replica_counts(layout_LP, 3)[0].tolist() == [2, 1, 1]
    assert rr[0, 0] == pytest.approx(even[0, 0], rel=0.01)   # both: two weight reads on the busiest GPU
    assert slowest_and_mean_s(np.array([[[0.0, 3.0, 3.0]]]), layout_LP, 2, "even", model)[0][0, 0] < even[0, 0]


def test_plan_cli_objective_time_on_a_trace(tmp_path):
    from tests.support.cli import in_process

    sample = Path(__file__).resolve().parents[2] / "moe_monitor" / "traces" / "samples" / "demo.parquet"
    out = tmp_path / "plan.json"
    r = in_process("plan", "--load", sample, "--gpus", 32, "--redundant", 32, "--objective", "time",
                   "--gpu-profile", "H100 SXM", "--hidden", 7168, "--moe-intermediate", 2048, "--weight-bytes", 1,
                   "--dispatch", "round_robin", "--out", out)
    assert r.returncode == 0, r.stderr
    payload = json.loads(out.read_text())
    assert payload["objective"] == "time" and len(payload["step_p99_moe_seconds_per_layer"]) == 4
    assert sum(payload["time_layers_won"].values()) == 4
    r = in_process("plan", "--load", sample, "--gpus", 32, "--redundant", 32, "--objective", "time", "--out", out)
    assert r.returncode == 2 and "no GPU profile" in r.stderr


def test_simulator_and_advisor_price_the_straggler_in_predicted_time():
    from moe_monitor.planner.advisor import advise_now
    from moe_monitor.planner.simulate import CostModel, simulate

    model = TimeModel(DSV3_FP8, GPU_PROFILES["H100 SXM"], gpus=2)
    steps = _steps([60, 20, 20, 20, 0, 0, 0, 0], steps=12)
    layout_LP = np.array([[0, 4, 5, 6, 1, 2, 3, 7]])     # the hot expert alone, three warm ones together
    cost = CostModel.in_time(model)
    result = simulate(steps, [(0, layout_LP)], cost, gpus=2)
    total = model.gpu_times(DispatchModel(layout_LP, 8, 2).slot_loads(steps)).total_s
    np.testing.assert_allclose(result.straggler_s_T, (total.max(-1) - total.mean(-1)).sum(-1))
    assert result.summary()["pricing"].startswith("predicted time for H100 SXM")
    assert cost.bytes_per_expert == DSV3_FP8.expert_bytes and cost.migration_seconds(1) > 0
    tokens = simulate(steps, [(0, layout_LP)], CostModel(), gpus=2)
    assert tokens.summary()["pricing"].startswith("token-slots")
    # by tokens the two GPUs are even (60 / 60); in time GPU 1 runs three weight reads against one
    assert tokens.straggler_s < 0.2 * result.straggler_s
    # the advisor's candidates are token repairs; their gain and the step time are priced in time
    skewed = _steps([60, 60, 20, 20, 0, 0, 0, 0], steps=12)
    stacked = np.array([[0, 1, 4, 5, 2, 3, 6, 7]])
    advice = advise_now(skewed, stacked, 2, cost, max_moves=4)
    by_time = model.gpu_times(DispatchModel(stacked, 8, 2).slot_loads(skewed)).total_s
    assert advice.moves > 0 and advice.step_s == pytest.approx(float(by_time.max(-1).sum(-1).mean()))
    after = cost.straggler_seconds(skewed, advice.layout_LP, 2).mean()
    before = cost.straggler_seconds(skewed, stacked, 2).mean()
    assert advice.gain_s == pytest.approx((before - after) * advice.horizon_steps)


def test_advise_cli_prices_in_time_with_a_profile(tmp_path):
    from tests.support.cli import in_process

    sample = Path(__file__).resolve().parents[2] / "moe_monitor" / "traces" / "samples" / "demo.parquet"
    out = tmp_path / "schedule.json"
    r = in_process("advise", "--trace", sample, "--gpus", 32, "--redundant", 32, "--gpu-profile", "H100 SXM",
                   "--hidden", 7168, "--moe-intermediate", 2048, "--weight-bytes", 1, "--out", out)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["params"]["pricing"].startswith("predicted time for H100 SXM")
    r = in_process("advise", "--trace", sample, "--gpus", 32, "--redundant", 32, "--out", out)
    assert r.returncode == 0 and json.loads(out.read_text())["params"]["pricing"].startswith("token-slots")
