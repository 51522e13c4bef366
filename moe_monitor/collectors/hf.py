"""attach(): hook an unmodified transformers MoE model; each top-level forward is one step.

When neither a config nor a router attribute says the model's top-k (collectors/discovery.py), the monitor
starts counting at the first call of a MoE layer: that call's ids are [tokens, k] wide, k is taken from
their shape (no device op, no sync), and the counter, the run's metadata and the sinks are made then, once,
outside any compiled graph. Until then counts() is all zeros, top_k is 0, nothing is published, and a step
in which no MoE layer ran is not a step. Starting never raises into the forward: a failure (an unwritable
trace file) is reported in stats() like a hook's, and the model runs on uncounted.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.hooks import RemovableHandle

from moe_monitor import core

from .discovery import MoELayer, find_moe_layers, model_sizes
from .hooks import install, layer_hook, routed_width, step_phase, step_shape, step_token_mask
from .monitor import ExpertLoadMonitor
from .options import MonitorOptions, resolve_options

# the model's sizes for the run's metadata that attach() takes by name, winning over what the configs say (a
# small model standing in for a large one declares the large one's: the cost model prices those)
DECLARED_SIZES = ("model_name", "hidden_size", "moe_intermediate_size", "dtype_bytes", "expert_matrices",
                  "act_dtype_bytes")


class AttachedMonitor(ExpertLoadMonitor):
    """An ExpertLoadMonitor wired to a model by hooks. close() also removes every hook.

    started: False while the top-k is still to be read from the first MoE layer's ids (module docstring);
    counts(), invalid_counts(), stats() and close() work before that, begin_step() / end_step() are no-ops
    (end_step() returns -1: no step), record() starts the monitor with the width of its ids.
    """

    def __init__(self, model: torch.nn.Module, *, redis_url: str | None = None, run: str | None = None,
                 options: MonitorOptions | None = None, **overrides: Any):
        layers = find_moe_layers(model)
        try:
            device = next(model.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
        sizes = model_sizes(model)
        declared = {name: overrides.pop(name) for name in DECLARED_SIZES if name in overrides}
        self.layers = layers
        self._depth = 0
        self._auto_phase = "unknown"
        self._handles: list[RemovableHandle] = []
        self._monitor_kwargs: dict[str, Any] = dict(
            device=device, redis_url=redis_url, run=run, layer_names=[layer.name for layer in layers],
            **{"model_name": sizes.model_name, "hidden_size": sizes.hidden_size,
               "moe_intermediate_size": sizes.moe_intermediate_size, "dtype_bytes": sizes.dtype_bytes, **declared},
            options=options, **overrides)
        self._pending_step: tuple[int, torch.Tensor | None] | None = None
        self._start_failed = False
        top_k = next((layer.top_k for layer in layers if layer.top_k is not None), None)
        self.started = False
        if top_k is not None:
            super().__init__(len(layers), layers[0].num_experts, top_k, **self._monitor_kwargs)
            self.started = True
        else:
            self._await_top_k(device, redis_url, run, options, overrides)
        try:
            for i, layer in enumerate(layers):
                hook = layer_hook(self, i, layer) if self.started else self._deferred_hook(i, layer)
                self._handles.append(install(layer, hook))
            self._handles.append(model.register_forward_pre_hook(self._on_step_start, with_kwargs=True))
            self._handles.append(model.register_forward_hook(self._on_step_end, always_call=True))
        except Exception:
            self.close(timeout_s=0.0)  # no half-attached monitor, no stray threads
            raise

    # ------------------------------------------------------------------ top-k read from the first ids
    def _await_top_k(self, device: torch.device, redis_url: str | None, run: str | None,
                     options: MonitorOptions | None, overrides: dict[str, Any]) -> None:
        """The state before the monitor starts. What attach() would refuse (an unknown option, a bad value,
        a bad Redis URL or run name) is refused now, not at the first forward."""
        resolve_options(options, overrides)
        if redis_url is not None:
            core.connect(redis_url).close()  # checks the URL; connecting is lazy: nothing is sent
        if run is not None:
            core.check_run_name(run)
        self.num_layers, self.num_experts, self.top_k = len(self.layers), self.layers[0].num_experts, 0
        self.layer_names = [layer.name for layer in self.layers]
        self.device = torch.device(device)
        self.step = 0
        self.publisher = None
        self.sampler = None
        self._phase_override: str | None = None
        self._step_open = False
        self._token_mask_N: torch.Tensor | None = None
        self._error: str | None = None
        self._hook_errors = 0
        self._warned = False
        self._closed = False

    @torch.compiler.disable
    def start_counting(self, top_k: int) -> bool:
        """Start the monitor with top_k (the width of the first ids seen): make the counter, the metadata and
        the sinks, and begin the step that is under way. Returns whether the monitor counts. Never raises:
        a failure is reported (stats() last_error) and not retried."""
        if self.started:
            return True
        if self._start_failed or self._closed:
            return False
        kept = (self._error, self._hook_errors, self._warned, self._phase_override)
        try:
            ExpertLoadMonitor.__init__(self, len(self.layers), self.num_experts, top_k, **self._monitor_kwargs)
        except Exception as exc:
            self._start_failed = True
            with contextlib.suppress(Exception):
                ExpertLoadMonitor.close(self, 0.0)  # whatever the failed start had made
            self._error, self._hook_errors, self._warned, self._phase_override = kept
            self.top_k, self.publisher, self.sampler, self._closed = 0, None, None, False
            self._note_failure(f"start with top_k={top_k}: {type(exc).__name__}: {exc}")
            return False
        self._error, self._hook_errors, self._warned, self._phase_override = kept
        self.started = True
        pending, self._pending_step = self._pending_step, None
        if pending is not None:
            self.begin_step(*pending)
        return True

    def _deferred_hook(self, index: int, layer: MoELayer) -> Callable[..., None]:
        """The layer's hook before the monitor has started: its first call with ids starts the monitor with
        their width, makes the family's hook (hooks.layer_hook) and hands this call and every later one to
        it. Never raises into the forward."""
        hot: list[Callable[..., None]] = []
        monitor = self

        @torch.compiler.disable
        def first_call(module: torch.nn.Module, args: tuple[Any, ...], extra: Any) -> Callable[..., None] | None:
            if not monitor.started:
                width = routed_width(layer, args, extra) if isinstance(extra, dict) else None
                if width is None or not monitor.start_counting(width):
                    return None
            hot.append(layer_hook(monitor, index, layer))
            return hot[0]

        def hook(module: torch.nn.Module, args: tuple[Any, ...], extra: Any) -> None:
            # extra: the call's kwargs (pre-hook kinds) or its output (forward-hook kinds)
            try:
                real = hot[0] if hot else first_call(module, args, extra)
                if real is not None:
                    real(module, args, extra)
            except Exception as exc:  # never break the model's forward
                monitor._hook_failed(index, exc)
            return None
        return hook

    # ------------------------------------------------------------------ the generic API, before the start
    def begin_step(self, tokens: int | None = None, token_mask: torch.Tensor | None = None) -> None:
        if not self.started:
            self._pending_step = (int(tokens or 0), token_mask)
            return
        super().begin_step(tokens, token_mask)

    def record(self, layer: int, topk_ids: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        if (not self.started and isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 2
                and not self.start_counting(int(topk_ids.shape[1]))):
            raise RuntimeError(f"the monitor could not start: {self._error}")
        super().record(layer, topk_ids, weights)

    def end_step(self, phase: str | None = None, tokens: int | None = None) -> int:
        if not self.started:
            self._pending_step = None
            return -1
        return super().end_step(phase, tokens)

    def counts(self) -> np.ndarray:
        if not self.started:
            return np.zeros((self.num_layers, self.num_experts), dtype=np.int64)
        return super().counts()

    def invalid_counts(self) -> np.ndarray:
        if not self.started:
            return np.zeros(self.num_layers, dtype=np.int64)
        return super().invalid_counts()

    def stats(self) -> dict[str, Any]:
        if not self.started:
            return {"steps": 0, "hook_errors": self._hook_errors, "invalid_ids": 0, "dropped_steps": 0,
                    "publisher_alive": False, "published_steps": 0, "queued_steps": 0,
                    "last_error": self._error or "", "sinks": {}}
        return super().stats()

    # ------------------------------------------------------------------ step hooks
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
        if not self.started:
            self._closed = True
            return
        super().close(timeout_s)


def attach(model: torch.nn.Module, redis_url: str | None = None, run: str | None = None,
           options: MonitorOptions | None = None, **overrides: Any) -> AttachedMonitor:
    """Hook every routed-expert layer of a transformers MoE model and start counting.

    Each call of model(...) (each step of generate()) is one step: prefill when it carries a prompt,
    decode when it carries one new token per sequence on top of a cache (monitor.set_phase overrides).
    Padding tokens (attention_mask 0) are not counted. redis_url None: counts in memory only.
    E, top-k, the layer names and the model's sizes come from the model's configs (nested sub-configs of a
    multimodal model included); E, where no config says, from the experts' weights; top-k, where no config
    says, from the router's attributes, else from the width of the ids at the first forward (the monitor
    starts then: see the module docstring). options: a
    MonitorOptions; overrides: its fields by name (sample_tokens, sample_every, gpus, nodes,
    physical_to_logical_map, queue_steps, host_slots, publish_interval_s, memory_budget_bytes, nvml,
    nvml_interval_s, redis_timeout_s, trace_path, trace_max_bytes, gpu_profile), which win over options, and the
    model's sizes (DECLARED_SIZES: hidden_size, dtype_bytes, ...), which win over the configs'. An unknown name
    raises TypeError.
    No hook ever raises into the model's forward: a layer that cannot be counted is reported in
    monitor.stats() (hook_errors, last_error) and the published health, and the other layers go on.
    """
    return AttachedMonitor(model, redis_url=redis_url, run=run, options=options, **overrides)
