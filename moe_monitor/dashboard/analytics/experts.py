"""Expert popularity: hot experts, dead experts and drift between windows.

Shape legend: L layers, E logical experts.
"""
from __future__ import annotations

import numpy as np


def _check_LE(counts_LE: np.ndarray) -> np.ndarray:
    counts_LE = np.asarray(counts_LE)
    if counts_LE.ndim != 2:
        raise ValueError(f"counts must be [layers, experts], got shape {counts_LE.shape}")
    if (counts_LE < 0).any():
        raise ValueError("counts must not be negative")
    return counts_LE


def hot_experts(counts_LE: np.ndarray, top_n: int) -> list[dict]:
    """The top_n (layer, expert) pairs by tokens over the window, hottest first.

    Each row: layer, expert, tokens, share (of the layer's tokens), x_mean (tokens / the layer's mean per
    expert: 1.0 is a perfectly average expert). Pairs with zero tokens are never listed."""
    counts_LE = _check_LE(counts_LE)
    if top_n < 1:
        raise ValueError(f"top_n must be at least 1, got {top_n}")
    flat = counts_LE.astype(np.int64).ravel()
    n = min(top_n, int((flat > 0).sum()))
    if n == 0:
        return []
    idx = np.argpartition(-flat, n - 1)[:n]
    idx = idx[np.lexsort((idx, -flat[idx]))]
    layer_total_L = counts_LE.sum(axis=1, dtype=np.int64)
    num_experts = counts_LE.shape[1]
    rows = []
    for i in idx:
        layer, expert = divmod(int(i), num_experts)
        total = int(layer_total_L[layer])
        rows.append({"layer": layer, "expert": expert, "tokens": int(flat[i]), "share": flat[i] / total,
                     "x_mean": flat[i] * num_experts / total})
    return rows


def gpus_holding(layout_LP: np.ndarray, gpus: int, layer: int, expert: int) -> list[int]:
    """The GPUs that hold a slot of `expert` in `layer` (slot p is on GPU p // (P / gpus)), ascending."""
    row = np.asarray(layout_LP)[layer]
    return sorted({int(p) // (row.size // gpus) for p in np.flatnonzero(row == expert)})


def dead_experts(counts_LE: np.ndarray) -> np.ndarray:
    """bool [L, E]: experts that got no token over the window, in layers that got tokens at all."""
    counts_LE = _check_LE(counts_LE)
    active_L = counts_LE.sum(axis=1) > 0
    return (counts_LE == 0) & active_L[:, None]


def js_divergence(counts_a_LE: np.ndarray, counts_b_LE: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence (base 2, in [0, 1]) between the expert-popularity distributions of two
    windows, per layer: float [L]; NaN for a layer where either window has no tokens."""
    a_LE, b_LE = _check_LE(counts_a_LE).astype(np.float64), _check_LE(counts_b_LE).astype(np.float64)
    if a_LE.shape != b_LE.shape:
        raise ValueError(f"windows must have the same [L, E], got {a_LE.shape} and {b_LE.shape}")
    total_a, total_b = a_LE.sum(axis=1, keepdims=True), b_LE.sum(axis=1, keepdims=True)
    valid_L = (total_a[:, 0] > 0) & (total_b[:, 0] > 0)
    p = a_LE / np.where(total_a > 0, total_a, 1.0)
    q = b_LE / np.where(total_b > 0, total_b, 1.0)
    m = 0.5 * (p + q)

    def kl(x, y):
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(x > 0, x * np.log2(np.where(x > 0, x, 1.0) / np.where(y > 0, y, 1.0)), 0.0)
        return terms.sum(axis=1)

    js_L = 0.5 * kl(p, m) + 0.5 * kl(q, m)
    return np.where(valid_L, np.clip(js_L, 0.0, 1.0), np.nan)
