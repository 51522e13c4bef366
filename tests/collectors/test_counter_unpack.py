"""DeviceCounter.unpack reads a round of step buffers together (a few numpy ops for all of them): each step comes
out as one read alone would give it, checked against a step-by-step reading written here from the buffer's layout
(counts, the invalid column, sampled rows with -1 for invalid ids and layers that did not run, a padding mask)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from moe_monitor.collectors import counter as counter_module
from moe_monitor.collectors.counter import DeviceCounter, StepFacts

L, E, K, N_SAMPLE = 3, 6, 2, 4


def _expected(flat: np.ndarray, facts: StepFacts) -> tuple[np.ndarray, int, np.ndarray | None, int]:
    """(counts [L, E], invalid ids, sampled rows [L, n, K] or None, tokens) read from one buffer step by step."""
    n_counts, n_sample = L * (E + 1), L * N_SAMPLE * K
    counts_LE1 = flat[:n_counts].reshape(L, E + 1)
    sample = None
    if facts.sample_n:
        rows = flat[n_counts: n_counts + n_sample].reshape(L, N_SAMPLE, K)[:, :facts.sample_n].copy()
        rows[rows == E] = -1
        rows[counts_LE1.sum(axis=1) == 0] = -1
        if facts.masked:
            rows = rows[:, flat[n_counts + n_sample: n_counts + n_sample + facts.sample_n] != 0]
        sample = rows if rows.shape[1] else None
    tokens = int(flat[-1]) if facts.masked else facts.tokens
    return counts_LE1[:, :E].copy(), int(counts_LE1[:, E].sum()), sample, tokens


def _round(counter: DeviceCounter, steps: int, seed: int) -> tuple[list[np.ndarray], list[StepFacts]]:
    """steps closed steps of mixed kinds: sampled or not, a padding mask (all padding once), invalid ids, a
    layer that did not run, a step never begun."""
    gen = torch.Generator().manual_seed(seed)
    flats, facts = [], []
    for s in range(steps):
        tokens = 1 + s % 5
        mask = None
        if s % 3 == 1:
            mask = (torch.rand(tokens, generator=gen) < 0.6).to(torch.int64)
            if s == 7:
                mask.zero_()  # every sampled token is padding: no rows
        if s % 6 != 5:  # steps 5, 11: never begun
            counter.begin_step(tokens, mask)
        for layer in range(L):
            if layer == s % L:
                continue  # this layer does not run in this step
            ids = torch.randint(-1, E + 2, (tokens, K), generator=gen)  # -1, E, E + 1: invalid ids
            counter.record(layer, ids, torch.ones(tokens, K, dtype=torch.int64) if mask is None
                           else mask[:, None].expand(tokens, K))
        slot = counter.new_slot()
        facts.append(counter.snapshot(slot))
        flat = slot.view.copy()
        # rows a layer left from an earlier step (a buffer not reset): a layer with no counts reads -1 anyway
        flat[L * (E + 1):].reshape(-1)[: L * N_SAMPLE * K].reshape(L, N_SAMPLE, K)[s % L] = 1
        flats.append(flat)
    return flats, facts


@pytest.mark.parametrize("chunk_bytes", [None, 2 * 8 * (L * (E + 1) + L * N_SAMPLE * K + N_SAMPLE + 1)])
def test_a_round_unpacks_each_step_as_alone(monkeypatch, chunk_bytes):
    if chunk_bytes is not None:  # steps read two at a time, as a large model's are read one at a time
        monkeypatch.setattr(counter_module, "UNPACK_CHUNK_BYTES", chunk_bytes)
    counter = DeviceCounter(L, E, K, "cpu", N_SAMPLE, 2)
    flats, facts = _round(counter, 13, seed=3)
    assert any(f.sample_n for f in facts) and any(not f.sample_n for f in facts) and any(f.masked for f in facts)
    assert any(f.tokens < 0 for f in facts)
    together = counter.unpack(flats, facts)
    assert len(together) == len(flats)
    seen_rows = 0
    for flat, fact, got in zip(flats, facts, together):
        counts, invalid, sample, tokens = _expected(flat, fact)
        assert got.counts_LE.dtype == np.int32 and np.array_equal(got.counts_LE, counts)
        assert (got.invalid, got.tokens) == (invalid, tokens)
        assert (got.sample_LNK is None) == (sample is None)
        if sample is not None:
            assert np.array_equal(got.sample_LNK, sample)
            seen_rows += 1
        alone = counter.unpack([flat], [fact])[0]
        assert np.array_equal(alone.counts_LE, got.counts_LE) and alone.invalid == got.invalid
    assert seen_rows >= 2
    assert counter.unpack([], []) == []
