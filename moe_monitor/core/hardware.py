"""GpuProfile: what the cost model needs to know of a GPU (peak dense FLOP/s per weight dtype, HBM and link
bandwidth, a fixed per-layer overhead), the table of common GPUs, and the lookup by NVML device name.

Spec figures are vendors' datasheet numbers (dense, no sparsity), sources in docs/costmodel.md; the model
multiplies them by the shares real grouped GEMMs reach (ACHIEVED_*). A profile fitted by `moe-monitor
calibrate` carries measured figures with both shares 1.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from .fields import _json

ACHIEVED_FLOPS_SHARE = 0.7  # of peak dense FLOP/s a tuned grouped GEMM reaches at large M
ACHIEVED_HBM_SHARE = 0.8    # of spec HBM bandwidth a streaming weight read reaches
DEFAULT_OVERHEAD_S = 45e-6  # per MoE layer: router, permute, launches, all-to-all latency (not bytes; docs/costmodel.md)
DEFAULT_TILE_TOKENS = 64    # rows of a grouped GEMM's M tile: an expert's tokens are padded up to a multiple
MAX_PROFILE_BYTES = 64 << 10


@dataclass(frozen=True)
class GpuProfile:
    """One GPU model. flops_per_s: peak dense FLOP/s by weight bytes ("1" fp8, "2" bf16/fp16, "4" fp32);
    hbm_bytes_per_s: memory bandwidth; nvlink_bytes_per_s / nic_bytes_per_s: one direction, per GPU, inside a
    node / across nodes; gpus_per_node: the scale-up domain; overhead_s: fixed time per MoE layer;
    tile_tokens: grouped-GEMM M tile; flops_share / hbm_share: achieved fractions of the peaks; overlap: a slot's
    weight reads and FLOPs overlap (a GPU's grouped GEMM: max of the two) or add (False: a CPU's BLAS packs the
    weights, then multiplies; `moe-monitor calibrate` picks the form that fits)."""

    name: str
    flops_per_s: dict[str, float]
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    nic_bytes_per_s: float
    gpus_per_node: int = 8
    overhead_s: float = DEFAULT_OVERHEAD_S
    tile_tokens: int = DEFAULT_TILE_TOKENS
    flops_share: float = ACHIEVED_FLOPS_SHARE
    hbm_share: float = ACHIEVED_HBM_SHARE
    source: str = "datasheet"
    notes: dict = field(default_factory=dict)
    overlap: bool = True

    def peak_flops(self, weight_bytes: float) -> float:
        """Achieved FLOP/s of a GEMM whose weights have this many bytes per element (the narrowest dtype the GPU
        has at or above it: an fp8 model on an A100 runs in bf16)."""
        for width in sorted(float(k) for k in self.flops_per_s):
            if width >= weight_bytes:
                return self.flops_per_s[_key(width)] * self.flops_share
        return self.flops_per_s[_key(max(float(k) for k in self.flops_per_s))] * self.flops_share

    @property
    def hbm(self) -> float:
        """Achieved HBM bytes/s."""
        return self.hbm_bytes_per_s * self.hbm_share

    def ridge_tokens(self, weight_bytes: float) -> float:
        """Tokens per expert at which its GEMM's FLOPs take as long as reading its weights (2 FLOPs per weight
        per token): below it the expert is memory-bound."""
        return self.peak_flops(weight_bytes) * weight_bytes / (2.0 * self.hbm)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def _key(width: float) -> str:
    return str(int(width)) if float(width).is_integer() else repr(width)


T, G = 1e12, 1e9
GPU_PROFILES: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("H100 SXM", {"1": 1979 * T, "2": 989.5 * T, "4": 67 * T}, 3.35 * T, 450 * G, 50 * G),
    GpuProfile("H200", {"1": 1979 * T, "2": 989.5 * T, "4": 67 * T}, 4.8 * T, 450 * G, 50 * G),
    GpuProfile("B200", {"1": 4500 * T, "2": 2250 * T, "4": 80 * T}, 8.0 * T, 900 * G, 50 * G),
    GpuProfile("MI300X", {"1": 2614.9 * T, "2": 1307.4 * T, "4": 163.4 * T}, 5.3 * T, 448 * G, 50 * G),
    GpuProfile("A100 SXM", {"2": 312 * T, "4": 19.5 * T}, 2.039 * T, 300 * G, 25 * G),
    GpuProfile("L40S", {"1": 733 * T, "2": 362 * T, "4": 91.6 * T}, 0.864 * T, 32 * G, 25 * G),
)}

# NVML / ROCm device-name fragments -> profile, first match wins (H100 PCIe and NVL are other products)
_NAME_RULES = (("H100 PCIE", None), ("H100 NVL", None), ("H100", "H100 SXM"), ("GH200", "H200"), ("H200", "H200"),
               ("B200", "B200"), ("MI300X", "MI300X"), ("A100", "A100 SXM"), ("L40S", "L40S"))


def profile_for_device(device_name: str) -> GpuProfile | None:
    """The table's profile of an NVML device name ("NVIDIA H100 80GB HBM3" -> H100 SXM); None when unknown."""
    upper = device_name.upper().replace("-", " ")
    for fragment, name in _NAME_RULES:
        if fragment in upper:
            return None if name is None else GPU_PROFILES[name]
    return None


def find_profile(name: str) -> GpuProfile:
    """A profile by its table name (case and spaces ignored) or an NVML device name; ValueError naming the table
    otherwise."""
    wanted = name.strip().lower().replace(" ", "").replace("-", "")
    for profile in GPU_PROFILES.values():
        if profile.name.lower().replace(" ", "") == wanted:
            return profile
    found = profile_for_device(name)
    if found is None:
        raise ValueError(f"no GPU profile {name!r}: one of {', '.join(GPU_PROFILES)}, or a file from "
                         "`moe-monitor calibrate`")
    return found


def parse_profile(text: str | bytes) -> GpuProfile:
    """A profile from its JSON (GpuProfile.to_json, `moe-monitor calibrate`); ValueError when it is not one."""
    raw = _json(text, "GPU profile", MAX_PROFILE_BYTES)
    if not isinstance(raw, dict):
        raise ValueError("a GPU profile must be a JSON object")
    try:
        profile = GpuProfile(**raw)
    except TypeError as exc:
        raise ValueError(f"GPU profile is malformed: {exc}") from None
    return check_profile(profile)


def check_profile(profile: GpuProfile) -> GpuProfile:
    """profile when every figure is a finite positive number (FLOP/s keyed by positive byte widths)."""
    if not isinstance(profile.name, str) or not isinstance(profile.flops_per_s, dict) or not profile.flops_per_s:
        raise ValueError("a GPU profile needs a name and flops_per_s {bytes per weight: FLOP/s}")
    numbers = [profile.hbm_bytes_per_s, profile.nvlink_bytes_per_s, profile.nic_bytes_per_s, profile.flops_share,
               profile.hbm_share, *profile.flops_per_s.values()]
    if not all(_positive(v) for v in numbers) or not all(_positive(_float(k)) for k in profile.flops_per_s):
        raise ValueError(f"GPU profile {profile.name!r}: every bandwidth, FLOP/s and share must be positive")
    if not (_non_negative(profile.overhead_s) and isinstance(profile.tile_tokens, int) and profile.tile_tokens >= 1
            and isinstance(profile.gpus_per_node, int) and profile.gpus_per_node >= 1
            and isinstance(profile.overlap, bool)):
        raise ValueError(f"GPU profile {profile.name!r}: overhead_s >= 0, tile_tokens and gpus_per_node >= 1, "
                         "overlap true or false")
    return profile


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _non_negative(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
