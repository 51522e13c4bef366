"""Planning for the dispatch and the tail: plan(objective="tail", dispatch=...), moe-monitor plan --objective
--dispatch, simulate and advise --dispatch (in this process: tests/support/cli.py); per-step counts sampled from the real DeepSeek-V3 popularity
(planner.synthetic.sampled_steps), a few layers on 8 GPUs to stay small."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor.core.steptails import step_tails
from moe_monitor.planner.advisor import static_schedule
from moe_monitor.planner.api import plan
from moe_monitor.planner.loads import check_layout
from moe_monitor.planner.simulate import simulate
from moe_monitor.planner.synthetic import sampled_steps
from moe_monitor.planner.windows import split_windows
from tests.support.cli import in_process as cli
from tests.support.synthfill import alternating_phases

DATA = Path(__file__).resolve().parents[1] / "data" / "sglang_deepseek_v3"
G, R = 8, 8


def real_steps(steps: int, seed: int = 0) -> np.ndarray:
    """[steps, 4, 256]: layer 0 dense (all zero, as layers 0-2 of the files), layers 1-3 the file's MoE layers
    3-5; decode batches of 64-256 tokens on each of 8 ranks x top-8."""
    pop = np.array(json.loads((DATA / "decode_in1000out1000.json").read_text())["logical_count"], float)[2:6]
    tokens = np.random.default_rng(seed).integers(64, 257, (steps, G)).sum(1)
    return sampled_steps(pop, steps, tokens, seed=seed)


def p99(counts_TLE, layout_LP, dispatch: str) -> float:
    value = step_tails(counts_TLE, layout_LP, G, dispatch).imbalance_summary()["p99"]
    assert value is not None
    return value


@pytest.fixture(scope="module")
def steps_TLE() -> np.ndarray:
    return real_steps(400)


def test_lp_plan_scores_better_under_lp_than_the_even_plan(steps_TLE):
    fit, held = steps_TLE[:200], steps_TLE[200:]
    lp = plan(split_windows(fit), G, R, objective="tail", dispatch="lp", steps=fit)
    even = plan(split_windows(fit), G, R, objective="tail", dispatch="even", steps=fit)
    check_layout(lp.layout_LP, 256, G)
    assert lp.dispatch == "lp" and lp.objective == "tail"
    assert lp.tail_p99_L is not None and lp.tail_p99_L[0] == 1.0     # the dense layer
    assert p99(held, lp.layout_LP, "lp") < p99(held, even.layout_LP, "lp") - 0.01


def test_tail_objective_lowers_the_per_step_p99_where_the_window_cannot_see_it():
    """Two alternating phases, each with its own 8 hot experts: their sum is flat, so any layout balances the
    window, but a layout that puts hot experts of one phase together has a busy GPU every step."""
    steps = alternating_phases()
    fit, held = steps[:160], steps[160:]
    window = plan(split_windows(fit), G, 8).layout_LP
    tail = plan(split_windows(fit), G, 8, objective="tail", steps=fit).layout_LP
    assert p99(held, tail, "even") < p99(held, window, "even") - 0.05


def test_simulate_charges_less_straggler_time_under_lp(steps_TLE):
    lay = plan(steps_TLE.sum(0), G, R).layout_LP
    even = simulate(steps_TLE[:100], static_schedule(lay, G), dispatch="even")
    lp = simulate(steps_TLE[:100], static_schedule(lay, G), dispatch="lp")
    assert 0 < lp.straggler_s < 0.8 * even.straggler_s


def test_cli_plan_tail_lp_then_simulate_and_advise(tmp_path, steps_TLE):
    counts = tmp_path / "steps.json"
    counts.write_text(json.dumps({"logical_count": steps_TLE[:120].tolist()}))
    out = tmp_path / "layout.json"
    r = cli("plan", "--load", counts, "--gpus", G, "--redundant", R, "--objective", "tail", "--dispatch", "lp",
            "--out", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["dispatch"] == "lp" and d["objective"] == "tail" and len(d["step_p99_imbalance"]) == 4
    check_layout(np.array(d["physical_to_logical_map"]), 256, G)
    straggler = {}
    for dispatch in ("even", "lp"):
        r = cli("simulate", "--trace", counts, "--schedule", out, "--gpus", G, "--dispatch", dispatch, "--json")
        assert r.returncode == 0, r.stderr
        straggler[dispatch] = json.loads(r.stdout)["summary"]["straggler_s"]
    assert straggler["lp"] < straggler["even"]
    sched = tmp_path / "schedule.json"
    r = cli("advise", "--trace", counts, "--gpus", G, "--redundant", R, "--every", 60, "--window", 60,
            "--dispatch", "lp", "--out", sched)
    assert r.returncode == 0, r.stderr
    assert json.loads(sched.read_text())["params"]["dispatch"] == "lp"


@pytest.mark.parametrize("args, message", [
    (("--dispatch", "lp"), "--objective tail"),
    (("--objective", "tail", "--nodes", 2, "--groups", 4), "global layouts"),
])
def test_cli_plan_refuses_what_it_cannot_plan(tmp_path, steps_TLE, args, message):
    counts = tmp_path / "steps.json"
    counts.write_text(json.dumps(steps_TLE[:20].tolist()))
    r = cli("plan", "--load", counts, "--gpus", G, "--redundant", R, *args, "--out", tmp_path / "x.json")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.json").exists()


def test_plan_checks_its_new_arguments(steps_TLE):
    with pytest.raises(ValueError, match="dispatch"):
        plan(steps_TLE.sum(0), G, R, dispatch="fastest")
    with pytest.raises(ValueError, match="objective"):
        plan(steps_TLE.sum(0), G, R, objective="median")
    with pytest.raises(ValueError, match="per-step counts"):
        plan(steps_TLE.sum(0), G, R, objective="tail")
    with pytest.raises(ValueError, match="do not match"):
        plan(steps_TLE.sum(0), G, R, objective="tail", steps=steps_TLE[:, :2])


def test_advise_now_prices_steps_under_the_dispatch(steps_TLE):
    from moe_monitor.planner.advisor import advise_now
    lay = plan(steps_TLE.sum(0), G, R).layout_LP
    even = advise_now(steps_TLE[:60], lay, G, dispatch="even")
    lp = advise_now(steps_TLE[:60], lay, G, dispatch="lp")
    assert lp.step_s < even.step_s
    with pytest.raises(ValueError, match="dispatch"):
        advise_now(steps_TLE[:60], lay, G, dispatch="fastest")
