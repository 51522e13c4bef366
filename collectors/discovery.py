"""Find the routed-expert layers of an unmodified Hugging Face transformers (5.x) MoE model.

The standard family (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, OLMoE, GPT-OSS and every model whose experts
module's forward takes the routed ids second: `(hidden_states, top_k_index, top_k_weights)`,
`(hidden_states, router_indices, routing_weights)` or `(hidden_states, selected_experts, ...)`) is hooked
with a forward pre-hook on that experts module: it sees the exact int64 [tokens, k] ids the model
dispatches, whatever the router did (bias correction, group-limited routing).
Families that route elsewhere get small adapters:
    llama4   forward hook on the Llama4Router: the ids are topk of the logits it returns (the router's own op)
    jetmoe   forward hook on the MLP gating (JetMoeTopKGating): ids rebuilt from its sorted dispatch order
    doge     forward pre-hook on the product-key `down_embed`: its input is the [tokens, k] expert ids
    zaya     standard hook, but weight-0 "skip" slots (id == E) are masked
    longcat  standard hook, zero-compute experts (ids >= n_routed_experts) are masked
E is taken from the config, never from the module (LongCat's module holds its zero experts too).
"""
from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

_STANDARD_INDEX_PARAMS = ("top_k_index", "router_indices", "selected_experts")
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts")
_MASKED_FAMILIES = ("zaya", "longcat_flash")  # ZAYA's weight-0 skip slot, LongCat's zero-compute experts


@dataclass
class MoELayer:
    """One routed-expert layer: the module to hook, how, and the sizes from the config."""

    name: str              # module path of the hooked module, e.g. "model.layers.3.mlp.experts"
    module: torch.nn.Module
    kind: str              # "standard" | "llama4" | "jetmoe" | "doge"
    num_experts: int
    top_k: int
    mask_out_of_range: bool = False  # ids >= E or routing weight 0 are not counted
    index_param: str = "top_k_index"  # standard kind: name of the forward's ids parameter


def _first_int(config: Any, keys: Iterable[str]) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _text_config(model: torch.nn.Module) -> Any:
    """The model's (text) config: transformers' multimodal configs hold the language model's in a sub-config."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        return config.get_text_config()
    return config


def _standard_index_param(module: torch.nn.Module) -> str | None:
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return None
    if len(params) >= 2 and params[1] in _STANDARD_INDEX_PARAMS:
        return params[1]
    return None


def _kind_of(module: torch.nn.Module) -> str | None:
    cls = type(module).__name__
    if cls == "Llama4Router":
        return "llama4"
    if cls == "JetMoeTopKGating":
        return "jetmoe"
    if cls == "DogeCDMoE":
        return "doge"
    if _standard_index_param(module) is not None:
        return "standard"
    return None


def find_moe_layers(model: torch.nn.Module) -> list[MoELayer]:
    """Every routed-expert layer of model, in module (= model) order. Raises ValueError when none is found
    or when E / top-k cannot be read from the config."""
    model_config = _text_config(model)
    family = getattr(model_config, "model_type", "") or ""
    layers: list[MoELayer] = []
    for name, module in model.named_modules():
        kind = _kind_of(module)
        if kind is None:
            continue
        if kind == "jetmoe" and ".mlp." not in f".{name}.":
            continue  # JetMoE's attention experts (MoA) use the same gating class; we count the MLP experts
        config = getattr(module, "config", None) or model_config
        num_experts = _first_int(config, _EXPERT_KEYS) or _first_int(model_config, _EXPERT_KEYS)
        top_k = _first_int(config, _TOPK_KEYS) or _first_int(model_config, _TOPK_KEYS)
        if num_experts is None or top_k is None:
            raise ValueError(f"{name}: cannot read the number of experts / top-k from the model config")
        hook_target = module.get_submodule("down_embed") if kind == "doge" else module
        hook_name = f"{name}.down_embed" if kind == "doge" else name
        layers.append(MoELayer(hook_name, hook_target, kind, num_experts, top_k,
                               mask_out_of_range=family in _MASKED_FAMILIES,
                               index_param=_standard_index_param(module) or ""))
    if not layers:
        raise ValueError(
            f"no routed-expert layers found in {type(model).__name__}: expected a module whose forward takes "
            f"(hidden_states, top_k_index, top_k_weights); use collectors.ExpertLoadMonitor.record() instead")
    experts = {layer.num_experts for layer in layers}
    if len(experts) != 1:
        raise ValueError(f"MoE layers disagree on the number of experts: {sorted(experts)}")
    return layers


@dataclass(frozen=True)
class ModelSizes:
    """What the run metadata says of the model: its name, hidden size, expert FFN width, bytes per weight."""

    model_name: str
    hidden_size: int
    moe_intermediate_size: int
    dtype_bytes: int


def model_sizes(model: torch.nn.Module) -> ModelSizes:
    """The model's sizes from its config (0 where the config does not say), bytes per weight from its first
    parameter (2 for a model without parameters)."""
    config = _text_config(model)
    hidden = getattr(config, "hidden_size", 0) or 0
    inter = (getattr(config, "moe_intermediate_size", None) or getattr(config, "expert_ffn_hidden_size", None)
             or getattr(config, "intermediate_size", 0) or 0)
    try:
        dtype_bytes = next(model.parameters()).element_size()
    except StopIteration:
        dtype_bytes = 2
    name = getattr(config, "_name_or_path", "") or getattr(config, "model_type", "") or type(model).__name__
    return ModelSizes(model_name=str(name), hidden_size=int(hidden), moe_intermediate_size=int(inter),
                      dtype_bytes=int(dtype_bytes))
