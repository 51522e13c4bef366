"""NVML sampler (nvidia-ml-py, import name pynvml) on its own thread, 1-4 Hz, drift-free on a monotonic clock.

Every per-GPU query goes through `_read`, which turns a missing function, an unsupported query or a lost GPU
into None: a value that could not be read is reported as missing, never invented. No driver / no GPU: one
GpuSample with status "unavailable" and the reason, then the thread ends.
Utilisation is NVML's time-based figure (share of the sample period in which a kernel ran), not SM occupancy.
The NVML module is a parameter (default: pynvml, imported on the sampler's thread), so tests can hand in a
stand-in that answers like a real GPU.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from moe_monitor import core


class Nvml(Protocol):
    """The part of pynvml the sampler calls. Handles are opaque; readings are NVML's own units
    (milliwatts, bytes, MHz, degrees C, percent)."""

    NVML_CLOCK_SM: int
    NVML_TEMPERATURE_GPU: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetHandleByPciBusId(self, bus_id: bytes) -> Any: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu: percent
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...        # .used, .total: bytes
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...        # milliwatts
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...  # milliwatts
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...  # MHz
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...  # degrees C


def _read(query: Callable[[], Any]) -> Any:
    try:
        return query()
    except Exception:  # pynvml.NVMLError and friends: not supported, GPU lost, function missing
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _watts(milliwatts: float | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def read_gpu(nvml: Nvml, index: int, handle: Any) -> dict[str, Any]:
    """One GPU's reading with the field names and units of core.GPU_FIELDS (None where NVML could not say)."""
    util = _read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    mem = _read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    return {
        "index": index,
        "name": _text(_read(lambda: nvml.nvmlDeviceGetName(handle)) or ""),
        "uuid": _text(_read(lambda: nvml.nvmlDeviceGetUUID(handle)) or ""),
        "gpu_utilization_percent": util,
        "memory_used_bytes": None if mem is None else mem.used,
        "memory_total_bytes": None if mem is None else mem.total,
        "power_usage_w": _watts(_read(lambda: nvml.nvmlDeviceGetPowerUsage(handle))),
        "power_limit_w": _watts(_read(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))),
        "sm_clock_mhz": _read(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        "temperature_c": _read(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
    }


def _local_indices(nvml: Nvml, device: torch.device, count: int) -> list[int]:
    """The NVML index of the CUDA device the model runs on (by PCI bus id), or every GPU for a CPU model."""
    if device.type != "cuda":
        return list(range(count))
    try:
        props: Any = torch.cuda.get_device_properties(device)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
        return [nvml.nvmlDeviceGetIndex(handle)]
    except Exception:
        return list(range(count))


def _pynvml() -> Nvml:
    import pynvml  # nvidia-ml-py
    return pynvml


class NvmlSampler:
    """Calls publish(GpuSample) every interval_s (clamped to 0.25-1 s) until stop(). nvml: the NVML module
    (None: pynvml, imported on the sampler's thread); an error importing or initialising it is published
    as the "unavailable" record with its reason."""

    def __init__(self, publish: Callable[[core.GpuSample], None], rank: int, interval_s: float = 0.5,
                 device: torch.device | str = "cpu", nvml: Nvml | None = None):
        self.publish, self.rank = publish, rank
        self.interval_s = min(1.0, max(0.25, interval_s))
        self.device = torch.device(device)
        self.host = socket.gethostname()
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moe-monitor-nvml", daemon=True)
        self._thread.start()

    def _unavailable(self, reason: str) -> None:
        self.publish(core.GpuSample(self.rank, self.host, time.time(), "unavailable", reason=reason))

    def _run(self) -> None:
        try:
            nvml = self._nvml if self._nvml is not None else _pynvml()
            nvml.nvmlInit()
        except Exception as exc:
            self._unavailable(f"NVML not available on {self.host}: {exc}")
            return
        try:
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                self._unavailable(f"no NVIDIA GPU on {self.host}")
                return
            handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in _local_indices(nvml, self.device, count)]
            next_t = time.monotonic()
            while not self._stop.is_set():
                gpus = [read_gpu(nvml, i, h) for i, h in handles]
                self.publish(core.GpuSample(self.rank, self.host, time.time(), "ok", gpus))
                next_t += self.interval_s
                if next_t < time.monotonic():  # stalled (a suspended process): resync, no burst
                    next_t = time.monotonic() + self.interval_s
                self._stop.wait(max(0.0, next_t - time.monotonic()))
        except Exception as exc:
            self._unavailable(f"NVML failed on {self.host}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
