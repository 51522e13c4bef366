"""The measured GPU loads of the last C steps of one run, from its physical records (core.PhysicalRecord: each
rank's tokens per physical slot as the engine's balancer dispatched them). Pure: no Streamlit, no I/O.

A step's row sums its ranks' records, each GPU's slots summed (core.measured_gpu_loads), with the ranks that sent
one. The ring keeps the C steps that arrived last; pages align it with a window view by step id (aligned()).
C x L x G int64 (600 x 58 layers x 32 GPUs: 8.9 MB); a ring over MAX_MEASURED_BYTES is refused at its first record.

Shape legend: C ring capacity (steps), T steps of a view, L MoE layers, G GPUs.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.sources.physical import PhysicalReader

MAX_MEASURED_BYTES = 128 << 20  # the ring's int64 [C, L, G]; a larger one refuses its records


@dataclass
class _Step:
    loads_LG: np.ndarray                                          # int64 [L, G], the ranks' records summed
    senders: set[tuple[str, int]] = field(default_factory=set)    # (instance, rank) of each record in it


@dataclass(frozen=True)
class MeasuredView:
    """The measured loads of steps step_T (int64 [T]): loads_TLG float64 [T, L, G] (0 where none), ranks_T
    int64 [T] ranks whose record arrived (0: the step has none)."""

    step_T: np.ndarray
    loads_TLG: np.ndarray
    ranks_T: np.ndarray


class MeasuredRing:
    """Per-step measured GPU loads of the last `capacity` steps. Sized ([L, G]) by the first record; add()
    refuses with ValueError (the caller counts a bad record): another layer or GPU count, a (step, rank) of one
    collector instance that arrived twice (a write retried after a timeout)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"measured-load ring capacity must be at least 1, got {capacity}")
        self.capacity = int(capacity)
        self.num_layers = self.num_gpus = 0
        self.records = 0
        self._steps: OrderedDict[int, _Step] = OrderedDict()

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, rec: core.PhysicalRecord) -> None:
        """Add one rank's record to its step's row; a refused record (ValueError) changes nothing."""
        loads_LG = rec.gpu_loads()
        layers, gpus = loads_LG.shape
        if not self.num_layers:
            if self.capacity * layers * gpus * 8 > MAX_MEASURED_BYTES:
                raise ValueError(f"measured loads of {self.capacity} steps x {layers} layers x {gpus} GPUs would "
                                 f"take more than {MAX_MEASURED_BYTES >> 20} MiB: lower the window")
            self.num_layers, self.num_gpus = layers, gpus
        elif (layers, gpus) != (self.num_layers, self.num_gpus):
            raise ValueError(f"physical counts of {layers} layers on {gpus} GPUs, this run's are "
                             f"{self.num_layers} x {self.num_gpus}")
        step = self._steps.get(rec.step)
        sender = (rec.instance, rec.rank)
        if step is not None and sender in step.senders:
            raise ValueError(f"physical counts of step {rec.step} rank {rec.rank} arrived twice")
        if step is None:
            step = self._steps[rec.step] = _Step(np.zeros((layers, gpus), dtype=np.int64))
            while len(self._steps) > self.capacity:
                self._steps.popitem(last=False)
        step.loads_LG += loads_LG
        step.senders.add(sender)
        self.records += 1

    def aligned(self, step_T) -> MeasuredView:
        """The measured loads of the steps step_T (int [T], a window view's step ids)."""
        step_T = np.asarray(step_T, dtype=np.int64)
        loads_TLG = np.zeros((step_T.size, self.num_layers, self.num_gpus), dtype=np.float64)
        ranks_T = np.zeros(step_T.size, dtype=np.int64)
        for t, step_id in enumerate(step_T.tolist()):
            step = self._steps.get(step_id)
            if step is not None:
                loads_TLG[t] = step.loads_LG
                ranks_T[t] = len({rank for _, rank in step.senders})
        return MeasuredView(step_T=step_T, loads_TLG=loads_TLG, ranks_T=ranks_T)


class MeasuredFeed:
    """A run's physical records read from Redis (sources.physical.PhysicalReader) into a MeasuredRing of the
    window's steps. bad_records / last_error: entries that did not decode or that the ring refused."""

    def __init__(self, client, run: str, capacity: int):
        self.reader = PhysicalReader(client, run)
        self.ring = MeasuredRing(capacity)
        self.refused = 0
        self.refusal = ""

    @property
    def bad_records(self) -> int:
        return self.reader.bad_records + self.refused

    @property
    def last_error(self) -> str:
        return self.refusal or self.reader.last_error

    @property
    def error(self) -> str:
        """The latest poll's Redis failure ("" when it answered)."""
        return self.reader.error

    def any(self) -> bool:
        """Whether the run has physical records (the ring holds steps)."""
        return len(self.ring) > 0

    def poll(self, world: int = 1) -> None:
        """Read what is new into the ring (world: ranks of the run; the first read takes window x ranks)."""
        for rec in self.reader.poll(first_entries=self.ring.capacity * max(1, world)):
            try:
                self.ring.add(rec)
            except ValueError as exc:
                self.refused += 1
                self.refusal = f"physical counts of step {rec.step} rank {rec.rank}: {core.why(exc)}"
