"""Find the routed-expert layers of an unmodified Hugging Face transformers (5.x) MoE model.

The standard family (Mixtral, Qwen-MoE, DeepSeek-V2/V3, OLMoE, GPT-OSS, ...: an experts module whose forward
takes the routed ids second) is hooked with a forward pre-hook on the experts module: the exact int64
[tokens, k] ids the model dispatches. Adapters for families that route elsewhere: llama4 (router), jetmoe
(gating), doge (product keys), switch (one-hot dispatch mask), zaya and longcat (masked skip / zero-compute ids).
E and top-k per layer: the layer's (text) config and the configs nested in it, then the experts module's own
weights and attributes; top-k left None is read from the ids at the first call. E is never taken from the ids.
Used by collectors.hf.attach; the lookup order in full: docs/collectors.md.
"""
from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

_STANDARD_INDEX_PARAMS = ("top_k_index", "router_indices", "selected_experts")
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts", "num_routed_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k", "moe_top_k",
              "top_k_experts", "num_experts_per_token", "experts_per_token", "moe_router_topk")
_ROUTER_TOPK_ATTRS = ("top_k", "num_experts_per_tok", "topk", "moe_k", "moe_top_k", "top_k_experts",
                      "num_experts_per_token", "n_activated_experts")
_MODULE_EXPERT_ATTRS = ("num_experts", "num_local_experts", "n_routed_experts", "num_routed_experts",
                        "moe_num_experts")
# Sub-configs searched first, in this order, then any other attribute that is a config (breadth first).
_TEXT_SUBCONFIGS = ("text_config", "language_config", "llm_config", "thinker_config", "decoder_config",
                    "ffn_config", "moe_config")
_MASKED_FAMILIES = ("zaya", "longcat_flash")  # ZAYA's weight-0 skip slot, LongCat's zero-compute experts


@dataclass
class MoELayer:
    """One routed-expert layer: the module to hook, how, and its sizes (see the module docstring)."""

    name: str              # module path of the hooked module, e.g. "model.layers.3.mlp.experts"
    module: torch.nn.Module
    kind: str              # "standard" | "llama4" | "jetmoe" | "doge" | "switch"
    num_experts: int
    top_k: int | None      # None: nobody says; read from the width of the ids at the first call
    mask_out_of_range: bool = False  # ids >= E or routing weight 0 are not counted
    index_param: str = "top_k_index"  # standard kind: name of the forward's ids parameter
    num_experts_from: str = "config"  # where E came from: "config" | "weights" | "module"
    top_k_from: str = "config"        # where k came from: "config" | "router" | "family" | "ids"


def _get(obj: Any, key: str) -> Any:
    """getattr that never raises: transformers' heterogeneous configs raise a RuntimeError for a per-layer
    attribute read globally, and a property may raise anything."""
    try:
        return getattr(obj, key, None)
    except Exception:
        return None


def _first_int(obj: Any, keys: Iterable[str]) -> int | None:
    for key in keys:
        value = _get(obj, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _is_config(obj: Any) -> bool:
    from transformers import PretrainedConfig
    return isinstance(obj, PretrainedConfig)


def _nested_configs(config: Any, max_depth: int = 4, text_only: bool = False) -> Iterator[Any]:
    """config, then every config nested in it, breadth first: the names in _TEXT_SUBCONFIGS first, then
    (unless text_only) any other attribute that is a PretrainedConfig. Each config once."""
    seen: set[int] = set()
    queue: deque[tuple[Any, int]] = deque([(config, 0)])
    while queue:
        cfg, depth = queue.popleft()
        if id(cfg) in seen:
            continue
        seen.add(id(cfg))
        yield cfg
        if depth >= max_depth:
            continue
        try:
            names = list(vars(cfg))
        except TypeError:
            names = []
        ordered = [n for n in _TEXT_SUBCONFIGS if n in names]
        if not text_only:
            ordered += [n for n in names if n not in _TEXT_SUBCONFIGS]
        for name in ordered:
            sub = _get(cfg, name)
            if _is_config(sub) and id(sub) not in seen:
                queue.append((sub, depth + 1))


def _text_config(model: torch.nn.Module) -> Any:
    """The model's (text) config: transformers' multimodal configs hold the language model's in a sub-config."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        try:
            return config.get_text_config(decoder=True)
        except Exception:  # a config whose text part is ambiguous: the config itself
            return config
    return config


def _owner(name: str, modules: dict[str, torch.nn.Module]) -> Any:
    """The config of the nearest module at or above `name` that holds a transformers config (the model the
    layer belongs to); None when none does."""
    parts = name.split(".") if name else []
    for cut in range(len(parts), -1, -1):
        config = _get(modules.get(".".join(parts[:cut])), "config")
        if _is_config(config):
            return config
    return None


def _configs_for(owner_config: Any, model: torch.nn.Module) -> list[Any]:
    """The configs to read a layer's E / top-k from, in order (module docstring, step 1): the layer's own
    model's config and every config in it, then the text config and every config in it, then the top
    config and its text-like sub-configs only (never, say, a vision encoder's: its experts are not these)."""
    roots = [(owner_config, False), (_text_config(model), False), (getattr(model, "config", None), True)]
    found: list[Any] = []
    for root, text_only in roots:
        if root is None:
            continue
        for cfg in _nested_configs(root, text_only=text_only):
            if all(cfg is not f for f in found):
                found.append(cfg)
    return found


def experts_from_weights(experts: torch.nn.Module) -> int | None:
    """E from the experts module's own weights: the length of a ModuleList / ModuleDict of per-expert modules
    (the module itself or its one container child), else the smallest leading dim of its stacked parameters
    (gate_up_proj [E, 2I, H], down_proj [E, H, I], quantized blocks [E, ...]: any parameter or buffer of 3 or
    more dims). None when neither exists (DBRX's flat [E * F, H] weights, 2-D packed quantized weights)."""
    containers = [experts] if isinstance(experts, (torch.nn.ModuleList, torch.nn.ModuleDict)) else [
        child for child in experts.children() if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict))]
    if len(containers) == 1 and len(containers[0]) > 1:
        return len(containers[0])
    leading = [t.shape[0] for t in list(experts.parameters()) + list(experts.buffers()) if t.dim() >= 3]
    return min(leading) if leading and min(leading) > 0 else None


def _block_and_siblings(name: str, modules: dict[str, torch.nn.Module]) -> list[torch.nn.Module]:
    """The MoE block holding the layer's module and the block's direct children (its router / gate)."""
    if "." not in name:
        return []
    block = modules.get(name.rsplit(".", 1)[0])
    return [block, *block.children()] if block is not None else []


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
    if cls == "SwitchTransformersExperts":
        return "switch"
    if _standard_index_param(module) is not None:
        return "standard"
    return None


def _sizes(name: str, module: torch.nn.Module, kind: str, configs: list[Any],
           modules: dict[str, torch.nn.Module]) -> tuple[int | None, str, int | None, str]:
    """(E, where from, top-k, where from) of one layer (module docstring)."""
    num_experts, e_from = None, "config"
    for cfg in configs:
        num_experts = _first_int(cfg, _EXPERT_KEYS)
        if num_experts is not None:
            break
    if num_experts is None and kind not in ("llama4", "jetmoe", "doge"):  # adapters' modules are no experts
        num_experts, e_from = experts_from_weights(module), "weights"
    if num_experts is None:
        num_experts, e_from = _first_int(module, _MODULE_EXPERT_ATTRS), "module"
    if kind == "switch":  # Top1Router: the dispatch mask holds one slot per token
        return num_experts, e_from, 1, "family"
    top_k, k_from = None, "config"
    for cfg in configs:
        top_k = _first_int(cfg, _TOPK_KEYS)
        if top_k is not None:
            break
    if top_k is None:
        k_from = "router"
        for candidate in [module, *_block_and_siblings(name, modules)]:
            top_k = _first_int(candidate, _ROUTER_TOPK_ATTRS)
            if top_k is not None:
                break
    if top_k is None:
        k_from = "ids"
    return num_experts, e_from, top_k, k_from


def find_moe_layers(model: torch.nn.Module) -> list[MoELayer]:
    """Every routed-expert layer of model, in module (= model) order, with its E and top-k (module docstring;
    top_k None: read from the ids at the first call). Raises ValueError when none is found, when a layer's E
    can be read neither from a config nor from its weights, or when the counted layers disagree on E."""
    family = _get(_text_config(model), "model_type") or ""
    modules = dict(model.named_modules())
    found: list[tuple[MoELayer, Any]] = []  # (layer, the config of the model it belongs to)
    for name, module in modules.items():
        kind = _kind_of(module)
        if kind is None:
            continue
        if kind == "jetmoe" and ".mlp." not in f".{name}.":
            continue  # JetMoE's attention experts (MoA) use the same gating class; we count the MLP experts
        own = _get(module, "config")
        owner_config = own if _is_config(own) else _owner(name, modules)
        configs = _configs_for(owner_config, model)
        num_experts, e_from, top_k, k_from = _sizes(name, module, kind, configs, modules)
        if num_experts is None:
            raise ValueError(f"{name}: cannot read the number of experts: no config of the model names it "
                             f"(looked for {', '.join(_EXPERT_KEYS)}) and {type(module).__name__} has neither "
                             f"stacked [E, ...] weights nor a list of experts")
        hook_target = module.get_submodule("down_embed") if kind == "doge" else module
        hook_name = f"{name}.down_embed" if kind == "doge" else name
        layer = MoELayer(hook_name, hook_target, kind, num_experts, top_k,
                         mask_out_of_range=family in _MASKED_FAMILIES,
                         index_param=_standard_index_param(module) or "", num_experts_from=e_from,
                         top_k_from=k_from)
        found.append((layer, owner_config))
    if not found:
        raise ValueError(
            f"no routed-expert layers found in {type(model).__name__}: expected a module whose forward takes "
            f"(hidden_states, top_k_index, top_k_weights); use collectors.ExpertLoadMonitor.record() instead")
    layers = _text_model_layers(model, found)
    experts = {layer.num_experts for layer in layers}
    if len(experts) != 1:
        raise ValueError(f"MoE layers disagree on the number of experts: {sorted(experts)}")
    return layers


def _text_model_layers(model: torch.nn.Module, found: list[tuple[MoELayer, Any]]) -> list[MoELayer]:
    """The layers to count: those whose model's config is of the text config's class (the text model, its
    encoder and decoder stacks, per-layer variants), when there are any; else all of them. A vision
    encoder's or a speech talker's experts (configs of other classes) are left out."""
    text = _text_config(model)
    ours = [layer for layer, config in found if text is not None and type(config) is type(text)]
    return ours or [layer for layer, _ in found]


@dataclass(frozen=True)
class ModelSizes:
    """What the run metadata says of the model: its name, hidden size, expert FFN width, bytes per weight."""

    model_name: str
    hidden_size: int
    moe_intermediate_size: int
    dtype_bytes: int


def _size(config: Any, *keys: str) -> int:
    for key in keys:
        value = _get(config, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], int):  # Ernie-VL: [text, vision]
            return int(value[0])
    return 0


def model_sizes(model: torch.nn.Module) -> ModelSizes:
    """The model's sizes from its (text) config (0 where no config says), bytes per weight from its first
    parameter (2 for a model without parameters)."""
    config = _text_config(model)
    hidden = _size(config, "hidden_size", "d_model")
    inter = 0
    for cfg in _nested_configs(config) if config is not None else ():
        inter = _size(cfg, "moe_intermediate_size", "expert_ffn_hidden_size", "ffn_hidden_size")
        if inter:
            break
    inter = inter or _size(config, "intermediate_size")
    try:
        dtype_bytes = next(model.parameters()).element_size()
    except StopIteration:
        dtype_bytes = 2
    name = _get(config, "_name_or_path") or _get(config, "model_type") or type(model).__name__
    return ModelSizes(model_name=str(name), hidden_size=int(hidden), moe_intermediate_size=int(inter),
                      dtype_bytes=int(dtype_bytes))
