"""The replica layout in force at each step of a run, for the rollups' GPU loads. Pure: no I/O.

The run's metadata layout is in force from step 0 (when it fits the steps' [L, E]; otherwise, or when the
run has no metadata, the contiguous layout over core.default_gpus(E, world) GPUs); each layout change
(core.LayoutRecord: an engine's rebalance, a layout applied by hand) from its step on, within the epoch whose
collectors published it (step ids start again when the collectors restart). Each map is checked once
(core.loadmodel.validated_layout); the rollups compute GPU loads from it with core.loadmodel.gpu_loads.

Shape legend: L layers, E logical experts, P physical slots, G GPUs, T steps.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from moe_monitor import core
from moe_monitor.core.loadmodel import validated_layout
from moe_monitor.core.timeline import LayoutTimeline

MAX_CHANGES = 1024  # layout changes kept per epoch (the collectors' layout stream keeps ~1000)
MAX_EPOCHS = 4  # epochs whose changes are kept (the current one and the last few)
MAX_CHECKED = 16  # layouts whose check is remembered


class LayoutBook:
    """Layouts by epoch and step; layouts(epoch, step_T, L, E, world) groups steps by the layout in force."""

    def __init__(self) -> None:
        self._base: tuple[np.ndarray, int, int] | None = None  # (layout_LP, gpus, key) of the run metadata
        self._changes: dict[str, LayoutTimeline[tuple[np.ndarray, int, int]]] = {}  # epoch -> its changes
        self._checked_layouts: OrderedDict[Hashable, np.ndarray] = OrderedDict()  # maps that passed the check

    def set_base(self, layout_LP: np.ndarray | list[list[int]] | None, gpus: int | None) -> None:
        """The run metadata's layout [L, P] on `gpus` GPUs (None: the run has none: contiguous default)."""
        if layout_LP is None or gpus is None:
            self._base = None
            return
        layout = np.array(layout_LP, dtype=np.int64)
        key = hash((layout.tobytes(), layout.shape, int(gpus)))
        if self._base is None or self._base[2] != key:
            self._base = (layout, int(gpus), key)

    def add(self, epoch: str, step: int, layout_LP: np.ndarray, gpus: int) -> None:
        """A layout in force from `step` on in `epoch` (checked by the caller against the run's [L, E]). A
        change for a step that has one replaces it (every rank may publish the same rebalance)."""
        layout = np.array(layout_LP, dtype=np.int64)
        entry = (layout, int(gpus), hash((layout.tobytes(), layout.shape, int(gpus))))
        self._changes.setdefault(epoch, LayoutTimeline(MAX_CHANGES)).add(step, entry)
        while len(self._changes) > MAX_EPOCHS:
            oldest = next(iter(self._changes))
            if oldest == epoch:
                break
            del self._changes[oldest]

    def changes(self, epoch: str) -> int:
        """How many layout changes are known for `epoch`."""
        timeline = self._changes.get(epoch)
        return 0 if timeline is None else len(timeline)

    def layouts(self, epoch: str, step_T: np.ndarray, num_layers: int, num_experts: int,
                world: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """[(indices into step_T, layout_LP int64 [L, P], G)], one per layout in force among the steps (ascending
        by step id within the epoch), each checked once (core.loadmodel.validated_layout). A layout that does not
        fit [L, E] gives way to the contiguous default."""
        timeline = self._changes.get(epoch) or LayoutTimeline(MAX_CHANGES)
        which_T = timeline.index_at(step_T)
        groups = []
        for which in np.unique(which_T).tolist():
            entry = timeline.items[which] if which >= 0 else self._base
            groups.append((np.flatnonzero(which_T == which), *self._checked(entry, num_layers, num_experts, world)))
        return groups

    def _checked(self, entry: tuple[np.ndarray, int, int] | None, num_layers: int, num_experts: int,
                 world: int) -> tuple[np.ndarray, int]:
        if entry is not None and entry[0].shape[0] == num_layers:
            layout, gpus, key = entry
            cached = self._cached((key, num_experts))
            if cached is not None:
                return cached, gpus
            try:
                return self._keep((key, num_experts), validated_layout(layout, num_experts, gpus, unused=True)), gpus
            except ValueError:
                pass  # it does not fit this run's experts: the default below
        gpus = core.default_gpus(num_experts, world)
        default_key = ("contiguous", num_layers, num_experts)
        cached = self._cached(default_key)
        if cached is None:
            cached = self._keep(default_key, np.asarray(core.contiguous_layout(num_layers, num_experts), np.int64))
        return cached, gpus

    def _cached(self, key: Hashable) -> np.ndarray | None:
        layout = self._checked_layouts.get(key)
        if layout is not None:
            self._checked_layouts.move_to_end(key)
        return layout

    def _keep(self, key: Hashable, layout_LP: np.ndarray) -> np.ndarray:
        self._checked_layouts[key] = layout_LP
        while len(self._checked_layouts) > MAX_CHECKED:
            self._checked_layouts.popitem(last=False)
        return layout_LP
