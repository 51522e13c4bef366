"""The pages' figures in time (core.costmodel): which TimeModel a run gets, the per-(row, layer) reductions of
its predicted GPU times that the window keeps, core.costmodel.verdict computed from them, the Overview's first
lines and each layer's regime. Pure: numpy only.

The window keeps reductions, not [C, L, G] times, so a tick costs O(rows x layers) (the verdict over a
600 x 58 x 32 view of times takes ~18 ms); tests/dashboard/test_analytics_timecost.py holds verdict_of equal
to core.costmodel.verdict. Shape legend: T rows, L layers, G GPUs.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from moe_monitor.core.costmodel import GpuTimes, ModelDims, TimeModel, Verdict
from moe_monitor.core.hardware import GpuProfile, find_profile, profile_for_device

MODEL_NOTE = "declare hidden_size, moe_intermediate_size and dtype_bytes in the run's metadata"
PROFILE_NOTE = "set gpu_profile in the collector's options, or run where NVML names a GPU of the table"


def time_model_for(meta, gpus: int, nodes: int, device_names: Iterable[str] = ()) -> tuple[TimeModel | None, str]:
    """(the run's TimeModel, "") from its metadata's dimensions and gpu_profile, else the first NVML device
    name of the table (core.hardware.profile_for_device); (None, what is missing: "no model dimensions",
    "no GPU profile", "no model dimensions/GPU profile") otherwise."""
    try:
        dims = None if meta is None else ModelDims.from_meta(meta)
    except ValueError:
        dims = None
    profile: GpuProfile | None = None
    declared = getattr(meta, "gpu_profile", "") if meta is not None else ""
    if declared:
        try:
            profile = find_profile(declared)
        except ValueError:
            profile = None
    else:
        profile = next((p for p in map(profile_for_device, device_names) if p is not None), None)
    missing = [what for what, known in (("model dimensions", dims), ("GPU profile", profile)) if known is None]
    if missing or dims is None or profile is None:
        return None, "no " + "/".join(missing)
    try:
        return TimeModel(dims, profile, gpus, nodes), ""
    except ValueError as exc:
        return None, f"no time model ({exc})"


@dataclass(frozen=True)
class RowTimes:
    """Per (row, layer), of predicted GPU times: slowest_TL / mean_TL seconds of the slowest and the mean GPU,
    busiest_TL (int64) the slowest; weights_excess_TL / flops_excess_TL its memory- / compute-bound seconds over
    the mean GPU's; active_busiest_TL / active_mean_TL / active_max_TL active slots; tokens_busiest_TL /
    tokens_mean_TL tokens; memory_bound_TL active slots on GPUs below the ridge. gpu_s_TG: seconds summed
    over layers per GPU."""

    slowest_TL: np.ndarray
    mean_TL: np.ndarray
    busiest_TL: np.ndarray
    weights_excess_TL: np.ndarray
    flops_excess_TL: np.ndarray
    active_busiest_TL: np.ndarray
    active_mean_TL: np.ndarray
    active_max_TL: np.ndarray
    tokens_busiest_TL: np.ndarray
    tokens_mean_TL: np.ndarray
    memory_bound_TL: np.ndarray
    gpu_s_TG: np.ndarray

    FIELDS_TL = ("slowest_TL", "mean_TL", "busiest_TL", "weights_excess_TL", "flops_excess_TL", "active_busiest_TL",
                 "active_mean_TL", "active_max_TL", "tokens_busiest_TL", "tokens_mean_TL", "memory_bound_TL")

    def layer(self, layer: int) -> RowTimes:
        """The same rows, one layer ([T, 1] each; gpu_s_TG that layer's seconds are not kept: unchanged)."""
        return RowTimes(**{name: getattr(self, name)[:, layer:layer + 1] for name in self.FIELDS_TL},
                        gpu_s_TG=self.gpu_s_TG)


def reduce_times(times: GpuTimes, ridge_tokens: float) -> RowTimes:
    """RowTimes of times [T, L, G] (core.costmodel.TimeModel.gpu_times of T rows)."""
    total = times.total_s
    busiest = total.argmax(-1)

    def at_busiest(part: np.ndarray) -> np.ndarray:
        return np.take_along_axis(part, busiest[..., None], axis=-1)[..., 0]

    active, tokens = times.active_slots, times.tokens
    per_active = np.divide(tokens, active, out=np.zeros_like(tokens), where=active > 0)
    return RowTimes(
        slowest_TL=total.max(-1), mean_TL=total.mean(-1), busiest_TL=busiest.astype(np.int64),
        weights_excess_TL=at_busiest(times.weights_s) - times.weights_s.mean(-1),
        flops_excess_TL=at_busiest(times.flops_s) - times.flops_s.mean(-1),
        active_busiest_TL=at_busiest(active), active_mean_TL=active.mean(-1), active_max_TL=active.max(-1),
        tokens_busiest_TL=at_busiest(tokens), tokens_mean_TL=tokens.mean(-1),
        memory_bound_TL=np.where(per_active < ridge_tokens, active, 0.0).sum(-1), gpu_s_TG=total.sum(-2))


def verdict_of(rows: RowTimes, comm_s_per_row: float, gpus: int) -> Verdict:
    """core.costmodel.verdict(times, ridge_tokens=ridge) of the times rows reduces (no speed_G: no slow GPU)."""
    steps = max(rows.slowest_TL.shape[0], 1)
    lost_TL = np.maximum(rows.slowest_TL - rows.mean_TL, 0.0)
    moe_s, lost_s = float(rows.slowest_TL.sum()) / steps, float(lost_TL.sum()) / steps
    active = float(rows.active_mean_TL.sum()) * gpus
    memory_bound_share = float(rows.memory_bound_TL.sum()) / active if active > 0 else float("nan")
    if lost_s <= 0 or gpus < 2:
        return Verdict(moe_s, lost_s, 0.0, None, None, "every GPU finishes together", 1.0, memory_bound_share)
    lost_G = np.bincount(rows.busiest_TL.ravel(), weights=lost_TL.ravel(), minlength=gpus)
    gpu = int(lost_G.argmax())
    cells = rows.busiest_TL == gpu
    comm_excess_TL = (rows.tokens_busiest_TL - rows.tokens_mean_TL) * comm_s_per_row
    excess = {"active experts": float(rows.weights_excess_TL[cells].sum()),
              "tokens": float(rows.flops_excess_TL[cells].sum()), "traffic": float(comm_excess_TL[cells].sum())}
    cause = max(excess, key=lambda k: excess[k])
    if cause == "active experts":
        mine, mean = rows.active_busiest_TL[cells].mean(), rows.active_mean_TL[cells].mean()
        why = f"it runs {mine:.1f} active experts per layer against a mean of {mean:.1f} (weight reads bound them)"
    else:
        mine, mean = rows.tokens_busiest_TL[cells].mean(), rows.tokens_mean_TL[cells].mean()
        why = (f"it computes {mine:,.0f} tokens per layer against a mean of {mean:,.0f}" if cause == "tokens" else
               f"it receives {mine:,.0f} tokens per layer against a mean of {mean:,.0f} over the all-to-all")
    return Verdict(moe_s, lost_s, lost_s / moe_s if moe_s > 0 else 0.0, gpu, cause, why,
                   moe_s / max(moe_s - lost_s, 1e-30), memory_bound_share)


@dataclass(frozen=True)
class TimeHeadline:
    """The Overview's first lines: first (what the busiest GPU costs), light (the speed-of-light line), label
    ("predicted for <profile>, <dims>"); gpu_hours_per_day and light_tokens_per_s NaN when the step rate
    does not allow them."""

    verdict: Verdict
    first: str
    light: str
    label: str
    gpu_hours_per_day: float
    light_tokens_per_s: float


def headline(verdict: Verdict, model: TimeModel, steps_per_s: float, tokens_per_s: float,
             gpus_per_node: int, scope: str = "") -> TimeHeadline:
    """The sentences of a verdict at the measured rates (steps_per_s, tokens_per_s; NaN or 0: unknown).
    scope: what the verdict covers when not every layer of every step ("layer 3"; "" for all)."""
    rate = steps_per_s if steps_per_s > 0 and math.isfinite(steps_per_s) else float("nan")
    layers, lose, their = ("The MoE layers", "lose", "their") if not scope else (f"MoE {scope}", "loses", "its")
    label = f"predicted for {model.label()}"
    if math.isfinite(verdict.memory_bound_share):
        label += (f"; {verdict.memory_bound_share:.0%} of active experts memory-bound (under "
                  f"{model.ridge_tokens:,.0f} tokens per expert)")
    if verdict.gpu is None:
        first = (f"{layers} {lose} no time waiting for the busiest GPU: {verdict.why} "
                 f"({_duration(verdict.moe_s)} per step).")
        return TimeHeadline(verdict, first, "", label, 0.0, float("nan"))
    hours = verdict.gpu_hours_per_day(rate, model.gpus)
    per_day = f"{hours:,.1f} GPU-hours a day at this rate" if math.isfinite(hours) else "no step rate yet"
    gpu = verdict.gpu
    first = (f"{layers} {lose} {_share(verdict.lost_share)} of {their} time waiting for the busiest GPU — "
             f"{_duration(verdict.lost_s)} per step, {per_day} — GPU {gpu} (node {gpu // max(gpus_per_node, 1)}), "
             f"because {verdict.why}.")
    light = f"{layers} would run {verdict.speedup:.2f}× faster if every GPU finished at the mean"
    light_tokens = float("nan")
    step_s = 1.0 / rate if math.isfinite(rate) else float("nan")
    if not scope and tokens_per_s > 0 and math.isfinite(step_s) and verdict.lost_s < step_s:
        light_tokens = tokens_per_s * step_s / (step_s - verdict.lost_s)
        light += f": {light_tokens:,.0f} tokens/s against {tokens_per_s:,.0f} measured."
    elif not scope and math.isfinite(step_s):
        light += (f" (no tokens/s at that speed: the predicted wait, {_duration(verdict.lost_s)}, is longer than "
                  f"the measured step, {_duration(step_s)}).")
    else:
        light += "."
    return TimeHeadline(verdict, first, light, label, hours, light_tokens)


@dataclass(frozen=True)
class LayerRegimes:
    """Per layer over a view's rows: active_max_L / active_mean_L active experts per GPU (mean over rows of
    the most-active GPU's and the mean GPU's), tokens_per_active_L, memory_bound_L (below ridge_tokens),
    layer_s_L its predicted seconds per step (the slowest GPU's), lost_share_L of them spent waiting for it."""

    active_max_L: np.ndarray
    active_mean_L: np.ndarray
    tokens_per_active_L: np.ndarray
    memory_bound_L: np.ndarray
    layer_s_L: np.ndarray
    lost_share_L: np.ndarray
    ridge_tokens: float


def layer_regimes(rows: RowTimes, ridge_tokens: float) -> LayerRegimes:
    """Each layer's active experts per GPU, regime (memory- vs compute-bound) and time over the rows."""
    active_L = rows.active_mean_TL.sum(0)
    per_active_L = np.divide(rows.tokens_mean_TL.sum(0), active_L, out=np.full(active_L.shape, np.nan),
                             where=active_L > 0)
    slowest_L = rows.slowest_TL.sum(0)
    lost_L = np.maximum(rows.slowest_TL - rows.mean_TL, 0.0).sum(0)
    steps = max(rows.active_mean_TL.shape[0], 1)
    return LayerRegimes(rows.active_max_TL.sum(0) / steps, active_L / steps, per_active_L,
                        per_active_L < ridge_tokens, slowest_L / steps,
                        np.divide(lost_L, slowest_L, out=np.zeros_like(lost_L), where=slowest_L > 0), ridge_tokens)


def regime_rows(reg: LayerRegimes) -> list[dict[str, float | int | str]]:
    """The Devices table: one row per layer, rounded for reading."""
    rows: list[dict[str, float | int | str]] = []
    for layer in range(reg.active_max_L.size):
        high, mean, per_active = (float(v) for v in (reg.active_max_L[layer], reg.active_mean_L[layer],
                                                     reg.tokens_per_active_L[layer]))
        regime = ("idle" if not math.isfinite(per_active) else
                  "memory-bound" if reg.memory_bound_L[layer] else "compute-bound")
        rows.append({"layer": layer, "active experts/GPU, max": round(high, 2), "mean": round(mean, 2),
                     "max/mean": round(high / mean, 2) if mean > 0 else float("nan"),
                     "tokens per active expert": round(per_active, 1), "regime": regime,
                     "predicted µs/step": round(float(reg.layer_s_L[layer]) * 1e6, 1),
                     "waiting for the busiest": f"{reg.lost_share_L[layer]:.1%}"})
    return rows


def regime_line(reg: LayerRegimes) -> str:
    """One sentence: active experts per GPU max/mean (median layer) and how many layers are memory-bound."""
    busy = np.isfinite(reg.tokens_per_active_L)
    ratio_L = np.divide(reg.active_max_L, reg.active_mean_L, out=np.full(reg.active_max_L.shape, np.nan),
                        where=reg.active_mean_L > 0)
    ratio = float(np.median(ratio_L[busy])) if busy.any() else float("nan")
    return (f"Active experts per GPU, max/mean: {ratio:.2f} (median layer). {int(reg.memory_bound_L[busy].sum())} of "
            f"{int(busy.sum())} layers memory-bound: under {reg.ridge_tokens:,.0f} tokens per active expert, an "
            "expert's time is its weight reads, so a GPU's time follows its active experts more than its tokens.")


def tokens_headline(note: str, idle_share: float, straggler_gpu: int | None, ratio_to_mean: float,
                    gpus_per_node: int) -> tuple[str, str]:
    """(first line, what would put it in time) when there is no time model: note ("no model dimensions", ...)
    and the token figures (idle share = 1 - balancedness; the straggler's load over the mean)."""
    idle = "n/a" if not math.isfinite(idle_share) else _share(idle_share)
    first = f"{note[:1].upper()}{note[1:]}: figures in tokens — idle share {idle} (1 − balancedness, window mean)"
    if straggler_gpu is not None:
        first += (f"; the busiest GPU, GPU {straggler_gpu} (node {straggler_gpu // max(gpus_per_node, 1)}), "
                  f"carries {ratio_to_mean:.2f}× the mean load")
    hints = [hint for what, hint in (("dimensions", MODEL_NOTE), ("profile", PROFILE_NOTE)) if what in note]
    return first + ".", "For time figures: " + "; ".join(hints or [note]) + "."


def _share(share: float) -> str:
    return f"{share:.0%}" if share >= 0.1 else f"{share:.1%}"


def _duration(seconds: float) -> str:
    """1.5 -> '1.50 s', 0.0123 -> '12.3 ms', 4e-5 -> '40 µs'."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.0f} µs"
