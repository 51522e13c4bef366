"""Layout schedules: changes (step, layout_LP), steps strictly increasing, the first at step 0 (the layout in
force when the trace starts); a change at step t is in force from step t on. Schedules travel as JSON
(``Schedule.to_json`` / ``load_schedule``): one ``physical_to_logical_map`` per change (SGLang's name and shape),
or a bare layout JSON (SGLang's export), which is a static schedule. planner/simulate.py prices them,
planner/advisor.py writes them.

Shape legend (README, Conventions): L layers, P slots, C changes.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moe_monitor.core.loadmodel import validated_layout

from .loads import whole_number

SCHEDULE_VERSION = 1


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



def check_schedule(schedule: Schedule, num_experts: int | None = None, layers: int | None = None) -> None:
    """ValueError unless the schedule is usable: gpus >= 1, at least one change, the first at step 0, steps
    whole and strictly increasing, every layout a valid [L, P] table of the same L (and of ``layers`` and
    experts 0..``num_experts``-1 when given) whose P splits over the GPUs."""
    gpus = whole_number(schedule.gpus, "schedule gpus", 1)
    if not schedule.changes:
        raise ValueError("schedule has no changes: it needs at least the layout in force at step 0")
    prev = -1
    shape_L = None
    for i, c in enumerate(schedule.changes):
        step = whole_number(c.step, f"schedule change {i}: step", 0)
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
    """core.loadmodel.validated_layout when E is known; before (E unknown) only the table: whole ids >= 0,
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
    g = whole_number(g, "gpus", 1)
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
            moves = whole_number(moves, f"schedule change {i}: moves", 0)
        reason = row.get("reason", "")
        changes.append(Change(step=whole_number(row["step"], f"schedule change {i}: step", 0),
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
