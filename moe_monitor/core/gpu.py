"""GpuSample: NVML readings (or an "unavailable" status) and their stream encoding."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .fields import _int, _is_int, _json, _text, _time, _version
from .keys import MAX_NAME_CHARS, MAX_WORLD, SCHEMA_VERSION

MAX_GPUS_PER_SAMPLE = 1024  # GPUs one host reports in one sample
MAX_GPU_VALUE = 1 << 62     # any numeric reading (bytes of memory are the largest: ~1e11 today)
MAX_REASON_CHARS = 4096

GPU_FIELDS = (
    # name                      unit      DCGM exporter field / nvitop attribute
    "index",                  # -         gpu
    "name",                   # -         modelName
    "uuid",                   # -         UUID
    "gpu_utilization_percent",  # %       DCGM_FI_DEV_GPU_UTIL / gpu_utilization (time-based: a kernel ran)
    "memory_used_bytes",      # B         DCGM_FI_DEV_FB_USED / memory_used
    "memory_total_bytes",     # B         memory_total
    "power_usage_w",          # W         DCGM_FI_DEV_POWER_USAGE / power_usage
    "power_limit_w",          # W         power_limit
    "sm_clock_mhz",           # MHz       DCGM_FI_DEV_SM_CLOCK / sm_clock
    "temperature_c",          # Celsius   DCGM_FI_DEV_GPU_TEMP / temperature
)


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of every GPU on one host, or a status: status "ok" with gpus, or "unavailable"
    with reason (no NVIDIA driver, no GPU). A value NVML could not read is None, never invented."""

    rank: int
    host: str
    time_s: float
    status: str
    gpus: list[dict] = field(default_factory=list)
    reason: str = ""


def encode_gpu_sample(sample: GpuSample) -> dict[str, str | int]:
    if sample.status not in ("ok", "unavailable"):
        raise ValueError(f"status must be 'ok' or 'unavailable', got {sample.status!r}")
    return {
        "v": SCHEMA_VERSION, "rank": sample.rank, "host": sample.host, "t": repr(float(sample.time_s)),
        "status": sample.status, "reason": sample.reason,
        "gpus": json.dumps([{k: g.get(k) for k in GPU_FIELDS} for g in sample.gpus], separators=(",", ":")),
    }


_GPU_TEXT_FIELDS = ("name", "uuid")


def _clean_gpu(raw: dict) -> dict:
    """One GPU's reading with every numeric field a finite number in 0..MAX_GPU_VALUE or None and text fields
    of at most MAX_NAME_CHARS characters; ValueError otherwise."""
    out = {}
    for key in GPU_FIELDS:
        value = raw.get(key)
        if key in _GPU_TEXT_FIELDS:
            if value is not None and not (isinstance(value, str) and len(value) <= MAX_NAME_CHARS):
                raise ValueError(f"GPU field {key!r} must be text of at most {MAX_NAME_CHARS} characters")
        elif value is not None:
            number = isinstance(value, float) and math.isfinite(value) or _is_int(value)
            if not number or not 0 <= value <= MAX_GPU_VALUE:
                shown = repr(value)[:40] if isinstance(value, (str, float)) or _is_int(value) and value < 10**20 \
                    else type(value).__name__
                raise ValueError(f"GPU field {key!r} must be a finite number in 0..{MAX_GPU_VALUE} or null, "
                                 f"got {shown}")
            if key == "index" and not _is_int(value):
                raise ValueError("GPU field 'index' must be an integer")
        out[key] = value
    if out["index"] is None:
        raise ValueError("GPU reading lacks its index")
    return out


def decode_gpu_sample(fields: dict) -> GpuSample:
    """Stream entry -> GpuSample; ValueError (never another exception) on any malformed entry: wrong types,
    NaN, negative or huge values, more than MAX_GPUS_PER_SAMPLE GPUs, JSON nested too deeply, rank >= MAX_WORLD,
    a host name over MAX_NAME_CHARS or a reason over MAX_REASON_CHARS characters."""
    _version(fields, SCHEMA_VERSION, say_supported=False)
    status = _text(fields, "status", max_chars=16)
    if status not in ("ok", "unavailable"):
        raise ValueError(f"unknown GPU status {status!r}")
    gpus = _json(_text(fields, "gpus"), "GPU sample 'gpus'", max_bytes=MAX_GPUS_PER_SAMPLE * 1024)
    time_s = _time(fields, "t")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus[:MAX_GPUS_PER_SAMPLE + 1]):
        raise ValueError("gpus must be a list of objects")
    if len(gpus) > MAX_GPUS_PER_SAMPLE:
        raise ValueError(f"a GPU sample lists {len(gpus)} GPUs, at most {MAX_GPUS_PER_SAMPLE} are supported")
    return GpuSample(rank=_int(fields, "rank", 0, MAX_WORLD), host=_text(fields, "host", max_chars=MAX_NAME_CHARS),
                     time_s=time_s, status=status, gpus=[_clean_gpu(g) for g in gpus],
                     reason=_text(fields, "reason", max_chars=MAX_REASON_CHARS))
