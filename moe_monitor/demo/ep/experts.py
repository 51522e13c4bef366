"""The EP path inside a transformers DeepSeek-V3: each MoE layer's `experts` module is replaced by EPExperts
and the layer (`mlp`, router + experts + shared experts) is wrapped by TimedMoE.

DeepseekV3MoE.forward calls its router (`self.gate(h)` -> logits, top-k weights, top-k ids: group-limited
top-8 on sigmoid scores + e_score_correction_bias), then `self.experts(h [N, H], top_k_index [N, K],
top_k_weights [N, K])`, then adds `self.shared_experts(h)`. So the router and the shared expert run locally,
unchanged, and only the routed experts go through dispatch -> this rank's expert FFNs -> combine.

Shape legend (README, Conventions): N this rank's tokens, K top-k, H hidden size.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from moe_monitor.collectors import ExpertLoadMonitor

from .dispatch import combine, dispatch
from .placement import Placement
from .store import ExpertStore


class _NoTimer:
    """Stands in for a LayerTimer when timing is off: the phases cost one attribute lookup."""

    _null = contextlib.nullcontext()

    def dispatch(self) -> contextlib.nullcontext:
        return self._null

    compute = combine = dispatch


@dataclass
class EPState:
    """What every EP layer of a rank shares: the placement and weights in force, the monitor, whether the
    layers are timed, and the timer of the layer running now."""

    placement: Placement
    store: ExpertStore
    monitor: ExpertLoadMonitor
    ranks: int
    timing: bool = True
    grouped: bool = False
    serial_compute: bool = False
    current: Any = field(default_factory=_NoTimer)


class EPExperts(nn.Module):
    """Routed experts of one MoE layer over the EP group: same call as transformers' experts module."""

    def __init__(self, layer: int, state: EPState):
        super().__init__()
        self.layer, self.state = layer, state

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        state, layer = self.state, self.layer
        state.monitor.record(layer, top_k_index)  # the router's own ids: counts per expert, on this rank
        timer = state.current
        with timer.dispatch():
            dst_M = state.placement.destinations(layer, top_k_index)
            sent = dispatch(hidden_states, top_k_index, dst_M, state.ranks)
        if state.serial_compute:  # ranks take turns: each one's expert compute timed with the machine to itself
            for turn in range(state.ranks):
                if turn == dist.get_rank():
                    y_RH = self._compute(sent, timer)
                dist.barrier()
        else:
            y_RH = self._compute(sent, timer)
        with timer.combine():
            return combine(y_RH, sent, top_k_index, top_k_weights)

    def _compute(self, sent, timer) -> torch.Tensor:
        state, layer = self.state, self.layer
        with timer.compute():
            if state.grouped:
                return state.store.compute_grouped(layer, sent.x_RH, sent.experts_R)
            return state.store.compute(layer, sent.x_RH, sent.experts_R, sent.kpos_R, sent.src_R)


class TimedMoE(nn.Module):
    """Wraps one MoE layer (router + experts + shared experts) in monitor.time_layer(layer) when timing is on."""

    def __init__(self, inner: nn.Module, layer: int, state: EPState):
        super().__init__()
        self.inner, self.layer, self.state = inner, layer, state

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        state = self.state
        if not state.timing:
            return self.inner(hidden_states)
        with state.monitor.time_layer(self.layer) as timer:
            state.current = timer
            try:
                return self.inner(hidden_states)
            finally:
                state.current = _NoTimer()


def moe_blocks(model) -> list[nn.Module]:
    """The MoE blocks (`mlp` with a router `gate` and `experts`) of a transformers DeepSeek-V3, in order."""
    return [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")]


def install(model, state: EPState) -> int:
    """Replace every MoE block's experts by EPExperts (dropping the full expert weights: the store holds this
    rank's) and wrap the block in TimedMoE. Returns the number of MoE layers."""
    index = 0
    for decoder_layer in model.model.layers:
        block = decoder_layer.mlp
        if not (hasattr(block, "gate") and hasattr(block, "experts")):
            continue
        block.experts = EPExperts(index, state)
        decoder_layer.mlp = TimedMoE(block, index, state)
        index += 1
    return index
