"""Which rows of a router's topk_ids [N, K] are this worker's own tokens under data parallelism (pure: no vLLM
import; the caller reads vLLM's forward context).

vLLM 0.32 routes in one of three batch layouts when data-parallel ranks share the MoE layers (its own
routed-experts capturer tells them apart the same way, by N):
    N == sum(num_tokens_across_dp)      all DP ranks' tokens gathered before routing: this rank's span starts
                                        after the ranks before it
    N == num_tokens_across_dp[dp_rank]  only this rank's tokens (the router runs before the dispatch)
    N == ceil(local / tp_size)          sequence-parallel MoE (TP > 1 and DP > 1 with expert parallelism and an
                                        all-gather / DeepEP backend): each TP rank routes its shard of the
                                        local tokens; shard r holds local tokens [r * N, (r + 1) * N)
Padding (CUDA graphs, DP batches padded to the same size) sits at the end of a rank's span.
"""
from __future__ import annotations

from collections.abc import Sequence


def local_span(num_rows: int, dp_rank: int, num_tokens_across_dp: Sequence[int] | None, tp_rank: int = 0,
               tp_size: int = 1) -> tuple[int, int, int] | None:
    """(first row, rows, first local token) of this rank's tokens among num_rows routed rows: the rows
    [first, first + rows) are local tokens [token, token + rows). num_tokens_across_dp: tokens [D] of every DP
    rank this step (vLLM's dp_metadata), None without data parallelism. None when num_rows fits no layout."""
    if num_tokens_across_dp is None:
        return 0, num_rows, 0
    sizes = [int(n) for n in num_tokens_across_dp]
    if not 0 <= dp_rank < len(sizes):
        return None
    local = sizes[dp_rank]
    if num_rows == sum(sizes) and len(sizes) > 1:
        return sum(sizes[:dp_rank]), local, 0
    if num_rows == local:
        return 0, local, 0
    if tp_size > 1 and num_rows == -(-local // tp_size):
        return 0, num_rows, tp_rank * num_rows
    return None
