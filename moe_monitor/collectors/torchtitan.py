"""attach(): count the routing of a torchtitan MoE model (torchtitan.models.common.moe.MoE) on the device.

    mon = attach(model_parts, redis_url=..., run="dsv3-train", optimizers=optimizers, parallel_dims=parallel_dims)
    ... train as usual: the optimizers' step post-hook closes each step (mon.end_step("train")) ...
    mon.close()

A forward pre-hook on each RoutedExperts counts topk_expert_ids_BLK (logical ids of this rank's tokens, before
any all-to-all) into the counter's device buffer; eval-mode forwards and activation-checkpoint recomputes are
not counted. Shapes: L MoE layers (this rank's), E experts, K top-k, B batch, S sequence. torchtitan is imported
inside the functions only. What is counted and why: docs/torchtitan.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .monitor import ExpertLoadMonitor
from .options import MonitorOptions

TRAIN_PHASE = "train"
_ROW, _SAMPLE = "_moe_monitor_counts_E1", "_moe_monitor_sample_NK"  # the counter's views a RoutedExperts carries
_PARALLEL_SIZES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")


@dataclass(frozen=True)
class TitanMoELayer:
    """One torchtitan MoE layer: name (its module path), moe (the MoE module), experts (its RoutedExperts, whose
    forward pre-hook counts), num_experts E and top_k K."""

    name: str
    moe: torch.nn.Module
    experts: torch.nn.Module
    num_experts: int
    top_k: int


def find_moe_layers(model_parts: Sequence[torch.nn.Module]) -> list[TitanMoELayer]:
    """Every torchtitan MoE module of the model parts, in model order (part by part). ValueError when there is
    none, or when their E or K differ (one monitor counts one [L, E] matrix of one top-k)."""
    from torchtitan.models.common.moe import MoE

    layers: list[TitanMoELayer] = []
    for part_index, part in enumerate(model_parts):
        for name, module in part.named_modules():
            if isinstance(module, MoE):
                router = module.router
                prefix = f"part{part_index}." if len(model_parts) > 1 else ""
                layers.append(TitanMoELayer(f"{prefix}{_clean(name)}", module, module.routed_experts,
                                            int(router.num_experts), int(router.top_k)))
    if not layers:
        raise ValueError("found no torchtitan MoE module (torchtitan.models.common.moe.MoE) in the model")
    shapes = {(layer.num_experts, layer.top_k) for layer in layers}
    if len(shapes) > 1:
        raise ValueError(f"MoE layers of different (experts, top_k): {sorted(shapes)}; one monitor counts one shape")
    return layers


def _clean(name: str) -> str:
    """The module path without the wrappers' names (activation checkpointing, torch.compile)."""
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name


def parallel_sizes(parallel_dims: Any) -> dict[str, int]:
    """The parallel sizes of a torchtitan ParallelDims (dp_replicate, dp_shard, cp, tp, pp, ep, etp: those it
    has), as ints; {} for None."""
    if parallel_dims is None:
        return {}
    return {name: int(getattr(parallel_dims, name)) for name in _PARALLEL_SIZES
            if isinstance(getattr(parallel_dims, name, None), int)}


def _in_recompute() -> bool:
    """Whether this forward runs inside the autograd engine (the recomputation of activation checkpointing).
    Under torch.compile the answer is False at trace time: a compiled backward recomputes inside its graph,
    where no module hook runs."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1


def _local_ids(ids: Any) -> torch.Tensor | None:
    """The ids this rank counts: a plain tensor as it is; a DTensor's local shard, or None when this rank's
    shard is a replica another rank counts (Replicate on a mesh dimension of size > 1 at coordinate > 0)."""
    if isinstance(ids, torch.Tensor) and hasattr(ids, "to_local") and hasattr(ids, "placements"):
        mesh = getattr(ids, "device_mesh")  # noqa: B009 (a DTensor's; torch.Tensor's stubs lack it)
        coordinate = mesh.get_coordinate()
        for dim, placement in enumerate(ids.placements):
            if placement.is_replicate() and mesh.size(dim) > 1 and coordinate is not None and coordinate[dim] != 0:
                return None
        return ids.to_local()
    return ids


class TorchtitanMonitor(ExpertLoadMonitor):
    """An ExpertLoadMonitor wired to a torchtitan model by hooks (module docstring). layers: the TitanMoELayers
    counted (monitor layer i = layers[i]); parallel: the run's parallel sizes (parallel_sizes()). end_step()
    closes a training step (phase "train" unless told otherwise); close() also removes every hook."""

    def __init__(self, model_parts: Sequence[torch.nn.Module], *, redis_url: str | None = None,
                 run: str | None = None, optimizers: Any = None, parallel_dims: Any = None,
                 model_name: str = "torchtitan", options: MonitorOptions | None = None, **overrides: Any):
        layers = find_moe_layers(model_parts)
        first = layers[0]
        inner = getattr(first.experts, "inner_experts", None)
        w1 = getattr(inner, "w1_EFD", None)
        device = _param_device(model_parts)
        hidden, intermediate = (int(w1.shape[2]), int(w1.shape[1])) if isinstance(w1, torch.Tensor) else (0, 0)
        self.parallel = parallel_sizes(parallel_dims)
        super().__init__(len(layers), first.num_experts, first.top_k, device=device, redis_url=redis_url, run=run,
                         layer_names=[layer.name for layer in layers], model_name=model_name, hidden_size=hidden,
                         moe_intermediate_size=intermediate, dtype_bytes=2, options=options,
                         extra={"framework": "torchtitan", "parallel": dict(self.parallel)}, **overrides)
        self.layers = layers
        self._step_tokens = 0
        self._handles: list[RemovableHandle] = []
        self._layer_index = {id(layer.experts): index for index, layer in enumerate(layers)}
        try:
            hook = self._shared_hook()
            for index, layer in enumerate(layers):
                setattr(layer.experts, _ROW, self.counter.counts_LE1[index])
                setattr(layer.experts, _SAMPLE, self.counter.sample_LNK[index])
                self._handles.append(layer.experts.register_forward_pre_hook(hook, with_kwargs=True))
            # the step's tokens from the first part only: a micro-batch passes every part of a pipeline rank
            self._handles.append(model_parts[0].register_forward_pre_hook(self._on_forward, with_kwargs=True))
            if optimizers is not None:
                self._handles.append(optimizers.register_step_post_hook(self._on_optimizer_step))
        except Exception:
            self.close(timeout_s=0.0)
            raise

    def _shared_hook(self) -> Any:
        """The forward pre-hook of every RoutedExperts (one function for all layers: a compiled block's guards
        then do not differ from layer to layer, so torchtitan's per-block torch.compile(fullgraph=True) compiles
        once, not once per layer). It counts topk_expert_ids_BLK (int [B, S, K]) into the layer's row of the
        counter, which the module carries as tensor attributes (_ROW: int32 [E + 1], _SAMPLE: int32 [N, K]), in
        training mode and outside recomputation: a clamp and a put_ (accumulate), plus the copy of the sampled
        rows; no host sync. Never raises into the forward."""
        counter, top_k, num_experts, monitor = self.counter, self.top_k, self.num_experts, self
        sample, device = counter.sample_tokens, counter.device

        def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not module.training or _in_recompute():
                return None
            try:
                ids = args[2] if len(args) > 2 else kwargs.get("topk_expert_ids_BLK")
                if not isinstance(ids, torch.Tensor) or ids.dim() < 1 or ids.is_floating_point():
                    raise ValueError(f"RoutedExperts got no integer topk_expert_ids_BLK: {type(ids).__name__}")
                local = _local_ids(ids)
                if local is None or local.numel() == 0:
                    return None
                ids_TK = local.reshape(-1, local.shape[-1] if local.dim() > 1 else 1)
                if ids_TK.device != device:
                    ids_TK = ids_TK.to(device, non_blocking=True)
                if ids_TK.shape[1] != top_k:  # a width the monitor was not made for: exact, rows not sampled
                    index = monitor._layer_index[id(module)]
                    monitor._count(index, ids_TK, torch.ones_like(ids_TK, dtype=torch.bool), False, True)
                    return None
                clamped_TK = ids_TK.to(torch.int64).clamp(-1, num_experts)  # -1 wraps to column E: invalid
                n = clamped_TK.numel()
                src = counter.src_buf
                if src.shape[0] < n:
                    src = counter.ones(n)
                getattr(module, _ROW).put_(clamped_TK, src[:n], accumulate=True)
                if sample:
                    rows = counter._sampled(clamped_TK)
                    sample_NK = getattr(module, _SAMPLE)
                    (sample_NK if rows.shape[0] == sample_NK.shape[0] else sample_NK[: rows.shape[0]]).copy_(rows)
            except Exception as exc:  # never break the training step
                monitor._hook_failed(monitor._layer_index.get(id(module), -1), exc)
            return None
        return pre_hook

    @torch.compiler.disable
    def _on_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A model part's forward pre-hook: T = B*S of its input (token ids [B, S] or hidden states [B, S, D]) is
        added to the step's tokens; the first forward of a step begins it (the counter's sampled rows and
        per-slot weights). Host only; never raises."""
        if not module.training or _in_recompute():
            return None
        try:
            inputs = args[0] if args else kwargs.get("tokens", kwargs.get("h"))
            if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2:
                tokens = int(inputs.shape[0]) * int(inputs.shape[1])
                if not self._step_open:
                    self.begin_step(tokens)
                self._step_tokens += tokens
        except Exception as exc:
            self._note_failure(f"step start: {type(exc).__name__}: {exc}")
        return None

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizers' step post-hook: one training iteration is over."""
        try:
            self.end_step()
        except Exception as exc:
            self._note_failure(f"step end: {type(exc).__name__}: {exc}")

    def end_step(self, phase: str | None = TRAIN_PHASE, tokens: int | None = None) -> int:
        """Close the step (default phase "train"; tokens default: those of this rank's forwards since the last
        step). Returns the step's id."""
        tokens = self._step_tokens if tokens is None and self._step_tokens else tokens
        self._step_tokens = 0
        return super().end_step(phase, tokens)

    def close(self, timeout_s: float = 5.0) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for layer in getattr(self, "layers", []):
            for name in (_ROW, _SAMPLE):
                if hasattr(layer.experts, name):
                    delattr(layer.experts, name)
        super().close(timeout_s)


def _param_device(model_parts: Sequence[torch.nn.Module]) -> torch.device:
    for part in model_parts:
        for param in part.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            return local.device
    return torch.device("cpu")


def attach(model: torch.nn.Module | Sequence[torch.nn.Module], redis_url: str | None = None, run: str | None = None,
           *, optimizers: Any = None, parallel_dims: Any = None, options: MonitorOptions | None = None,
           **overrides: Any) -> TorchtitanMonitor:
    """Hook every MoE layer of a torchtitan model (one nn.Module, or the list of model parts of a pipeline
    rank) and start counting. optimizers: torchtitan's OptimizersContainer (or any torch optimizer): each of
    its steps closes a monitor step (phase "train"); without it, call monitor.end_step() once per training
    iteration. parallel_dims: torchtitan's ParallelDims (its sizes are kept in monitor.parallel). redis_url None:
    counts in memory only. options / overrides: MonitorOptions fields, as collectors.attach takes them.
    Attach after parallelize (FSDP, EP, activation checkpointing, compile) or before: the hooks sit on the
    MoE modules themselves."""
    parts = [model] if isinstance(model, torch.nn.Module) else list(model)
    return TorchtitanMonitor(parts, redis_url=redis_url, run=run, optimizers=optimizers,
                             parallel_dims=parallel_dims, options=options, **overrides)
