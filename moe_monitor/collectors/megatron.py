"""attach_megatron(model): count a Megatron-Core MoE model's routing, one step per training iteration.

    monitor = attach_megatron(model, redis_url="redis://...", run="moe-pretrain")   # after initialize_model_parallel
    with monitor.iteration():                    # or: train_step(...); monitor.end_step()
        train_step(...)                          # every micro-batch's forward + backward, optimizer step

A forward hook on each Router turns its bool routing map [N, E] into [N, K] ids and a validity mask, added into
the counter's device buffers (no host sync); a router forward inside backward (recomputation) is not counted.
A map with more than K experts in a row is counted whole and said; one that is not a bool [N, E] map is not
counted and said (stats()["hook_errors"], the published health); routers sharing a layer_number get a row each.
Rows are Megatron's global MoE layer numbers, then MTP layers; each process publishes as its global rank.
Shapes: L MoE layers, E experts, K top-k, N tokens of one forward. What is counted and why: docs/megatron.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .monitor import ExpertLoadMonitor
from .options import MonitorOptions


@dataclasses.dataclass(frozen=True)
class RouterSite:
    """One router found in the model: its module path, its Megatron layer number (1-based, global) and module.
    shared: its own layer_number was another router's too (then every router is numbered by its order)."""

    name: str
    layer_number: int
    module: torch.nn.Module
    shared: bool = False


@dataclasses.dataclass(frozen=True)
class ParallelSizes:
    """parallel_state's sizes (tp, pp, ep, dp, cp, etp: expert tensor parallel, edp: expert data parallel) and this
    rank's indices; all 1 and 0 when parallel_state is not initialised."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    cp: int = 1
    etp: int = 1
    edp: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    ep_rank: int = 0
    dp_rank: int = 0

    def describe(self) -> str:
        return f"tp{self.tp} pp{self.pp} ep{self.ep} dp{self.dp} cp{self.cp}"


def parallel_sizes() -> ParallelSizes:
    """The run's parallel sizes from megatron.core.parallel_state (defaults when it is not initialised)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return ParallelSizes()

    def get(name: str, default: int) -> int:
        fn = getattr(ps, name, None)
        try:
            return int(fn()) if fn is not None else default
        except (AssertionError, RuntimeError, TypeError, AttributeError):
            return default

    return ParallelSizes(
        tp=get("get_tensor_model_parallel_world_size", 1), pp=get("get_pipeline_model_parallel_world_size", 1),
        ep=get("get_expert_model_parallel_world_size", 1), dp=get("get_data_parallel_world_size", 1),
        cp=get("get_context_parallel_world_size", 1), etp=get("get_expert_tensor_parallel_world_size", 1),
        edp=get("get_expert_data_parallel_world_size", 1), tp_rank=get("get_tensor_model_parallel_rank", 0),
        pp_rank=get("get_pipeline_model_parallel_rank", 0), ep_rank=get("get_expert_model_parallel_rank", 0),
        dp_rank=get("get_data_parallel_rank", 0))


def find_routers(chunks: Sequence[torch.nn.Module]) -> list[RouterSite]:
    """Every Megatron router (megatron.core.transformer.moe.router.Router) in the model chunks, in layer order.
    A router without a layer number (a bare MoELayer) is numbered by its order, and so is every router when two
    share a number (marked shared). ValueError when there is none."""
    from megatron.core.transformer.moe.router import Router

    sites: list[tuple[str, int | None, torch.nn.Module]] = []
    for c, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            if isinstance(module, Router):
                number = getattr(module, "layer_number", None)
                sites.append((name if len(chunks) == 1 else f"chunk{c}.{name}",
                              int(number) if isinstance(number, int) else None, module))
    if not sites:
        raise ValueError("found no Megatron-Core MoE router (megatron.core.transformer.moe.router.Router) in the "
                         "model: is it built with num_moe_experts set?")
    if any(number is None for _, number, _ in sites):
        return [RouterSite(name, i + 1, module) for i, (name, _, module) in enumerate(sites)]
    numbers = [number for _, number, _ in sites]
    if len(set(numbers)) < len(numbers):
        return [RouterSite(name, i + 1, module, shared=numbers.count(number) > 1)
                for i, (name, number, module) in enumerate(sites)]
    return sorted((RouterSite(name, number, module) for name, number, module in sites if number is not None),
                  key=lambda site: site.layer_number)


def moe_layer_numbers(config: Any, sites: Sequence[RouterSite]) -> list[int]:
    """The global 1-based numbers of every MoE layer of the model, the same on every rank: from config.num_layers
    and moe_layer_freq (an int f: layers 0, f, 2f, ...; a list: 1 marks a MoE layer), as Megatron's layer specs
    read them, then the config.mtp_num_layers MTP layers (Megatron numbers them num_layers + 1 ...), when they
    cover every router found; else the routers' own numbers."""
    found = sorted({site.layer_number for site in sites})
    num_layers = getattr(config, "num_layers", None)
    freq = getattr(config, "moe_layer_freq", 1)
    pattern: list[int] | None = None
    if isinstance(num_layers, int) and num_layers > 0:
        if isinstance(freq, int) and freq > 0:
            pattern = [i + 1 for i in range(num_layers) if i % freq == 0]
        elif isinstance(freq, (list, tuple)) and len(freq) == num_layers:
            pattern = [i + 1 for i, is_moe in enumerate(freq) if is_moe]
    if pattern is not None and isinstance(num_layers, int):
        mtp = getattr(config, "mtp_num_layers", None)
        pattern += [num_layers + i + 1 for i in range(mtp if isinstance(mtp, int) and mtp > 0 else 0)]
        if set(found) <= set(pattern):
            return pattern
    return found


def layer_name(config: Any, number: int) -> str:
    """decoder.layers.<n> (0-based) for a decoder layer, mtp.layers.<i> for an MTP layer."""
    num_layers = getattr(config, "num_layers", None)
    if isinstance(num_layers, int) and number > num_layers:
        return f"mtp.layers.{number - num_layers - 1}"
    return f"decoder.layers.{number - 1}"


def routing_map_of(output: Any, num_experts: int) -> torch.Tensor:
    """The bool routing map [N, E] of a router's output (probs, routing_map); ValueError naming what it is
    instead (a float map of probabilities would count nothing, a wider one ids outside [0, E))."""
    routing_map = output[1] if isinstance(output, (tuple, list)) and len(output) >= 2 else None
    if not isinstance(routing_map, torch.Tensor):
        raise ValueError(f"the router returned {type(output).__name__}, not (probs, routing_map): not counted")
    if routing_map.dtype != torch.bool or routing_map.dim() != 2 or routing_map.shape[1] != num_experts:
        raise ValueError(f"routing_map is {routing_map.dtype} {list(routing_map.shape)}, not the bool [tokens, "
                         f"{num_experts}] map of Megatron's routers: not counted")
    return routing_map


def _device_of(chunks: Sequence[torch.nn.Module], routers: set[int]) -> torch.device:
    """The model's device: of its first parameter that is not a router's (Megatron creates router weights on the
    CPU and moves them at the first forward), else the CPU."""
    for chunk in chunks:
        for module in chunk.modules():
            if id(module) in routers:
                continue
            for param in module.parameters(recurse=False):
                return param.device
    return torch.device("cpu")


def _shared_run_name() -> str:
    """The default run name, the same on every rank: "megatron-<pid of global rank 0>" (one broadcast at attach
    time when torch.distributed is initialised with more than one rank)."""
    name = [f"megatron-{os.getpid()}"]
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(name, src=0)
    return str(name[0])


def _dtype_bytes(config: Any) -> int:
    dtype = getattr(config, "params_dtype", None)
    return int(torch.empty((), dtype=dtype).element_size()) if isinstance(dtype, torch.dtype) else 2


class MegatronMonitor(ExpertLoadMonitor):
    """An ExpertLoadMonitor hooked to a Megatron-Core model's routers (module docstring). close() removes the hooks.

    sites: the routers, in row order of their layers (rows: self.layer_numbers, 1-based global); parallel:
    the run's ParallelSizes."""

    def __init__(self, model: torch.nn.Module | Sequence[torch.nn.Module], *, redis_url: str | None = None,
                 run: str | None = None, device: str | torch.device | None = None, model_name: str | None = None,
                 options: MonitorOptions | None = None, **overrides: Any):
        chunks: list[torch.nn.Module] = list(model) if isinstance(model, (list, tuple)) else [model]  # type: ignore[list-item]
        self.sites = find_routers(chunks)
        config: Any = getattr(self.sites[0].module, "config", None)
        self.parallel = parallel_sizes()
        shared = [site.name for site in self.sites if site.shared]
        if shared:  # one row per router, named by its module path
            self.layer_numbers = [site.layer_number for site in self.sites]
            names = [site.name for site in self.sites]
            note = (f"routers {', '.join(shared)} share a layer_number: rows are the {len(self.sites)} routers in "
                    f"model order, named by module path")
            warnings.warn(f"moe monitor: {note}", RuntimeWarning, stacklevel=3)
        else:
            self.layer_numbers = moe_layer_numbers(config, self.sites)
            names = [layer_name(config, n) for n in self.layer_numbers]
            note = ""
        row_of = {number: row for row, number in enumerate(self.layer_numbers)}
        num_experts, top_k = int(config.num_moe_experts), int(config.moe_router_topk)
        if (options is None or options.gpus is None) and "gpus" not in overrides and num_experts % self.parallel.ep == 0:
            overrides["gpus"] = self.parallel.ep
        super().__init__(
            len(self.layer_numbers), num_experts, top_k,
            device=device if device is not None else _device_of(chunks, {id(s.module) for s in self.sites}),
            redis_url=redis_url, run=run or _shared_run_name(), layer_names=names,
            model_name=model_name or f"megatron-core ({self.parallel.describe()})",
            hidden_size=int(getattr(config, "hidden_size", 0) or 0),
            moe_intermediate_size=int(getattr(config, "moe_ffn_hidden_size", 0) or 0),
            dtype_bytes=_dtype_bytes(config), options=options,
            extra={"framework": "megatron-core", "parallel": dataclasses.asdict(self.parallel),
                   **({"layer_numbering": note} if note else {})}, **overrides)
        self._full_width = bool(getattr(config, "moe_pad_expert_input_to_capacity", False))
        self._expert_ids_1E = torch.arange(num_experts, device=self.device).unsqueeze(0)
        self._step_tokens = 0
        self._warned_unusual = False
        self._handles: list[RemovableHandle] = []
        first = min(row_of[site.layer_number] for site in self.sites)
        try:
            for site in self.sites:
                row = row_of[site.layer_number]
                self._handles.append(site.module.register_forward_hook(self._router_hook(row, row == first)))
        except Exception:
            self.close(timeout_s=0.0)
            raise

    def _router_hook(self, row: int, first_layer: bool) -> Callable[..., None]:
        """The forward hook of the router of row `row`: output (probs [N, E], routing_map bool [N, E])."""
        monitor, counter, top_k, num_experts = self, self.counter, self.top_k, self.num_experts

        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if torch._C._current_graph_task_id() != -1:  # recomputed inside backward: tokens already counted
                return None
            try:
                routing_map_NE = routing_map_of(output, num_experts)
                num_tokens = int(routing_map_NE.shape[0])
                if not monitor._step_open:
                    monitor.begin_step(tokens=num_tokens)
                if first_layer:
                    monitor._step_tokens += num_tokens
                if monitor._full_width or top_k >= num_experts:
                    ids = monitor._expert_ids_1E.expand(num_tokens, -1)
                    counter.record(row, ids, routing_map_NE)
                    return None
                valid_NK, ids_NK = routing_map_NE.to(torch.int8).topk(top_k, dim=1)
                counter.record(row, ids_NK, valid_NK)
                # the experts a row marks beyond its first k (0 for a router's map): counted too, and said
                # when the step is published (_decode), with no host sync here
                beyond_1E = routing_map_NE.scatter(1, ids_NK, False).sum(0, keepdim=True)
                counter.record(row, monitor._expert_ids_1E, beyond_1E)
            except Exception as exc:  # never break the training step
                monitor._hook_failed(row, exc)
            return None
        return hook

    def _decode(self, jobs: Sequence[Any]) -> list[Any]:
        """The base class's records, checked (publisher thread): a layer that counted more than top-k experts
        per token without moe_pad_expert_input_to_capacity is said (hook_errors, last_error), once per step."""
        records = super()._decode(jobs)
        if not self._full_width:
            for record in records:
                picks_L = record.counts_LE.sum(axis=1)
                over = [row for row in range(len(picks_L)) if picks_L[row] > record.tokens * self.top_k]
                if record.tokens > 0 and over:
                    self._note_unusual(
                        f"step {record.step}, layer {self.layer_names[over[0]]}: the routing map marks "
                        f"{int(picks_L[over[0]])} experts for {record.tokens} tokens, more than top-k={self.top_k} "
                        f"each (moe_pad_expert_input_to_capacity is off): every marked expert counted")
        return records

    def _note_unusual(self, message: str) -> None:
        """Say a router output counted in full that Megatron's routers do not make: in hook_errors and
        last_error (the published health's collector_error), and one warning. Never raises."""
        self._hook_errors += 1
        self._error = f"unusual routing ({self._hook_errors}x): {message}"
        if not self._warned_unusual:
            self._warned_unusual = True
            with contextlib.suppress(Exception):
                warnings.warn(f"moe monitor: {message}", RuntimeWarning, stacklevel=2)

    def end_step(self, phase: str | None = "train", tokens: int | None = None) -> int:
        """Close the training iteration's step (phase "train" unless given; set_phase() overrides both). tokens:
        default the tokens the rank's first MoE layer routed in it (none seen: taken from the counts)."""
        if tokens is None and self._step_tokens > 0:
            tokens = self._step_tokens
        self._step_tokens = 0
        return super().end_step(phase, tokens)

    @contextlib.contextmanager
    def iteration(self, phase: str = "train") -> Iterator[MegatronMonitor]:
        """One training iteration (forward + backward of all its micro-batches, the optimizer step) as one step:
        end_step(phase) when the block is left, even by an exception."""
        try:
            yield self
        finally:
            self.end_step(phase)

    def close(self, timeout_s: float = 5.0) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        super().close(timeout_s)


def attach_megatron(model: torch.nn.Module | Sequence[torch.nn.Module], redis_url: str | None = None,
                    run: str | None = None, options: MonitorOptions | None = None,
                    **overrides: Any) -> MegatronMonitor:
    """Hook every router of a Megatron-Core model (one module, or the list of model chunks of a virtual pipeline)
    and start counting; call after parallel_state.initialize_model_parallel (for the sizes) and after the
    model is built. E and K from the routers' TransformerConfig (num_moe_experts, moe_router_topk).
    run: the stream's name (default "megatron-<pid of rank 0>", the same on every rank). device: the counters'
    (default the model's), model_name: for the run's metadata (default
    "megatron-core (tp.. pp.. ep.. dp.. cp..)"); options / overrides: MonitorOptions fields, as for attach()."""
    return MegatronMonitor(model, redis_url=redis_url, run=run, options=options, **overrides)
