"""Physical-slot counts on their way from an engine to the publisher (ExpertLoadMonitor.record_physical).

The caller's thread checks what it can without reading the data (a 2-D integer array or tensor of [L, P] with P
the slots of the layout in force, splitting over the GPUs) and raises ValueError otherwise; a tensor on a GPU is
copied into pinned host memory on the current stream with an event behind it (never a host sync on the
model's thread). The publisher thread waits for that event, checks the values (no negative counts, int32) and
makes the core.PhysicalRecord; a record refused there is counted as dropped and named in last_error.

Shape legend (README, Conventions): L MoE layers, P physical slots of the layout.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_monitor import core


@dataclass
class PhysicalJob:
    """One step's physical counts waiting for the publisher. counts: int [L, P] numpy (host data), or None
    while `host` (a pinned tensor [L, P]) is being copied from the device, done when `event` is."""

    run: str
    step: int
    rank: int
    time_s: float
    gpus: int
    instance: str
    source: str
    counts: np.ndarray | None = None
    host: Any = None
    event: Any = None

    def record(self) -> core.PhysicalRecord:
        """The checked record (publisher thread: waits for the device copy). ValueError when the counts are not
        whole numbers 0..2**31 - 1."""
        counts = self.counts
        if counts is None:
            if self.event is not None:
                self.event.synchronize()
            counts = self.host.numpy()
        return core.PhysicalRecord(run=self.run, step=self.step, rank=self.rank, time_s=self.time_s,
                                   counts_LP=core.check_physical_counts(counts, self.gpus), gpus=self.gpus,
                                   instance=self.instance, source=self.source)


def physical_job(counts_LP: Any, *, num_layers: int, num_slots: int, gpus: int, **facts: Any) -> PhysicalJob:
    """A PhysicalJob for counts_LP (a numpy array, nested lists or a tensor on any device), int [L, P] with
    L = num_layers and P = num_slots (the layout in force), P a multiple of gpus. facts: PhysicalJob's run, step,
    rank, time_s, instance and source. ValueError naming what is wrong; host data is checked in full here."""
    import torch  # here: the publisher imports this module and needs no torch
    if isinstance(counts_LP, torch.Tensor):
        shape, integer = tuple(counts_LP.shape), not counts_LP.is_floating_point() and not counts_LP.is_complex() \
            and counts_LP.dtype != torch.bool
    elif isinstance(counts_LP, (np.ndarray, list, tuple)):
        counts_LP = np.asarray(counts_LP)
        shape, integer = counts_LP.shape, counts_LP.dtype.kind in "iu"
    else:
        raise ValueError(f"physical counts must be an int array, tensor or nested lists [layers][slots], got "
                         f"{type(counts_LP).__name__}")
    if len(shape) != 2 or not integer:
        raise ValueError(f"physical counts must be a 2-D integer array [layers, slots], got shape {shape}")
    if shape != (num_layers, num_slots):
        raise ValueError(f"physical counts are {list(shape)}, the layout in force is [{num_layers}, {num_slots}]")
    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 1 or num_slots % gpus:
        raise ValueError(f"{num_slots} slots do not split evenly over gpus={gpus}")
    job = PhysicalJob(gpus=int(gpus), **facts)
    if isinstance(counts_LP, np.ndarray):
        job.counts = core.check_physical_counts(counts_LP, gpus)  # host data: every check now
    elif counts_LP.device.type == "cuda":
        host = torch.empty(shape, dtype=counts_LP.dtype, pin_memory=True)  # torch's caching host allocator
        host.copy_(counts_LP.detach(), non_blocking=True)
        job.host, job.event = host, torch.cuda.Event()
        job.event.record()
    else:
        job.counts = core.check_physical_counts(counts_LP.detach().to("cpu").numpy(), gpus)
    return job


class PhysicalInbox:
    """Jobs handed to the publisher (any thread appends, its thread drains): at most `bound` wait; past that a
    new one is dropped and counted, and so is one whose counts are refused when read."""

    def __init__(self, bound: int):
        self.bound, self.dropped = bound, 0
        self._jobs: collections.deque[PhysicalJob] = collections.deque()

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(self, job: PhysicalJob) -> None:
        if len(self._jobs) >= self.bound:
            self.dropped += 1
            return
        self._jobs.append(job)

    def drain(self) -> tuple[list[core.PhysicalRecord], str]:
        """(the records of every waiting job, the reason of the last one refused or "")."""
        records, refused = [], ""
        for _ in range(len(self._jobs)):
            try:
                records.append(self._jobs.popleft().record())
            except Exception as exc:  # counts the engine handed over that no reader would take
                refused = f"physical counts refused: {type(exc).__name__}: {exc}"
                self.dropped += 1
        return records, refused
