"""On the CPU a closed step waits in its host slot until the publisher thread is done with it, and only then joins
the running total (DeviceCounter.fold): the totals are exact at every moment (steps in slots, steps folded, a
slot used again before it was folded, steps with no slot), and through a real monitor publishing to a real Redis
every published step is folded once."""
from __future__ import annotations

import numpy as np
import torch

from moe_monitor import core
from moe_monitor.collectors.counter import DeviceCounter
from moe_monitor.collectors.monitor import ExpertLoadMonitor

L, E, K = 2, 5, 2


def _step(counter: DeviceCounter, ids_NK: torch.Tensor, slot) -> None:
    counter.begin_step(ids_NK.shape[0], None)
    for layer in range(L):
        counter.record(layer, ids_NK + layer, torch.ones_like(ids_NK))
    counter.snapshot(slot)


def _truth(steps: list[torch.Tensor]) -> np.ndarray:
    """int64 [L, E + 1] written here from the ids: layer l counts ids + l, an id >= E in column E."""
    out = np.zeros((L, E + 1), np.int64)
    for ids in steps:
        for layer in range(L):
            for expert in (ids + layer).reshape(-1).tolist():
                out[layer, min(expert, E)] += 1
    return out


def test_totals_are_exact_with_steps_in_slots_folded_reused_and_unpublished():
    gen = torch.Generator().manual_seed(11)
    counter = DeviceCounter(L, E, K, "cpu", sample_tokens=2, sample_every=1)
    slots = [counter.new_slot() for _ in range(3)]
    steps = [torch.randint(0, E, (3 + s, K), generator=gen) for s in range(7)]
    _step(counter, steps[0], slots[0])
    _step(counter, steps[1], slots[1])
    assert slots[0].unfolded and slots[1].unfolded  # waiting for the publisher: not in the total yet
    np.testing.assert_array_equal(counter.running_total().numpy(), _truth(steps[:2]))  # yet counted
    counter.fold(slots[0])
    counter.fold(slots[0])  # twice: once only
    assert not slots[0].unfolded
    np.testing.assert_array_equal(counter.running_total().numpy(), _truth(steps[:2]))
    _step(counter, steps[2], None)  # no free slot: into the total at once
    _step(counter, steps[3], slots[1])  # used again before anyone folded it: its earlier step is kept
    _step(counter, steps[4], slots[2])
    counter.begin_step(steps[5].shape[0], None)
    counter.record(0, steps[5], torch.ones_like(steps[5]))  # the open step: counted, in no slot
    open_step = _truth([steps[5]])
    open_step[1] = 0
    np.testing.assert_array_equal(counter.running_total().numpy(), _truth(steps[:5]) + open_step)
    np.testing.assert_array_equal(slots[1].view[: L * (E + 1)].reshape(L, E + 1), _truth(steps[3:4]))
    for slot in slots:
        counter.fold(slot)
    assert not any(slot.unfolded for slot in slots)
    np.testing.assert_array_equal(counter.running_total().numpy(), _truth(steps[:5]) + open_step)
    np.testing.assert_array_equal(counter.total_LE1.numpy(), _truth(steps[:5]))


def test_a_published_monitor_folds_every_step_once(redis_server, redis_url):
    gen = torch.Generator().manual_seed(12)
    steps = [torch.randint(0, E, (4, K), generator=gen) for _ in range(40)]
    mon = ExpertLoadMonitor(L, E, K, redis_url=redis_url, run="fold", nvml=False, host_slots=4,
                            publish_interval_s=0.01)
    try:
        for ids in steps:
            mon.begin_step(tokens=ids.shape[0])
            for layer in range(L):
                mon.record(layer, (ids + layer).clamp(max=E - 1))
            mon.end_step(phase="decode")
        expected = np.zeros((L, E), np.int64)
        for ids in steps:
            for layer in range(L):
                np.add.at(expected[layer], (ids + layer).clamp(max=E - 1).reshape(-1).numpy(), 1)
        np.testing.assert_array_equal(mon.counts(), expected)  # some steps still in slots, some folded
    finally:
        mon.close()
    published = [core.decode_step(fields) for _, fields in redis_server.client().xrange(core.steps_key("fold"))]
    assert len(published) + mon.stats()["dropped_steps"] == len(steps)
    assert not any(slot.unfolded for slot in mon._free_slots)  # every slot the publisher released was folded
    np.testing.assert_array_equal(mon.counts(), expected)
    np.testing.assert_array_equal(mon.counter.total_LE1.numpy()[:, :E], expected)
