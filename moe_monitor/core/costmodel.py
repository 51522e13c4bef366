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

from .hardware import GpuProfile, find_profile, profile_for_device

NO_DIMS = "no model dimensions"
NO_PROFILE = "no GPU profile"


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
        return cls(meta.hidden_size, meta.moe_intermediate_size, meta.expert_matrices, float(meta.dtype_bytes),
                   float(meta.act_dtype_bytes or meta.dtype_bytes))


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


def slot_work(dims: ModelDims, tokens_XLP, tile_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes_XLP, flops_XLP) float64: what each slot reads (its expert's weights and its tokens' activations in
    and out; 0 for an idle slot) and computes (its tokens padded up to the GEMM tile)."""
    t = np.asarray(tokens_XLP, dtype=np.float64)
    bytes_XLP = np.where(t > 0, dims.expert_bytes + t * (2.0 * dims.hidden_size * dims.act_bytes), 0.0)
    return bytes_XLP, np.ceil(t / tile_tokens) * tile_tokens * dims.flops_per_token


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
        """(seconds, memory_bound) float64 / bool [..., L, P]: each slot's expert GEMM (0 for an idle slot):
        the max of its reads and FLOPs, or their sum where the profile's do not overlap."""
        bytes_XLP, flops_XLP = slot_work(self.dims, tokens_XLP, self.profile.tile_tokens)
        memory_s, flops_s = bytes_XLP / self.profile.hbm, flops_XLP / self.peak_flops
        seconds = np.maximum(memory_s, flops_s) if self.profile.overlap else memory_s + flops_s
        return seconds, (bytes_XLP > 0) & (memory_s >= flops_s)

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


def run_profile(meta, device_names=()) -> GpuProfile | None:
    """The GPU profile of a run: its metadata's gpu_profile, else the first of its GPUs' NVML names the table
    knows (core.hardware.profile_for_device), else None."""
    declared = "" if meta is None else meta.gpu_profile
    if declared:
        try:
            return find_profile(declared)
        except ValueError:
            return None
    return next((p for p in map(profile_for_device, device_names) if p is not None), None)


def run_nodes(meta, gpus: int) -> int | None:
    """The nodes the run's layout puts `gpus` GPUs on (None: no metadata, or its layout is for other GPUs)."""
    return meta.layout.nodes if meta is not None and meta.layout.gpus == gpus else None


def default_nodes(gpus: int, profile: GpuProfile) -> int:
    """Nodes G GPUs span when nothing says: G / the profile's GPUs per node when that divides G, else 1."""
    per_node = max(1, profile.gpus_per_node)
    return gpus // per_node if gpus > per_node and gpus % per_node == 0 else 1


def time_model(dims: ModelDims | None, profile: GpuProfile | None, gpus: int,
               nodes: int | None = None) -> TimeModel | list[str]:
    """The TimeModel of `gpus` GPUs over `nodes` nodes (None: default_nodes), or the reasons there is none
    (NO_DIMS, NO_PROFILE)."""
    missing = ([NO_DIMS] if dims is None else []) + ([NO_PROFILE] if profile is None else [])
    if dims is None or profile is None:
        return missing
    return TimeModel(dims, profile, gpus, default_nodes(gpus, profile) if nodes is None else nodes)


CAUSES = ("tokens", "active experts", "traffic", "slow GPU")


@dataclass(frozen=True)
class ReducedTimes:
    """What a verdict needs of predicted times [T, L, G], per (step, layer): slowest_TL / mean_TL seconds of the
    slowest and the mean GPU, busiest_TL (int64) the slowest; weights_excess_TL / flops_excess_TL /
    comm_excess_TL its memory-bound, compute-bound and all-to-all seconds over the mean GPU's; flops_busiest_TL its
    compute-bound seconds; active_busiest_TL / active_mean_TL / active_max_TL active slots; tokens_busiest_TL /
    tokens_mean_TL tokens; memory_bound_TL active slots on GPUs below the ridge (NaN: no ridge given); gpus G.
    The step window keeps these per row, not the [T, L, G] times."""

    slowest_TL: np.ndarray
    mean_TL: np.ndarray
    busiest_TL: np.ndarray
    weights_excess_TL: np.ndarray
    flops_excess_TL: np.ndarray
    comm_excess_TL: np.ndarray
    flops_busiest_TL: np.ndarray
    active_busiest_TL: np.ndarray
    active_mean_TL: np.ndarray
    active_max_TL: np.ndarray
    tokens_busiest_TL: np.ndarray
    tokens_mean_TL: np.ndarray
    memory_bound_TL: np.ndarray
    gpus: int

    FIELDS_TL = ("slowest_TL", "mean_TL", "busiest_TL", "weights_excess_TL", "flops_excess_TL", "comm_excess_TL",
                 "flops_busiest_TL", "active_busiest_TL", "active_mean_TL", "active_max_TL", "tokens_busiest_TL",
                 "tokens_mean_TL", "memory_bound_TL")

    def layer(self, layer: int) -> ReducedTimes:
        """The same steps, one layer ([T, 1] each)."""
        return ReducedTimes(**{name: getattr(self, name)[:, layer:layer + 1] for name in self.FIELDS_TL},
                            gpus=self.gpus)


def reduce_times(times: GpuTimes, ridge_tokens: float | None = None) -> ReducedTimes:
    """ReducedTimes of times [T, L, G] (TimeModel.gpu_times); ridge_tokens: TimeModel.ridge_tokens."""
    total = times.total_s
    if total.ndim != 3:
        raise ValueError(f"times must be [steps, layers, GPUs], got {total.shape}")
    busiest = total.argmax(-1)

    def at_busiest(part: np.ndarray) -> np.ndarray:
        return np.take_along_axis(part, busiest[..., None], axis=-1)[..., 0]

    active, tokens = times.active_slots, times.tokens
    per_active = np.divide(tokens, active, out=np.zeros_like(tokens), where=active > 0)
    memory_bound = (np.full(total.shape[:2], np.nan) if ridge_tokens is None
                    else np.where(per_active < ridge_tokens, active, 0.0).sum(-1))
    flops_busiest = at_busiest(times.flops_s)
    return ReducedTimes(
        slowest_TL=total.max(-1), mean_TL=total.mean(-1), busiest_TL=busiest.astype(np.int64),
        weights_excess_TL=at_busiest(times.weights_s) - times.weights_s.mean(-1),
        flops_excess_TL=flops_busiest - times.flops_s.mean(-1),
        comm_excess_TL=at_busiest(times.comm_s) - times.comm_s.mean(-1), flops_busiest_TL=flops_busiest,
        active_busiest_TL=at_busiest(active), active_mean_TL=active.mean(-1), active_max_TL=active.max(-1),
        tokens_busiest_TL=at_busiest(tokens), tokens_mean_TL=tokens.mean(-1), memory_bound_TL=memory_bound,
        gpus=int(total.shape[-1]))


@dataclass(frozen=True)
class Verdict:
    """What the busiest GPUs cost, over some (step, layer) cells: moe_s per step (sum over layers of the slowest
    GPU), lost_s per step (sum over layers of slowest minus mean: every other GPU waits that long), lost_share =
    lost_s / moe_s, gpu the one that holds layers back longest (None: no time lost), cause one of CAUSES
    (its largest excess over the mean GPU) and why (a sentence), speedup the MoE layers' if every GPU finished
    at the mean; memory_bound_share: share of active slots below the ridge (NaN: no ridge given)."""

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
    return verdict_of(reduce_times(times, ridge_tokens), speed_G)


def verdict_of(reduced: ReducedTimes, speed_G=None) -> Verdict:
    """The Verdict of reduced times; speed_G: each GPU's compute speed (None: 1), the "slow GPU" cause."""
    steps = max(reduced.slowest_TL.shape[0], 1)
    gpus = reduced.gpus
    lost_TL = np.maximum(reduced.slowest_TL - reduced.mean_TL, 0.0)
    moe_s, lost_s = float(reduced.slowest_TL.sum()) / steps, float(lost_TL.sum()) / steps
    active = float(reduced.active_mean_TL.sum()) * gpus
    memory_bound_share = float(reduced.memory_bound_TL.sum()) / active if active > 0 else float("nan")
    if lost_s <= 0 or gpus < 2:
        return Verdict(moe_s, lost_s, 0.0, None, None, "every GPU finishes together", 1.0, memory_bound_share)
    lost_G = np.bincount(reduced.busiest_TL.ravel(), weights=lost_TL.ravel(), minlength=gpus)
    gpu = int(lost_G.argmax())
    cells = reduced.busiest_TL == gpu
    excess = {name: float(part[cells].sum()) for name, part in (
        ("active experts", reduced.weights_excess_TL), ("tokens", reduced.flops_excess_TL),
        ("traffic", reduced.comm_excess_TL))}
    speed = 1.0 if speed_G is None else float(np.asarray(speed_G)[gpu])
    if speed < 1.0:
        excess["slow GPU"] = float(reduced.flops_busiest_TL[cells].sum() * (1.0 - speed))
    cause = max(excess, key=lambda k: excess[k])
    return Verdict(moe_s, lost_s, lost_s / moe_s if moe_s > 0 else 0.0, gpu, cause,
                   _why(cause, reduced, cells, speed), moe_s / max(moe_s - lost_s, 1e-30), memory_bound_share)


def _why(cause: str, reduced: ReducedTimes, cells: np.ndarray, speed: float) -> str:
    """One sentence: the straggler's figure against the mean GPU's over the cells it is the busiest in."""
    if cause == "slow GPU":
        return f"it computes at {speed:.0%} of its rated clock"
    if cause == "active experts":
        mine, mean = reduced.active_busiest_TL[cells].mean(), reduced.active_mean_TL[cells].mean()
        return f"it runs {mine:.1f} active experts per layer against a mean of {mean:.1f} (weight reads bound them)"
    mine, mean = reduced.tokens_busiest_TL[cells].mean(), reduced.tokens_mean_TL[cells].mean()
    if cause == "tokens":
        return f"it computes {mine:,.0f} tokens per layer against a mean of {mean:,.0f}"
    return f"it receives {mine:,.0f} tokens per layer against a mean of {mean:,.0f} over the all-to-all"
