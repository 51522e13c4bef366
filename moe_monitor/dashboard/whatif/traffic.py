"""What-if traffic figures, pure (no Streamlit): where each sampled token starts (its rank's GPU), the
per-layer traffic model of planner.traffic averaged over layers, and the table the page shows.

Cross-node traffic is counted from the token's source node (the node of the GPU its rank runs on) when
ranks map one-to-one onto GPUs (world_size == gpus: rank r is GPU r); otherwise from its experts' home node,
a lower bound, and the page says so. The lower bound is always shown beside it.

Shape legend (README, Conventions): L layers, E logical experts, P slots, G GPUs, N sampled tokens, K top-k.
"""
from __future__ import annotations

from dataclasses import astuple
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from moe_monitor.planner.sizes import DEEPSEEK_V3
from moe_monitor.planner.traffic import traffic

SOURCE_RULE, HOME_RULE = "source rank", "home node"
# (hidden, moe_intermediate, dtype bytes) for sizes a run leaves unknown
DEFAULT_SIZES: tuple[int, int, int] = astuple(DEEPSEEK_V3)
SIZE_NAMES = ("hidden_size", "moe_intermediate_size", "dtype_bytes")


def run_sizes(meta: Any) -> tuple[tuple[int, int, int], str | None]:
    """(hidden, moe_intermediate, dtype_bytes) of the run and a note naming what was assumed, or None.

    A size of 0 (or less, or missing) is unknown - the generic collector API defaults them to 0 - and
    falls back to DeepSeek-V3's, as when the run has no metadata at all; never 0 bytes shown as real."""
    if meta is None:
        return DEFAULT_SIZES, "sizes assumed (DeepSeek-V3: hidden 7168, moe_intermediate 2048, bf16): the run has no metadata"
    given = [int(getattr(meta, name, 0) or 0) for name in SIZE_NAMES]
    hidden, inter, dtype_bytes = (v if v > 0 else d for v, d in zip(given, DEFAULT_SIZES))
    sizes = (hidden, inter, dtype_bytes)
    unknown = [f"{name} = {d}" for name, v, d in zip(SIZE_NAMES, given, DEFAULT_SIZES) if v <= 0]
    if not unknown:
        return sizes, None
    return sizes, f"assumed DeepSeek-V3's {', '.join(unknown)}: the run's metadata leaves them 0 (unknown)"


def source_gpus(rank_N: ArrayLike | None, world_size: int, gpus: int) -> tuple[np.ndarray | None, str]:
    """GPU each sampled row starts on, int64 [N], and a note. GPU of rank r = r when world_size == gpus;
    otherwise None and a note saying the home-node rule (a lower bound) is used instead."""
    if rank_N is None:
        return None, "the sampled rows carry no rank: cross-node share from the home-node rule (a lower bound)"
    ranks_N = np.asarray(rank_N, dtype=np.int64)
    if world_size != gpus:
        return None, (f"{world_size} rank(s) do not map one-to-one onto {gpus} GPUs: cross-node share from the "
                      "home-node rule (each token placed on the node holding most of its experts; a lower bound)")
    if ranks_N.size and (ranks_N.min() < 0 or ranks_N.max() >= gpus):
        return None, f"sampled ranks outside 0..{gpus - 1}: cross-node share from the home-node rule (a lower bound)"
    return ranks_N, "cross-node share counted from each token's own rank (rank r = GPU r)"


def traffic_summary(ids_LNK: ArrayLike, layout_LP: ArrayLike, num_experts: int, gpus: int, nodes: int,
                    hidden: int, dtype_bytes: int, tokens_per_step: float, node_cap: int | None = None,
                    source_gpu_N: ArrayLike | None = None) -> dict:
    """Traffic of a layout from sampled rows, averaged over layers that have rows: GPUs and nodes touched
    per token, cross-node share (from source_gpu_N when given, else the home-node lower bound) and its lower
    bound, all-to-all bytes per step and layer (dispatch + combine, 2*d*b per (token, expert) pair, and per
    (token, GPU) for a deduplicating dispatcher) scaled to tokens_per_step, and with node_cap the share of
    (token, expert) pairs a node-limited router must re-route."""
    lay = np.asarray(layout_LP, dtype=np.int64)
    ids = np.asarray(ids_LNK)
    rows = []
    for layer in range(lay.shape[0]):
        ids_NK = ids[layer].astype(np.int64)
        if not (ids_NK >= 0).any():
            continue
        cap = node_cap if node_cap is not None and 1 <= node_cap <= nodes else None
        rows.append(traffic(ids_NK, lay[layer], num_experts, gpus, nodes, hidden, dtype_bytes, cap, source_gpu_N))
    if not rows:
        raise ValueError("the sampled rows hold no routed token")
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("mean_gpus_per_token", "mean_nodes_per_token",
                                                             "cross_node_share", "cross_node_share_lower_bound")}
    tokens = sum(r["tokens"] for r in rows)
    per_pair = sum(r["bytes_per_expert_dispatch"] for r in rows) / tokens
    per_gpu = sum(r["bytes_per_gpu_dispatch"] for r in rows) / tokens
    out = {**mean, "layers": len(rows), "sampled_tokens": tokens // len(rows), "cross_node_rule": rows[0]["cross_node_rule"],
           "bytes_per_step_layer": per_pair * tokens_per_step,
           "dedup_bytes_per_step_layer": per_gpu * tokens_per_step,
           "cross_node_bytes_per_step_layer": per_pair * tokens_per_step * mean["cross_node_share"],
           "cross_node_bytes_lower_bound": per_pair * tokens_per_step * mean["cross_node_share_lower_bound"]}
    if rows[0].get("node_cap") is not None:
        out["node_cap"] = rows[0]["node_cap"]
        out["rerouted_pair_share"] = float(np.mean([r["rerouted_pair_share"] for r in rows]))
        out["tokens_over_cap_share"] = float(np.mean([r["tokens_over_cap_share"] for r in rows]))
    return out


def _table_rows(rule: str) -> tuple[tuple[str, str, str], ...]:
    """(summary key, label, format) of each row of the table, for the summaries' cross-node rule."""
    cross: tuple[tuple[str, str, str], ...]
    cross_bytes: tuple[tuple[str, str, str], ...]
    if rule == SOURCE_RULE:
        cross = (("cross_node_share", "cross-node share of (token, expert) pairs (from the token's rank)", "{:.1%}"),
                 ("cross_node_share_lower_bound", "... lower bound (token on its experts' home node)", "{:.1%}"))
        cross_bytes = (("cross_node_bytes_per_step_layer", "cross-node bytes / step / layer (from the token's rank)",
                        "{:,.0f}"),
                       ("cross_node_bytes_lower_bound", "... lower bound (home node)", "{:,.0f}"))
    else:
        cross = (("cross_node_share", "cross-node share of (token, expert) pairs, lower bound (home node)",
                  "{:.1%}"),)
        cross_bytes = (("cross_node_bytes_per_step_layer", "cross-node bytes / step / layer, lower bound (home node)",
                        "{:,.0f}"),)
    return (("mean_gpus_per_token", "GPUs touched per token", "{:.2f}"),
            ("mean_nodes_per_token", "nodes touched per token", "{:.2f}"), *cross,
            ("bytes_per_step_layer", "all-to-all bytes / step / layer (2·k·d·b per token)", "{:,.0f}"),
            ("dedup_bytes_per_step_layer", "... deduplicated per GPU (DeepEP-style)", "{:,.0f}"), *cross_bytes,
            ("tokens_over_cap_share", "tokens over the node cap", "{:.1%}"),
            ("rerouted_pair_share", "pairs a node-limited router re-routes", "{:.1%}"))


def traffic_table(before: dict, after: dict) -> list[dict]:
    """Rows {metric, before, after} (formatted strings) for the figures both summaries have."""
    return [{"metric": label, "before": fmt.format(before[key]), "after": fmt.format(after[key])}
            for key, label, fmt in _table_rows(before.get("cross_node_rule", HOME_RULE)) if key in before and key in after]
