"""The cost model: predicted time of each GPU's MoE layer from the tokens on its slots, and what the busiest GPU
costs. Every reader that speaks in seconds (pages, score, diagnose, the exporter, the bench) uses it, as they use
core.loadmodel for tokens. Pure: numpy only. Formula, hardware table and measured error: docs/costmodel.md.

Per active slot: max(weight bytes / HBM, FLOPs of its tokens padded to the GEMM tile / peak); per GPU: the sum
over its slots + dispatch and combine bytes / link (inside the node over NVLink, across nodes over the NIC) + a
fixed overhead. Shapes: X any leading axes (steps), L layers, P slots, G GPUs, S = P / G slots per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hardware import GpuProfile


@dataclass(frozen=True)
class ModelDims:
    """One routed expert and what crosses the all-to-all: hidden_size H, moe_intermediate_size I, expert_matrices
    (3 for a gated FFN: gate, up, down), weight_bytes per weight element (fp8 1, bf16 2), act_bytes per
    activation element sent in dispatch and combine."""

    hidden_size: int
    moe_intermediate_size: int
    expert_matrices: int = 3
    weight_bytes: float = 2.0
    act_bytes: float = 2.0

    def __post_init__(self):
        if min(self.hidden_size, self.moe_intermediate_size, self.expert_matrices) < 1 or not (
                self.weight_bytes > 0 and self.act_bytes > 0):
            raise ValueError(f"model dimensions must be positive, got {self}")

    @property
    def weights_per_expert(self) -> int:
        return self.expert_matrices * self.hidden_size * self.moe_intermediate_size

    @property
    def expert_bytes(self) -> float:
        """Bytes of one expert's weights (read once per active slot per step)."""
        return self.weights_per_expert * self.weight_bytes

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.weights_per_expert

    def label(self) -> str:
        return (f"hidden {self.hidden_size} x expert {self.moe_intermediate_size} x {self.expert_matrices} "
                f"matrices, {_dtype(self.weight_bytes)} weights")

    @classmethod
    def from_meta(cls, meta) -> ModelDims | None:
        """The dimensions a RunMeta declares (its expert_matrices and act_dtype_bytes where it has them); None
        when hidden or expert size is unknown (0)."""
        if not (meta.hidden_size and meta.moe_intermediate_size and meta.dtype_bytes):
            return None
        return cls(meta.hidden_size, meta.moe_intermediate_size, getattr(meta, "expert_matrices", 3) or 3,
                   float(meta.dtype_bytes), float(getattr(meta, "act_dtype_bytes", 0) or meta.dtype_bytes))


def _dtype(width: float) -> str:
    return {1.0: "fp8", 2.0: "16-bit", 4.0: "fp32"}.get(float(width), f"{width:g}-byte")


@dataclass(frozen=True)
class GpuTimes:
    """Predicted seconds of each GPU's MoE layer, float64 [..., L, G] each: weights_s the slots whose weight reads
    outlast their FLOPs (memory-bound), flops_s the others (compute-bound), comm_s dispatch + combine; overhead_s
    per layer; active_slots and tokens [..., L, G] what they come from."""

    weights_s: np.ndarray
    flops_s: np.ndarray
    comm_s: np.ndarray
    overhead_s: float
    active_slots: np.ndarray
    tokens: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return self.weights_s + self.flops_s + self.comm_s + self.overhead_s


class TimeModel:
    """Predicted MoE-layer time of `gpus` GPUs over `nodes` nodes for a model's dimensions on one GPU profile."""

    def __init__(self, dims: ModelDims, profile: GpuProfile, gpus: int, nodes: int = 1):
        if gpus < 1 or nodes < 1 or gpus % nodes:
            raise ValueError(f"gpus={gpus} must be a positive multiple of nodes={nodes}")
        self.dims, self.profile, self.gpus, self.nodes = dims, profile, int(gpus), int(nodes)
        self.peak_flops = profile.peak_flops(dims.weight_bytes)
        self.weight_read_s = dims.expert_bytes / profile.hbm
        per_node = gpus // nodes
        row_bytes = dims.hidden_size * dims.act_bytes
        # a row received by GPU g comes from each GPU alike (data-parallel attention): (per_node - 1)/G of them
        # over NVLink, (G - per_node)/G over the NIC, both links busy at once; once for dispatch, once for combine
        self.comm_s_per_row = 2.0 * row_bytes * max((per_node - 1) / gpus / profile.nvlink_bytes_per_s,
                                                    (gpus - per_node) / gpus / profile.nic_bytes_per_s)

    @property
    def ridge_tokens(self) -> float:
        """Tokens per expert where its FLOPs take as long as its weight reads."""
        return self.profile.ridge_tokens(self.dims.weight_bytes)

    def label(self) -> str:
        return f"{self.profile.name}, {self.dims.label()}"

    def slot_seconds(self, tokens_XLP) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, memory_bound) float64 / bool [..., L, P]: each slot's expert GEMM (0 for an idle slot)."""
        t = np.asarray(tokens_XLP, dtype=np.float64)
        tile = self.profile.tile_tokens
        padded = np.ceil(t / tile) * tile
        active = t > 0
        act_read_s = t * (2.0 * self.dims.hidden_size * self.dims.act_bytes) / self.profile.hbm
        memory_s = np.where(active, self.weight_read_s + act_read_s, 0.0)
        flops_s = padded * (self.dims.flops_per_token / self.peak_flops)
        return np.maximum(memory_s, flops_s), active & (memory_s >= flops_s)

    def gpu_times(self, slot_tokens_XLP, speed_G=None) -> GpuTimes:
        """Predicted times from tokens per slot [..., L, P] (a core.dispatch policy's slot_loads); speed_G: each
        GPU's compute speed relative to the profile (an NVML clock over its maximum; None: 1)."""
        t = np.asarray(slot_tokens_XLP, dtype=np.float64)
        if t.ndim < 2 or t.shape[-1] % self.gpus:
            raise ValueError(f"slot tokens [..., L, P] with P a multiple of {self.gpus} GPUs, got {t.shape}")
        seconds, memory_bound = self.slot_seconds(t)
        if speed_G is not None:
            speed_P = np.repeat(np.asarray(speed_G, dtype=np.float64), t.shape[-1] // self.gpus)
            seconds = np.where(memory_bound, seconds, seconds / np.clip(speed_P, 1e-3, None))
        shape = t.shape[:-1] + (self.gpus, t.shape[-1] // self.gpus)
        weights_s = np.where(memory_bound, seconds, 0.0).reshape(shape).sum(-1)
        flops_s = np.where(memory_bound, 0.0, seconds).reshape(shape).sum(-1)
        tokens = t.reshape(shape).sum(-1)
        active = (t > 0).reshape(shape).sum(-1).astype(np.float64)
        return GpuTimes(weights_s, flops_s, tokens * self.comm_s_per_row, self.profile.overhead_s, active, tokens)


CAUSES = ("tokens", "active experts", "traffic", "slow GPU")


@dataclass(frozen=True)
class Verdict:
    """What the busiest GPUs cost, over some (step, layer) cells: moe_s per step (sum over layers of the slowest
    GPU), lost_s per step (sum over layers of slowest minus mean: every other GPU waits that long), lost_share =
    lost_s / moe_s, gpu the one that holds layers back longest (None: no time lost), cause one of CAUSES
    (its largest excess over the mean GPU) and why (a sentence), speedup the MoE layers' if every GPU finished
    at the mean; memory_bound_share: share of active slots below the ridge."""

    moe_s: float
    lost_s: float
    lost_share: float
    gpu: int | None
    cause: str | None
    why: str
    speedup: float
    memory_bound_share: float

    def gpu_hours_per_day(self, steps_per_s: float, gpus: int) -> float:
        """GPU-hours a day lost waiting at this rate: every GPU waits lost_s per step."""
        return self.lost_s * gpus * steps_per_s * 86400.0 / 3600.0


def verdict(times: GpuTimes, speed_G=None, ridge_tokens: float | None = None) -> Verdict:
    """The Verdict of times [T, L, G] (steps x layers x GPUs; a single step as [1, L, G])."""
    total = times.total_s
    if total.ndim != 3:
        raise ValueError(f"times must be [steps, layers, GPUs], got {total.shape}")
    steps = max(total.shape[0], 1)
    slowest_TL = total.max(-1)
    lost_TL = np.maximum(slowest_TL - total.mean(-1), 0.0)
    moe_s, lost_s = float(slowest_TL.sum()) / steps, float(lost_TL.sum()) / steps
    active = times.active_slots
    tokens_per_active = np.divide(times.tokens, active, out=np.zeros_like(times.tokens), where=active > 0)
    memory_bound_share = float("nan")
    if ridge_tokens is not None and active.sum() > 0:
        memory_bound_share = float(active[tokens_per_active < ridge_tokens].sum() / active.sum())
    if lost_s <= 0 or total.shape[-1] < 2:
        return Verdict(moe_s, lost_s, 0.0, None, None, "every GPU finishes together", 1.0, memory_bound_share)
    busiest_TL = total.argmax(-1)
    lost_G = np.bincount(busiest_TL.ravel(), weights=lost_TL.ravel(), minlength=total.shape[-1])
    gpu = int(lost_G.argmax())
    cells = busiest_TL == gpu
    excess = {}
    for name, part in (("active experts", times.weights_s), ("tokens", times.flops_s), ("traffic", times.comm_s)):
        excess[name] = float((part[..., gpu] - part.mean(-1))[cells].sum())
    if speed_G is not None and float(np.asarray(speed_G)[gpu]) < 1.0:
        speed = float(np.asarray(speed_G)[gpu])
        excess["slow GPU"] = float(times.flops_s[..., gpu][cells].sum() * (1.0 - speed))
    cause = max(excess, key=lambda k: excess[k])
    why = _why(cause, times, gpu, cells, speed_G)
    return Verdict(moe_s, lost_s, lost_s / moe_s if moe_s > 0 else 0.0, gpu, cause, why,
                   moe_s / max(moe_s - lost_s, 1e-30), memory_bound_share)


def _why(cause: str, times: GpuTimes, gpu: int, cells: np.ndarray, speed_G) -> str:
    """One sentence: the straggler's figure against the mean GPU's over the cells it is the busiest in."""
    if cause == "slow GPU":
        return f"it computes at {float(np.asarray(speed_G)[gpu]):.0%} of its rated clock"
    if cause == "active experts":
        mine, mean = times.active_slots[..., gpu][cells].mean(), times.active_slots.mean(-1)[cells].mean()
        return f"it runs {mine:.1f} active experts per layer against a mean of {mean:.1f} (weight reads bound them)"
    mine, mean = times.tokens[..., gpu][cells].mean(), times.tokens.mean(-1)[cells].mean()
    if cause == "tokens":
        return f"it computes {mine:,.0f} tokens per layer against a mean of {mean:,.0f}"
    return f"it receives {mine:,.0f} tokens per layer against a mean of {mean:,.0f} over the all-to-all"
