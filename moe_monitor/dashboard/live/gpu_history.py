"""NVML samples per GPU device kept as short time series, and the collector's "unavailable" state.

A device is (host, NVML index). Values NVML could not read stay None (plotted as gaps), never invented.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from moe_monitor import core

MAX_DEVICES = 1024  # devices (host, NVML index) and "unavailable" reports kept; the least recently heard go first


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
        self.series: OrderedDict[tuple[str, int], deque] = OrderedDict()
        self.unavailable: OrderedDict[tuple[str, int], Unavailable] = OrderedDict()

    def add(self, sample: core.GpuSample) -> None:
        if sample.status == "unavailable":
            key = (sample.host, sample.rank)
            self.unavailable[key] = Unavailable(sample.host, sample.rank, sample.reason, sample.time_s)
            self.unavailable.move_to_end(key)
            _forget_oldest(self.unavailable)
            return
        self.unavailable.pop((sample.host, sample.rank), None)
        for gpu in sample.gpus:
            index = gpu.get("index")
            if not isinstance(index, int):
                continue
            row = {"time_s": sample.time_s, "rank": sample.rank, **gpu}
            key = (sample.host, index)
            held = self.series.get(key)
            if held is None:
                held = self.series[key] = deque(maxlen=self.max_samples)
            else:
                self.series.move_to_end(key)
            held.append(row)
        _forget_oldest(self.series)

    def devices(self) -> list[tuple[str, int]]:
        """Devices with readings, sorted by (host, NVML index)."""
        return sorted(self.series)

    def names(self) -> list[str]:
        """NVML device names of the devices with readings (their latest reading's), by (host, NVML index)."""
        latest = (self.series[device][-1].get("name") for device in self.devices())
        return [name for name in latest if isinstance(name, str) and name]

    def rows(self, device: tuple[str, int]) -> list[dict]:
        """Readings of one device, oldest first: dicts with time_s, rank and core.GPU_FIELDS."""
        return list(self.series.get(device, ()))

    def pairing(self, gpus: int, world_size: int) -> tuple[dict[int, tuple[str, int]], str]:
        """EP GPU -> NVML device (host, index), by the rank that sent the readings: EP GPU g is rank g's
        device when there is one GPU per rank (world_size == gpus) and rank g reports exactly one device.
        Returns (pairs, note); pairs is empty and note says why when no pairing can be claimed."""
        if world_size != gpus:
            return {}, (f"not paired: {world_size} rank(s) for {gpus} EP GPUs, so which NVML device serves which "
                        "EP GPU is not known; NVML devices are listed by host and index")
        devices_of_rank: dict[int, list[tuple[str, int]]] = {}
        for device, rows in self.series.items():
            devices_of_rank.setdefault(rows[-1].get("rank"), []).append(device)
        pairs = {rank: found[0] for rank, found in devices_of_rank.items()
                 if isinstance(rank, int) and 0 <= rank < gpus and len(found) == 1}
        several = sorted(rank for rank, found in devices_of_rank.items() if len(found) > 1)
        note = "" if not several else (f"rank(s) {', '.join(map(str, several))} report several NVML devices: "
                                       "those EP GPUs are not paired")
        return pairs, note


def _forget_oldest(held: OrderedDict) -> None:
    while len(held) > MAX_DEVICES:
        held.popitem(last=False)
