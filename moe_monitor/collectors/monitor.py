"""ExpertLoadMonitor: the generic collector, fed by any engine (hf.attach() feeds it from hooks).

    mon = ExpertLoadMonitor(num_layers=58, num_experts=256, top_k=8, device="cuda", redis_url=..., run="prod")
    mon.record(layer, topk_ids)          # int [N, K], every MoE layer, every step
    mon.end_step(phase="decode")         # once per step
    mon.publish_layout(layout_LP)        # when the engine moves experts (EPLB): in force from the next step
    mon.record_physical(counts_LP)       # optional, after end_step: tokens per physical slot its balancer sent

counts() -> int64 [L, E], cumulative. Nothing raises into the model's forward: a failing hook is counted
(stats() hook_errors, last_error) and ids outside [0, E) are counted as invalid, never as an expert.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
import warnings
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from moe_monitor import core

from .counter import DeviceCounter, HostSlot
from .dist import rank_and_world
from .nvml import NvmlSampler
from .options import MonitorOptions, resolve_options
from .physical import physical_job
from .publisher import Publisher, StepJob
from .sinks import RedisSink, Sink, TraceFileSink
from .timing import LayerTimer, StepTimer

_Monitor = TypeVar("_Monitor", bound="ExpertLoadMonitor")


class ExpertLoadMonitor:
    """Counts tokens per expert per layer per step on the device and publishes each step.

    redis_url None: counts in memory only (unless options.trace_path names a trace file).
    run: the stream's name (default: "<model>-<pid>"). layer_names: one per layer (default layer0, ...).
    model_name, hidden_size, moe_intermediate_size, dtype_bytes, expert_matrices, act_dtype_bytes: for the
    run's metadata (the traffic, memory and time figures need the sizes; core.costmodel); extra: a JSON object kept in the metadata as it is (a framework's parallel
    sizes, say). options: a MonitorOptions; overrides: MonitorOptions fields by name
    (they win over options), e.g. ExpertLoadMonitor(58, 256, 8, gpus=32, nodes=4, sample_tokens=0).
    """

    def __init__(self, num_layers: int, num_experts: int, top_k: int, *, device: str | torch.device = "cpu",
                 redis_url: str | None = None, run: str | None = None, layer_names: Sequence[str] | None = None,
                 model_name: str = "", hidden_size: int = 0, moe_intermediate_size: int = 0,
                 dtype_bytes: int = 2, expert_matrices: int = 3, act_dtype_bytes: int = 0,
                 options: MonitorOptions | None = None, extra: dict | None = None, **overrides: Any):
        opts = resolve_options(options, overrides)
        self.num_layers, self.num_experts, self.top_k = int(num_layers), int(num_experts), int(top_k)
        self.layer_names = list(layer_names) if layer_names else [f"layer{i}" for i in range(self.num_layers)]
        if len(self.layer_names) != self.num_layers:
            raise ValueError(f"{len(self.layer_names)} layer names for {self.num_layers} layers")
        self.rank, self.world_size = rank_and_world()
        if opts.rank is not None and opts.world_size is not None:  # the engine's own publisher numbering
            self.rank, self.world_size = opts.rank, opts.world_size
        self.scope = opts.scope
        self.run = core.check_run_name(run or f"{(model_name or 'moe').split('/')[-1]}-{os.getpid()}")
        if opts.sample_tokens and self.num_experts > core.MAX_SAMPLE_EXPERTS:
            warnings.warn(f"{self.num_experts} experts do not fit the int16 sampled rows: sampling is off",
                          RuntimeWarning, stacklevel=2)
            opts = dataclasses.replace(opts, sample_tokens=0)
        self.instance = core.new_instance_id()
        self.counter = DeviceCounter(self.num_layers, self.num_experts, self.top_k, device, opts.sample_tokens,
                                     opts.sample_every)
        self.device = self.counter.device
        gpus = opts.gpus or core.default_gpus(self.num_experts, self.world_size)
        rows = opts.physical_to_logical_map
        layout = core.Layout(gpus, opts.nodes, [list(row) for row in rows] if rows is not None
                             else core.contiguous_layout(self.num_layers, self.num_experts))
        self.meta = core.RunMeta(
            run=self.run, model_name=model_name, layer_names=self.layer_names, num_experts=self.num_experts,
            top_k=self.top_k, hidden_size=hidden_size, moe_intermediate_size=moe_intermediate_size,
            dtype_bytes=dtype_bytes, layout=layout, world_size=self.world_size, started_s=time.time(),
            host=socket.gethostname(), sample_tokens_per_layer=opts.sample_tokens, instance=self.instance,
            dispatch=opts.dispatch, extra=dict(extra or {}), expert_matrices=expert_matrices,
            act_dtype_bytes=act_dtype_bytes, gpu_profile=opts.gpu_profile)
        core.encode_meta(self.meta)  # validates the layout now, not in the thread
        self.step = 0
        self.last_layout: core.LayoutRecord | None = None  # the latest publish_layout() (None: the meta's layout)
        self._phase_override: str | None = None
        self._step_open = False
        self._token_mask_N: torch.Tensor | None = None
        self._error: str | None = None      # the latest failure of a hook or step hook ("" in stats when none)
        self._hook_errors = 0               # hook calls that could not count
        self._warned = False
        self._published_invalid = 0         # invalid ids in the steps the publisher decoded (its thread)
        self._closed = False
        sinks: list[Sink] = []
        if redis_url is not None:  # made first: a bad URL raises before a trace file is opened
            maxlen = core.maxlen_for_budget(opts.memory_budget_bytes, self.num_layers, self.num_experts,
                                            self.num_layers * opts.sample_tokens * self.top_k * 2)
            sinks.append(RedisSink(redis_url, self.meta, maxlen, opts.redis_timeout_s, opts.memory_budget_bytes))
        if opts.trace_path is not None:  # written first: a trace failure reaches the Redis health at once
            try:
                sinks.insert(0, TraceFileSink(opts.trace_path, self.meta, opts.trace_max_bytes))
            except BaseException:
                for sink in sinks:  # the Redis client made above is not left open
                    sink.close()
                raise
        self._timer = StepTimer(self.num_layers, self.device, opts.host_slots)  # time_layer(): per-step times
        self._free_slots = [self.counter.new_slot() for _ in range(opts.host_slots)] if sinks else []
        self.publisher = Publisher(sinks, self._decode, self._release, self.rank, opts.queue_steps,
                                   queue_s=opts.queue_s, queue_bytes=opts.queue_bytes,
                                   flush_interval_s=opts.publish_interval_s, wake_at=max(1, opts.host_slots // 2),
                                   collector_health=self._collector_health,
                                   decode_timing=self._decode_timing) if sinks else None
        self.sampler: NvmlSampler | None = None
        if opts.nvml and self.publisher is not None:
            self.sampler = NvmlSampler(self.publisher.submit_sample, self.rank, opts.nvml_interval_s, self.device)

    # ------------------------------------------------------------------ the generic API
    def begin_step(self, tokens: int | None = None, token_mask: torch.Tensor | None = None) -> None:
        """Optional: announce a step of `tokens` tokens (or token_mask [tokens], 1 = real token) before its
        layers are recorded; this picks the sampled tokens and excludes padding. record() calls it with the
        first layer's token count when the step was not announced."""
        mask = token_mask
        if mask is not None and (mask.dim() != 1 or mask.dtype != torch.int64 or mask.device != self.device):
            mask = mask.reshape(-1).to(self.device, torch.int64)
        n = int(mask.numel()) if mask is not None else int(tokens or 0)
        self._token_mask_N = mask
        self.counter.begin_step(n, mask)
        self._step_open = True

    def record(self, layer: int, topk_ids: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Count one layer's routing: topk_ids int [tokens, k] on the monitor's device. Ids outside [0, E) are
        counted as invalid (stats() invalid_ids), never as an expert; when weights [tokens, k] is given,
        slots of weight 0 are not counted at all. Raises ValueError on a bad layer or shape (this is the
        engines' API; the hooks of attach() never raise)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.is_floating_point():
            raise ValueError(f"topk_ids must be an integer tensor [tokens, k], got "
                             f"{getattr(topk_ids, 'shape', type(topk_ids).__name__)}")
        if weights is not None and weights.shape != topk_ids.shape:
            raise ValueError(f"weights {tuple(weights.shape)} must match topk_ids {tuple(topk_ids.shape)}")
        if not self._step_open:
            self.begin_step(tokens=topk_ids.shape[0])
        self._count(layer, topk_ids, weights, skip_out_of_range=False, masked=True)

    def end_step(self, phase: str | None = None, tokens: int | None = None) -> int:
        """Close the step: one copy of its counts leaves the device (asynchronously on CUDA). tokens
        overrides the step's token count. Returns the step's id."""
        phase = self._phase_override or phase or "unknown"
        if phase not in core.PHASES:
            raise ValueError(f"phase must be one of {core.PHASES}, got {phase!r}")
        publisher, slot = self.publisher, None
        if publisher is not None:
            try:  # list.pop and the publisher's append are atomic: no lock on the model's thread
                slot = self._free_slots.pop()
            except IndexError:
                publisher.count_dropped()
        facts = self.counter.snapshot(slot)
        timer = self._timer
        timings = timer.take() if timer.measured else None
        step = self.step
        self.step = step + 1
        if slot is not None:
            publisher.submit(StepJob(step, time.time(), phase, tokens, slot, facts, timings))  # type: ignore[union-attr]
        elif timings is not None:
            timer.release(timings)
        self._token_mask_N = None
        self._step_open = False
        return step

    def time_layer(self, layer: int) -> LayerTimer:
        """Time one MoE layer of the current step (collectors/timing.py): use it as a context manager around
        the whole layer, and its .dispatch(), .compute() and .combine() around those phases. The step's
        times travel with the step (a core.TimingRecord, stream core.timings_key(run)); CUDA events on the
        current stream on a GPU, read on the publisher thread (never a host sync here), perf_counter on the
        CPU. ValueError on a bad layer (this is the engines' API)."""
        return self._timer.layer(layer)

    def record_times(self, layer: int, dispatch_s: float | None = None, compute_s: float | None = None,
                     combine_s: float | None = None, layer_s: float | None = None) -> None:
        """For engines that time their layers themselves: seconds of one layer's phases in the current step
        (None: not measured). ValueError on a bad layer or a negative or non-finite time."""
        self._timer.record_times(layer, dispatch_s, compute_s, combine_s, layer_s)

    def publish_layout(self, layout_LP: Any, *, from_step: int | None = None, gpus: int | None = None,
                       source: str = "engine") -> None:
        """Say that the experts moved: layout_LP, int [L, P] (SGLang's physical_to_logical_map: the
        logical expert of each physical slot; a numpy array, nested lists or a tensor on any device), is in
        force from step id from_step on (default: the next step, self.step) on `gpus` GPUs (default: the run
        metadata's; slot p on GPU p // (P / gpus)). source: "engine" (the engine's own rebalance, EPLB),
        "apply" (a layout applied by hand) or "initial". For engine glue, not the forward: the map is checked
        here (every expert 0..E-1 in every layer, P a multiple of gpus; ValueError otherwise, naming what is
        wrong), then handed to the publisher thread; this thread never blocks and never does I/O (a tensor on
        a GPU is copied to the host first). The dashboard computes the GPU loads of each step under the
        layout in force at that step."""
        if self._closed:
            raise RuntimeError("publish_layout() after close(): the monitor publishes nothing any more")
        if source not in core.LAYOUT_SOURCES:
            raise ValueError(f"source must be one of {core.LAYOUT_SOURCES}, got {source!r}")
        if isinstance(layout_LP, torch.Tensor):
            layout_LP = layout_LP.detach().cpu().numpy()
        if not isinstance(layout_LP, (np.ndarray, list, tuple)):
            raise ValueError("layout_LP must be an int array, tensor or nested lists [layers][slots], "
                             f"got {type(layout_LP).__name__}")
        gpus = self.meta.layout.gpus if gpus is None else gpus
        step = self.step if from_step is None else from_step
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step < core.MAX_STEP:
            raise ValueError(f"from_step must be a step id 0..{core.MAX_STEP - 1}, got {from_step!r}")
        layout_LP = core.check_layout_map(layout_LP, gpus, self.meta.layout.nodes, self.num_layers,
                                          self.num_experts, unused=True)  # vLLM's -1: an unused slot
        record = core.LayoutRecord(run=self.run, step=int(step), time_s=time.time(),
                                   layout_LP=layout_LP.astype(np.int32), gpus=int(gpus),
                                   nodes=self.meta.layout.nodes, source=source, rank=self.rank,
                                   instance=self.instance)
        core.encode_layout_record(record)  # the reader's bounds, checked here rather than in the writer
        self.last_layout = record
        if self.publisher is not None:
            self.publisher.submit_layout(record)

    def record_physical(self, counts_LP: Any, *, step: int | None = None, gpus: int | None = None,
                        source: str = "engine") -> None:
        """Publish what the engine's balancer dispatched in a step: counts_LP, int [L, P] tokens this rank sent to
        each physical slot of the layout in force (SGLang's global_physical_count, vLLM's EPLB expert_load_pass;
        a numpy array, nested lists or a tensor on any device), as a core.PhysicalRecord on stream
        core.physical_key(run). step: the step id they belong to (default: the step end_step closed last);
        gpus: default the layout in force's. source: one of core.PHYSICAL_SOURCES. Shape, type and (for host
        data) values are checked here (ValueError naming what is wrong); a tensor on a GPU is copied to pinned
        host memory without a host sync and its values checked on the publisher thread (a refused one is
        counted in dropped_physical and named in last_error). Never blocks, never does I/O: a full queue drops
        the record and counts it (stats() sinks' dropped_physical)."""
        if self._closed:
            raise RuntimeError("record_physical() after close(): the monitor publishes nothing any more")
        if source not in core.PHYSICAL_SOURCES:
            raise ValueError(f"source must be one of {core.PHYSICAL_SOURCES}, got {source!r}")
        step = self.step - 1 if step is None else step
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step < core.MAX_STEP:
            raise ValueError(f"step must be a step id 0..{core.MAX_STEP - 1} (default: the step closed last; "
                             f"none closed yet), got {step!r}")
        layout = self.last_layout
        num_slots = layout.num_slots if layout is not None else len(self.meta.layout.physical_to_logical_map[0])
        in_force_gpus = layout.gpus if layout is not None else self.meta.layout.gpus
        job = physical_job(counts_LP, num_layers=self.num_layers, num_slots=num_slots,
                           gpus=in_force_gpus if gpus is None else gpus, run=self.run, step=int(step),
                           rank=self.rank, time_s=time.time(), instance=self.instance, source=source)
        if self.publisher is not None:
            self.publisher.submit_physical(job)

    def set_phase(self, phase: str | None) -> None:
        """Force the phase of the following steps ("prefill", "decode", "mixed"), or None for automatic."""
        if phase is not None and phase not in core.PHASES:
            raise ValueError(f"phase must be one of {core.PHASES} or None, got {phase!r}")
        self._phase_override = phase

    def counts(self) -> np.ndarray:
        """int64 [L, E]: tokens per expert per layer since the monitor was made (closed steps and the open one)."""
        return self.counter.running_total()[:, : self.num_experts].cpu().numpy()

    def invalid_counts(self) -> np.ndarray:
        """int64 [L]: ids outside [0, E) per layer since the monitor was made (counted, never as an expert)."""
        return self.counter.running_total()[:, self.num_experts].cpu().numpy()

    def stats(self) -> dict[str, Any]:
        """steps: closed so far; with more than one sink (Redis and a trace file) the step figures are the
        worst sink's: published_steps every sink has, queued_steps and dropped_steps of the sink that lacks
        the most; sinks: the same figures per sink, by name, with its failed writes and the reason of the
        latest (kept after it recovers) and its layout changes (published_layouts, queued_layouts,
        dropped_layouts: see publish_layout); last_error: every failure that still stands (the sinks', the
        publisher's, a hook's); hook_errors: hook calls that could not count; invalid_ids: ids outside
        [0, E) counted so far (reads the device: a sync on CUDA, like counts())."""
        pub = self.publisher
        collector_error = self._error or ""
        base = {"steps": self.step, "hook_errors": self._hook_errors,
                "invalid_ids": int(self.invalid_counts().sum())}
        if pub is None:
            return {**base, "dropped_steps": 0, "publisher_alive": False, "published_steps": 0,
                    "queued_steps": 0, "last_error": collector_error, "sinks": {}}
        return {**base, "dropped_steps": pub.dropped_steps, "publisher_alive": pub.alive,
                "published_steps": pub.published_steps, "queued_steps": pub.queued_steps,
                "last_error": pub.last_error, "sinks": pub.sink_stats()}

    def close(self, timeout_s: float = 5.0) -> None:
        """Publish everything buffered (up to timeout_s), stop the threads, close the sinks. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.sampler is not None:
            self.sampler.stop()
        if self.publisher is not None:
            self.publisher.close(timeout_s)

    def __enter__(self: _Monitor) -> _Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _count(self, layer: int, ids: torch.Tensor, weights: torch.Tensor | None, skip_out_of_range: bool,
               masked: bool) -> None:
        """Count [..., K] ids of one layer. masked False: the hot path (padding handled by the step's mask);
        masked True: a validity mask from weights (weight 0: not counted), the step's padding mask and,
        when skip_out_of_range (families whose ids >= E are zero-compute or skip slots by design), the range."""
        ids = ids.reshape(-1, ids.shape[-1])
        if ids.dtype != torch.int64:
            ids = ids.to(torch.int64)
        mask = self._token_mask_N
        if not masked or (not skip_out_of_range and weights is None and mask is None):
            self.counter.record(layer, ids)  # nothing to mask: the hooks' hot path
            return
        valid = (ids >= 0) & (ids < self.num_experts) if skip_out_of_range else torch.ones_like(ids, dtype=torch.bool)
        if weights is not None:
            valid &= weights.reshape(ids.shape) != 0
        if mask is not None and mask.shape[0] == ids.shape[0]:
            valid &= mask.unsqueeze(1) != 0
        self.counter.record(layer, ids, valid)

    def _hook_failed(self, layer: int, exc: BaseException | str) -> None:
        """A hook could not count (a model that breaks our assumptions): count it, keep the latest reason for
        stats() and the published health, warn once, and never raise (not even under warnings-as-errors)."""
        try:
            reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
            name = self.layer_names[layer] if 0 <= layer < len(self.layer_names) else f"layer {layer}"
            self._note_failure(f"layer {name}: {reason}")
        except Exception:  # noqa: SIM105 (the last line of defence of the model's forward)
            pass

    def _note_failure(self, message: str) -> None:
        """Record a collector-side failure (hook or step hook); warn the first time. Never raises."""
        self._hook_errors += 1
        self._error = f"hook failed ({self._hook_errors}x): {message}"
        if not self._warned:
            self._warned = True
            with contextlib.suppress(Exception):  # warnings turned into errors must not reach the model
                warnings.warn(f"moe monitor could not count: {message}", RuntimeWarning, stacklevel=3)

    def _collector_health(self) -> dict[str, object]:
        """The collector's own part of the published health (called on the publisher thread)."""
        return {"hook_errors": self._hook_errors, "invalid_ids": self._published_invalid,
                "collector_error": self._error or ""}

    def _release(self, slot: HostSlot) -> None:
        """The publisher is done with a step's host slot: its counts join the running total, and it is free."""
        self.counter.fold(slot)
        self._free_slots.append(slot)

    def _decode_timing(self, job: StepJob) -> core.TimingRecord | None:
        """The TimingRecord of a published step (None when the step timed nothing); publisher thread."""
        if job.timings is None:
            return None
        times_4L = self._timer.read(job.timings)
        return core.TimingRecord(run=self.run, rank=self.rank, world_size=self.world_size, step=job.step,
                                 time_s=job.time_s, dispatch_s_L=times_4L[0], compute_s_L=times_4L[1],
                                 combine_s_L=times_4L[2], layer_s_L=times_4L[3], instance=self.instance)

    def _decode(self, jobs: Sequence[StepJob]) -> list[core.StepRecord]:
        """The StepRecords of finished steps, in order (publisher thread)."""
        unpacked = self.counter.unpack([job.slot.wait() for job in jobs], [job.facts for job in jobs])
        records = []
        for job, step in zip(jobs, unpacked):
            counts, tokens = step.counts_LE, step.tokens
            self._published_invalid += step.invalid
            if job.tokens is not None:
                tokens = job.tokens
            elif tokens < 0:  # never begun: each token has k slots in every layer
                tokens = int(round(counts.sum(axis=1).max() / self.top_k))
            records.append(core.StepRecord(
                run=self.run, rank=self.rank, world_size=self.world_size, step=job.step, time_s=job.time_s,
                phase=job.phase, tokens=tokens, counts_LE=counts, sample_ids_LNK=step.sample_LNK,
                instance=self.instance, scope=self.scope))
        return records
