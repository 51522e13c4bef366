"""Per-step wall time of each MoE layer and its phases (dispatch, expert compute, combine), for engines with an
all-to-all; the monitor's time_layer() / record_times() feed it (a model that never calls them publishes none).

    with monitor.time_layer(layer) as t:     # the whole MoE layer
        with t.dispatch(): ...               # also t.compute(), t.combine()

Times: seconds, float32 [4, L] in core.TIMING_PHASES order (dispatch, compute, combine, layer); NaN = not
measured; a phase timed twice in a step adds up. CPU: time.perf_counter(); CUDA: events from a pool of at most
max_slots slots, read on the publisher thread (the model never waits); measurements beyond the pool or beyond
4 phases per layer are skipped and counted (`skipped`). Details: docs/collectors.md (Layer timings).
"""
from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

DISPATCH, COMPUTE, COMBINE, LAYER = range(4)  # rows of the [4, L] arrays (core.TIMING_PHASES order)


@dataclass
class _EventSlot:
    """CUDA events of one step in flight: spans (phase, layer, start index, end index) into events."""

    events: list[torch.cuda.Event]
    used: int = 0
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class PendingTimings:
    """One step's timings on their way to the publisher: host-measured seconds float64 [4, L] (NaN = none)
    and, on CUDA, the event slot still to be read."""

    times_4L: np.ndarray
    slot: _EventSlot | None


class _Phase:
    """Context manager timing one phase of one layer."""

    __slots__ = ("_timer", "_phase", "_layer", "_start")

    def __init__(self, timer: StepTimer, phase: int, layer: int):
        self._timer, self._phase, self._layer = timer, phase, layer
        self._start: float | int = -1

    def __enter__(self) -> _Phase:
        self._start = self._timer.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.span(self._phase, self._layer, self._start, self._timer.mark())


class LayerTimer(_Phase):
    """Times one MoE layer (as a context manager) and, inside it, its dispatch(), compute() and combine()."""

    __slots__ = ()

    def __init__(self, timer: StepTimer, layer: int):
        super().__init__(timer, LAYER, layer)

    def __enter__(self) -> LayerTimer:
        super().__enter__()
        return self

    def dispatch(self) -> _Phase:
        return _Phase(self._timer, DISPATCH, self._layer)

    def compute(self) -> _Phase:
        return _Phase(self._timer, COMPUTE, self._layer)

    def combine(self) -> _Phase:
        return _Phase(self._timer, COMBINE, self._layer)


class StepTimer:
    """Collects the phase times of the current step for num_layers layers on `device` (see the module).
    measured: whether the current step timed anything (take() has something to give)."""

    def __init__(self, num_layers: int, device: torch.device, max_slots: int = 64):
        self.num_layers = num_layers
        self.cuda = device.type == "cuda"
        self._device = device
        self._max_slots = max(1, max_slots)
        self._times_4L = np.full((4, num_layers), np.nan)
        self.measured = False
        self._free: collections.deque[_EventSlot] = collections.deque()  # the publisher gives slots back here
        self._slots_made = 0
        self._slot: _EventSlot | None = None  # the current step's (CUDA)
        self.skipped = 0  # measurements not taken (no free event slot, or a slot full)

    # ------------------------------------------------------------------ the model's thread
    def layer(self, layer: int) -> LayerTimer:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        return LayerTimer(self, layer)

    def mark(self) -> float | int:
        """A time boundary: perf_counter seconds on the CPU; on CUDA the index of an event recorded now on the
        current stream (-1 when none is free)."""
        self.measured = True
        if not self.cuda:
            return time.perf_counter()
        slot = self._slot
        if slot is None:
            slot = self._slot = self._take_slot()
        if slot is None or slot.used >= len(slot.events):
            return -1
        index = slot.used
        slot.events[index].record(torch.cuda.current_stream(self._device))
        slot.used += 1
        return index

    def span(self, phase: int, layer: int, start: float | int, end: float | int) -> None:
        """One measured interval between two marks."""
        if not self.cuda:
            self._add(phase, layer, float(end) - float(start))
        elif start >= 0 and end >= 0 and self._slot is not None:
            self._slot.spans.append((phase, layer, int(start), int(end)))
        else:
            self.skipped += 1

    def record_times(self, layer: int, dispatch_s: float | None, compute_s: float | None, combine_s: float | None,
                     layer_s: float | None) -> None:
        """Times an engine measured itself (seconds; None or NaN: not measured). ValueError for a bad layer or
        a time that is negative or not finite."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        for phase, value in enumerate((dispatch_s, compute_s, combine_s, layer_s)):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            seconds = float(value)
            if not math.isfinite(seconds) or seconds < 0:
                raise ValueError(f"times must be finite seconds >= 0 (or None), got {value!r}")
            self._add(phase, layer, seconds)
        self.measured = True

    def take(self) -> PendingTimings | None:
        """At end_step: the step's timings (None when nothing was timed) and a fresh step."""
        if not self.measured:
            return None
        pending = PendingTimings(self._times_4L, self._slot)
        self._times_4L = np.full((4, self.num_layers), np.nan)
        self._slot, self.measured = None, False
        return pending

    # ------------------------------------------------------------------ the publisher's thread
    def read(self, pending: PendingTimings) -> np.ndarray:
        """float32 [4, L] seconds of a step taken by take() (waits for its CUDA events), and frees its slot."""
        times_4L = pending.times_4L
        slot = pending.slot
        if slot is not None:
            try:
                if slot.used:
                    slot.events[slot.used - 1].synchronize()  # recorded last: the others are done too
                for phase, layer, start, end in slot.spans:
                    seconds = slot.events[start].elapsed_time(slot.events[end]) / 1000.0
                    held = times_4L[phase, layer]
                    times_4L[phase, layer] = max(0.0, seconds) + (0.0 if np.isnan(held) else held)
            finally:
                self.release(pending)
        return times_4L.astype(np.float32)

    def release(self, pending: PendingTimings | None) -> None:
        """Give a step's event slot back without reading it (a step that is not published)."""
        slot = None if pending is None else pending.slot
        if slot is not None:
            pending.slot = None  # type: ignore[union-attr]
            slot.used = 0
            slot.spans = []
            self._free.append(slot)

    # ------------------------------------------------------------------ internals
    def _add(self, phase: int, layer: int, seconds: float) -> None:
        held = self._times_4L[phase, layer]
        self._times_4L[phase, layer] = seconds if np.isnan(held) else held + seconds

    def _take_slot(self) -> _EventSlot | None:
        if self._free:
            return self._free.pop()
        if self._slots_made >= self._max_slots:
            return None
        self._slots_made += 1
        with torch.cuda.device(self._device):
            events = [torch.cuda.Event(enable_timing=True) for _ in range(8 * self.num_layers)]
        return _EventSlot(events)
