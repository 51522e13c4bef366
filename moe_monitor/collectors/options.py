"""MonitorOptions: the collector's tuning knobs, checked once when they are made.

    attach(model, redis_url=..., run=..., sample_tokens=0, nvml=False)       # overrides by name
    opts = MonitorOptions(gpus=32, nodes=4, trace_path="run.jsonl")
    attach(model, redis_url=..., run=..., options=opts, queue_s=120)         # both: the names win

Identity (run, Redis URL, device, model sizes) stays an explicit argument of ExpertLoadMonitor / attach.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moe_monitor import core
from moe_monitor.core.dispatch import DISPATCH_POLICIES
from moe_monitor.core.hardware import find_profile


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class MonitorOptions:
    """How a monitor samples, lays out, buffers and publishes. Every field has a working default.

    sample_tokens: top-k rows of that many tokens per layer (every stride-th token of the batch) travel with
        one step in sample_every, for the traffic model; 0 turns sampling off.
    gpus, nodes: the expert-parallel group the layout describes (gpus default: the world size when
        distributed, else the largest of 32, 16, 8, 4, 2, 1 that divides E).
    physical_to_logical_map: the current layout [L][P] (SGLang's name); default contiguous over gpus.
    queue_s, queue_bytes: what each sink keeps while it is unreachable, before the oldest are dropped (and
        counted): the steps of the last queue_s seconds (at least the newest 1,024, whatever their age), so a
        decode loop at 190 steps/s keeps as many seconds as one at 5; never more than queue_bytes of records
        (each its counts and sampled rows plus ~1 kB; timings and physical counts get a quarter of it each:
        at most 1.5 x queue_bytes a sink); what that holds at DeepSeek-V3's size: docs/collectors.md. The bounds hold at any step rate: the publisher keeps taking steps off the host
        slots every flush interval (and as soon as half of them are in use) while a sink backs off or hangs
        in a write; only that sink's writes wait. A batch being written (at most 256 steps) is held on top.
    queue_steps: a fixed number of steps instead of queue_s (None: by seconds); queue_bytes still applies.
    host_slots: host copies of the step buffer in flight to the publisher thread; a step that finds none
        free is dropped (and counted), never waited for. Each is the step's counts and sampled rows in int32
        (pinned memory on CUDA): 256 of DeepSeek-V3's 58 x 256 experts, 16 sampled tokens, take 256 x 89 kB, about
        23 MB.
    publish_interval_s: how often the publisher thread takes the finished steps (at once when half the host
        slots are in use) and the writers send them: a step reaches Redis within about this. A round's fixed
        costs (a health record, a few commands besides the steps, thread wake-ups) are shared by its steps
        (CPU per published step: docs/collectors.md, `python -m bench.publishing`).
    memory_budget_bytes: the Redis step stream is trimmed (MAXLEN ~) to stay near this size.
    nvml, nvml_interval_s: sample the GPUs with NVML every interval (clamped to 0.25-1 s).
    redis_timeout_s: socket (and connect) timeout of the publisher's Redis client: a write to a Redis that
        hangs gives up after about this (connect, then the reply), on the Redis sink's own thread.
    trace_path: also append every step and NVML sample to this JSON-lines trace file.
    trace_max_bytes: size cap of the trace file (None: no cap). A batch that would take the file past it
        first rotates it, once: `<trace_path>` is renamed to `<trace_path>.1` (replacing the previous one)
        and a new `<trace_path>` starts with the metadata line, so each file replays on its own and the two
        together hold at most about 2 x trace_max_bytes. A single line longer than the cap still goes in.
    rank, world_size: this publisher's index among the run's publishers and how many there are (default: from
        torch.distributed, else RANK / WORLD_SIZE, else 0 of 1). An engine whose ranks do not all publish
        (tensor-parallel attention: one rank per data-parallel group) sets them to its publishers' numbering.
    scope: whose tokens a step record counts (core.SCOPES): "rank", the tokens this rank routed (one process,
        data-parallel attention); "dp-group", the tokens of this rank's data-parallel group, published by one
        of its tensor-parallel ranks on behalf of all. Either way the reader's sum over ranks counts each
        token once.
    dispatch: how the engine shares an expert's tokens among its replicas (core.dispatch.DISPATCH_POLICIES),
        written to the run's metadata: the vLLM plugin sets "round_robin" (vLLM's EPLB), the default "even".
    gpu_profile: the GPU the cost model prices (a core.hardware.GPU_PROFILES name, "H100 SXM"); "": the
        readers take it from the GPUs' NVML names.
    """

    sample_tokens: int = 16
    sample_every: int = 4
    gpus: int | None = None
    nodes: int = 1
    physical_to_logical_map: Sequence[Sequence[int]] | None = None
    queue_s: float = 60.0
    queue_bytes: int = 256 << 20
    queue_steps: int | None = None
    host_slots: int = 256
    publish_interval_s: float = 0.25
    memory_budget_bytes: int = 256 << 20
    nvml: bool = True
    nvml_interval_s: float = 0.5
    redis_timeout_s: float = 1.0
    trace_path: str | os.PathLike[str] | None = None
    trace_max_bytes: int | None = 1 << 30
    rank: int | None = None
    world_size: int | None = None
    scope: str = "rank"
    dispatch: str = "even"
    gpu_profile: str = ""

    def __post_init__(self) -> None:
        for name, least in (("sample_tokens", 0), ("sample_every", 1), ("nodes", 1), ("queue_steps", 1),
                            ("host_slots", 1), ("memory_budget_bytes", 1), ("queue_bytes", 1)):
            value = getattr(self, name)
            if name == "queue_steps" and value is None:
                continue
            if not _is_int(value) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if self.trace_max_bytes is not None and (not _is_int(self.trace_max_bytes) or self.trace_max_bytes < 1):
            raise ValueError(f"trace_max_bytes must be a positive integer (or None for no cap), "
                             f"got {self.trace_max_bytes!r}")
        if self.gpus is not None and (not _is_int(self.gpus) or self.gpus < 1):
            raise ValueError(f"gpus must be a positive integer (or None for the default), got {self.gpus!r}")
        if self.gpus is not None and self.gpus % self.nodes:
            raise ValueError(f"gpus={self.gpus} must be a multiple of nodes={self.nodes}")
        rank, world = self.rank, self.world_size
        if (rank is None) != (world is None) or (rank is not None and world is not None and not (
                _is_int(rank) and _is_int(world) and 0 <= rank < world)):
            raise ValueError(f"rank and world_size go together, 0 <= rank < world_size, got rank={self.rank!r} "
                             f"world_size={self.world_size!r}")
        if self.dispatch not in DISPATCH_POLICIES:
            raise ValueError(f"dispatch must be one of {DISPATCH_POLICIES}, got {self.dispatch!r}")
        if self.gpu_profile:
            find_profile(self.gpu_profile)
        if self.scope not in core.SCOPES:
            raise ValueError(f"scope must be one of {core.SCOPES}, got {self.scope!r}")
        if not isinstance(self.nvml, bool):
            raise ValueError(f"nvml must be True or False, got {self.nvml!r}")
        for name in ("nvml_interval_s", "redis_timeout_s", "publish_interval_s", "queue_s"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.trace_path is not None and not (isinstance(self.trace_path, (str, os.PathLike))
                                                and os.fspath(self.trace_path)):
            raise ValueError(f"trace_path must be a file path (or None), got {self.trace_path!r}")
        if self.physical_to_logical_map is not None:
            rows = self.physical_to_logical_map
            if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not all(
                    isinstance(row, Sequence) and all(_is_int(v) for v in row) for row in rows):
                raise ValueError("physical_to_logical_map must be a list of rows of integer expert ids [L][P]")
            # stored as tuples: the options are frozen, and a caller's later edit of its list changes nothing
            object.__setattr__(self, "physical_to_logical_map", tuple(tuple(row) for row in rows))


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(MonitorOptions))


def resolve_options(options: MonitorOptions | None, overrides: Mapping[str, Any]) -> MonitorOptions:
    """options (default: MonitorOptions()) with the fields named in overrides replaced. An unknown name raises
    TypeError listing the valid ones; a bad value raises ValueError."""
    if options is not None and not isinstance(options, MonitorOptions):
        raise TypeError(f"options must be a MonitorOptions, got {type(options).__name__}")
    unknown = sorted(set(overrides) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown monitor option(s) {', '.join(unknown)}; the options are: {', '.join(OPTION_NAMES)}")
    base = options if options is not None else MonitorOptions()
    return dataclasses.replace(base, **overrides) if overrides else base
