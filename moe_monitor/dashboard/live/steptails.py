"""Per-step figures of a live window under a dispatch policy, computed once per step (core.steptails defines
them); the load pages read them through LiveTails.

Kept per ring row of the StepWindow with the row's version and layout key, as the window keeps its GPU loads: a
tick solves only rows that are new or changed. lp solves at most LP_ROWS_PER_CALL rows a call, the newest first
(LiveTails.pending). The arrays reserve their bytes from the window's memory budget and go with the window (weak
reference), one set per policy. Costs: docs/dashboard.md, "Inside the window".

Shape legend: C ring capacity, T rows in the view, L layers, E experts, P slots, G GPUs.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from moe_monitor.core import membudget
from moe_monitor.core.dispatch import DispatchModel, check_policy
from moe_monitor.core.steptails import StepTails, pair_imbalance, pair_skew
from moe_monitor.core.timeline import index_in_force
from moe_monitor.dashboard.live.layout import ResolvedLayout
from moe_monitor.dashboard.live.window import StepWindow

LP_ROWS_PER_CALL = 96  # lp rows solved per call at most (~0.6 s at 58 layers x 32 GPUs); other policies: all


@dataclass(frozen=True)
class LiveTails:
    """The per-step figures of the rows of a view done so far: tails (core.steptails.StepTails over those rows,
    oldest first), step_T int64 [T'] their steps, rows_in_view: rows the view holds, solved_now: rows this call
    computed (0 once the window has been seen: only new steps cost a tick)."""

    tails: StepTails
    step_T: np.ndarray
    rows_in_view: int
    solved_now: int

    @property
    def pending(self) -> int:
        """Rows of the view whose figures are not computed yet (lp catching up on a backlog)."""
        return self.rows_in_view - self.tails.steps


class RowTails:
    """The per-step figures of every ring row of one window under one policy: imbalance_CL and skew_CL float64
    [C, L] (NaN: idle pair or not computed), loads_CLG float32 [C, L, G] the row's GPU loads under the policy
    (for the window imbalance), with the row version and layout key each row was computed under."""

    def __init__(self, window: StepWindow, policy: str, gpus: int):
        self.policy, self.gpus = check_policy(policy), int(gpus)
        C, L = window.capacity, window.num_layers
        nbytes = C * L * (16 + 4 * self.gpus) + C * 16
        held = window.budget.try_reserve(nbytes)
        if held is None:
            raise ValueError(f"per-step figures of this window ({C} steps x {L} layers x {gpus} GPUs, {policy}) need "
                             f"{membudget.format_bytes(nbytes)} and {window.budget.describe()} has "
                             f"{membudget.format_bytes(window.budget.available_bytes)} left")
        self._reservation = held
        self.imbalance_CL = np.full((C, L), np.nan)
        self.skew_CL = np.full((C, L), np.nan)
        self.loads_CLG = np.zeros((C, L, self.gpus), dtype=np.float32)
        self.version_C = np.full(C, -1, dtype=np.int64)
        self.key_C = np.zeros(C, dtype=np.int64)
        self._models: dict[int, DispatchModel] = {}
        self.lock = threading.Lock()  # one update at a time (sessions share nothing else; the exporter polls alone)

    def update(self, window: StepWindow, slots_T: np.ndarray, layout: ResolvedLayout,
               max_rows: int | None = None) -> LiveTails:
        """Solve the rows of slots_T (ring rows, oldest first) not yet computed under the layout in force at their
        step (at most max_rows, the newest first), and give the figures of the rows done."""
        slots_T = np.asarray(slots_T, dtype=np.int64)
        maps = _layout_keys(layout)
        keys_T = _keys_at(layout, window.step_C[slots_T], maps)
        stale = (self.version_C[slots_T] != window.row_version_C[slots_T]) | (self.key_C[slots_T] != keys_T)
        todo = np.flatnonzero(stale)
        if max_rows is not None:
            todo = todo[::-1][:max(0, int(max_rows))][::-1]  # the newest first
        for key in np.unique(keys_T[todo]).tolist():
            rows = slots_T[todo[keys_T[todo] == key]]
            model = self._model(key, maps[key], window.num_experts)
            for a in range(0, rows.size, model.steps_per_chunk):
                self._solve(window, rows[a:a + model.steps_per_chunk], model)
            self.key_C[rows] = key
        self._models = {k: m for k, m in self._models.items() if k in maps}
        fresh_T = ~stale
        fresh_T[todo] = True
        done = slots_T[fresh_T]  # view order (oldest first)
        tails = StepTails(self.policy, self.imbalance_CL[done], self.skew_CL[done],
                          self.loads_CLG[done].sum(axis=0, dtype=np.float64))
        return LiveTails(tails, window.step_C[done].copy(), int(slots_T.size), int(todo.size))

    def _model(self, key: int, layout_LP: np.ndarray, num_experts: int) -> DispatchModel:
        if key not in self._models:
            self._models[key] = DispatchModel(layout_LP, num_experts, self.gpus, self.policy)
        return self._models[key]

    def _solve(self, window: StepWindow, rows: np.ndarray, model: DispatchModel) -> None:
        slot_TLP = model.slot_loads(window.counts_CLE[rows])
        slot_TLGS = slot_TLP.reshape(slot_TLP.shape[:2] + (self.gpus, model.slots_per_gpu))
        gpu_TLG = slot_TLGS.sum(-1)
        self.imbalance_CL[rows] = pair_imbalance(gpu_TLG)
        self.skew_CL[rows] = pair_skew(slot_TLGS)
        self.loads_CLG[rows] = gpu_TLG
        self.version_C[rows] = window.row_version_C[rows]


def _layout_keys(layout: ResolvedLayout) -> dict[int, np.ndarray]:
    """key -> map [L, P] of every layout the view may use: the schedule's, or the one layout."""
    maps = [change.layout_LP for change in layout.schedule] or [layout.layout_LP]
    return {_key(p2l): np.asarray(p2l) for p2l in maps}


def _keys_at(layout: ResolvedLayout, step_T: np.ndarray, maps: dict[int, np.ndarray]) -> np.ndarray:
    """int64 [T]: the key of the layout in force at each step (core.timeline; before the first change the first)."""
    if not layout.schedule:
        return np.full(step_T.size, next(iter(maps)), dtype=np.int64)
    keys_C = np.fromiter((_key(change.layout_LP) for change in layout.schedule), dtype=np.int64,
                         count=len(layout.schedule))
    starts_C = np.fromiter((change.step for change in layout.schedule), dtype=np.int64, count=len(layout.schedule))
    return keys_C[np.maximum(index_in_force(starts_C, step_T), 0)]


def _key(layout_LP: np.ndarray) -> int:
    p2l = np.asarray(layout_LP, dtype=np.int64)
    return hash((p2l.shape, p2l.tobytes()))


_HELD: weakref.WeakKeyDictionary[StepWindow, dict[tuple[str, int], RowTails]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def live_tails(window: StepWindow, slots_T: np.ndarray, layout: ResolvedLayout, policy: str,
               max_rows: int | None = -1) -> LiveTails:
    """The per-step figures of the view's rows (slots_T, oldest first) under `policy` and the layout in force at
    each step, from the figures kept beside the window (computed once per step). max_rows: rows solved this call
    at most (-1: LP_ROWS_PER_CALL for lp, every row otherwise; None: every row). ValueError for a rollup window
    (rows are bucket sums: no single steps) or when the memory budget cannot hold the figures."""
    if window.resolution_s:
        raise ValueError("rollup buckets are sums of steps: per-step figures need full resolution")
    check_policy(policy)
    if max_rows == -1:
        max_rows = LP_ROWS_PER_CALL if policy == "lp" else None
    with _LOCK:
        per_window = _HELD.setdefault(window, {})
        for other in [k for k in per_window if k[1] != layout.gpus]:  # another GPU count: those figures are moot
            del per_window[other]
        rows = per_window.get((policy, layout.gpus))
        if rows is None:
            rows = per_window[(policy, layout.gpus)] = RowTails(window, policy, layout.gpus)
    with rows.lock:
        return rows.update(window, slots_T, layout, max_rows)
