"""NVML sampler (nvidia-ml-py, import name pynvml) on its own thread, 1-4 Hz, drift-free on a monotonic clock.

Every NVML call goes through `_read`, which turns a missing function, an unsupported query or a lost GPU
into None: a value that could not be read is reported as missing, never invented. No driver / no GPU: one
GpuSample with status "unavailable" and the reason, then the thread ends.
Utilisation is NVML's time-based figure (share of the sample period in which a kernel ran), not SM occupancy.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import torch

import wire


def _read(fn: Callable, *args, scale: float = 1.0):
    try:
        value = fn(*args)
    except Exception:  # pynvml.NVMLError and friends: not supported, GPU lost, function missing
        return None
    return value * scale if scale != 1.0 else value


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpu(nvml, index: int, handle) -> dict:
    """One GPU's reading with the field names of wire.GPU_FIELDS (None where NVML could not say)."""
    util = _read(nvml.nvmlDeviceGetUtilizationRates, handle)
    mem = _read(nvml.nvmlDeviceGetMemoryInfo, handle)
    return {
        "index": index,
        "name": _text(_read(nvml.nvmlDeviceGetName, handle) or ""),
        "uuid": _text(_read(nvml.nvmlDeviceGetUUID, handle) or ""),
        "gpu_utilization_percent": None if util is None else util.gpu,
        "memory_used_bytes": None if mem is None else mem.used,
        "memory_total_bytes": None if mem is None else mem.total,
        "power_usage_w": _read(nvml.nvmlDeviceGetPowerUsage, handle, scale=1e-3),
        "power_limit_w": _read(nvml.nvmlDeviceGetEnforcedPowerLimit, handle, scale=1e-3),
        "sm_clock_mhz": _read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "temperature_c": _read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
    }


def _local_indices(nvml, device: torch.device, count: int) -> list[int]:
    """The NVML index of the CUDA device the model runs on (by PCI bus id), or every GPU for a CPU model."""
    if device.type != "cuda":
        return list(range(count))
    try:
        props = torch.cuda.get_device_properties(device)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
        return [nvml.nvmlDeviceGetIndex(handle)]
    except Exception:
        return list(range(count))


class NvmlSampler:
    """Calls publish(GpuSample) every interval_s (clamped to 0.25-1 s) until stop()."""

    def __init__(self, publish: Callable[[wire.GpuSample], None], rank: int, interval_s: float = 0.5,
                 device: torch.device | str = "cpu"):
        self.publish, self.rank = publish, rank
        self.interval_s = min(1.0, max(0.25, interval_s))
        self.device = torch.device(device)
        self.host = socket.gethostname()
        self.status = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moe-monitor-nvml", daemon=True)
        self._thread.start()

    def _unavailable(self, reason: str) -> None:
        self.status = f"unavailable: {reason}"
        self.publish(wire.GpuSample(self.rank, self.host, time.time(), "unavailable", reason=reason))

    def _run(self) -> None:
        try:
            import pynvml as nvml
            nvml.nvmlInit()
        except Exception as exc:
            self._unavailable(f"NVML not available on {self.host}: {exc}")
            return
        try:
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                self._unavailable(f"no NVIDIA GPU on {self.host}")
                return
            indices = _local_indices(nvml, self.device, count)
            handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
            self.status = "ok"
            next_t = time.monotonic()
            while not self._stop.is_set():
                gpus = [read_gpu(nvml, i, h) for i, h in handles]
                self.publish(wire.GpuSample(self.rank, self.host, time.time(), "ok", gpus))
                next_t += self.interval_s
                if next_t < time.monotonic():  # stalled (a suspended process): resync, no burst
                    next_t = time.monotonic() + self.interval_s
                self._stop.wait(max(0.0, next_t - time.monotonic()))
        except Exception as exc:
            self._unavailable(f"NVML failed on {self.host}: {exc}")
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
