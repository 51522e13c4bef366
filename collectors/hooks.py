"""Hook functions that turn a layer's routing into counter updates (per family), and what the step hooks
read from a top-level call (its shape, padding mask and phase).

Every per-layer hook only enqueues tensor ops on the model's device: no .item(), no .cpu(), no Python
branching on tensor values, so it is safe under torch.compile and CUDA graph capture.
Shape legend (README, Conventions): N tokens, K top-k; ids_NK are the int64 [N, K] ids a layer dispatches.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from .discovery import MoELayer

if TYPE_CHECKING:
    from .monitor import ExpertLoadMonitor


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], position: int, names: tuple[str, ...]) -> Any:
    if len(args) > position:
        return args[position]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def _standard(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    record_ids, param = monitor.counter.recorder(index), layer.index_param

    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = args[1] if len(args) > 1 else kwargs.get(param)
        if ids is None:
            return None
        if layer.mask_out_of_range:
            weights = _arg(args, kwargs, 2, ("top_k_weights", "routing_weights"))
            monitor._record_hooked(index, ids, weights, True)
            return None
        try:  # the hot path: the model's own int64 [N, K] ids, straight into the counter
            if ids.dtype != torch.int64 or ids.dim() != 2:
                ids = ids.reshape(-1, ids.shape[-1]).to(torch.int64)
            record_ids(ids)
        except Exception as exc:  # never break the model's forward
            monitor._hook_failed(index, exc)
        return None
    return pre_hook


def _llama4(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        # Llama4Router.forward returns (scores, logits) and dispatches to topk(logits, k, dim=1): the same op
        # on the same tensor gives the same ids.
        logits = output[1]
        ids = torch.topk(logits, module.top_k, dim=1).indices
        monitor._record_hooked(index, ids, None, False)
    return hook


def _jetmoe(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        # JetMoeTopKGating returns (index_sorted_experts, batch_index, batch_gates, expert_size, logits):
        # entry j of the dispatch order is flat slot index_sorted_experts[j] = token * k + slot, and the
        # first expert_size[0] entries go to expert 0, the next expert_size[1] to expert 1, ...
        order, _, _, expert_size, _ = output
        sizes = torch.as_tensor(expert_size, device=order.device)
        experts_sorted = torch.repeat_interleave(torch.arange(sizes.numel(), device=order.device), sizes,
                                                 output_size=order.numel())  # no device->host sync
        ids = torch.empty_like(order)
        ids[order] = experts_sorted
        monitor._record_hooked(index, ids.view(-1, module.top_k), None, False)
    return hook


def _doge(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        # DogeCDMoE looks up its product-key experts with down_embed(indices), indices [N, K].
        monitor._record_hooked(index, args[0], None, False)
        return None
    return pre_hook


def register_layer_hook(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> RemovableHandle:
    """Install the hook for one discovered layer; returns its removable handle."""
    if layer.kind == "standard":
        return layer.module.register_forward_pre_hook(_standard(monitor, index, layer), with_kwargs=True)
    if layer.kind == "llama4":
        return layer.module.register_forward_hook(_llama4(monitor, index, layer))
    if layer.kind == "jetmoe":
        return layer.module.register_forward_hook(_jetmoe(monitor, index, layer))
    if layer.kind == "doge":
        return layer.module.register_forward_pre_hook(_doge(monitor, index, layer))
    raise ValueError(f"unknown MoE layer kind {layer.kind!r}")


def step_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(batch, seq) of a top-level causal-LM call, from input_ids or inputs_embeds; None if neither."""
    ids = _arg(args, kwargs, 0, ("input_ids",))
    if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
        return int(ids.shape[0]), int(ids.shape[1])
    embeds = kwargs.get("inputs_embeds")
    if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        return int(embeds.shape[0]), int(embeds.shape[1])
    return None


def step_token_mask(kwargs: dict[str, Any], batch: int, seq: int,
                    skip_all_ones: bool = False) -> torch.Tensor | None:
    """token_mask_N: the int64 [N = batch*seq] mask of real tokens from a 2-D attention_mask (its last `seq` columns), or None.
    skip_all_ones: return None for a mask without padding (worth asking only where asking is free: the CPU)."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] < seq:
        return None
    mask = mask[:, -seq:]
    if skip_all_ones and bool(mask.all()):
        return None
    return mask.reshape(-1).to(torch.int64)


def step_phase(kwargs: dict[str, Any], seq: int) -> str:
    """prefill for a prompt (seq > 1 or no cache yet), decode for one new token on top of a cache."""
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    if seq == 1 and cache is not None:
        return "decode"
    return "prefill"
