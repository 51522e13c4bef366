"""Layouts and counts that stress the lp dispatch policy (core.lpsplit), for its tests and bench.dispatch: random
layouts with wide and duplicated replicas, crowded small layouts (up to every expert replicated, ties, replicated
experts without tokens), and chains and rings of replicated experts (load pushed along many GPUs)."""
from __future__ import annotations

import numpy as np


def random_layout(rng, layers: int, experts: int, gpus: int, redundant: int, allow_duplicates: bool) -> np.ndarray:
    """int [layers, experts + redundant]: every expert once plus `redundant` random extra copies, shuffled (up to
    100 tries for no two copies of an expert on one GPU unless allow_duplicates)."""
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


def crowded_case(seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(layout [2, P], counts [3, 2, E], gpus): 2-8 GPUs of 2-4 slots, E between P / 3 and P (duplicates on one
    GPU allowed); counts: sparse gamma, small integers (ties), equal counts with idle experts."""
    rng = np.random.default_rng(1000 + seed)
    gpus, per_gpu = int(rng.integers(2, 9)), int(rng.integers(2, 5))
    slots = gpus * per_gpu
    experts = int(rng.integers(max(1, slots // 3), slots + 1))
    layout = np.stack([rng.permutation(np.concatenate([np.arange(experts), rng.integers(0, experts, slots - experts)]))
                       for _ in range(2)])
    counts = np.stack([rng.gamma(0.5, 40, (2, experts)).round(), rng.integers(0, 4, (2, experts)).astype(float),
                       np.full((2, experts), 7.0) * rng.integers(0, 2, (2, experts))])
    return layout, counts, gpus


def chain_layout(gpus: int, ring: bool) -> np.ndarray:
    """One layer: replicated expert g on GPUs g and g + 1 (g < G - 1, or every g mod G for a ring), then experts
    of their own until each GPU has 4 slots."""
    links = gpus if ring else gpus - 1
    rows, own = [], links
    for g in range(gpus):
        row = [e for e in (g, g - 1) if 0 <= e < links] + ([gpus - 1] if ring and g == 0 else [])
        while len(row) < 4:
            row.append(own)
            own += 1
        rows.append(row)
    return np.array([sum(rows, [])])


def chain_counts(layout: np.ndarray, gpus: int, seed: int = 7) -> np.ndarray:
    """[6, 1, E] for chain_layout: gamma counts; step 0 hot chain experts, step 1 fixed loads falling along the
    chain, step 2 an idle chain."""
    experts = int(layout.max()) + 1
    counts = np.random.default_rng(seed).gamma(2.0, 50.0, size=(6, 1, experts)).round()
    counts[0, 0, :gpus] *= 10
    counts[1, 0, gpus:] = np.linspace(500, 0, experts - gpus).round()
    counts[2, 0, :gpus] = 0
    return counts
