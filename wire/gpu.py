"""GpuSample: NVML readings (or an "unavailable" status) and their stream encoding."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .fields import _int, _is_int, _text
from .keys import SCHEMA_VERSION

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
    """One GPU's reading with every numeric field a finite number >= 0 or None; ValueError otherwise."""
    out = {}
    for key in GPU_FIELDS:
        value = raw.get(key)
        if key in _GPU_TEXT_FIELDS:
            if value is not None and not isinstance(value, str):
                raise ValueError(f"GPU field {key!r} must be text")
        elif value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"GPU field {key!r} must be a finite number >= 0 or null, got {value!r}")
            if key == "index" and not _is_int(value):
                raise ValueError("GPU field 'index' must be an integer")
        out[key] = value
    if out["index"] is None:
        raise ValueError("GPU reading lacks its index")
    return out


def decode_gpu_sample(fields: dict) -> GpuSample:
    """Stream entry -> GpuSample; ValueError on any malformed entry (wrong types, NaN, negative values)."""
    version = _int(fields, "v")
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema version {version} is not supported")
    status = _text(fields, "status")
    if status not in ("ok", "unavailable"):
        raise ValueError(f"unknown GPU status {status!r}")
    try:
        gpus = json.loads(_text(fields, "gpus"))
        time_s = float(_text(fields, "t"))
    except (json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"GPU sample is malformed: {exc}") from None
    if not math.isfinite(time_s):
        raise ValueError("time is not finite")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise ValueError("gpus must be a list of objects")
    return GpuSample(rank=_int(fields, "rank"), host=_text(fields, "host"), time_s=time_s,
                     status=status, gpus=[_clean_gpu(g) for g in gpus], reason=_text(fields, "reason"))
