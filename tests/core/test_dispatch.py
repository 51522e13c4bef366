"""core.dispatch: the four dispatch policies. lp is checked against a general LP solver (scipy's HiGHS) on the
real DeepSeek-V3 popularity sampled per step, and on small random layouts with wide and duplicated replicas."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor.core.dispatch import DISPATCH_POLICIES, LP_TOKEN_FLOOR, LP_TOLERANCE, DispatchModel
from moe_monitor.core.loadmodel import gpu_loads
from moe_monitor.planner.api import plan
from tests.support.lp_reference import busiest_gpu_optimum

DATA = Path(__file__).resolve().parents[1] / "data" / "sglang_deepseek_v3" / "decode_in1000out1000.json"


def deepseek_steps(steps: int, tokens: int, seed: int, layers: slice = slice(3, 61)) -> np.ndarray:
    """Per-step counts [T, L, E]: multinomial draws of `tokens` top-8 slots from the real per-layer popularity."""
    popularity = np.asarray(json.loads(DATA.read_text())["logical_count"], dtype=np.float64)[layers]
    p = popularity / popularity.sum(1, keepdims=True)
    rng = np.random.default_rng(seed)
    return np.stack([np.stack([rng.multinomial(tokens, row) for row in p]) for _ in range(steps)]).astype(np.float64)


def random_layout(rng, layers: int, experts: int, gpus: int, redundant: int, allow_duplicates: bool) -> np.ndarray:
    rows = []
    for _ in range(layers):
        extra = rng.choice(experts, size=redundant, replace=True, p=None)
        slots = np.concatenate([np.arange(experts), extra])
        for _ in range(100):
            rng.shuffle(slots)
            on_gpu = slots.reshape(gpus, -1)
            if allow_duplicates or all(len(set(g)) == len(g) for g in on_gpu):
                break
        rows.append(slots.copy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def deepseek():
    counts = deepseek_steps(12, 128 * 32 * 8, seed=3)
    layout = plan(counts.sum(0), 32, 32, policy="refined").layout_LP
    return counts, layout


def test_even_is_the_load_models_split(deepseek):
    counts, layout = deepseek
    np.testing.assert_allclose(DispatchModel(layout, 256, 32, "even").gpu_loads(counts),
                               gpu_loads(counts, layout, 32), rtol=1e-12)


@pytest.mark.parametrize("policy", DISPATCH_POLICIES)
def test_every_policy_serves_every_token_once(deepseek, policy):
    counts, layout = deepseek
    slots = DispatchModel(layout, 256, 32, policy).slot_loads(counts)
    assert (slots >= -1e-9).all()
    np.testing.assert_allclose(slots.sum(-1), counts.sum(-1), rtol=1e-12)
    if policy != "ideal":  # each expert's slots carry exactly its tokens
        per_expert = np.zeros_like(counts)
        for layer in range(layout.shape[0]):
            np.add.at(per_expert[:, layer], (slice(None), layout[layer]), slots[:, layer])
        np.testing.assert_allclose(per_expert, counts, rtol=1e-9, atol=1e-6)


def test_round_robin_gives_each_replica_the_even_splits_rounding():
    layout = np.array([[0, 1, 0, 2, 0, 3]])                  # expert 0 in slots 0, 2, 4 (3 GPUs of 2 slots)
    counts = np.array([[[7.0, 5.0, 2.0, 1.0]]])
    slots = DispatchModel(layout, 4, 3, "round_robin").slot_loads(counts)[0, 0]
    assert slots.tolist() == [3.0, 5.0, 2.0, 2.0, 2.0, 1.0]   # 7 = 3 + 2 + 2, the first replica in slot order first


def test_lp_matches_a_general_lp_solver_on_deepseek_v3_steps(deepseek):
    counts, layout = deepseek
    got = DispatchModel(layout, 256, 32, "lp").gpu_loads(counts).max(-1)
    even = gpu_loads(counts, layout, 32).max(-1)
    checked = 0
    for t in range(counts.shape[0]):
        for layer in range(0, layout.shape[0], 3):
            ref = busiest_gpu_optimum(counts[t, layer], layout[layer], 32)
            assert ref * (1 - 1e-9) <= got[t, layer] <= ref * (1 + LP_TOLERANCE) + LP_TOKEN_FLOOR
            checked += 1
    assert checked == 12 * 20 and (got <= even + 1e-6).all() and (got < even - 1).mean() > 0.5


@pytest.mark.parametrize("seed", range(6))
def test_lp_matches_a_general_lp_solver_on_random_layouts(seed):
    rng = np.random.default_rng(seed)
    experts, gpus = 24, 6
    layout = random_layout(rng, 4, experts, gpus, redundant=12, allow_duplicates=seed % 2 == 1)
    counts = rng.gamma(0.5, 40.0, size=(5, 4, experts)).round()
    counts[:, 1] = 0.0  # an idle layer
    got = DispatchModel(layout, experts, gpus, "lp").gpu_loads(counts)
    np.testing.assert_allclose(got.sum(-1), counts.sum(-1), rtol=1e-12)
    for t in range(5):
        for layer in (0, 2, 3):
            ref = busiest_gpu_optimum(counts[t, layer], layout[layer], gpus)
            assert ref * (1 - 1e-9) - 1e-9 <= got[t, layer].max() <= ref * (1 + LP_TOLERANCE) + LP_TOKEN_FLOOR
    assert (got[:, 1] == 0).all()


def test_lp_without_replicas_is_the_even_split():
    rng = np.random.default_rng(0)
    layout = np.stack([rng.permutation(16) for _ in range(3)])
    counts = rng.integers(0, 50, size=(4, 3, 16)).astype(float)
    np.testing.assert_array_equal(DispatchModel(layout, 16, 4, "lp").gpu_loads(counts), gpu_loads(counts, layout, 4))


def test_ideal_puts_every_gpu_at_the_mean(deepseek):
    counts, layout = deepseek
    loads = DispatchModel(layout, 256, 32, "ideal").gpu_loads(counts)
    np.testing.assert_allclose(loads, np.broadcast_to(counts.sum(-1, keepdims=True) / 32, loads.shape))


def test_bad_policy_and_shapes_are_refused():
    layout = np.arange(8)[None]
    with pytest.raises(ValueError, match="unknown dispatch policy 'fastest'"):
        DispatchModel(layout, 8, 2, "fastest")
    with pytest.raises(ValueError, match=r"counts must be \[steps, 1, 8\]"):
        DispatchModel(layout, 8, 2, "lp").gpu_loads(np.zeros((2, 1, 7)))
    with pytest.raises(ValueError, match="do not split evenly"):
        DispatchModel(layout, 8, 3, "even")
