"""Checked dumps -> per-step arrays in our terms: logical counts, tokens, phase, sampled routing rows (pure).

Shape legend (README, Conventions): T steps, L layers, E logical experts, P physical slots, N tokens,
K top-k.

- per_pass / per_token: one step per forward pass per rank. Logical counts are the physical counts summed
  per logical expert through the dump's physical_to_logical_map. Tokens: len(input_ids) when the dump has
  it (per_token), else the busiest layer's count sum / k. per_token also gives sampled routing rows: at
  most `sample_tokens` tokens per pass, taken evenly over the batch, their physical ids mapped to logical
  ones (-1 where a slot was empty).
- stat: one step per non-zero buffered row (rows summed over ranks: published as rank 0 of world 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_monitor import core

from .sglang_dumps import PassDump, StatDump

SAMPLE_TOKENS = 16  # sampled routing rows per pass and rank (per_token dumps)


@dataclass(frozen=True)
class Steps:
    """The steps of one dump file, in step order. counts_TLE int32 [T, L, E]; tokens_T int64 [T];
    phase_T our phases; position_T int64 [T] (forward_pass_id, or the stat buffer row) to place them in
    time; sample_T: int16 [L, N, K] sampled rows per step (per_token) or None."""

    rank: int
    counts_TLE: np.ndarray
    tokens_T: np.ndarray
    phase_T: tuple[str, ...]
    position_T: np.ndarray
    sample_T: tuple[np.ndarray | None, ...]


def logical_counts(physical_count_TLP: np.ndarray, layout_LP: np.ndarray,
                   num_experts: int) -> np.ndarray:
    """int64 [T, L, E]: each logical expert's tokens, the sum over its physical slots (replicas)."""
    num_steps, num_layers, num_slots = physical_count_TLP.shape
    cells = num_layers * num_experts
    cell_LP = (np.arange(num_layers)[:, None] * num_experts + layout_LP).ravel()  # cell of L x E
    out_TLE = np.zeros((num_steps, num_layers, num_experts), dtype=np.int64)
    for t in range(num_steps):  # one pass at a time: memory stays at a few [L, P] arrays
        # float64 weights are exact: every count is below 2**31 and a cell sums at most 2**16 of them
        sums = np.bincount(cell_LP, weights=physical_count_TLP[t].ravel(), minlength=cells)
        out_TLE[t] = sums.round().astype(np.int64).reshape(num_layers, num_experts)
    return out_TLE


def tokens_from_counts(counts_TLE: np.ndarray, top_k: int) -> np.ndarray:
    """int64 [T]: tokens of each step, the busiest layer's count sum / k (rounded)."""
    if top_k < 1:
        raise ValueError(f"top-k must be at least 1, got {top_k}")
    per_layer_TL = counts_TLE.sum(axis=2, dtype=np.int64)
    return (per_layer_TL.max(axis=1, initial=0) + top_k // 2) // top_k


def top_k_of(dump: PassDump) -> int | None:
    """k from per_token ids: the most valid (non -1) ids any token has in any layer; None when the dump has no
    ids or no token was routed."""
    if dump.topk_ids_T is None:
        return None
    best = 0
    for ids_LNK in dump.topk_ids_T:
        if ids_LNK.size:
            best = max(best, int((ids_LNK >= 0).sum(axis=2).max()))
    return best or None


def pass_steps(dump: PassDump, top_k: int, sample_tokens: int = SAMPLE_TOKENS) -> Steps:
    """The steps of a per_pass / per_token dump. top_k: k of the model (tokens from counts, width of the
    sampled rows)."""
    counts_TLE = logical_counts(dump.physical_count_TLP, dump.layout_LP, dump.num_experts)
    tokens_T = np.where(dump.tokens_T >= 0, dump.tokens_T, tokens_from_counts(counts_TLE, top_k))
    samples: list[np.ndarray | None] = [None] * len(dump.phase_T)
    if dump.topk_ids_T is not None and sample_tokens > 0 and dump.num_experts <= core.MAX_SAMPLE_EXPERTS:
        samples = [sampled_rows(ids, dump.layout_LP, top_k, sample_tokens) for ids in dump.topk_ids_T]
    return Steps(rank=dump.rank, counts_TLE=_int32(counts_TLE), tokens_T=tokens_T.astype(np.int64),
                 phase_T=dump.phase_T, position_T=dump.pass_id_T, sample_T=tuple(samples))


def stat_steps(dump: StatDump, top_k: int) -> Steps:
    """The non-zero buffered rows of a stat dump, in buffer order (the ring's order is not time order)."""
    rows = np.flatnonzero(dump.logical_count_TLE.reshape(dump.logical_count_TLE.shape[0], -1).any(axis=1))
    counts_TLE = dump.logical_count_TLE[rows]
    return Steps(rank=0, counts_TLE=_int32(counts_TLE), tokens_T=tokens_from_counts(counts_TLE, top_k),
                 phase_T=("unknown",) * rows.size, position_T=rows.astype(np.int64), sample_T=(None,) * rows.size)


def sampled_rows(ids_LNK: np.ndarray, layout_LP: np.ndarray, top_k: int,
                 sample_tokens: int = SAMPLE_TOKENS) -> np.ndarray | None:
    """int16 [L, n, top_k] logical ids of n = min(N, sample_tokens) tokens taken evenly over the pass
    (physical ids mapped through the layout; -1 stays -1), or None for a pass without tokens. Columns past
    the ids' width are -1; columns past top_k are dropped (SGLang pads its ids to a fixed width)."""
    num_layers, num_tokens, width = ids_LNK.shape
    if num_tokens == 0:
        return None
    pick_N = np.unique(np.arange(min(num_tokens, sample_tokens)) * num_tokens // min(num_tokens, sample_tokens))
    picked_LNK = ids_LNK[:, pick_N, :top_k]
    logical_LNK = np.full((num_layers, pick_N.size, top_k), -1, dtype=np.int16)
    rows_L11 = np.arange(num_layers)[:, None, None]
    valid = picked_LNK >= 0
    mapped = layout_LP[np.broadcast_to(rows_L11, picked_LNK.shape), np.where(valid, picked_LNK, 0)]
    logical_LNK[:, :, :picked_LNK.shape[2]] = np.where(valid, mapped, -1)
    return logical_LNK


def _int32(counts: np.ndarray) -> np.ndarray:
    if counts.size and int(counts.max()) > np.iinfo(np.int32).max:
        raise ValueError("a logical count exceeds int32 (the wire's counts): more than 2**31 tokens in one step")
    return counts.astype(np.int32)
