"""Seeded synthetic expert counts for tests, benchmarks and demos (never shown as real data).

skewed_counts: per layer, expert popularity ~ lognormal(0, sigma), then Poisson token counts.
sigma 0.7 is the "skewed" / "mild skew" case the planner's anchors are quoted on.
drifting_windows: T windows whose log-popularity follows a random walk (step ``drift``) around a
lognormal base, as traffic that drifts over time.
"""
from __future__ import annotations

import numpy as np


def skewed_counts(layers: int = 58, experts: int = 256, sigma: float = 0.7, tokens: float = 8e6,
                  seed: int = 0) -> np.ndarray:
    """Counts [L, E] (float64)."""
    rng = np.random.default_rng(seed)
    p = rng.lognormal(0.0, sigma, (layers, experts))
    return rng.poisson(p / p.sum(1, keepdims=True) * tokens).astype(np.float64)


def drifting_windows(windows: int = 12, layers: int = 16, experts: int = 256, sigma: float = 0.9,
                     drift: float = 0.15, tokens: float = 2e6, seed: int = 0) -> np.ndarray:
    """Counts [W, L, E] (float64), windows oldest..newest."""
    rng = np.random.default_rng(seed)
    logp = rng.normal(0.0, sigma, (layers, experts))
    out = np.empty((windows, layers, experts))
    for t in range(windows):
        logp = logp + rng.normal(0.0, drift, logp.shape)
        p = np.exp(logp)
        out[t] = rng.poisson(p / p.sum(1, keepdims=True) * tokens)
    return out


def sampled_steps(popularity_LE, steps: int, tokens_per_step, top_k: int = 8, seed: int = 0) -> np.ndarray:
    """Per-step counts [T, L, E] (float64): each step routes tokens x top_k assignments per layer, drawn
    multinomially from the layer's popularity [L, E] (normalised; layers without traffic stay zero).
    ``tokens_per_step``: one number, or [T] tokens of each step (a decode batch that varies)."""
    rng = np.random.default_rng(seed)
    pop = np.asarray(popularity_LE, dtype=np.float64)
    total = pop.sum(1, keepdims=True)
    busy = total[:, 0] > 0
    share = np.where(busy[:, None], pop / np.where(total > 0, total, 1.0), 0.0)
    tokens_T = np.broadcast_to(np.asarray(tokens_per_step, dtype=np.int64), (steps,))
    out = np.zeros((steps,) + pop.shape)
    for t in range(steps):
        out[t, busy] = rng.multinomial(int(tokens_T[t]) * top_k, share[busy])
    return out
