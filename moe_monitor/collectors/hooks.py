"""Hook functions that turn a layer's routing into counter updates (per family), and what the step hooks read
from a top-level call (its shape, padding mask and phase).

Per-layer hooks only enqueue tensor ops on the model's device (no .item(), no .cpu(), no branching on tensor
values): safe under torch.compile and CUDA graph capture. A hook never raises into the forward: a failure is
counted and reported by the monitor (stats() hook_errors / last_error) and that layer's call is not counted.
ids_NK: the int64 [N, K] ids a layer dispatches (N tokens, K top-k). A layer whose ids are not K wide is still
counted exactly, through the validity-mask path; only its sampled rows are not kept.
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


def _counting(monitor: ExpertLoadMonitor, index: int) -> Callable[[torch.Tensor], None]:
    """count(ids) for one layer: ids int [..., K'] expert ids. K' == the monitor's K: the counter's hot path
    (two device ops); any other width: the validity-mask path (a few more ops, the same counts)."""
    record_ids, top_k = monitor.counter.recorder(index), monitor.top_k

    def count(ids: torch.Tensor) -> None:
        if ids.dtype != torch.int64 or ids.dim() != 2:
            ids = ids.reshape(-1, ids.shape[-1]).to(torch.int64)
        if ids.shape[1] == top_k:
            record_ids(ids)
        else:
            monitor._count(index, ids, torch.ones_like(ids, dtype=torch.bool), False, True)
    return count


def _standard(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    count, param, masked_family = _counting(monitor, index), layer.index_param, layer.mask_out_of_range

    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            ids = args[1] if len(args) > 1 else kwargs.get(param)
            if ids is None:
                return None
            if masked_family:  # ids >= E are zero-compute experts / weight-0 skip slots: not counted at all
                weights = _arg(args, kwargs, 2, ("top_k_weights", "routing_weights"))
                monitor._count(index, ids, weights, True, True)
                return None
            count(ids)  # the hot path: the model's own int64 [N, K] ids, straight into the counter
        except Exception as exc:  # never break the model's forward
            monitor._hook_failed(index, exc)
        return None
    return pre_hook


def _switch(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    num_experts, param = monitor.num_experts, layer.index_param

    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # SwitchTransformersExperts(hidden_states, selected_experts, routing_weights): selected_experts is the
        # router's one-hot dispatch mask [N, 1, E]; a token dropped by expert capacity has no 1 and is
        # computed by no expert. ids [N, 1] = its argmax, counted where the mask holds a 1.
        try:
            mask = args[1] if len(args) > 1 else kwargs.get(param)
            if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or mask.shape[-1] != num_experts:
                raise ValueError(f"selected_experts is not a dispatch mask [tokens, k, {num_experts}]: "
                                 f"{_describe(mask)}")
            mask_NKE = mask.reshape(-1, 1, num_experts) if mask.dim() == 2 else mask.reshape(
                -1, mask.shape[-2], num_experts)
            hit_NK, ids_NK = mask_NKE.max(dim=-1)
            monitor._count(index, ids_NK, hit_NK, False, True)
        except Exception as exc:  # never break the model's forward
            monitor._hook_failed(index, exc)
        return None
    return pre_hook


def _llama4(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    num_experts, count = monitor.num_experts, _counting(monitor, index)

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        # Llama4Router.forward returns (scores, logits [N, E]) and dispatches to topk(logits, k, dim=1): the
        # same op on the same tensor gives the same ids. Any other shape is reported, not guessed at.
        try:
            logits = output[1] if isinstance(output, (tuple, list)) and len(output) == 2 else None
            if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != num_experts:
                raise ValueError(f"router output is not (scores, logits [tokens, {num_experts}]): "
                                 f"{_describe(output)}")
            count(torch.topk(logits, module.top_k, dim=1).indices)
        except Exception as exc:  # never break the model's forward
            monitor._hook_failed(index, exc)
    return hook


def _jetmoe(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    num_experts, count = monitor.num_experts, _counting(monitor, index)

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        # JetMoeTopKGating returns (index_sorted_experts, batch_index, batch_gates, expert_size, logits):
        # entry j of the dispatch order is flat slot index_sorted_experts[j] = token * k + slot, and the
        # first expert_size[0] entries go to expert 0, the next expert_size[1] to expert 1, ... Every slot of
        # every token is dispatched (logits [N, E]: N * k entries); anything else is reported, not guessed at.
        try:
            if not isinstance(output, (tuple, list)) or len(output) != 5:
                raise ValueError(f"gating output is not the 5-tuple of JetMoeTopKGating: {_describe(output)}")
            order, _, _, expert_size, logits = output
            top_k = module.top_k
            if (not isinstance(order, torch.Tensor) or order.dim() != 1 or not isinstance(logits, torch.Tensor)
                    or logits.dim() != 2 or order.numel() != logits.shape[0] * top_k):
                raise ValueError(f"gating dispatch order does not hold top_k={top_k} slots of every token: "
                                 f"{_describe(output)}")
            if len(expert_size) != num_experts or (
                    isinstance(expert_size, (list, tuple)) and sum(expert_size) != order.numel()):
                raise ValueError(f"gating expert sizes do not match {num_experts} experts and "
                                 f"{order.numel()} dispatched slots")
            sizes = torch.as_tensor(expert_size, device=order.device)
            experts_sorted = torch.repeat_interleave(torch.arange(sizes.numel(), device=order.device), sizes,
                                                     output_size=order.numel())  # no device->host sync
            ids = torch.empty_like(order)
            ids[order] = experts_sorted
            count(ids.view(-1, top_k))
        except Exception as exc:  # never break the model's forward
            monitor._hook_failed(index, exc)
    return hook


def _doge(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    count = _counting(monitor, index)

    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # DogeCDMoE looks up its product-key experts with down_embed(indices), indices [N, K].
        try:
            ids = _arg(args, kwargs, 0, ("input",))
            if not isinstance(ids, torch.Tensor) or ids.dim() < 1 or ids.is_floating_point():
                raise ValueError(f"down_embed input is not integer expert ids [tokens, k]: {_describe(ids)}")
            count(ids if ids.dim() > 1 else ids.unsqueeze(1))
        except Exception as exc:  # never break the model's forward
            monitor._hook_failed(index, exc)
        return None
    return pre_hook


def _describe(value: Any) -> str:
    """A short description of what a hook got instead (types and shapes, never values)."""
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v) for v in value[:6])
        return f"{type(value).__name__} of {len(value)} ({inner}{', ...' if len(value) > 6 else ''})"
    return type(value).__name__


_FACTORIES: dict[str, tuple[Callable[[ExpertLoadMonitor, int, MoELayer], Callable[..., None]], bool]] = {
    # kind: (hook factory, whether it is a forward pre-hook with kwargs; else a forward hook)
    "standard": (_standard, True),
    "switch": (_switch, True),
    "doge": (_doge, True),
    "llama4": (_llama4, False),
    "jetmoe": (_jetmoe, False),
}


def layer_hook(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> Callable[..., None]:
    """The hook function of one discovered layer (its family's adapter), bound to the monitor's counter."""
    if layer.kind not in _FACTORIES:
        raise ValueError(f"unknown MoE layer kind {layer.kind!r}")
    return _FACTORIES[layer.kind][0](monitor, index, layer)


def is_pre_hook(layer: MoELayer) -> bool:
    """Whether the layer's hook is a forward pre-hook (with kwargs) rather than a forward hook."""
    if layer.kind not in _FACTORIES:
        raise ValueError(f"unknown MoE layer kind {layer.kind!r}")
    return _FACTORIES[layer.kind][1]


def install(layer: MoELayer, hook: Callable[..., None]) -> RemovableHandle:
    """Register hook on the layer's module, as a pre-hook or a forward hook as its kind needs."""
    if is_pre_hook(layer):
        return layer.module.register_forward_pre_hook(hook, with_kwargs=True)
    return layer.module.register_forward_hook(hook)


def register_layer_hook(monitor: ExpertLoadMonitor, index: int, layer: MoELayer) -> RemovableHandle:
    """Install the hook for one discovered layer; returns its removable handle."""
    return install(layer, layer_hook(monitor, index, layer))


def routed_width(layer: MoELayer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """K, the number of experts each token is routed to, read from what a pre-hooked layer receives (only its
    shape: no device op, no sync): the width of the [..., K] ids (standard, doge), the k of Switch's
    [N, k, E] dispatch mask. None when the call carries no ids (the layer learns it at a later call)."""
    if layer.kind == "doge":
        ids = _arg(args, kwargs, 0, ("input",))
    elif layer.kind in ("standard", "switch"):
        ids = args[1] if len(args) > 1 else kwargs.get(layer.index_param)
    else:
        return None
    if not isinstance(ids, torch.Tensor) or ids.dim() < 1:
        return None
    if layer.kind == "switch":
        return int(ids.shape[-2]) if ids.dim() >= 3 else 1
    width = int(ids.shape[-1]) if ids.dim() >= 2 else 1
    return width if width >= 1 else None


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
