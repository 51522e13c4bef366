"""The eager CPU path keeps a step's ids and counts them when the step closes (DeviceCounter.flush): the same
counts, invalid ids and sampled rows as counting each layer at once, whatever order and shapes the layers come in."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from moe_monitor.collectors.counter import DeviceCounter

L, E, K, N_SAMPLE = 3, 6, 2, 4


def _pair() -> tuple[DeviceCounter, DeviceCounter]:
    return DeviceCounter(L, E, K, "cpu", N_SAMPLE, 1), DeviceCounter(L, E, K, "cpu", N_SAMPLE, 1)


def _step(counter: DeviceCounter, calls, deferred: bool, mask_N: torch.Tensor | None = None) -> np.ndarray:
    """Run one step of (layer, ids) calls; returns the host copy of the step buffer."""
    counter.begin_step(calls[0][1].shape[0], mask_N)
    for layer, ids in calls:
        (counter._recorders if deferred else counter._direct)[layer](ids)
    if deferred:
        assert counter._pending, "the eager CPU path keeps the ids until the step closes"
    slot = counter.new_slot()
    counter.snapshot(slot)
    return slot.buf.numpy().copy()


def _ids(gen: torch.Generator, n: int, lo: int = 0, hi: int = E) -> torch.Tensor:
    return torch.randint(lo, hi, (n, K), generator=gen)


@pytest.mark.parametrize("order", ["in order", "out of order", "a layer twice", "shapes differ", "bad ids"])
def test_deferred_counts_equal_direct_counts(order):
    gen = torch.Generator().manual_seed(3)
    calls = {
        "in order": [(0, _ids(gen, 8)), (1, _ids(gen, 8)), (2, _ids(gen, 8))],
        "out of order": [(2, _ids(gen, 8)), (0, _ids(gen, 8)), (1, _ids(gen, 8))],
        "a layer twice": [(0, _ids(gen, 8)), (0, _ids(gen, 8)), (1, _ids(gen, 8))],
        "shapes differ": [(0, _ids(gen, 8)), (1, _ids(gen, 5)), (2, _ids(gen, 8))],
        "bad ids": [(0, _ids(gen, 8, -7, E + 5)), (1, _ids(gen, 8, -7, E + 5)), (2, _ids(gen, 8))],
    }[order]
    deferred, direct = _pair()
    a, b = _step(deferred, calls, True), _step(direct, calls, False)
    np.testing.assert_array_equal(a, b)
    counts = a[: L * (E + 1)].reshape(L, E + 1)
    assert counts.sum() == sum(ids.numel() for _, ids in calls)  # every (token, slot) once, bad ids in column E
    if order == "bad ids":
        assert counts[:, E].sum() > 0


def test_deferred_path_under_a_padding_mask_counts_real_tokens_only():
    gen = torch.Generator().manual_seed(5)
    calls = [(layer, _ids(gen, 6)) for layer in range(L)]
    mask_N = torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.int64)
    deferred, direct = _pair()
    a, b = _step(deferred, calls, True, mask_N), _step(direct, calls, False, mask_N)
    np.testing.assert_array_equal(a, b)
    assert a[: L * (E + 1)].sum() == L * 4 * K


def test_a_step_never_closed_keeps_a_bounded_list_and_the_totals_stay_exact():
    counter = DeviceCounter(L, E, K, "cpu", 0, 1)
    ids = torch.tensor([[0, 1]] * 3)
    for _ in range(100):
        counter._recorders[1](ids)
        assert len(counter._pending) < counter._pending_cap
    total = counter.running_total()
    assert int(total[1, 0]) == 300 and int(total[1, 1]) == 300 and int(total.sum()) == 600
    assert not counter._pending
