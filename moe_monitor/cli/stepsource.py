"""Per-step counts for score and diagnose: from a trace or counts file, or from a live run in Redis, with the
layout in force at the first step and its GPUs where the source says.

Per-step counts [T, L, E] come from a trace or counts file (planner.io.load_trace_steps) or from a live run's newest
steps in Redis (ranks summed per step; the aggregator's summed steps when it runs); the layout in force is the
trace's or run's at the first step (its metadata's, or the last layout change before).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moe_monitor import core

LIVE_WINDOW_STEPS = 2000      # --steps default: the newest steps read from Redis
LIVE_READ_S = 60.0            # a live read gives up after this long


def add_source_flags(parser, file_flag: str, file_help: str) -> None:
    """The source flags of score and diagnose: `file_flag` FILE or --redis URL (one of them), --run, --steps."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(file_flag, metavar="FILE", help=file_help)
    src.add_argument("--redis", metavar="URL", help="read a live run from this Redis (with --run)")
    parser.add_argument("--run", metavar="NAME", help="the live run's name (with --redis)")
    parser.add_argument("--steps", type=int, default=LIVE_WINDOW_STEPS,
                        help=f"newest steps of the live run read (default {LIVE_WINDOW_STEPS})")


def check_source_flags(args) -> None:
    """ValueError unless --redis and --run come together (or neither)."""
    if (args.redis is None) != (args.run is None):
        raise ValueError("--redis URL and --run NAME go together")


@dataclass
class Source:
    """Per-step counts float64 [T, L, E], the layout in force at the first step (None: unknown), its GPUs, the
    run's metadata (None: a counts file) and the NVML device names a live run reported."""
    counts_TLE: np.ndarray
    layout_LP: np.ndarray | None
    gpus: int | None
    notes: list[str]
    meta: core.RunMeta | None = None
    device_names: list[str] = field(default_factory=list)


TRACE_SUFFIXES = (".parquet", ".arrows", ".jsonl", ".trace")


def is_trace(path) -> bool:
    """Whether the file is a project trace (a trace container, or a .json that starts as a trace line: its first
    bytes, never a whole line)."""
    from moe_monitor.planner.io import looks_like_trace
    p = Path(path)
    if p.suffix.lower() in TRACE_SUFFIXES:
        return True
    return p.suffix.lower() == ".json" and p.is_file() and looks_like_trace(p)


def check_steps_shape(path, gpus: int, layout_LP: np.ndarray | None = None, replan: bool = False,
                      redundant: int | None = None) -> None:
    """Before any count is loaded: a trace's steps x layers x experts within the decoded-bytes budget
    (planner.io.check_counts_shape), its layers those of layout_LP, and with `replan` (diagnose) the planner's
    size limit (planner.loads.check_size) for E + redundant slots (default: the layout's, else E). A counts file
    is bounded by its own reader instead."""
    from moe_monitor.planner.io import check_counts_shape, steps_shape
    shape = steps_shape(path)
    if shape is None:
        return
    steps, layers, num_experts = shape
    check_counts_shape(Path(path).name, steps, layers, num_experts)
    if layout_LP is not None and layout_LP.shape[0] != layers:
        raise ValueError(f"the layout has {layout_LP.shape[0]} layers, the trace has {layers}")
    if replan and gpus >= 1:
        from moe_monitor.planner.loads import check_size
        slots = num_experts + redundant if redundant is not None else \
            int(layout_LP.shape[1]) if layout_LP is not None else num_experts
        check_size(layers, num_experts, gpus, slots)


def load_steps(path) -> np.ndarray:
    """Per-step counts float64 [T, L, E] of a trace or a counts file (planner.io.load_trace_steps); a counts file
    holding one [L, E] table is refused with words for score and diagnose."""
    from moe_monitor.planner.io import load_counts, load_trace_steps
    if is_trace(path) or not Path(path).is_file():
        return load_trace_steps(path)
    counts = load_counts(path)
    if counts.ndim != 3:
        raise ValueError(f"{path}: one [layers, experts] table has no steps; give per-step counts "
                         "[steps, layers, experts] (one entry per step) or a trace")
    return counts


def contiguous_layout_LP(layers: int, num_experts: int) -> np.ndarray:
    """The default layout int64 [L, E]: slot p holds expert p in every layer."""
    return np.tile(np.arange(num_experts, dtype=np.int64), (layers, 1))


def read_trace(path: str) -> Source:
    """A trace's per-step counts and the layout in force at its first step; a counts file's counts alone."""
    counts = load_steps(path)
    if not is_trace(path):
        return Source(counts, None, None, [])
    from moe_monitor.core.tracefile import open_trace
    with open_trace(Path(path)) as reader:
        steps_T = reader.timeline().step_T
        meta = reader.meta
        layout, gpus = np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64), meta.layout.gpus
        records = reader.layouts_in_force(int(steps_T[0]), int(steps_T[-1]))
    return _with_changes(Source(counts, layout, gpus, [], meta), records, int(steps_T[0]))


def trace_meta(path: str) -> core.RunMeta | None:
    """The run metadata of a trace (its model's dimensions, GPU profile); None for a counts file."""
    if not is_trace(path):
        return None
    from moe_monitor.core.tracefile import open_trace
    with open_trace(Path(path)) as reader:
        return reader.meta


def _with_changes(src: Source, records: list[core.LayoutRecord], first_step: int) -> Source:
    """The layout record in force at first_step (when any) replaces the metadata's; later changes are noted."""
    fitting = [rec for rec in records if rec.gpus == src.gpus and rec.num_layers == src.counts_TLE.shape[1]]
    if fitting and fitting[0].step <= first_step:
        src.layout_LP = np.asarray(fitting[0].layout_LP, dtype=np.int64)
        fitting = fitting[1:]
    if fitting:
        src.notes.append(f"{len(fitting)} layout change(s) inside the window are not followed: the layout in force "
                         "at the first step is held")
    return src


def read_live(url: str, run: str, steps: int) -> Source:
    """The newest ``steps`` steps of a live run (ranks summed per step, or the aggregator's sums) and the layout in
    force at the first of them. ValueError when the run has no metadata or no steps; Redis errors propagate."""
    from moe_monitor.dashboard.sources.redis import RedisSource  # the dashboard's own reader of a live run
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    core.check_run_name(run)
    client = core.connect(url, timeout_s=5.0)
    try:
        client.ping()
        source = RedisSource(client, url, run, steps)
        per_step: dict[int, np.ndarray] = {}
        ranks: dict[int, int] = {}                      # per-rank records of each step (aggregates: the world)
        layouts: list[core.LayoutRecord] = []
        names: set[str] = set()
        deadline = time.monotonic() + LIVE_READ_S
        quiet = 0
        while time.monotonic() < deadline:
            batch = source.poll(4000)
            health = source.health()
            if not health.reachable:
                raise ValueError(f"Redis: {health.error}")
            for rec in batch.steps:
                _add(per_step, rec.step, rec.counts_LE)
                ranks[rec.step] = ranks.get(rec.step, 0) + 1
            for agg in batch.aggregates:
                _add(per_step, agg.step, agg.counts_LE)
                ranks[agg.step] = 1 << 30
            layouts.extend(batch.layouts)
            names.update(gpu["name"] for sample in batch.gpu_samples for gpu in sample.gpus
                         if isinstance(gpu.get("name"), str) and gpu["name"])
            got = bool(batch.steps or batch.aggregates)
            quiet = 0 if batch.more or got else quiet + 1
            if quiet >= 2:                              # the window is read (or the run has none)
                break
            if not batch.more and not got:
                time.sleep(0.05)
    finally:
        client.close()
    meta = source.meta()
    if meta is None:
        raise ValueError(f"run {run!r} has no metadata in Redis" + (f" ({source.meta_error})" if source.meta_error
                                                                     else ""))
    shape = (len(meta.layer_names), meta.num_experts)
    kept = sorted(s for s, c in per_step.items() if c.shape == shape)
    if len(kept) > 1 and ranks[kept[-1]] < meta.world_size:  # the newest step: not every rank has written it yet
        kept = kept[:-1]
    kept = kept[-steps:]
    if not kept:
        raise ValueError(f"run {run!r} has no step records in Redis")
    counts = np.stack([per_step[s] for s in kept]).astype(np.float64)
    valid: list[core.LayoutRecord] = []
    for change in layouts:
        with contextlib.suppress(ValueError):       # a change that does not fit the run: left out
            valid.append(change.validate(meta.num_experts, num_layers=len(meta.layer_names), unused=True))
    before = [change for change in valid if change.step <= kept[0]][-1:]
    src = Source(counts, np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64), meta.layout.gpus,
                 [f"live run {run}: steps {kept[0]}..{kept[-1]}"], meta, sorted(names))
    return _with_changes(src, before + [c for c in valid if kept[0] < c.step <= kept[-1]], kept[0])


def _add(per_step: dict[int, np.ndarray], step: int, counts_LE: np.ndarray) -> None:
    counts = np.asarray(counts_LE, dtype=np.int64)
    held = per_step.get(step)
    per_step[step] = counts if held is None or held.shape != counts.shape else held + counts
