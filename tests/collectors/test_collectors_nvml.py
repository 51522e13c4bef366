"""The NVML sampler on every machine: a stand-in NVML module that answers the way pynvml does on a GPU host.

The answers have the types and units pynvml returns (nvidia-ml-py 12.x): power in milliwatts, memory info and
utilisation as objects with .used/.total (bytes) and .gpu (percent), clocks in MHz, temperature in degrees C,
names as str (bytes from older bindings); the values are those of an idle NVIDIA H100 80GB HBM3. Errors are
raised the way pynvml raises them: an NVMLError whose text is NVML's own message.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from moe_monitor import core
from moe_monitor.collectors.nvml import NvmlSampler, read_gpu

H100_TOTAL_BYTES = 85_520_809_984  # 81559 MiB


class NVMLError(Exception):
    """pynvml.NVMLError: str() is NVML's message ("Not Supported", "NVML Shared Library Not Found", ...)."""


class RecordedNvml:
    """pynvml's functions, answering for `count` identical H100s."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, count: int = 1):
        self.count = count
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < self.count:
            raise NVMLError("Invalid Argument")
        return ("handle", index)

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"  # bytes, as bindings before 11.515 return it

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-6f2b1c3e-8d5a-4e9f-a1b7-0c4d2e6f8a9{handle[1]}"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=37, memory=12)  # c_nvmlUtilization_t: percent of the sample period

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=H100_TOTAL_BYTES, free=H100_TOTAL_BYTES - 535_166_976, used=535_166_976)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 68123  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700000  # mW

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1980  # MHz

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 34  # degrees C


class PartialNvml(RecordedNvml):
    """A GPU (or driver) that supports fewer queries: power is "Not Supported", the power limit is missing
    from the bindings altogether."""

    nvmlDeviceGetEnforcedPowerLimit = None

    def nvmlDeviceGetPowerUsage(self, handle):
        raise NVMLError("Not Supported")


def _samples(nvml) -> list[core.GpuSample]:
    """Start a sampler on nvml, wait for its first sample, stop it; every sample it published."""
    samples, got = [], threading.Event()

    def publish(sample):
        samples.append(sample)
        got.set()

    sampler = NvmlSampler(publish, rank=3, interval_s=0.25, nvml=nvml)
    assert got.wait(5.0), "the sampler published nothing"
    sampler.stop()
    return samples


def test_read_gpu_converts_to_the_wire_units():
    nvml = RecordedNvml()
    reading = read_gpu(nvml, 0, nvml.nvmlDeviceGetHandleByIndex(0))
    assert reading == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-6f2b1c3e-8d5a-4e9f-a1b7-0c4d2e6f8a90",
        "gpu_utilization_percent": 37, "memory_used_bytes": 535_166_976, "memory_total_bytes": H100_TOTAL_BYTES,
        "power_usage_w": pytest.approx(68.123), "power_limit_w": pytest.approx(700.0), "sm_clock_mhz": 1980,
        "temperature_c": 34,
    }
    assert set(reading) == set(core.GPU_FIELDS)


def test_a_query_the_gpu_cannot_answer_reads_none():
    nvml = PartialNvml()
    reading = read_gpu(nvml, 0, nvml.nvmlDeviceGetHandleByIndex(0))
    assert reading["power_usage_w"] is None and reading["power_limit_w"] is None  # missing, not invented
    assert reading["memory_total_bytes"] == H100_TOTAL_BYTES and reading["temperature_c"] == 34
    sample = core.GpuSample(0, "host", 1.0, "ok", [reading])
    assert core.decode_gpu_sample(core.encode_gpu_sample(sample)).gpus == [reading]  # valid on the wire


def test_sampler_publishes_every_gpu_of_a_cpu_model_in_wire_form():
    nvml = RecordedNvml(count=2)
    sample = _samples(nvml)[0]
    assert (sample.status, sample.rank, sample.reason) == ("ok", 3, "")
    assert [gpu["index"] for gpu in sample.gpus] == [0, 1]
    assert [gpu["power_usage_w"] for gpu in sample.gpus] == [pytest.approx(68.123)] * 2
    decoded = core.decode_gpu_sample(core.encode_gpu_sample(sample))
    assert decoded.gpus == sample.gpus and decoded.status == "ok"
    assert nvml.calls == ["init", "shutdown"]


def test_sampler_interval_is_clamped():
    for asked, used in ((0.01, 0.25), (0.5, 0.5), (10.0, 1.0)):
        sampler = NvmlSampler(lambda sample: None, rank=0, interval_s=asked, nvml=RecordedNvml(count=0))
        sampler.stop()
        assert sampler.interval_s == used


class NoLibrary(RecordedNvml):
    def nvmlInit(self):
        raise NVMLError("NVML Shared Library Not Found")


class LostGpu(RecordedNvml):
    def nvmlDeviceGetHandleByIndex(self, index):
        raise NVMLError("GPU is lost")


@pytest.mark.parametrize(("nvml", "reason", "shut_down"), [
    (NoLibrary(), "NVML not available on {host}: NVML Shared Library Not Found", False),
    (RecordedNvml(count=0), "no NVIDIA GPU on {host}", True),
    (LostGpu(), "NVML failed on {host}: GPU is lost", True),
])
def test_sampler_says_why_nvml_is_unavailable_once(nvml, reason, shut_down):
    import socket
    (sample,) = _samples(nvml)
    assert sample.status == "unavailable" and sample.gpus == []
    assert sample.reason == reason.format(host=socket.gethostname())
    assert ("shutdown" in nvml.calls) == shut_down
    assert core.decode_gpu_sample(core.encode_gpu_sample(sample)).reason == sample.reason
