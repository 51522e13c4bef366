"""The pages' figures in time (core.costmodel): which TimeModel a run gets, the Overview's first lines and each
layer's regime, from the core.costmodel.ReducedTimes the window keeps per row (a tick costs O(rows x layers);
the verdict over a 600 x 58 x 32 view of full times takes ~18 ms). Pure: numpy only.
Shape legend: T rows, L layers, G GPUs.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from moe_monitor.core.costmodel import ModelDims, ReducedTimes, TimeModel, Verdict, run_profile, time_model
from moe_monitor.core.hardware import GpuProfile

MODEL_NOTE = "declare hidden_size, moe_intermediate_size and dtype_bytes in the run's metadata"
FOREIGN_SHARE = 0.01  # predicted MoE time below this share of the measured step: the profile is not the hardware's
PROFILE_NOTE = "set gpu_profile in the collector's options, or run where NVML names a GPU of the table"


def time_model_for(meta, gpus: int, nodes: int | None, device_names: Iterable[str] = (),
                   profile: GpuProfile | None = None) -> tuple[TimeModel | None, str]:
    """(the run's TimeModel, "") from its metadata's dimensions and a GPU profile (given, else
    core.costmodel.run_profile); (None, what is missing: "no model dimensions", "no GPU profile", "no model
    dimensions/GPU profile")."""
    try:
        dims = None if meta is None else ModelDims.from_meta(meta)
    except ValueError:
        dims = None
    try:
        found = time_model(dims, profile or run_profile(meta, device_names), gpus, nodes)
    except ValueError as exc:
        return None, f"no time model ({exc})"
    if isinstance(found, list):
        return None, "no " + "/".join(reason.removeprefix("no ") for reason in found)
    return found, ""


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
                 f"({duration_text(verdict.moe_s)} per step).")
        return TimeHeadline(verdict, first, "", label, 0.0, float("nan"))
    hours = verdict.gpu_hours_per_day(rate, model.gpus)
    per_day = f"{hours:,.1f} GPU-hours a day at this rate" if math.isfinite(hours) else "no step rate yet"
    gpu = verdict.gpu
    first = (f"{layers} {lose} {share_text(verdict.lost_share)} of {their} time waiting for the busiest GPU — "
             f"{duration_text(verdict.lost_s)} per step, {per_day} — GPU {gpu} (node {gpu // max(gpus_per_node, 1)}), "
             f"because {verdict.why}.")
    light = f"{layers} would run {verdict.speedup:.2f}× faster if every GPU finished at the mean"
    light_tokens = float("nan")
    step_s = 1.0 / rate if math.isfinite(rate) else float("nan")
    if not scope and math.isfinite(step_s) and verdict.moe_s < FOREIGN_SHARE * step_s:
        light += (f" (no tokens/s derived: the predicted MoE time, {duration_text(verdict.moe_s)} per step, is under "
                  f"{FOREIGN_SHARE:.0%} of the measured step, {duration_text(step_s)}: the steps run on other hardware "
                  "than the profile's).")
    elif not scope and tokens_per_s > 0 and math.isfinite(step_s) and verdict.lost_s < step_s:
        light_tokens = tokens_per_s * step_s / (step_s - verdict.lost_s)
        light += f": {light_tokens:,.0f} tokens/s against {tokens_per_s:,.0f} measured."
    elif not scope and math.isfinite(step_s):
        light += (f" (no tokens/s at that speed: the predicted wait, {duration_text(verdict.lost_s)}, is longer than "
                  f"the measured step, {duration_text(step_s)}).")
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


def layer_regimes(rows: ReducedTimes, ridge_tokens: float) -> LayerRegimes:
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


BALANCED_BY_CONSTRUCTION = ("lp", "ideal")  # dispatch policies under which every GPU gets the mean tokens (or
                                           # the fewest the replicas allow): GPU token balance says nothing


def router_skew(counts_sum_LE: np.ndarray) -> float:
    """The router's logical skew: max/mean tokens per expert over the window, median over layers with tokens
    (NaN when none)."""
    counts = np.asarray(counts_sum_LE, dtype=np.float64)
    mean_L = counts.mean(-1)
    busy = mean_L > 0
    return float(np.median(counts.max(-1)[busy] / mean_L[busy])) if busy.any() else float("nan")


def balanced_backend_line(dispatch: str, skew: float, regimes: LayerRegimes | None) -> str:
    """For an engine whose dispatch evens GPU tokens by construction (BALANCED_BY_CONSTRUCTION), what to read
    instead of GPU tokens; "" for any other dispatch."""
    if dispatch not in BALANCED_BY_CONSTRUCTION:
        return ""
    text = (f"This engine evens GPU tokens by construction (dispatch {dispatch}): per-GPU tokens say nothing about "
            f"the straggler. The router's skew is {skew:.2f}× (max/mean tokens per expert, median layer)")
    if regimes is None:
        return text + "; declare the model's dimensions and a GPU profile to see the time it costs."
    busy = np.isfinite(regimes.tokens_per_active_L) & (regimes.active_mean_L > 0)
    ratio = float(np.median(regimes.active_max_L[busy] / regimes.active_mean_L[busy])) if busy.any() else float("nan")
    return text + f"; active experts per GPU, max/mean {ratio:.2f} (median layer); the time verdict above prices both."


def tokens_headline(note: str, idle_share: float, straggler_gpu: int | None, ratio_to_mean: float,
                    gpus_per_node: int) -> tuple[str, str]:
    """(first line, what would put it in time) when there is no time model: note ("no model dimensions", ...)
    and the token figures (idle share = 1 - balancedness; the straggler's load over the mean)."""
    idle = "n/a" if not math.isfinite(idle_share) else share_text(idle_share)
    first = f"{note[:1].upper()}{note[1:]}: figures in tokens — idle share {idle} (1 − balancedness, window mean)"
    if straggler_gpu is not None:
        first += (f"; the busiest GPU, GPU {straggler_gpu} (node {straggler_gpu // max(gpus_per_node, 1)}), "
                  f"carries {ratio_to_mean:.2f}× the mean load")
    hints = [hint for what, hint in (("dimensions", MODEL_NOTE), ("profile", PROFILE_NOTE)) if what in note]
    return first + ".", "For time figures: " + "; ".join(hints or [note]) + "."


def share_text(share: float) -> str:
    return f"{share:.0%}" if share >= 0.1 else f"{share:.1%}"


def duration_text(seconds: float) -> str:
    """1.5 -> '1.50 s', 0.0123 -> '12.3 ms', 4e-5 -> '40 µs'."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.0f} µs"
