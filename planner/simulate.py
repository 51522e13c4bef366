"""Replay a trace against a layout schedule and charge every step the time it loses.

Cost model (also README, "Planning layouts" > "Rebalance advisor and simulator"):

- straggler time: in every step t and MoE layer l the layer waits for its busiest GPU beyond the mean,
  ``straggler_s[t] = sum_l (max_g load[t, l, g] - mean_g load[t, l, g]) * seconds_per_token_slot``, where a
  GPU's load is its tokens under the layout in force at step t, split evenly across an expert's replicas
  (planner.loads, the one GPU-load rule), and ``seconds_per_token_slot`` is the time one GPU spends on one token
  routed to one expert of one layer. Default: the gated FFN's 2 x 3 x hidden x moe_intermediate FLOPs at
  400 TFLOP/s effective, about 2.2e-7 s for DeepSeek-V3 (planner.sizes.DEEPSEEK_V3).
- migration time: a change from layout A to layout B copies ``experts_copied(A, B)`` experts (planner.repair:
  one copy = a (layer, GPU, expert) that B holds and A did not; dropped replicas are free), each
  ``bytes_per_expert = 3 x hidden x moe_intermediate x dtype_bytes`` (88 MB for DeepSeek-V3 in bf16). The
  copies share ``link_gbps`` gigabits per second (1e9 bits) in all and serving waits for them:
  ``migration_s = copies x bytes_per_expert x 8 / (link_gbps x 1e9)``. To model G links moving in parallel, pass
  G times one link's bandwidth.
- step-time equivalents: seconds / ``step_seconds``; by default ``step_seconds`` is the mean over the trace of
  a step's perfectly balanced expert time, sum_l mean_g load x seconds_per_token_slot (the same for every
  schedule, since the mean GPU load does not depend on the layout).
- total lost time = sum of straggler time + sum of migration time.

A schedule is a list of changes (step, layout_LP), steps strictly increasing, the first at step 0 (the
layout in force when the trace starts, free); a change at step t is in force from step t on and is paid
at t. Steps are indices into the trace's steps (0 = its first step); changes at or after the trace's end are
not charged. Schedules travel as JSON (``Schedule.to_json`` / ``load_schedule``): one
``physical_to_logical_map`` per change, or a bare layout JSON (SGLang's), which is a static schedule.

Shape legend (README, Conventions): T steps, L layers, E logical experts, P slots, G GPUs, C changes.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .budget import bytes_per_expert
from .io import _is_trace_line, load_counts
from .loads import as_counts, gpu_loads, validated_layout
from .repair import experts_copied
from .sizes import DEEPSEEK_V3

SCHEDULE_VERSION = 1
DEFAULT_TFLOPS = 400.0        # effective expert GEMM throughput behind the default seconds_per_token_slot
DEFAULT_LINK_GBPS = 400.0     # Gb/s shared by a migration's copies (one 400 Gb/s NIC: 50 GB/s)
_CHUNK_STEPS = 512            # steps replayed at once (bounds the [steps, L, P] temporaries)


def _positive(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


@dataclass(frozen=True)
class CostModel:
    """Prices of the simulator (see the module docstring). Defaults: DeepSeek-V3 sizes, 400 TFLOP/s, 400 Gb/s."""
    seconds_per_token_slot: float = (2 * 3 * DEEPSEEK_V3.hidden_size * DEEPSEEK_V3.moe_intermediate_size
                                     / (DEFAULT_TFLOPS * 1e12))
    link_gbps: float = DEFAULT_LINK_GBPS
    bytes_per_expert: int = bytes_per_expert(DEEPSEEK_V3.hidden_size, DEEPSEEK_V3.moe_intermediate_size,
                                             DEEPSEEK_V3.dtype_bytes)
    step_seconds: float | None = None

    def __post_init__(self):
        _positive(self.seconds_per_token_slot, "seconds per token-slot")
        _positive(self.link_gbps, "link bandwidth (Gb/s)")
        _positive(self.bytes_per_expert, "bytes per expert")
        if self.step_seconds is not None:
            _positive(self.step_seconds, "step seconds")

    @classmethod
    def for_sizes(cls, hidden: int = DEEPSEEK_V3.hidden_size,
                  moe_intermediate: int = DEEPSEEK_V3.moe_intermediate_size,
                  dtype_bytes: int = DEEPSEEK_V3.dtype_bytes, tflops: float = DEFAULT_TFLOPS,
                  link_gbps: float = DEFAULT_LINK_GBPS, step_seconds: float | None = None) -> CostModel:
        """Cost model of an expert of these sizes on GPUs of ``tflops`` effective TFLOP/s."""
        tflops = _positive(tflops, "TFLOP/s")
        bpe = bytes_per_expert(hidden, moe_intermediate, dtype_bytes)
        return cls(seconds_per_token_slot=2 * 3 * hidden * moe_intermediate / (tflops * 1e12),
                   link_gbps=link_gbps, bytes_per_expert=bpe, step_seconds=step_seconds)

    def migration_seconds(self, copies: int) -> float:
        """Seconds serving waits while ``copies`` experts move."""
        return copies * self.bytes_per_expert * 8 / (self.link_gbps * 1e9)


@dataclass(frozen=True)
class Change:
    """A layout in force from ``step`` on, with what the policy predicted when it chose it (None: nothing)."""
    step: int
    layout_LP: np.ndarray
    moves: int | None = None
    predicted_gain_s: float | None = None
    predicted_migration_s: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class Schedule:
    """Changes (steps strictly increasing, the first at 0) of layouts [L, P] on ``gpus`` GPUs."""
    gpus: int
    changes: tuple[Change, ...]
    policy: str = "custom"
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        check_schedule(self)

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self.changes]

    def to_json(self) -> dict:
        """Strict-JSON dict; ``physical_to_logical_map`` rows per change (SGLang's name and shape)."""
        rows = []
        for c in self.changes:
            row: dict = {"step": int(c.step), "physical_to_logical_map": np.asarray(c.layout_LP).tolist()}
            if c.moves is not None:
                row["moves"] = int(c.moves)
            if c.predicted_gain_s is not None:
                row["predicted_gain_s"] = float(c.predicted_gain_s)
            if c.predicted_migration_s is not None:
                row["predicted_migration_s"] = float(c.predicted_migration_s)
            if c.reason:
                row["reason"] = c.reason
            rows.append(row)
        return {"schedule_version": SCHEDULE_VERSION, "policy": self.policy, "gpus": int(self.gpus),
                "params": self.params, "changes": rows}


def _whole(value, name: str, minimum: int = 0) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def check_schedule(schedule: Schedule, num_experts: int | None = None, layers: int | None = None) -> None:
    """ValueError unless the schedule is usable: gpus >= 1, at least one change, the first at step 0, steps
    whole and strictly increasing, every layout a valid [L, P] table of the same L (and of ``layers`` and
    experts 0..``num_experts``-1 when given) whose P splits over the GPUs."""
    gpus = _whole(schedule.gpus, "schedule gpus", 1)
    if not schedule.changes:
        raise ValueError("schedule has no changes: it needs at least the layout in force at step 0")
    prev = -1
    shape_L = None
    for i, c in enumerate(schedule.changes):
        step = _whole(c.step, f"schedule change {i}: step")
        if i == 0 and step != 0:
            raise ValueError(f"schedule starts at step {step}: its first change must be at step 0 (the layout "
                             "in force when the trace starts)")
        if step <= prev:
            raise ValueError(f"schedule change {i}: step {step} is not after the previous change's step {prev}")
        prev = step
        try:
            lay = _checked_layout(c.layout_LP, num_experts, gpus)
        except ValueError as exc:
            raise ValueError(f"schedule change {i} (step {step}): {exc}") from None
        n_layers = lay.shape[0]
        if shape_L is None:
            shape_L = n_layers
        elif n_layers != shape_L:
            raise ValueError(f"schedule change {i} (step {step}): {n_layers} layers, the first change has {shape_L}")
        if layers is not None and n_layers != layers:
            raise ValueError(f"schedule has {n_layers} layers, the trace has {layers}")


def _checked_layout(layout_LP, num_experts: int | None, gpus: int) -> np.ndarray:
    """planner.loads.validated_layout when E is known; before (E unknown) only the table: whole ids >= 0,
    [L, P] with P a multiple of the GPUs."""
    if num_experts is not None:
        return validated_layout(layout_LP, num_experts, gpus)
    lay = np.asarray(layout_LP)
    if lay.dtype == object or lay.ndim != 2 or lay.shape[1] == 0 or not np.issubdtype(lay.dtype, np.integer):
        raise ValueError(f"physical_to_logical_map must be a rectangular [layers][slots] table of whole expert "
                         f"ids, got shape {lay.shape} of {lay.dtype}")
    if lay.shape[1] % gpus:
        raise ValueError(f"{lay.shape[1]} slots per layer do not split evenly over {gpus} GPUs")
    if lay.min() < 0:
        raise ValueError("physical_to_logical_map holds negative expert ids")
    return lay


def as_schedule(schedule, gpus: int | None = None) -> Schedule:
    """A Schedule as is, or a list of (step, layout_LP) pairs on ``gpus`` GPUs."""
    if isinstance(schedule, Schedule):
        if gpus is not None and gpus != schedule.gpus:
            raise ValueError(f"schedule is for {schedule.gpus} GPUs, not {gpus}")
        return schedule
    if gpus is None:
        raise ValueError("a schedule given as (step, layout) pairs needs gpus")
    try:
        changes = tuple(Change(step=s, layout_LP=np.asarray(lay)) for s, lay in schedule)
    except (TypeError, ValueError):
        raise ValueError("schedule must be a list of (step, physical_to_logical_map) pairs") from None
    return Schedule(gpus=gpus, changes=changes)


def _optional_number(row: dict, key: str, i: int):
    v = row.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"schedule change {i}: {key} must be a finite number, got {v!r}")
    return v


def schedule_from_json(obj, gpus: int | None = None) -> Schedule:
    """A schedule from its JSON dict (``Schedule.to_json``), or a bare layout JSON
    ({"physical_to_logical_map": ...}, e.g. an SGLang-exported layout) as a static schedule. ``gpus``
    overrides or supplies the GPU count (a bare layout carries none unless it has a "gpus" key).
    ValueError with one message for anything else."""
    if not isinstance(obj, dict):
        raise ValueError("schedule JSON must be an object with 'changes' (a schedule) or "
                         "'physical_to_logical_map' (a layout held static)")
    g = obj.get("gpus") if gpus is None else gpus
    if g is None:
        raise ValueError("schedule JSON says nothing of the GPUs: pass --gpus")
    g = _whole(g, "gpus", 1)
    if "changes" not in obj:
        if "physical_to_logical_map" not in obj:
            raise ValueError("schedule JSON has neither 'changes' nor 'physical_to_logical_map'")
        return Schedule(gpus=g, changes=(Change(step=0, layout_LP=_layout_rows(obj["physical_to_logical_map"], 0)),),
                        policy="static", params={"source": "layout"})
    version = obj.get("schedule_version", SCHEDULE_VERSION)
    if version != SCHEDULE_VERSION:
        raise ValueError(f"schedule_version {version!r} is not supported (this planner reads {SCHEDULE_VERSION})")
    rows = obj["changes"]
    if not isinstance(rows, list):
        raise ValueError("schedule 'changes' must be a list")
    changes = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "step" not in row or "physical_to_logical_map" not in row:
            raise ValueError(f"schedule change {i} must be an object with 'step' and 'physical_to_logical_map'")
        moves = row.get("moves")
        if moves is not None:
            moves = _whole(moves, f"schedule change {i}: moves")
        reason = row.get("reason", "")
        changes.append(Change(step=_whole(row["step"], f"schedule change {i}: step"),
                              layout_LP=_layout_rows(row["physical_to_logical_map"], i), moves=moves,
                              predicted_gain_s=_optional_number(row, "predicted_gain_s", i),
                              predicted_migration_s=_optional_number(row, "predicted_migration_s", i),
                              reason=reason if isinstance(reason, str) else str(reason)))
    policy = obj.get("policy", "custom")
    params = obj.get("params", {})
    return Schedule(gpus=g, changes=tuple(changes), policy=policy if isinstance(policy, str) else "custom",
                    params=params if isinstance(params, dict) else {})


def _layout_rows(rows, i: int) -> np.ndarray:
    """A JSON physical_to_logical_map as int64 [L, P]: whole numbers only (no bools, floats or strings)."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) and r for r in rows):
        raise ValueError(f"schedule change {i}: physical_to_logical_map must be a non-empty [layers][slots] list")
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"schedule change {i}: physical_to_logical_map must have the same slots in every layer")
    if not all(type(v) is int and 0 <= v < 1 << 31 for r in rows for v in r):
        raise ValueError(f"schedule change {i}: physical_to_logical_map must hold whole expert ids >= 0")
    return np.asarray(rows, dtype=np.int64)


def load_schedule(path, gpus: int | None = None) -> Schedule:
    """A schedule (or a layout held static) from a JSON file; ValueError naming the file otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not UTF-8 text (a schedule is JSON)") from None
    except RecursionError:
        raise ValueError(f"{p}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None
    try:
        return schedule_from_json(obj, gpus)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None


def load_trace_steps(path) -> np.ndarray:
    """Per-step counts float64 [T, L, E] from a file: a project trace read through traces.open_trace (a columnar
    ``.parquet`` / ``.arrows`` trace, or JSON lines: ``.jsonl`` / ``.trace`` or a ``.json`` whose first line is
    a trace line; ranks summed, steps in order, a repeated record once; a line or row that does not decode is
    refused, naming the file) or a counts file planner.io.load_counts reads with shape [T, L, E]. The one
    reader of the advisor and the simulator. ValueError naming the file otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    trace = p.suffix.lower() in (".jsonl", ".trace", ".parquet", ".arrows")
    if p.suffix.lower() == ".json":
        try:
            with p.open("r", encoding="utf-8") as handle:
                trace = _is_trace_line(handle.readline())
        except UnicodeDecodeError:
            raise ValueError(f"{p}: not UTF-8 text (a JSON file is text)") from None
    if trace:
        return as_counts(_trace_counts(p), f"{p.name}: counts", ndim=(3,))
    counts = load_counts(p)
    if counts.ndim != 3:
        raise ValueError(f"{p}: counts are one [layers, experts] table; the advisor and the simulator need "
                         "per-step counts [steps, layers, experts] or a trace")
    return counts


def _trace_counts(p: Path) -> np.ndarray:
    """int64 [T, L, E] of a trace through traces.open_trace, ranks summed; ValueError on any bad record."""
    from traces import open_trace  # pyarrow: only for a trace

    with open_trace(p) as reader:
        steps_T = reader.timeline().step_T
        if reader.bad_records:
            raise ValueError(f"{p.name}: {reader.bad_records} record(s) do not decode ({reader.last_error})")
        if steps_T.size == 0:
            raise ValueError(f"{p.name}: the trace holds no step lines")
        counts_TLE = np.zeros((steps_T.size, len(reader.meta.layer_names), reader.meta.num_experts), dtype=np.int64)
        for a in range(0, steps_T.size, _CHUNK_STEPS):
            b = min(steps_T.size, a + _CHUNK_STEPS) - 1
            for rec in reader.read_steps(int(steps_T[a]), int(steps_T[b])):
                counts_TLE[np.searchsorted(steps_T, rec.step)] += rec.counts_LE
        if reader.bad_records:
            raise ValueError(f"{p.name}: {reader.bad_records} record(s) do not decode ({reader.last_error})")
    return counts_TLE


def straggler_tokens(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int) -> np.ndarray:
    """Per step, sum over layers of (max_g - mean_g) GPU load in tokens, float64 [T] (counts [T, L, E])."""
    out = np.empty(counts_TLE.shape[0])
    for a in range(0, counts_TLE.shape[0], _CHUNK_STEPS):
        loads = gpu_loads(counts_TLE[a:a + _CHUNK_STEPS], layout_LP, gpus)        # [t, L, G]
        # max >= mean up to rounding: a mean one ulp above the max must not make a cost negative
        out[a:a + _CHUNK_STEPS] = np.maximum(loads.max(-1) - loads.mean(-1), 0.0).sum(-1)
    return out


@dataclass(frozen=True)
class SimResult:
    """straggler_s_T [T]; per change applied (C of them, the first at step 0): change_steps_C, moves_C,
    migration_s_C (0 for the first). ``step_seconds``: the unit of the step-time equivalents."""
    straggler_s_T: np.ndarray
    change_steps_C: np.ndarray
    moves_C: np.ndarray
    migration_s_C: np.ndarray
    step_seconds: float
    ignored_changes: int = 0

    @property
    def straggler_s(self) -> float:
        return float(self.straggler_s_T.sum())

    @property
    def migration_s(self) -> float:
        return float(self.migration_s_C.sum())

    @property
    def total_s(self) -> float:
        return self.straggler_s + self.migration_s

    @property
    def moves(self) -> int:
        return int(self.moves_C.sum())

    def summary(self) -> dict:
        eq = (lambda s: s / self.step_seconds) if self.step_seconds > 0 else (lambda s: None)
        return {"steps": int(self.straggler_s_T.size), "changes": int(self.change_steps_C.size - 1),
                "moves": self.moves, "straggler_s": self.straggler_s, "migration_s": self.migration_s,
                "total_lost_s": self.total_s, "step_seconds": self.step_seconds,
                "total_lost_steps": eq(self.total_s), "straggler_steps": eq(self.straggler_s),
                "migration_steps": eq(self.migration_s), "ignored_changes": self.ignored_changes}

    def to_json(self) -> dict:
        return {"summary": self.summary(),
                "changes": [{"step": int(s), "moves": int(m), "migration_s": float(x)}
                            for s, m, x in zip(self.change_steps_C, self.moves_C, self.migration_s_C)],
                "straggler_s_per_step": self.straggler_s_T.tolist()}


def simulate(counts_TLE, schedule, cost: CostModel | None = None, gpus: int | None = None) -> SimResult:
    """Replay per-step counts [T, L, E] (T >= 1) under ``schedule`` (a Schedule, or (step, layout_LP) pairs
    with ``gpus``) and price every step (module docstring). ValueError for counts or layouts that do not
    fit together."""
    cost = CostModel() if cost is None else cost
    c = as_counts(counts_TLE, "counts", ndim=(3,))
    T, L, E = c.shape
    sched = as_schedule(schedule, gpus)
    check_schedule(sched, num_experts=E, layers=L)
    g = sched.gpus
    applied = [ch for ch in sched.changes if ch.step < T]
    straggler = np.empty(T)
    moves, migration = [0], [0.0]
    bounds = [ch.step for ch in applied] + [T]
    for k, ch in enumerate(applied):
        lay = np.asarray(ch.layout_LP, dtype=np.int64)
        straggler[bounds[k]:bounds[k + 1]] = straggler_tokens(c[bounds[k]:bounds[k + 1]], lay, g)
        if k:
            m = experts_copied(np.asarray(applied[k - 1].layout_LP, dtype=np.int64), lay, g)
            moves.append(m)
            migration.append(cost.migration_seconds(m))
    step_s = cost.step_seconds
    if step_s is None:
        step_s = float(c.sum((1, 2)).mean() / g * cost.seconds_per_token_slot)
    return SimResult(straggler_s_T=straggler * cost.seconds_per_token_slot,
                     change_steps_C=np.array([ch.step for ch in applied], dtype=np.int64),
                     moves_C=np.array(moves, dtype=np.int64), migration_s_C=np.array(migration),
                     step_seconds=step_s, ignored_changes=len(sched.changes) - len(applied))
