"""core.dispatch: the four dispatch policies. lp (core.lpsplit) is checked against a general LP solver (scipy's
HiGHS) to rounding, on the real DeepSeek-V3 popularity sampled per step, on small random layouts with wide and
duplicated replicas, on chains and rings of replicated experts, and for the minimum-norm conditions (every expert
sends tokens only to its least-loaded GPUs)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor.core import lpsplit
from moe_monitor.core.dispatch import DISPATCH_POLICIES, DispatchModel
from moe_monitor.core.loadmodel import gpu_loads
from moe_monitor.core.lpsplit import active_set_split
from moe_monitor.planner.api import plan
from tests.support.lp_cases import chain_counts, chain_layout, crowded_case, random_layout
from tests.support.lp_reference import busiest_gpu_optimum

DATA = Path(__file__).resolve().parents[1] / "data" / "sglang_deepseek_v3" / "decode_in1000out1000.json"
EXACT = 1e-9  # |lp's busiest GPU - HiGHS's optimum| at most this x (1 + the largest count): rounding only


def deepseek_steps(steps: int, tokens: int, seed: int, layers: slice = slice(3, 61)) -> np.ndarray:
    """Per-step counts [T, L, E]: multinomial draws of `tokens` top-8 slots from the real per-layer popularity."""
    popularity = np.asarray(json.loads(DATA.read_text())["logical_count"], dtype=np.float64)[layers]
    p = popularity / popularity.sum(1, keepdims=True)
    rng = np.random.default_rng(seed)
    return np.stack([np.stack([rng.multinomial(tokens, row) for row in p]) for _ in range(steps)]).astype(np.float64)


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


def lp_gaps(counts_TLE, layout_LP, gpus: int, pairs=None) -> tuple[float, float]:
    """(the largest |busiest GPU under lp - HiGHS's optimum| and the largest minimum-norm violation, both over
    1 + the largest count) over (step, layer) pairs (all by default). The violation: how far above the least
    loaded of an expert's GPUs a GPU it sends tokens to sits (0 at the minimum-norm loads)."""
    model = DispatchModel(layout_LP, counts_TLE.shape[2], gpus, "lp")
    slots = model.slot_loads(counts_TLE)
    loads = model.gpu_loads(counts_TLE)
    T, L, P = slots.shape
    np.testing.assert_allclose(slots.reshape(T, L, gpus, -1).sum(-1), loads, rtol=0, atol=1e-9 * counts_TLE.max())
    gpu_P = np.arange(P) // (P // gpus)
    scale = 1.0 + counts_TLE.max()
    worst_max = worst_norm = 0.0
    for t, layer in pairs or [(t, layer) for t in range(T) for layer in range(L)]:
        ref = busiest_gpu_optimum(counts_TLE[t, layer], layout_LP[layer], gpus)
        worst_max = max(worst_max, abs(loads[t, layer].max() - ref) / scale)
        for expert in np.unique(layout_LP[layer]):
            on = layout_LP[layer] == expert
            used = gpu_P[on & (slots[t, layer] > EXACT * scale)]
            if used.size:
                above = loads[t, layer][used].max() - loads[t, layer][gpu_P[on]].min()
                worst_norm = max(worst_norm, above / scale)
    return worst_max, worst_norm


def test_lp_matches_a_general_lp_solver_on_deepseek_v3_steps(deepseek):
    counts, layout = deepseek
    pairs = [(t, layer) for t in range(counts.shape[0]) for layer in range(0, layout.shape[0], 3)]
    assert max(lp_gaps(counts, layout, 32, pairs)) <= EXACT
    got = DispatchModel(layout, 256, 32, "lp").gpu_loads(counts).max(-1)
    even = gpu_loads(counts, layout, 32).max(-1)
    assert (got <= even + 1e-6).all() and (got < even - 1).mean() > 0.5


@pytest.mark.parametrize("seed", range(6))
def test_lp_matches_a_general_lp_solver_on_random_layouts(seed):
    rng = np.random.default_rng(seed)
    experts, gpus = 24, 6
    layout = random_layout(rng, 4, experts, gpus, redundant=12, allow_duplicates=seed % 2 == 1)
    counts = rng.gamma(0.5, 40.0, size=(5, 4, experts)).round()
    counts[:, 1] = 0.0  # an idle layer
    assert max(lp_gaps(counts, layout, gpus)) <= EXACT
    got = DispatchModel(layout, experts, gpus, "lp").gpu_loads(counts)
    np.testing.assert_allclose(got.sum(-1), counts.sum(-1), rtol=1e-12)
    assert (got[:, 1] == 0).all()


@pytest.mark.parametrize("seed", range(40))
def test_lp_is_exact_on_crowded_layouts_with_ties_and_idle_experts(seed):
    """Up to every expert replicated, duplicates on one GPU, equal counts (ties) and replicated experts without
    tokens, which must neither carry tokens nor link their GPUs."""
    layout, counts, gpus = crowded_case(seed)
    assert max(lp_gaps(counts, layout, gpus)) <= EXACT


@pytest.mark.parametrize("ring", [False, True])
def test_lp_is_exact_along_chains_of_replicated_experts(ring):
    """The case water-filling converged slowly on: load pushed along a chain of 16 GPUs through 15 experts."""
    layout = chain_layout(16, ring)
    counts = chain_counts(layout, 16)
    experts = counts.shape[2]
    assert max(lp_gaps(counts, layout, 16)) <= EXACT
    busiest = DispatchModel(layout, experts, 16, "lp").gpu_loads(counts)[:, 0].max(-1)
    even = gpu_loads(counts, layout, 16)[:, 0].max(-1)
    assert (busiest <= even + 1e-9).all() and busiest[0] < even[0] - 100   # the hot chain spreads its load


def test_one_share_active_steps_alone_are_exact(monkeypatch):
    """The active set's finite fallback (one share a step, Lawson-Hanson) without the block steps before it."""
    monkeypatch.setattr(lpsplit, "LP_BLOCK_STEPS", 0)
    for seed in range(12):
        layout, counts, gpus = crowded_case(seed)
        assert max(lp_gaps(counts, layout, gpus)) <= EXACT
    layout = chain_layout(16, ring=True)
    assert max(lp_gaps(chain_counts(layout, 16), layout, 16)) <= EXACT


def test_lp_is_exact_beyond_64_gpus():
    rng = np.random.default_rng(5)
    gpus, experts = 80, 160
    layout = random_layout(rng, 1, experts, gpus, redundant=80, allow_duplicates=False)
    counts = rng.gamma(0.4, 60.0, size=(2, 1, experts)).round()
    assert max(lp_gaps(counts, layout, gpus)) <= EXACT


def test_the_two_exact_paths_agree(deepseek):
    """The full split (a linear map per layer) and the active-set method give the same loads where both apply:
    the minimum-norm loads are unique."""
    counts, layout = deepseek
    model = DispatchModel(layout, 256, 32, "lp")
    tables = model._lp
    inputs = tables._inputs(counts[:3])
    G = 32
    layer_B = np.repeat(np.arange(layout.shape[0]), 3)
    step_B = np.tile(np.arange(3), layout.shape[0])
    inputs_BK = inputs[layer_B, step_B]
    shares = active_set_split(inputs_BK[:, :G], inputs_BK[:, G:], tables.split.gpu_LFR[layer_B], G)
    gpu = tables.split.gpu_LFR[layer_B].reshape(layer_B.size, -1)
    loads = inputs_BK[:, :G].copy()
    np.add.at(loads, (np.arange(layer_B.size)[:, None], np.minimum(gpu, G - 1)),
              np.where(gpu < G, shares.reshape(layer_B.size, -1), 0.0))
    np.testing.assert_allclose(loads, model.gpu_loads(counts[:3])[step_B, layer_B], rtol=0, atol=1e-8)


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
