"""Replica-budget curve: imbalance vs the number of redundant slots R (0 ... 2G), with memory cost.

Only R with (E + R) divisible by G are feasible (every GPU has the same S slots). Memory: a gated FFN
expert holds 3 matrices hidden x moe_intermediate, so bytes_per_expert = 3 * hidden * moe_intermediate
* dtype_bytes; R redundant slots cost R / G experts per GPU in every MoE layer. Defaults: DeepSeek-V3
(planner.sizes.DEEPSEEK_V3: hidden 7168, moe_intermediate 2048, bf16). The knee is the point farthest from the straight line
between the curve's ends (Kneedle), i.e. where more replicas stop paying off.

Shapes: counts_LE [L, E] (or [W, L, E], planned robustly); returns a list of dict rows.
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.counts import as_counts

from .api import plan
from .sizes import DEEPSEEK_V3


def bytes_per_expert(hidden: int, moe_intermediate: int, dtype_bytes: int) -> int:
    """Weight bytes of one gated-FFN expert (gate, up, down)."""
    if min(hidden, moe_intermediate, dtype_bytes) <= 0:
        raise ValueError("hidden, moe_intermediate and dtype_bytes must be positive")
    return 3 * hidden * moe_intermediate * dtype_bytes


def feasible_redundant(num_experts: int, gpus: int, max_redundant: int) -> list[int]:
    """R in 0..max_redundant with (E + R) % G == 0."""
    return [r for r in range(0, max_redundant + 1) if (num_experts + r) % gpus == 0
            and (r == 0 or (num_experts + r) // gpus <= num_experts)]


def knee_index(x, y) -> int:
    """Index of the knee of a decreasing curve (max distance below the chord); 0 if < 3 points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return int(np.argmin(y)) if x.size and np.ptp(y) > 0 and x.size < 3 else 0
    xn, yn = (x - x[0]) / np.ptp(x), (y - y.min()) / np.ptp(y)
    chord = yn[0] + (yn[-1] - yn[0]) * xn
    return int(np.argmax(chord - yn))


def replica_budget_curve(counts, gpus: int, max_redundant: int | None = None, hidden: int = DEEPSEEK_V3.hidden_size,
                         moe_intermediate: int = DEEPSEEK_V3.moe_intermediate_size, dtype_bytes: int = DEEPSEEK_V3.dtype_bytes, policy: str = "auto",
                         nodes: int | None = None, groups: int | None = None) -> dict:
    """{"rows": [{redundant, mean_imbalance, worst_imbalance, mean_lower_bound, extra_bytes_per_gpu,
    extra_bytes_total}], "knee": index into rows, "bytes_per_expert": int}."""
    c = as_counts(counts, "counts", ndim=(2, 3))
    E = c.shape[-1]
    max_r = 2 * gpus if max_redundant is None else max_redundant
    target = c if c.ndim == 2 else c.sum(0)
    moe_layers = int((target.sum(1) > 0).sum())
    bpe = bytes_per_expert(hidden, moe_intermediate, dtype_bytes)
    rows = []
    for r in feasible_redundant(E, gpus, max_r):
        if nodes is not None and r % nodes:
            continue
        res = plan(c, gpus, r, nodes=nodes, groups=groups, policy=policy)
        s = res.summary()
        rows.append({"redundant": r, "mean_imbalance": s["mean_imbalance"],
                     "worst_imbalance": s["worst_imbalance"], "mean_lower_bound": s["mean_lower_bound"],
                     "extra_bytes_per_gpu": r * moe_layers * bpe / gpus,
                     "extra_bytes_total": r * moe_layers * bpe})
    if not rows:
        raise ValueError(f"no R in 0..{max_r} makes {E} + R slots split evenly over {gpus} GPUs")
    k = knee_index([r["redundant"] for r in rows], [r["mean_imbalance"] for r in rows])
    return {"rows": rows, "knee": k, "bytes_per_expert": bpe, "moe_layers": moe_layers}
