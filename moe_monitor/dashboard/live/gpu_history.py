"""NVML samples per GPU device kept as short time series, the collector's "unavailable" state, and the GPU
panel's all-GPU matrix built from them.

A device is (host, NVML index). Values NVML could not read stay None (NaN in arrays; plotted as gaps), never
invented. Shapes: M the GRID_FIELDS, R rows of the matrix (EP GPUs, then devices paired with none), B time bins.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from moe_monitor import core

MAX_DEVICES = 1024  # devices (host, NVML index) and "unavailable" reports kept; the least recently heard go first
GRID_FIELDS = ("sm_clock_mhz", "power_usage_w", "temperature_c", "gpu_utilization_percent", "memory_used_bytes")
MAX_SPAN_S = 900.0  # the all-GPU matrix covers at most this much time before the newest reading
BIN_INTERVALS = 1.5  # a time bin is at least this many sampling intervals wide, so a steady sampler leaves no hole

Device = tuple[str, int]


@dataclass
class Unavailable:
    """The collector on `host` (rank) reported that it has no NVIDIA GPU / NVML: `reason`, at time_s."""

    host: str
    rank: int
    reason: str
    time_s: float


class _Readings:
    """One device's GRID_FIELDS readings as a ring of arrays (what the all-GPU matrix bins without touching
    a dict per reading): time_s [n] and values [M, n] (NaN: not read)."""

    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self.time_s = np.zeros(min(64, max_samples), dtype=np.float64)
        self.values = np.zeros((len(GRID_FIELDS), self.time_s.size), dtype=np.float32)
        self.added = 0

    def add(self, time_s: float, gpu: dict) -> None:
        size = self.time_s.size
        if self.added == size < self.max_samples:  # grow until the ring holds max_samples
            grown = min(2 * size, self.max_samples)
            self.time_s = np.concatenate([self.time_s, np.zeros(grown - size)])
            self.values = np.concatenate([self.values, np.zeros((len(GRID_FIELDS), grown - size), np.float32)], 1)
        at = self.added % self.time_s.size
        self.time_s[at] = time_s
        self.values[:, at] = [np.nan if gpu.get(name) is None else gpu[name] for name in GRID_FIELDS]
        self.added += 1

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """(time_s [n], values [M, n]), oldest first."""
        size = self.time_s.size
        if self.added <= size:
            return self.time_s[:self.added], self.values[:, :self.added]
        at = self.added % size
        return (np.concatenate([self.time_s[at:], self.time_s[:at]]),
                np.concatenate([self.values[:, at:], self.values[:, :at]], 1))


class GpuHistory:
    """The last `max_samples` NVML readings of every device, plus the latest 'unavailable' reports."""

    def __init__(self, max_samples: int = 900):
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        self.max_samples = max_samples
        self.series: OrderedDict[Device, deque] = OrderedDict()
        self.unavailable: OrderedDict[tuple[str, int], Unavailable] = OrderedDict()
        self._readings: dict[Device, _Readings] = {}

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
                self._readings[key] = _Readings(self.max_samples)
            else:
                self.series.move_to_end(key)
            held.append(row)
            self._readings[key].add(sample.time_s, gpu)
        for forgotten in _forget_oldest(self.series):
            del self._readings[forgotten]

    def devices(self) -> list[Device]:
        """Devices with readings, sorted by (host, NVML index)."""
        return sorted(self.series)

    def names(self) -> list[str]:
        """NVML device names of the devices with readings (their latest reading's), by (host, NVML index)."""
        latest = (self.series[device][-1].get("name") for device in self.devices())
        return [name for name in latest if isinstance(name, str) and name]

    def rows(self, device: Device) -> list[dict]:
        """Readings of one device, oldest first: dicts with time_s, rank and core.GPU_FIELDS."""
        return list(self.series.get(device, ()))

    def readings(self) -> dict[Device, tuple[np.ndarray, np.ndarray]]:
        """Every device's GRID_FIELDS readings: device -> (time_s [n], values [M, n], NaN where not read),
        oldest first."""
        return {device: held.ordered() for device, held in self._readings.items()}

    def pairing(self, gpus: int, world_size: int) -> tuple[dict[int, Device], str]:
        """EP GPU -> NVML device (host, index), by the rank that sent the readings: EP GPU g is rank g's
        device when there is one GPU per rank (world_size == gpus) and rank g reports exactly one device.
        Returns (pairs, note); pairs is empty and note says why when no pairing can be claimed."""
        if world_size != gpus:
            return {}, (f"not paired: {world_size} rank(s) for {gpus} EP GPUs, so which NVML device serves which "
                        "EP GPU is not known; NVML devices are listed by host and index")
        devices_of_rank: dict[int, list[Device]] = {}
        for device, rows in self.series.items():
            devices_of_rank.setdefault(rows[-1].get("rank"), []).append(device)
        pairs = {rank: found[0] for rank, found in devices_of_rank.items()
                 if isinstance(rank, int) and 0 <= rank < gpus and len(found) == 1}
        several = sorted(rank for rank, found in devices_of_rank.items() if len(found) > 1)
        note = "" if not several else (f"rank(s) {', '.join(map(str, several))} report several NVML devices: "
                                       "those EP GPUs are not paired")
        return pairs, note


@dataclass(frozen=True)
class GpuGrid:
    """The all-GPU matrix. Rows: gpu_R (EP GPU, -1 for a device paired with none) and device_R (its NVML
    device, None for an EP GPU that no device is paired with); names_R ("GPU 3", "node-a #0"). Time bins of
    equal width: edges_s (unix time) [B + 1]. mean_MRB: per field, row and bin the mean of the readings in the
    bin (NaN: none, or NVML could not read it); latest_MR and latest_s_R: each row's newest reading (NaN when
    it has none)."""

    gpu_R: np.ndarray
    device_R: list[Device | None]
    names_R: list[str]
    edges_s: np.ndarray
    mean_MRB: np.ndarray
    latest_MR: np.ndarray
    latest_s_R: np.ndarray

    @property
    def newest_s(self) -> float:
        return float(self.edges_s[-1]) if self.edges_s.size else float("nan")

    def field(self, name: str) -> int:
        return GRID_FIELDS.index(name)


def grid_rows(pairs: Mapping[int, Device], devices: Sequence[Device], gpus: int) -> list[tuple[int, Device | None]]:
    """The matrix's rows as (EP GPU or -1, device or None): with a pairing, every EP GPU in order (its device,
    or None) then the devices paired with none; without one, the devices by (host, NVML index)."""
    if not pairs:
        return [(-1, device) for device in sorted(devices)]
    paired = set(pairs.values())
    return [(gpu, pairs.get(gpu)) for gpu in range(gpus)] + [(-1, d) for d in sorted(devices) if d not in paired]


def gpu_grid(readings: Mapping[Device, tuple[np.ndarray, np.ndarray]], rows: Sequence[tuple[int, Device | None]],
             max_bins: int, max_span_s: float = MAX_SPAN_S) -> GpuGrid:
    """Bin every row's readings (device -> (time_s [n], values [M, n]), oldest first, as GpuHistory.readings)
    into at most max_bins equal time bins over the last max_span_s seconds before the newest reading of any
    row. A bin is at least BIN_INTERVALS median sampling intervals wide, so a device that samples steadily has
    a reading in every bin; a bin without one (the device was silent, or NVML could not read the field) is NaN."""
    if max_bins < 1:
        raise ValueError(f"max_bins must be at least 1, got {max_bins}")
    fields, num_rows = len(GRID_FIELDS), len(rows)
    held = [readings.get(device) if device is not None else None for _, device in rows]
    held = [None if found is None or not found[0].size else found for found in held]
    latest_MR = np.full((fields, num_rows), np.nan, dtype=np.float32)
    latest_s_R = np.full(num_rows, np.nan)
    for r, found in enumerate(held):
        if found is not None:
            latest_MR[:, r], latest_s_R[r] = found[1][:, -1], found[0][-1]
    gpu_R = np.asarray([gpu for gpu, _ in rows], dtype=np.int64)
    devices = [device for _, device in rows]
    names = [f"GPU {gpu}" if gpu >= 0 or device is None else f"{device[0]} #{device[1]}" for gpu, device in rows]
    if np.isnan(latest_s_R).all():
        return GpuGrid(gpu_R, devices, names, np.zeros(0), np.zeros((fields, num_rows, 0), dtype=np.float32),
                       latest_MR, latest_s_R)
    newest = float(np.nanmax(latest_s_R))
    times, values, row_of = [], [], []
    for r, found in enumerate(held):
        if found is not None:
            keep = found[0] >= newest - max_span_s
            times.append(found[0][keep])
            values.append(found[1][:, keep])
            row_of.append(np.full(int(keep.sum()), r, dtype=np.int64))
    time_N, values_MN, row_N = np.concatenate(times), np.concatenate(values, 1), np.concatenate(row_of)
    start = float(time_N.min())
    steps = np.concatenate([np.diff(t) for t in times])
    interval_s = float(np.median(steps)) if steps.size else 0.0
    span_s = newest - start
    bins = max(1, min(max_bins, int(span_s / (BIN_INTERVALS * interval_s)) if interval_s > 0 else 1))
    edges_s = start + span_s * np.arange(bins + 1) / bins
    edges_s[-1] = newest
    bin_N = np.zeros(time_N.size, dtype=np.int64) if span_s <= 0 else \
        np.clip(((time_N - start) * (bins / span_s)).astype(np.int64), 0, bins - 1)
    cell_N = row_N * bins + bin_N
    cells = num_rows * bins
    every = np.bincount(cell_N, minlength=cells)
    mean_MRB = np.full((fields, num_rows, bins), np.nan, dtype=np.float32)
    for m in range(fields):
        value_N = values_MN[m]
        read = np.isfinite(value_N)
        if read.all():
            count, total = every, np.bincount(cell_N, weights=value_N, minlength=cells)
        else:
            count = np.bincount(cell_N[read], minlength=cells)
            total = np.bincount(cell_N[read], weights=value_N[read], minlength=cells)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_MRB[m] = (total / count).reshape(num_rows, bins)  # 0 / 0: no reading, NaN
    return GpuGrid(gpu_R, devices, names, edges_s, mean_MRB, latest_MR, latest_s_R)


def _forget_oldest(held: OrderedDict) -> list:
    """Drop the least recently heard entries beyond MAX_DEVICES; returns their keys."""
    forgotten = []
    while len(held) > MAX_DEVICES:
        forgotten.append(held.popitem(last=False)[0])
    return forgotten
