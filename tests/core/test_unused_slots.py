"""An unused slot (-1, vLLM's) in the load model and every dispatch policy: it holds nothing, counts as no replica
and serves no token; the loads equal those of the same layout with a phantom zero-token expert in its place
(core.layouts.with_unused_as_expert), which each reader used before."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor.core.dispatch import DISPATCH_POLICIES, DispatchModel
from moe_monitor.core.layouts import UNUSED, with_unused_as_expert
from moe_monitor.core.loadmodel import (
    gpu_loads,
    gpu_weights,
    replica_counts,
    slot_weights,
    validated_layout,
    weighted_loads,
)

E, G = 6, 3


def _layout() -> np.ndarray:
    """2 layers, 3 GPUs x 3 slots: expert 0 on three GPUs, 1 on two, one unused slot per GPU in layer 0 and two
    GPUs with one in layer 1 (so the phantom needs an extra slot there)."""
    return np.array([[0, 1, -1, 0, 2, 3, -1, 4, 5],
                     [0, 1, 2, 3, 0, -1, 4, 5, -1]], dtype=np.int64)


def _counts(steps: int = 7, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50, size=(steps, 2, E)).astype(np.float64)


def test_replica_counts_and_slot_weights_skip_unused_slots():
    lay = _layout()
    rep = replica_counts(lay, E)
    assert rep.tolist() == [[2, 1, 1, 1, 1, 1], [2, 1, 1, 1, 1, 1]]
    c = _counts()[0]
    w = slot_weights(c, lay)
    assert np.all(w[lay == UNUSED] == 0)
    np.testing.assert_allclose(w.sum(axis=1), c.sum(axis=1))   # every token is served, by a used slot
    padded_c, padded = with_unused_as_expert(c, lay, G)
    np.testing.assert_allclose(gpu_loads(c, lay, G), gpu_loads(padded_c, padded, G))


def test_gpu_weights_of_an_unused_slot_layout_match_the_phantom_expert():
    lay, counts = _layout(), _counts()
    padded_c, padded = with_unused_as_expert(counts, lay, G)
    got = weighted_loads(counts, gpu_weights(lay, E, G))
    want = weighted_loads(padded_c, gpu_weights(padded, E + 1, G))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(gpu_weights(lay, E, G).sum(axis=2), 1.0, rtol=1e-6)


@pytest.mark.parametrize("policy", DISPATCH_POLICIES)
def test_every_dispatch_policy_reads_unused_slots_as_the_phantom_expert(policy):
    lay, counts = _layout(), _counts()
    padded_c, padded = with_unused_as_expert(counts, lay, G)
    got = DispatchModel(lay, E, G, policy).gpu_loads(counts)
    want = DispatchModel(padded, E + 1, G, policy).gpu_loads(padded_c)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    slots = DispatchModel(lay, E, G, policy).slot_loads(counts)
    np.testing.assert_allclose(slots.sum(axis=2), counts.sum(axis=2))
    if policy != "ideal":
        assert np.all(slots[:, lay == UNUSED] == 0)


def test_validated_layout_takes_unused_slots_only_when_told():
    lay = _layout()
    with pytest.raises(ValueError, match="unused"):
        validated_layout(lay, E, G)
    assert validated_layout(lay, E, G, unused=True).tolist() == lay.tolist()
    starved = lay.copy()
    starved[0, starved[0] == 5] = UNUSED
    with pytest.raises(ValueError, match="expert 5 has no slot"):
        validated_layout(starved, E, G, unused=True)
    with pytest.raises(ValueError, match="outside"):
        validated_layout(np.where(lay < 0, -2, lay), E, G, unused=True)
