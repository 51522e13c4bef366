"""attach(): hook an unmodified transformers MoE model; each top-level forward is one step."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .discovery import find_moe_layers, model_sizes
from .hooks import register_layer_hook, step_phase, step_shape, step_token_mask
from .monitor import ExpertLoadMonitor
from .options import MonitorOptions


class AttachedMonitor(ExpertLoadMonitor):
    """An ExpertLoadMonitor wired to a model by hooks. close() also removes every hook."""

    def __init__(self, model: torch.nn.Module, *, redis_url: str | None = None, run: str | None = None,
                 options: MonitorOptions | None = None, **overrides: Any):
        layers = find_moe_layers(model)
        try:
            device = next(model.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
        sizes = model_sizes(model)
        super().__init__(len(layers), layers[0].num_experts, layers[0].top_k, device=device, redis_url=redis_url,
                         run=run, layer_names=[layer.name for layer in layers], model_name=sizes.model_name,
                         hidden_size=sizes.hidden_size, moe_intermediate_size=sizes.moe_intermediate_size,
                         dtype_bytes=sizes.dtype_bytes, options=options, **overrides)
        self.layers = layers
        self._depth = 0
        self._auto_phase = "unknown"
        self._handles: list[RemovableHandle] = []
        try:
            for i, layer in enumerate(layers):
                self._handles.append(register_layer_hook(self, i, layer))
            self._handles.append(model.register_forward_pre_hook(self._on_step_start, with_kwargs=True))
            self._handles.append(model.register_forward_hook(self._on_step_end, always_call=True))
        except Exception:
            self.close(timeout_s=0.0)  # no half-attached monitor, no stray threads
            raise

    @torch.compiler.disable
    def _on_step_start(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._depth += 1
        if self._depth > 1:
            return None
        try:
            shape = step_shape(args, kwargs)
            if shape is None:
                self._auto_phase = "unknown"
                return None
            batch, seq = shape
            mask = step_token_mask(kwargs, batch, seq, skip_all_ones=self.device.type == "cpu")
            self._auto_phase = step_phase(kwargs, seq)
            self.begin_step(batch * seq, mask)
        except Exception as exc:  # never break the model's forward
            self._auto_phase = "unknown"
            self._note_failure(f"step start: {type(exc).__name__}: {exc}")
        return None

    @torch.compiler.disable
    def _on_step_end(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            try:
                self.end_step(self._auto_phase)
            except Exception as exc:
                self._note_failure(f"step end: {type(exc).__name__}: {exc}")
        return None

    def close(self, timeout_s: float = 5.0) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        super().close(timeout_s)


def attach(model: torch.nn.Module, redis_url: str | None = None, run: str | None = None,
           options: MonitorOptions | None = None, **overrides: Any) -> AttachedMonitor:
    """Hook every routed-expert layer of a transformers MoE model and start counting.

    Each call of model(...) (each step of generate()) is one step: prefill when it carries a prompt,
    decode when it carries one new token per sequence on top of a cache (monitor.set_phase overrides).
    Padding tokens (attention_mask 0) are not counted. redis_url None: counts in memory only.
    E, top-k, the layer names and the model's sizes come from the model and its config. options: a
    MonitorOptions; overrides: its fields by name (sample_tokens, sample_every, gpus, nodes,
    physical_to_logical_map, queue_steps, host_slots, memory_budget_bytes, nvml, nvml_interval_s,
    redis_timeout_s, trace_path, trace_max_bytes), which win over options. An unknown name raises TypeError.
    No hook ever raises into the model's forward: a layer that cannot be counted is reported in
    monitor.stats() (hook_errors, last_error) and the published health, and the other layers go on.
    """
    return AttachedMonitor(model, redis_url=redis_url, run=run, options=options, **overrides)
