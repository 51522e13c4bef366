"""NVML samples per GPU device kept as short time series, and the collector's "unavailable" state.

A device is (host, NVML index). Values NVML could not read stay None (plotted as gaps), never invented.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import wire


@dataclass
class Unavailable:
    """The collector on `host` (rank) reported that it has no NVIDIA GPU / NVML: `reason`, at time_s."""

    host: str
    rank: int
    reason: str
    time_s: float


class GpuHistory:
    """The last `max_samples` NVML readings of every device, plus the latest 'unavailable' reports."""

    def __init__(self, max_samples: int = 900):
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        self.max_samples = max_samples
        self.series: dict[tuple[str, int], deque] = {}
        self.unavailable: dict[tuple[str, int], Unavailable] = {}
        self.samples_seen = 0

    def add(self, sample: wire.GpuSample) -> None:
        self.samples_seen += 1
        if sample.status == "unavailable":
            self.unavailable[(sample.host, sample.rank)] = Unavailable(sample.host, sample.rank, sample.reason,
                                                                       sample.time_s)
            return
        self.unavailable.pop((sample.host, sample.rank), None)
        for gpu in sample.gpus:
            index = gpu.get("index")
            if not isinstance(index, int):
                continue
            row = {"time_s": sample.time_s, "rank": sample.rank, **gpu}
            self.series.setdefault((sample.host, index), deque(maxlen=self.max_samples)).append(row)

    def devices(self) -> list[tuple[str, int]]:
        """Devices with readings, sorted by (host, NVML index)."""
        return sorted(self.series)

    def rows(self, device: tuple[str, int]) -> list[dict]:
        """Readings of one device, oldest first: dicts with time_s, rank and wire.GPU_FIELDS."""
        return list(self.series.get(device, ()))
