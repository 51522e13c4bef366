"""The expert weights one rank holds, and its expert FFNs on the tokens it received.

Shape legend (README, Conventions): L MoE layers, E logical experts, H hidden size, I the expert FFN width
(moe_intermediate_size), R received (token, expert) rows.
Weights per (layer, expert): gate_up float [2I, H] and down float [H, I], transformers' DeepseekV3Experts
layout (gate_up_proj[e], down_proj[e]); a rank keeps one copy per expert however many of its slots hold it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .placement import Placement


class ExpertStore:
    """Weights of the experts `rank` holds under a placement, per layer: {expert: (gate_up, down)}."""

    def __init__(self, weights_L: list[dict[int, tuple[torch.Tensor, torch.Tensor]]], hidden_size: int,
                 ffn_size: int):
        self.weights_L = weights_L
        self.hidden_size, self.ffn_size = hidden_size, ffn_size
        self._stacks: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_experts(cls, experts_modules: list, placement: Placement, rank: int) -> ExpertStore:
        """Clone the rank's experts out of each layer's DeepseekV3Experts (gate_up_proj [E, 2I, H], down_proj
        [E, H, I]); the caller then drops the modules, so the rank holds only its own experts."""
        weights_L = []
        for layer, module in enumerate(experts_modules):
            weights_L.append({e: (module.gate_up_proj[e].detach().clone(), module.down_proj[e].detach().clone())
                              for e in placement.experts_on(rank, layer)})
        first = experts_modules[0]
        return cls(weights_L, int(first.gate_up_proj.shape[2]), int(first.down_proj.shape[2]))

    @property
    def floats_per_expert(self) -> int:
        return 3 * self.ffn_size * self.hidden_size

    def pack(self, layer: int, expert: int) -> torch.Tensor:
        """float [3 I H]: one expert's weights in one buffer (what a move sends)."""
        gate_up, down = self.weights_L[layer][expert]
        return torch.cat([gate_up.reshape(-1), down.reshape(-1)])

    def unpack(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, h = self.ffn_size, self.hidden_size
        return flat[: 2 * i * h].view(2 * i, h), flat[2 * i * h:].view(h, i)

    def holds(self, layer: int, expert: int) -> bool:
        return expert in self.weights_L[layer]

    def compute(self, layer: int, x_RH: torch.Tensor, experts_R: torch.Tensor, kpos_R: torch.Tensor,
                src_R: torch.Tensor) -> torch.Tensor:
        """float [R, H]: each received row through its expert's FFN, down(silu(gate(x)) * up(x)), unweighted
        (the router weight is applied where the token lives, in combine). One GEMM per (source rank, expert),
        rows in (top-k position, token) order: exactly the GEMM transformers' eager experts loop runs for that
        rank's tokens, so without replicas the result is the single-process one bit for bit (float GEMM
        kernels round differently for different row counts; with replicas an expert's rows are split over its
        replicas, a few ulps apart). A real engine batches all sources in one grouped GEMM.
        KeyError when a row names an expert this rank does not hold."""
        out_RH = torch.empty_like(x_RH)
        if x_RH.shape[0] == 0:
            return out_RH
        top_k = int(kpos_R.max()) + 1
        group_R = src_R * (int(experts_R.max()) + 1) + experts_R
        order = torch.argsort(group_R * top_k + kpos_R, stable=True)
        _, counts = torch.unique_consecutive(group_R[order], return_counts=True)
        weights = self.weights_L[layer]
        start = 0
        for count in counts.tolist():
            rows = order[start: start + count]
            start += count
            gate_up, down = weights[int(experts_R[rows[0]])]
            gate, up = F.linear(x_RH[rows], gate_up).chunk(2, dim=-1)
            out_RH[rows] = F.linear(F.silu(gate) * up, down)
        return out_RH

    def compute_grouped(self, layer: int, x_RH: torch.Tensor, experts_R: torch.Tensor) -> torch.Tensor:
        """float [R, H]: the same FFNs as compute(), as a real engine runs them: every received row of every
        local expert in two grouped GEMMs (torch._grouped_mm) over the layer's weights stacked once (stacked()),
        so the time follows the rows and the active experts (a group without rows reads no weights), not the
        number of (source, expert) groups nor the experts held. Equal to compute() within float rounding
        (different GEMM blocking), not bit for bit. KeyError when a row names an expert this rank does not hold."""
        out_RH = torch.empty_like(x_RH)
        if x_RH.shape[0] == 0:
            return out_RH
        ids_G, gate_up_GHI, down_GIH = self.stacked(layer)
        held = ids_G.shape[0]
        experts_R = experts_R.to(ids_G.dtype)
        pos_R = torch.searchsorted(ids_G, experts_R)
        if held == 0 or (pos_R >= held).any() or (ids_G[pos_R.clamp(max=held - 1)] != experts_R).any():
            raise KeyError(f"layer {layer}: a row names an expert rank does not hold")
        order = torch.argsort(pos_R, stable=True)
        offs_G = torch.cumsum(torch.bincount(pos_R, minlength=held), 0).to(torch.int32)
        gate, up = torch._grouped_mm(x_RH[order].contiguous(), gate_up_GHI, offs=offs_G).chunk(2, dim=-1)
        out_RH[order] = torch._grouped_mm((F.silu(gate) * up).contiguous(), down_GIH, offs=offs_G)
        return out_RH

    def stacked(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids_G, gate_up_GHI [G, H, 2I], down_GIH [G, I, H]): the layer's held experts, ascending, their
        weights stacked for the grouped GEMMs on first use; the store's per-expert weights become views of the
        stacks (one copy held). Stacking on every call would copy every held expert's weights each step."""
        cached = self._stacks.get(layer)
        if cached is None:
            weights = self.weights_L[layer]
            held = sorted(weights)
            ids_G = torch.tensor(held, dtype=torch.int64)
            if not held:
                cached = (ids_G, torch.empty(0, self.hidden_size, 2 * self.ffn_size),
                          torch.empty(0, self.ffn_size, self.hidden_size))
            else:
                gate_up_GHI = torch.stack([weights[e][0].t() for e in held]).contiguous()
                down_GIH = torch.stack([weights[e][1].t() for e in held]).contiguous()
                for g, e in enumerate(held):
                    weights[e] = (gate_up_GHI[g].t(), down_GIH[g].t())
                cached = (ids_G, gate_up_GHI, down_GIH)
            self._stacks[layer] = cached
        return cached
