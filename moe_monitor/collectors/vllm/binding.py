"""RunnerBinding: one monitor bound to a loaded vLLM model runner (made by the package's register(), through the
load_model wrapper of patch.py).

Every fused-MoE router gets a capture function (logical topk_ids [N, K], before EPLB maps them) that only runs
device ops into fixed buffers, under a gate [T] of 1s for the step's real tokens and 0s for padding and between
steps, so it is exact eagerly, compiled and in CUDA graphs; under data parallelism it counts this rank's rows
(rules.local_span). execute_model's begin/end open and close the gate and the step. With EPLB: each committed
physical_to_logical_map [L, P] as a layout record, each pass's expert_load_pass [L, P] as a physical record.
docs/collectors.md ("How it counts") gives the details.
"""
from __future__ import annotations

import atexit
import logging
from typing import Any

import numpy as np
import torch

from moe_monitor.collectors.counter import byte_view
from moe_monitor.collectors.monitor import ExpertLoadMonitor

from .patch import attach
from .rules import (
    PluginSettings,
    Publishing,
    bind_cache_key,
    graph_key,
    local_span,
    publishing_rule,
    run_name_for,
    step_facts,
    weight_bytes,
)

log = logging.getLogger("vllm.moe_monitor")
VLLM_DISPATCH = "round_robin"  # vLLM's EPLB sends token i of an expert with r replicas to replica i mod r
EXACT_BALANCE_BACKENDS = ("moonep",)  # all-to-all backends that give every GPU the same tokens: dispatch "ideal"
BINDINGS: list[RunnerBinding] = []   # every live binding of this process (EPLB commits mark them)


def moe_layers(vllm_config) -> list[tuple[str, Any]]:
    """(name, MoE runner layer) of every fused-MoE layer in model order whose router takes a capture function."""
    cc = vllm_config.compilation_config
    context = getattr(cc, "static_forward_context", {}) or {}
    found = []
    for name in getattr(cc, "static_all_moe_layers", []) or []:
        layer = context.get(name)
        router = getattr(layer, "router", None)
        if router is not None and callable(getattr(router, "set_capture_fn", None)):
            found.append((name, layer))
    return found


def tensor_parallel_rank(parallel_config) -> int:
    """This worker's tensor-parallel rank (0 without tensor parallelism)."""
    if parallel_config.tensor_parallel_size <= 1:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    return int(get_tensor_model_parallel_rank())


def worker_publishing(vllm_config) -> Publishing:
    """The publishing rule for this worker (rules.publishing_rule), from vLLM's parallel config and groups."""
    pc = vllm_config.parallel_config
    return publishing_rule(tensor_parallel_rank(pc), pc.tensor_parallel_size, pc.data_parallel_rank,
                           pc.data_parallel_size, pc.pipeline_parallel_size, bool(pc.enable_expert_parallel),
                           bool(getattr(pc, "use_sequence_parallel_moe", False)))


def dp_tokens(dp_size: int):
    """A function () -> tokens [D] of every data-parallel rank in the current forward (vLLM's dp_metadata), or
    None; None without data parallelism (rules.local_span)."""
    if dp_size <= 1:
        return None
    from vllm.forward_context import get_forward_context, is_forward_context_available

    def read():
        if not is_forward_context_available():
            return None
        meta = getattr(get_forward_context(), "dp_metadata", None)
        sizes = getattr(meta, "num_tokens_across_dp_cpu", None)
        return None if sizes is None else sizes.tolist()
    return read


def eplb_map(runner) -> torch.Tensor | None:
    """The engine's current physical_to_logical_map [L, P] (int64, on the host), or None without EPLB."""
    state = getattr(runner, "eplb_state", None)
    models = getattr(state, "model_states", None) or {}
    for model_state in models.values():
        return model_state.physical_to_logical_map.detach().to("cpu", torch.int64)
    return None


def pass_load(state: Any, num_layers: int) -> Any:
    """The first model's expert_load_pass [L, P] tensor of an EplbState (recent vLLM: state.model_states[name];
    older: on the state itself) whose L is num_layers; None when there is none. It holds the tokens this rank
    sent to each physical expert in the current pass until EplbState.step zeroes it (older vLLM counted local
    experts only, [L, P / ranks]: record_physical refuses that shape)."""
    models = getattr(state, "model_states", None)
    candidates = list(models.values()) if isinstance(models, dict) and models else [state]
    for model_state in candidates:
        load = getattr(model_state, "expert_load_pass", None)
        shape = getattr(load, "shape", None)
        if shape is not None and len(shape) == 2 and int(shape[0]) == num_layers:
            return load
    return None


class RunnerBinding:
    """Counts one vLLM worker's routing and publishes a step per execute_model call (module docstring)."""

    def __init__(self, runner, settings: PluginSettings, publishing: Publishing):
        config = runner.vllm_config
        layers = moe_layers(config)
        if not layers:
            raise ValueError("the model has no fused-MoE layer with a capture hook")
        moe = [layer.moe_config for _, layer in layers]
        num_experts, top_k = moe[0].num_logical_experts, moe[0].experts_per_token
        if any((m.num_logical_experts, m.experts_per_token) != (num_experts, top_k) for m in moe):
            raise ValueError("MoE layers with different expert counts or top-k are not supported")
        model = config.model_config
        served = model.served_model_name
        model_name = (served[0] if isinstance(served, list) and served else served) or model.model
        text_config = getattr(model, "hf_text_config", None)
        options: dict[str, Any] = dict(settings.options, rank=publishing.rank, world_size=publishing.world_size,
                                       scope=publishing.scope, gpus=publishing.gpus)
        backend = str(getattr(config.parallel_config, "all2all_backend", "") or "")
        # a setting the user passed wins
        options.setdefault("dispatch", "ideal" if backend in EXACT_BALANCE_BACKENDS else VLLM_DISPATCH)
        initial = eplb_map(runner)
        if initial is not None and initial.shape[0] == len(layers):
            options.update(physical_to_logical_map=initial.tolist(), gpus=publishing.gpus)
        self.device = torch.device(runner.device)
        self.monitor = ExpertLoadMonitor(
            len(layers), num_experts, top_k, device=self.device, redis_url=settings.redis_url,
            run=settings.run or run_name_for(str(model_name)), layer_names=[name for name, _ in layers],
            model_name=str(model_name), hidden_size=int(moe[0].hidden_dim),
            moe_intermediate_size=int(getattr(text_config, "moe_intermediate_size", 0) or moe[0].intermediate_size),
            dtype_bytes=weight_bytes(getattr(model, "quantization", None), int(model.dtype.itemsize)),
            act_dtype_bytes=int(model.dtype.itemsize), **options)
        scheduler = config.scheduler_config
        capture_max = getattr(config.compilation_config, "max_cudagraph_capture_size", None) or 0
        self.gate_T = torch.zeros(2 * max(int(scheduler.max_num_batched_tokens), int(capture_max), 1),
                                  dtype=self.monitor.counter.dtype, device=self.device)
        # on the CPU the gate is opened and closed through a byte view of its memory (counter.py: no torch op, no
        # numpy call), copied from ones or zeros of its own size
        self._gate_bytes, self._gate_item = None, self.gate_T.element_size()
        if self.device.type == "cpu":
            gate = self.gate_T.numpy()
            self._gate_bytes = byte_view(gate)
            self._gate_fill = [byte_view(np.full_like(gate, value)) for value in (0, 1)]
        self.tokens, self.phase, self.in_step = 0, "unknown", False
        pc = config.parallel_config
        self.dp_rank, self.tp_rank, self.tp_size = int(pc.data_parallel_rank), tensor_parallel_rank(pc), int(pc.tensor_parallel_size)
        self.dp_tokens = dp_tokens(int(pc.data_parallel_size))
        # sequence-parallel MoE: this rank routes a shard; its tokens are read from the counts (none sampled)
        self.sharded = bool(getattr(pc, "use_sequence_parallel_moe", False)) and self.tp_size > 1
        self.runner = runner
        self.layout_from: int | None = None   # step from which a committed EPLB layout is in force
        # physical records only where each publisher's ranks are its own tokens (their sum is the GPU loads)
        self.physical_off = "" if publishing.scope == "rank" else f"scope {publishing.scope}"
        fused_shared = [int(getattr(layer.moe_config, "num_fused_shared_experts", 0) or 0) > 0 for _, layer in layers]
        for index, (_, layer) in enumerate(layers):
            attach(layer.router, self._capture_fn(index, num_experts, fused_shared[index]))  # beside vLLM's own
        counter = self.monitor.counter
        cache = bind_cache_key(config, graph_key(dict(
            layers=len(layers), experts=num_experts, top_k=top_k, sample_tokens=counter.sample_tokens,
            gate=int(self.gate_T.shape[0]), fused_shared=fused_shared, dp=int(pc.data_parallel_size),
            tp=self.tp_size, sharded=self.sharded)))
        BINDINGS.append(self)
        atexit.register(self.monitor.close, 2.0)
        log.info("moe monitor: %d MoE layers x %d experts (top-%d) -> run %s; %s; %s", len(layers), num_experts,
                 top_k, self.monitor.run, publishing.reason, cache)

    def _capture_fn(self, layer: int, num_experts: int, fused_shared: bool):
        """The capture function of one layer: device ops into fixed buffers only (module docstring). With shared
        experts fused into the routing (their ids follow the E routed ones), those slots are not counted; any
        other id outside [0, E) is counted as invalid, as on every other path."""
        counter, gate_T, monitor = self.monitor.counter, self.gate_T, self.monitor
        gate_len = gate_T.shape[0]

        def capture(topk_ids: torch.Tensor) -> None:
            try:
                num = topk_ids.shape[0]
                if num == 0 or topk_ids.dim() != 2:
                    return
                span = local_span(num, self.dp_rank, self.dp_tokens() if self.dp_tokens else None,
                                  self.tp_rank, self.tp_size)
                if span is None:
                    monitor._hook_failed(layer, f"{num} routed rows fit no data-parallel layout: not counted")
                    return
                first, rows, token = span
                if token + rows > gate_len:
                    monitor._hook_failed(layer, f"{token + rows} tokens exceed the gate of {gate_len}: not counted")
                    return
                ids = topk_ids[first:first + rows].to(torch.int64)
                valid = gate_T[token:token + rows].unsqueeze(1).expand(rows, ids.shape[1])
                if fused_shared:
                    valid = valid * (ids < num_experts)
                counter.record(layer, ids, valid)
            except Exception as exc:  # never into the model's forward
                monitor._hook_failed(layer, exc)
        return capture

    # ------------------------------------------------------------------ the step boundary (host, outside graphs)
    def begin(self, scheduler_output) -> None:
        """Open the gate for the step's scheduled tokens."""
        tokens, phase = step_facts(scheduler_output)
        self.tokens, self.phase, self.in_step = tokens, phase, True
        if tokens > 0:
            self._set_gate(tokens, 1)
            if not self.sharded:  # a shard's tokens are read from its counts (each routed k times a layer)
                self.monitor.begin_step(tokens=tokens)

    def end(self) -> None:
        """Close the gate and the step (its copy leaves the device asynchronously); publish a committed layout."""
        self.in_step = False
        if self.tokens > 0:
            self._set_gate(self.tokens, 0)
            self.monitor.end_step(phase=self.phase, tokens=None if self.sharded else self.tokens)
            self.tokens = 0
        if self.layout_from is not None:
            self._publish_layout()

    def _set_gate(self, tokens: int, value: int) -> None:
        """gate_T[:tokens] = value, 0 or 1 (a slice past the end stops at it): through its byte view on the CPU."""
        if self._gate_bytes is not None:
            end = self._gate_item * tokens
            self._gate_bytes[:end] = self._gate_fill[value][:end]
        else:
            self.gate_T[:tokens].fill_(value)

    def physical_pass(self, state) -> None:
        """EPLB is about to close a forward pass: publish its expert_load_pass [L, P] as the open step's physical
        record. A shape that does not fit the layout (older vLLM counts local experts only) turns it off, said once."""
        if self.physical_off or not self.in_step or self.tokens <= 0:
            return
        load = pass_load(state, self.monitor.num_layers)
        if load is None:
            return
        try:
            self.monitor.record_physical(load, step=self.monitor.step, source="vllm")
        except ValueError as exc:
            self.physical_off = str(exc)
            log.warning("moe monitor: EPLB's per-pass load is not published: %s", exc)

    def layout_committed(self) -> None:
        """EPLB committed new maps: they route the steps after the current one (or from the next step)."""
        self.layout_from = self.monitor.step + (1 if self.in_step else 0)

    def _publish_layout(self) -> None:
        start, self.layout_from = self.layout_from, None
        current = eplb_map(self.runner)
        if current is None or current.shape[0] != self.monitor.num_layers:
            return
        try:
            self.monitor.publish_layout(current, from_step=start, source="engine")
        except ValueError as exc:
            log.warning("moe monitor: the engine's new layout was not published: %s", exc)
