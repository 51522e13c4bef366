"""Dispatch and combine: the two all-to-alls of an EP MoE layer, and the weighted sum.

Shape legend (README, Conventions): N this rank's tokens, K top-k, H hidden size, M = N x K (token, expert)
pairs, G ranks, R the pairs this rank received (from every rank, its own included).

dispatch: the split sizes (an all_to_all_single of G counts), then the pairs' codes (expert x K + top-k position)
and hidden rows, pairs sorted by destination rank (stable: token-major within one). combine: the reverse
all_to_all_single, then out[n] = sum over k of w[n, k] y[n, k], added in ascending expert id as transformers'
eager loop does, so the output is the single-process one bit for bit (docs/ep-runtime.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dispatched:
    """What one rank received (x_RH; for each row its expert experts_R, its top-k position kpos_R and its source
    rank src_R) and what combine needs to send it back: the pair order (order_M: pair indices sorted by
    destination) and both sides' split sizes."""

    x_RH: torch.Tensor
    experts_R: torch.Tensor
    kpos_R: torch.Tensor
    src_R: torch.Tensor
    order_M: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]


def dispatch(x_NH: torch.Tensor, ids_NK: torch.Tensor, dst_M: torch.Tensor, ranks: int,
             group: dist.ProcessGroup | None = None) -> Dispatched:
    """Send every (token, expert) pair to the rank dst_M says (int64 [M], Placement.destinations)."""
    k = ids_NK.shape[1]
    order_M = torch.argsort(dst_M, stable=True)
    send_counts_G = torch.bincount(dst_M, minlength=ranks)
    recv_counts_G = torch.empty_like(send_counts_G)
    dist.all_to_all_single(recv_counts_G, send_counts_G, group=group)
    send_counts, recv_counts = send_counts_G.tolist(), recv_counts_G.tolist()
    received = sum(recv_counts)
    codes_M = (ids_NK.to(torch.int64) * k + torch.arange(k, dtype=torch.int64)).reshape(-1)[order_M]
    codes_R = codes_M.new_empty(received)
    dist.all_to_all_single(codes_R, codes_M, recv_counts, send_counts, group=group)
    rows_M = x_NH[torch.div(order_M, k, rounding_mode="floor")]
    x_RH = x_NH.new_empty((received, x_NH.shape[1]))
    dist.all_to_all_single(x_RH, rows_M, recv_counts, send_counts, group=group)
    src_R = torch.repeat_interleave(torch.arange(ranks, dtype=torch.int64), recv_counts_G)
    return Dispatched(x_RH, torch.div(codes_R, k, rounding_mode="floor"), codes_R % k, src_R, order_M,
                      send_counts, recv_counts)


def combine(y_RH: torch.Tensor, sent: Dispatched, ids_NK: torch.Tensor, weights_NK: torch.Tensor,
            group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """float [N, H]: the expert outputs back to their tokens (reverse all-to-all), weighted and summed."""
    n, k = ids_NK.shape
    back_MH = y_RH.new_empty((n * k, y_RH.shape[1]))
    dist.all_to_all_single(back_MH, y_RH, sent.send_counts, sent.recv_counts, group=group)
    y_MH = torch.empty_like(back_MH)
    y_MH[sent.order_M] = back_MH
    weighted_NKH = y_MH.view(n, k, -1) * weights_NK.to(y_MH.dtype).unsqueeze(-1)
    by_expert_NK = torch.argsort(ids_NK, dim=1)
    terms_NKH = weighted_NKH.gather(1, by_expert_NK.unsqueeze(-1).expand_as(weighted_NKH))
    out_NH = terms_NKH[:, 0].clone()
    for j in range(1, k):
        out_NH += terms_NKH[:, j]
    return out_NH
