"""Traffic model under a layout, from sampled per-token top-k rows of one layer: bytes, GPUs and nodes touched.

Input topk_NK: int [N tokens, K] expert ids, -1 = masked. Replica rule (deterministic): a single replica takes
the token; else a replica on a GPU the token already touches, else on a node it touches, else replica
(token index mod replicas). Bytes: 2 * d * b per (token, expert) pair and per (token, distinct GPU) (a
deduplicating dispatcher such as DeepEP). Cross-node share: pairs outside the source node (``source_gpu_N``),
always also as a lower bound (outside the node holding most of the token's experts); node-limited what-if: the
share of pairs outside the M nodes that cover most of a token's experts. docs/planner.md (Traffic model).
"""
from __future__ import annotations

import numpy as np

from .sizes import DEEPSEEK_V3


def _replica_table(layout_P: np.ndarray, num_experts: int, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    S = layout_P.size // gpus
    rep = np.bincount(layout_P, minlength=num_experts)
    if np.any(rep == 0):
        raise ValueError(f"layout misses expert {int(np.argmin(rep))}")
    table = np.full((num_experts, int(rep.max())), -1, dtype=np.int64)
    order = np.argsort(layout_P, kind="stable")
    start = np.concatenate([[0], np.cumsum(rep)[:-1]])
    for e in range(num_experts):
        table[e, :rep[e]] = order[start[e]:start[e] + rep[e]] // S
    return table, rep


def route(topk_NK, layout_P, num_experts: int, gpus: int, nodes: int = 1) -> np.ndarray:
    """GPU serving each (token, expert) pair, int [N, K] (-1 where masked)."""
    t = np.asarray(topk_NK)
    if t.ndim != 2 or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"top-k ids must be an int array [tokens, k], got {t.dtype} {t.shape}")
    if t.size and (t.max() >= num_experts or t.min() < -1):
        raise ValueError(f"top-k ids must lie in [-1, {num_experts}), found {t.min()}..{t.max()}")
    lay = np.asarray(layout_P, dtype=np.int64)
    if gpus % nodes:
        raise ValueError(f"{gpus} GPUs do not split over {nodes} nodes")
    table, rep = _replica_table(lay, num_experts, gpus)
    N, K = t.shape
    per_node = gpus // nodes
    gpu_NK = np.full((N, K), -1, dtype=np.int64)
    touched = np.zeros((N, gpus), dtype=bool)
    rows = np.arange(N)
    ids = np.where(t >= 0, t, 0)
    single = (t >= 0) & (rep[ids] == 1)
    gpu_NK[single] = table[ids[single], 0]
    for k in range(K):
        touched[rows[single[:, k]], gpu_NK[single[:, k], k]] = True
    for k in range(K):
        m = (t[:, k] >= 0) & ~single[:, k]
        if not m.any():
            continue
        r = rows[m]
        cand = table[ids[r, k]]                                    # [n, Rmax]
        valid = cand >= 0
        cg = np.where(valid, cand, 0)
        on_gpu = touched[r[:, None], cg] & valid
        node_t = touched[r].reshape(-1, nodes, per_node).any(2)
        on_node = node_t[np.arange(r.size)[:, None], cg // per_node] & valid
        fallback = r % rep[ids[r, k]]
        pick = np.where(on_gpu.any(1), on_gpu.argmax(1), np.where(on_node.any(1), on_node.argmax(1), fallback))
        g = cand[np.arange(r.size), pick]
        gpu_NK[r, k] = g
        touched[r, g] = True
    return gpu_NK


def traffic(topk_NK, layout_P, num_experts: int, gpus: int, nodes: int = 1, hidden: int = DEEPSEEK_V3.hidden_size,
            dtype_bytes: int = DEEPSEEK_V3.dtype_bytes, node_cap: int | None = None, source_gpu_N=None) -> dict:
    """Per-layer traffic figures for one batch of sampled tokens (see module doc). source_gpu_N: int [N],
    the GPU each token starts on (None: unknown, the cross-node share is the home-node lower bound)."""
    gpu_NK = route(topk_NK, layout_P, num_experts, gpus, nodes)
    t = np.asarray(topk_NK)
    N = t.shape[0]
    if source_gpu_N is not None:
        source_gpu_N = np.asarray(source_gpu_N, dtype=np.int64)
        if source_gpu_N.shape != (N,) or (N and (source_gpu_N.min() < 0 or source_gpu_N.max() >= gpus)):
            raise ValueError(f"source GPUs must be {N} ids in [0, {gpus}), got shape {source_gpu_N.shape}")
    per_node = gpus // nodes
    valid = gpu_NK >= 0
    touched = np.zeros((N, gpus), dtype=bool)
    r, k = np.nonzero(valid)
    touched[r, gpu_NK[r, k]] = True
    node_touch = touched.reshape(N, nodes, per_node).any(2)
    gpus_per_tok = touched.sum(1)
    nodes_per_tok = node_touch.sum(1)
    pairs = int(valid.sum())
    # cross-node: pairs served on a node other than the token's home (its node with most experts)
    node_NK = np.where(valid, gpu_NK // per_node, -1)
    node_hits = np.stack([(node_NK == n).sum(1) for n in range(nodes)], 1)
    home = node_hits.argmax(1)
    cross_lb = int((valid & (node_NK != home[:, None])).sum())
    if source_gpu_N is None:
        cross, rule = cross_lb, "home node"
    else:
        cross, rule = int((valid & (node_NK != (source_gpu_N // per_node)[:, None])).sum()), "source rank"
    out = {"tokens": N, "pairs": pairs,
           "bytes_per_expert_dispatch": 2 * pairs * hidden * dtype_bytes,
           "bytes_per_gpu_dispatch": 2 * int(gpus_per_tok.sum()) * hidden * dtype_bytes,
           "mean_gpus_per_token": float(gpus_per_tok.mean()) if N else 0.0,
           "mean_nodes_per_token": float(nodes_per_tok.mean()) if N else 0.0,
           "cross_node_share": cross / pairs if pairs else 0.0, "cross_node_rule": rule,
           "cross_node_share_lower_bound": cross_lb / pairs if pairs else 0.0,
           "gpu_tokens": np.bincount(gpu_NK[valid], minlength=gpus)}
    if node_cap is not None:
        out.update(node_limited(t, layout_P, num_experts, gpus, nodes, node_cap))
    return out


def node_limited(topk_NK, layout_P, num_experts: int, gpus: int, nodes: int, cap: int) -> dict:
    """What-if of a cap on nodes per token: share of tokens over the cap and of pairs to re-route."""
    if not 1 <= cap <= nodes:
        raise ValueError(f"node cap must be in 1..{nodes}, got {cap}")
    t = np.asarray(topk_NK)
    lay = np.asarray(layout_P, dtype=np.int64)
    S = lay.size // gpus
    per_node = gpus // nodes
    on_node_EM = np.zeros((num_experts, nodes), dtype=bool)
    on_node_EM[lay, (np.arange(lay.size) // S) // per_node] = True
    valid = t >= 0
    cover = on_node_EM[np.where(valid, t, 0)] & valid[..., None]       # [N, K, nodes]
    N = t.shape[0]
    kept = np.zeros((N, nodes), dtype=bool)
    covered = np.zeros(t.shape, dtype=bool)
    for _ in range(cap):
        gain = (cover & ~covered[..., None]).sum(1)                      # [N, nodes]
        gain = np.where(kept, -1, gain)
        n = gain.argmax(1)
        kept[np.arange(N), n] = True
        covered |= cover[np.arange(N), :, n]
    need = (cover.any(2) & valid)
    over = (need & ~covered).any(1)
    pairs = int(valid.sum())
    return {"node_cap": cap, "tokens_over_cap_share": float(over.mean()) if N else 0.0,
            "rerouted_pair_share": float((need & ~covered).sum() / pairs) if pairs else 0.0}
