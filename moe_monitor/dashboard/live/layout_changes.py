"""The layout changes of a watched run (core.LayoutRecord: an engine's EPLB rebalance, a layout applied by
hand): which physical_to_logical_map is in force from which step, kept bounded, and where the figures mark
them. Pure: no Streamlit, no I/O.

Shape legend: L layers, P physical slots (slot p on GPU p // (P / gpus)), E logical experts, T steps.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core.costmodel import ModelDims
from moe_monitor.core.layouts import unused_for_copies
from moe_monitor.core.timeline import MAX_CHANGES, LayoutTimeline, index_in_force
from moe_monitor.planner.rebalances import RebalanceHealth, rebalance_health
from moe_monitor.planner.repair import experts_copied

MARK_LABELS = {"engine": "engine rebalanced", "apply": "layout applied", "initial": "initial layout"}


@dataclass(frozen=True)
class LayoutChange:
    """A layout in force from step id `step` on, until the next change.

    layout_LP: int64 [L, P] (read-only) physical_to_logical_map; gpus, nodes as in core.Layout; source: one of
    core.LAYOUT_SOURCES, or "run metadata" / "contiguous default" for the layout a run starts with; time_s: unix seconds it was issued
    (None for the metadata's); instance: the collector that published it; key: a hash of the map, the step
    window's cache key (equal maps, equal keys)."""

    step: int
    layout_LP: np.ndarray
    gpus: int
    nodes: int
    source: str
    key: int
    time_s: float | None = None
    instance: str = ""

    @staticmethod
    def of(step: int, layout_LP, gpus: int, nodes: int, source: str, time_s: float | None = None,
           instance: str = "") -> LayoutChange:
        """A LayoutChange with its map as a read-only int64 copy and its key computed (once)."""
        layout_LP = np.array(layout_LP, dtype=np.int64)
        layout_LP.setflags(write=False)
        return LayoutChange(step=int(step), layout_LP=layout_LP, gpus=int(gpus), nodes=int(nodes), source=source,
                            key=hash(layout_LP.tobytes()), time_s=time_s, instance=instance)

    @property
    def label(self) -> str:
        """How a figure marks it: "engine rebalanced", "layout applied", "initial layout" ("" for the layout a
        run starts with, which is no change)."""
        return MARK_LABELS.get(self.source, "")


def change_from_record(rec: core.LayoutRecord, num_layers: int, num_experts: int) -> LayoutChange:
    """rec as a LayoutChange once it fits a run of num_layers x num_experts (every expert in every row, P a
    multiple of gpus, gpus of nodes: LayoutRecord.validate), its step an id within core/keys.py's bounds,
    its source known and its time finite; ValueError naming what is wrong. (Records from
    core.decode_layout_record pass all but the fit; this guards against any other source too.)"""
    try:
        step = operator.index(rec.step)
    except TypeError:
        raise ValueError(f"layout step must be an integer, got {type(rec.step).__name__}") from None
    if isinstance(rec.step, bool) or not 0 <= step < core.MAX_STEP:
        raise ValueError(f"layout step is outside 0..{core.MAX_STEP - 1}")
    if rec.source not in core.LAYOUT_SOURCES:
        raise ValueError(f"unknown layout source {str(rec.source)[:40]!r}")
    try:
        time_s = float(rec.time_s)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"layout time must be a number, got {type(rec.time_s).__name__}") from None
    if not (math.isfinite(time_s) and abs(time_s) < core.MAX_TIME_S):
        raise ValueError("layout time is not a finite time")
    if not isinstance(rec.instance, str) or len(rec.instance) > core.MAX_NAME_CHARS:
        raise ValueError(f"collector instance id must be text of at most {core.MAX_NAME_CHARS} characters")
    rec.validate(num_experts, num_layers=num_layers, unused=True)  # -1: an unused slot (vLLM's), it serves nothing
    return LayoutChange.of(step, rec.layout_LP, rec.gpus, rec.nodes, rec.source, time_s,
                           rec.instance)


class LayoutHistory:
    """The run's layout changes, ascending by step, at most max_changes (the oldest forgotten first, counted in
    `forgotten`): the layout timeline (core.timeline) of checked LayoutChange records. A change for a step that
    already has one replaces it."""

    def __init__(self, max_changes: int = MAX_CHANGES):
        self._timeline: LayoutTimeline[LayoutChange] = LayoutTimeline(max_changes)
        self.max_changes = max_changes

    @property
    def changes(self) -> tuple[LayoutChange, ...]:
        return tuple(self._timeline.items)

    @property
    def forgotten(self) -> int:
        return self._timeline.forgotten

    def __len__(self) -> int:
        return len(self._timeline)

    def add(self, change: LayoutChange) -> None:
        self._timeline.add(change.step, change)

    def forget(self, instance: str) -> None:
        """Drop the changes a retired collector instance published (its step ids are not the new ones')."""
        self._timeline.remove_if(lambda change: change.instance == instance)


def in_force(schedule: Sequence[LayoutChange], step: int) -> LayoutChange | None:
    """The change of schedule (ascending by step) in force at `step`: the last one with change.step <= step."""
    at = int(index_in_force([c.step for c in schedule], [step])[0])
    return schedule[at] if at >= 0 else None


@dataclass(frozen=True)
class LayoutMark:
    """A layout change to mark on a time axis: the step it took force, the time of that step (unix s, the
    first step of the view at or after it), and the label ("engine rebalanced", "layout applied")."""

    step: int
    time_s: float
    label: str


def change_marks(schedule: Sequence[LayoutChange], step_T: np.ndarray, time_s_T: np.ndarray) -> list[LayoutMark]:
    """Marks for the changes that happen inside a view of steps step_T (ascending) at times time_s_T [T]: a
    change is in view when steps on both sides of it are (step_T[0] < change.step <= step_T[-1]). The
    layout a run starts with is not a change and gets no mark."""
    step_T = np.asarray(step_T)
    if step_T.size == 0:
        return []
    first, last = int(step_T[0]), int(step_T[-1])
    marks = []
    for change in schedule:
        if change.label and first < change.step <= last:
            at = int(np.searchsorted(step_T, change.step, side="left"))
            marks.append(LayoutMark(change.step, float(time_s_T[at]), change.label))
    return marks


MAX_MOVES_MEMO = 4096  # (layout before, layout after, GPUs) pairs whose expert copies rebalances_of remembers
_MOVES_MEMO: dict[tuple[int, int, int], int] = {}


def rebalances_of(meta: core.RunMeta | None, changes: Sequence[LayoutChange], now_s: float) -> RebalanceHealth:
    """A run's layout changes as rebalance health (planner.rebalances): moves counted from the metadata's layout
    (each pair of layouts once: by their keys), bytes from the expert's size where the metadata has the model's
    dimensions. Every tick of a live page asks; without changes it costs nothing."""
    timed = [(c.time_s, c.layout_LP, c.gpus, c.source) for c in changes if c.time_s is not None]
    if not timed:
        return rebalance_health([], now_s)
    initial = None if meta is None else np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64)
    key_of = {id(c.layout_LP): c.key for c in changes}
    if initial is not None:
        key_of[id(initial)] = hash(initial.tobytes())

    def copied(before: np.ndarray, after: np.ndarray, gpus: int) -> int:
        pair = (key_of[id(before)], key_of[id(after)], gpus)
        if pair not in _MOVES_MEMO:
            if len(_MOVES_MEMO) >= MAX_MOVES_MEMO:
                _MOVES_MEMO.clear()
            _MOVES_MEMO[pair] = experts_copied(*unused_for_copies(before, after, gpus), gpus)
        return _MOVES_MEMO[pair]

    try:
        dims = None if meta is None else ModelDims.from_meta(meta)
    except ValueError:
        dims = None
    return rebalance_health(timed, now_s, initial_LP=initial, expert_bytes=None if dims is None else dims.expert_bytes,
                            copied=copied)
