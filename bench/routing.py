"""Real-shaped routing for simulated ranks: DeepSeek-V3's shape, per-layer expert popularity from the real SGLang
counts in tests/data, each rank's own mix, each token's top-8 distinct experts, and the run metadata they go
with. Shapes: L layers, E experts, N tokens, K top-k."""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moe_monitor import core

LAYERS, EXPERTS, TOP_K = 58, 256, 8           # DeepSeek-V3: 61 layers, the first 3 dense
HIDDEN, MOE_FFN, DTYPE_BYTES = 7168, 2048, 2  # its hidden size and expert FFN width (bytes per value on the wire)
DATA_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "sglang_deepseek_v3"
DEFAULT_SOURCE = "decode_in1000out1000"


# ---------------------------------------------------------------------------------------------------- traffic
def popularity_LE(num_layers: int = LAYERS, num_experts: int = EXPERTS, source: str = DEFAULT_SOURCE,
                  seed: int = 0) -> np.ndarray:
    """float64 [L, E], each row a probability over the experts (every entry > 0). From the real DeepSeek-V3 SGLang
    counts `source` (a file name in tests/data/sglang_deepseek_v3/ without .json; its all-zero dense layers left
    out, the first L MoE layers kept) when it has E experts and at least L MoE layers; else a heavy-tailed
    Dirichlet(0.3) per layer drawn with `seed`."""
    path = DATA_DIR / f"{source}.json"
    rows_LE: np.ndarray | None = None
    if path.is_file():
        counts = np.asarray(json.loads(path.read_text())["logical_count"], dtype=np.float64)
        counts = counts[counts.sum(axis=1) > 0]
        if counts.ndim == 2 and counts.shape[1] == num_experts and counts.shape[0] >= num_layers:
            rows_LE = counts[:num_layers]
    if rows_LE is None:
        rows_LE = np.random.default_rng(seed).dirichlet(np.full(num_experts, 0.3), size=num_layers)
    rows_LE = rows_LE / rows_LE.sum(axis=1, keepdims=True) + 1e-6  # every expert reachable (K distinct exist)
    return rows_LE / rows_LE.sum(axis=1, keepdims=True)


def rank_mix_LE(base_LE: np.ndarray, rank: int, spread: float = 0.25, seed: int = 0) -> np.ndarray:
    """float64 [L, E]: base_LE times a log-normal factor per (layer, expert) of sigma `spread`, drawn for `rank`
    (the same rank and seed give the same mix), each row renormalised to 1."""
    rng = np.random.default_rng([seed, 1, rank])
    mixed = base_LE * np.exp(rng.normal(0.0, spread, size=base_LE.shape))
    return mixed / mixed.sum(axis=1, keepdims=True)


def draw_topk_ids(p_LE: np.ndarray, tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """int32 [L, N, K] expert ids: for each layer, N = tokens tokens each pick K distinct experts, drawn one at a
    time from the layer's probabilities p_LE [L, E] (a repeat is drawn again, which is sampling without
    replacement in proportion to p). Each token's K ids come out sorted."""
    num_layers, num_experts = p_LE.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in 1..{num_experts}")
    offsets_L = np.arange(num_layers, dtype=np.float64)
    cdf_LE = np.cumsum(p_LE, axis=1)
    cdf_LE[:, -1] = 1.0
    cdf_flat = (cdf_LE + offsets_L[:, None]).ravel()  # layer l's CDF shifted to (l, l + 1]

    def draw(layer_X: np.ndarray) -> np.ndarray:
        flat = np.searchsorted(cdf_flat, rng.random(layer_X.shape) + layer_X, side="right")
        return np.clip(flat - layer_X.astype(np.int64) * num_experts, 0, num_experts - 1)

    layer_LNK = np.broadcast_to(np.arange(num_layers)[:, None, None], (num_layers, tokens, top_k))
    ids_LNK = draw(layer_LNK).astype(np.int32)
    while True:
        ids_LNK.sort(axis=2)
        repeat = ids_LNK[:, :, 1:] == ids_LNK[:, :, :-1]
        if not repeat.any():
            return ids_LNK
        where = np.nonzero(repeat)
        ids_LNK[where[0], where[1], where[2] + 1] = draw(where[0])


def counts_from_ids(ids_LNK: np.ndarray, num_experts: int) -> np.ndarray:
    """int32 [L, E]: how many of the ids [L, N, K] (all in [0, E)) name each expert, per layer."""
    num_layers = ids_LNK.shape[0]
    flat = ids_LNK.reshape(num_layers, -1) + (np.arange(num_layers) * num_experts)[:, None]
    return np.bincount(flat.ravel(), minlength=num_layers * num_experts).reshape(num_layers, num_experts).astype(
        np.int32)


@dataclass
class RankPool:
    """Pre-drawn steps of one rank: counts_SLE int32 [S, L, E] (S = pool steps; step k uses k % S) and, when
    sampled rows are on, sample_SLNK int16 [S, L, N, K] (N sampled tokens, every tokens // N-th)."""

    counts_SLE: np.ndarray
    sample_SLNK: np.ndarray | None


def rank_pool(rank: int, pool_steps: int, tokens: int, base_LE: np.ndarray, top_k: int = TOP_K,
              sample_tokens: int = 0, spread: float = 0.25, seed: int = 0) -> RankPool:
    """The pool of `pool_steps` steps of `rank` (its own mix of base_LE [L, E], see rank_mix_LE)."""
    p_LE = rank_mix_LE(base_LE, rank, spread, seed)
    rng = np.random.default_rng([seed, 2, rank])
    counts, samples = [], []
    for _ in range(pool_steps):
        ids_LNK = draw_topk_ids(p_LE, tokens, top_k, rng)
        counts.append(counts_from_ids(ids_LNK, p_LE.shape[1]))
        if sample_tokens:
            stride = max(1, tokens // sample_tokens)
            samples.append(ids_LNK[:, ::stride][:, :sample_tokens].astype(np.int16))
    return RankPool(np.stack(counts), np.stack(samples) if sample_tokens else None)


# ---------------------------------------------------------------------------------------------------- the run
def run_meta(run: str, ranks: int, num_layers: int = LAYERS, num_experts: int = EXPERTS, top_k: int = TOP_K,
             sample_tokens: int = 0, instance: str = "") -> core.RunMeta:
    """The RunMeta every simulated rank writes (as collectors/monitor.py builds it): DeepSeek-V3 sizes,
    world_size = ranks, the contiguous layout over core.default_gpus(E, ranks) GPUs in nodes of 8 where they
    divide evenly."""
    gpus = core.default_gpus(num_experts, ranks)
    nodes = gpus // 8 if gpus % 8 == 0 else 1
    layout = core.Layout(gpus, nodes, core.contiguous_layout(num_layers, num_experts))
    return core.RunMeta(
        run=core.check_run_name(run), model_name="deepseek-ai/DeepSeek-V3 (bench.loadgen)",
        layer_names=[f"model.layers.{i}.mlp.experts" for i in range(61 - num_layers, 61)][:num_layers]
        if num_layers <= 61 else [f"layer{i}" for i in range(num_layers)],
        num_experts=num_experts, top_k=top_k, hidden_size=HIDDEN, moe_intermediate_size=MOE_FFN,
        dtype_bytes=DTYPE_BYTES, layout=layout, world_size=ranks, started_s=time.time(), host=socket.gethostname(),
        sample_tokens_per_layer=sample_tokens, instance=instance)


