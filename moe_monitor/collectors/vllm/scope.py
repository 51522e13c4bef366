"""Which vLLM ranks publish, under which numbering, so that the reader's sum over ranks counts each token once
(pure: no vLLM import).

vLLM flags → rule:
    --tensor-parallel-size T (attention sharded over T ranks): the T ranks of a data-parallel group route the
        same tokens; only tensor-parallel rank 0 publishes them (scope "dp-group").
    --data-parallel-size D (data-parallel attention): each of the D groups routes its own tokens; each group
        publishes, as rank dp_rank of D.
    --enable-expert-parallel: the experts are spread over the T x D ranks, so the layout has T x D GPUs;
        without it every rank holds a tensor-parallel slice of every expert (the layout has one "GPU": no rank
        can be a straggler by expert placement).
    --pipeline-parallel-size > 1: each stage owns other layers; not supported yet (nothing is published).
    sequence-parallel MoE (vLLM's use_sequence_parallel_moe: T > 1 and D > 1 with expert parallelism and the
        default all-gather / DeepEP all-to-all backends): each tensor-parallel rank routes its own shard of its
        group's tokens, so every rank publishes its shard, as rank dp_rank * T + tp_rank of T x D (scope "rank").
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Publishing:
    """publishes: whether this rank publishes; rank, world_size: its publisher numbering; scope: core.SCOPES;
    gpus: the expert-parallel GPUs the layout spans; reason: one line for the log."""

    publishes: bool
    rank: int
    world_size: int
    scope: str
    gpus: int
    reason: str


def publishing_rule(tp_rank: int, tp_size: int, dp_rank: int, dp_size: int, pp_size: int,
                    expert_parallel: bool, sequence_parallel_moe: bool = False) -> Publishing:
    """The rule for one vLLM worker (its tensor-, data- and pipeline-parallel ranks and sizes; whether vLLM
    shards each group's tokens over its tensor-parallel ranks for the MoE layers)."""
    gpus = tp_size * dp_size if expert_parallel else 1
    scope = "dp-group" if tp_size > 1 else "rank"
    if pp_size > 1:
        return Publishing(False, dp_rank, dp_size, scope, gpus,
                          f"pipeline parallel size {pp_size}: not supported yet, nothing is published")
    if sequence_parallel_moe and tp_size > 1:
        rank = dp_rank * tp_size + tp_rank
        return Publishing(True, rank, dp_size * tp_size, "rank", gpus,
                          f"publishes its shard of data-parallel group {dp_rank}'s tokens (sequence-parallel MoE: "
                          f"tensor-parallel rank {tp_rank} of {tp_size}), as rank {rank} of {dp_size * tp_size}")
    if tp_rank != 0:
        return Publishing(False, dp_rank, dp_size, scope, gpus,
                          f"tensor-parallel rank {tp_rank}: rank 0 of the group publishes its tokens")
    who = (f"data-parallel group {dp_rank} of {dp_size}" if dp_size > 1 else "the only data-parallel group")
    shared = f", on behalf of its {tp_size} tensor-parallel ranks" if tp_size > 1 else ""
    return Publishing(True, dp_rank, dp_size, scope, gpus, f"publishes the tokens of {who}{shared}")
