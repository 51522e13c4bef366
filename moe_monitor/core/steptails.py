"""Per-step figures under a dispatch policy (docs/definitions.md, "Per-step tails"); pure numpy, one home for every
reader (pages, exporter, planner, score, diagnose). For every (step, layer) pair with tokens:
per-step imbalance = max / mean GPU load under the policy (core.dispatch); ideal fraction = its inverse; expert
skew = over the GPUs with tokens, the largest (most tokens of one slot on the GPU) / (mean tokens per slot there).
Percentiles are numpy's default (linear) over the pairs with tokens; idle pairs are NaN and left out. The window
imbalance is max / mean of the loads summed over the window, averaged over layers.

Shape legend: T steps, L layers, E experts, P slots, G GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dispatch import DispatchModel


@dataclass(frozen=True)
class StepTails:
    """Per-step figures of T steps under one layout and policy: imbalance_TL and skew_TL float64 [T, L] (NaN
    for idle pairs), window_loads_LG float64 [L, G] (the per-step GPU loads summed)."""
    policy: str
    imbalance_TL: np.ndarray
    skew_TL: np.ndarray
    window_loads_LG: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.imbalance_TL.shape[0])

    def imbalance_summary(self) -> dict[str, float | None]:
        """{"p50", "p99", "max"} of the per-step imbalance over all pairs with tokens (None without any)."""
        return _percentiles(self.imbalance_TL)

    def skew_summary(self) -> dict[str, float | None]:
        """{"p50", "p99", "max"} of the expert skew over all pairs with tokens."""
        return _percentiles(self.skew_TL)

    def layer_summary(self) -> dict[str, list[float | None]]:
        """Per layer [L]: p50, p99, max of the per-step imbalance and p99 of the skew (None for idle layers)."""
        out: dict[str, list[float | None]] = {}
        for name, values, q in (("p50", self.imbalance_TL, 50), ("p99", self.imbalance_TL, 99),
                                ("max", self.imbalance_TL, 100), ("skew_p99", self.skew_TL, 99)):
            out[name] = [_none(v) for v in _nan_percentile_columns(values, q)]
        return out

    @property
    def ideal_fraction(self) -> float | None:
        """Mean over the pairs with tokens of mean / max GPU load."""
        finite = np.isfinite(self.imbalance_TL)
        return float(np.mean(1.0 / self.imbalance_TL[finite])) if finite.any() else None

    @property
    def window_imbalance(self) -> float | None:
        """max / mean of the window's summed GPU loads, averaged over the layers with tokens."""
        loads = self.window_loads_LG
        busy = loads.sum(-1) > 0
        if not busy.any():
            return None
        return float(np.mean(loads[busy].max(-1) / loads[busy].mean(-1)))

    def to_json(self) -> dict:
        """The figures `moe-monitor score --json` prints (strict JSON: None for what has no value)."""
        return {"steps": self.steps, "dispatch": self.policy, "per_step_imbalance": self.imbalance_summary(),
                "window_imbalance": _none(self.window_imbalance), "ideal_fraction": _none(self.ideal_fraction),
                "expert_skew_p99": self.skew_summary()["p99"], "expert_skew": self.skew_summary(),
                "per_layer": self.layer_summary()}


def step_tails(counts_TLE, layout_LP, gpus: int, policy: str = "even") -> StepTails:
    """Per-step figures of counts [T, L, E] (numbers >= 0) under layout_LP [L, P] on `gpus` GPUs and a dispatch
    policy (core.dispatch.DISPATCH_POLICIES). ValueError for a layout or counts that do not fit together."""
    counts = np.asarray(counts_TLE)
    if counts.ndim != 3:
        raise ValueError(f"counts must be [steps, layers, experts], got shape {counts.shape}")
    model = DispatchModel(layout_LP, counts.shape[2], gpus, policy)
    return tails_of(model, counts)


def tails_of(model: DispatchModel, counts_TLE: np.ndarray) -> StepTails:
    """step_tails() with a DispatchModel built once (a page scoring many windows under one layout)."""
    T, L = counts_TLE.shape[:2]
    imbalance_TL = np.full((T, L), np.nan)
    skew_TL = np.full((T, L), np.nan)
    window_LG = np.zeros((L, model.gpus))
    chunk = model.steps_per_chunk  # bounds the [steps, L, P] float64 temporaries
    for a in range(0, T, chunk):
        slot_TLP = model.slot_loads(counts_TLE[a:a + chunk])
        slot_TLGS = slot_TLP.reshape(slot_TLP.shape[:2] + (model.gpus, model.slots_per_gpu))
        gpu_TLG = slot_TLGS.sum(-1)
        window_LG += gpu_TLG.sum(0)
        imbalance_TL[a:a + chunk] = pair_imbalance(gpu_TLG)
        skew_TL[a:a + chunk] = pair_skew(slot_TLGS)
    return StepTails(model.policy, imbalance_TL, skew_TL, window_LG)


def pair_imbalance(loads_XG: np.ndarray) -> np.ndarray:
    """max / mean over the last axis (GPUs), NaN where every GPU is idle: [..., G] -> [...]."""
    peak = loads_XG.max(-1)
    mean = loads_XG.mean(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, peak / np.where(mean > 0, mean, 1.0), np.nan)


def pair_skew(slot_XGS: np.ndarray) -> np.ndarray:
    """Expert skew [...] from slot loads [..., G, S]: over the GPUs with tokens, the largest max slot / mean slot;
    NaN where no GPU has tokens."""
    mean_XG = slot_XGS.mean(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_XG = np.where(mean_XG > 0, slot_XGS.max(-1) / np.where(mean_XG > 0, mean_XG, 1.0), -np.inf)
    worst = ratio_XG.max(-1)
    return np.where(np.isfinite(worst), worst, np.nan)


def _nan_percentile(values: np.ndarray, q: float) -> float:
    """The q-th percentile of the finite values, NaN without any."""
    finite = np.isfinite(values)
    return float(np.percentile(values[finite], q)) if finite.any() else float("nan")


def _nan_percentile_columns(values: np.ndarray, q: float) -> np.ndarray:
    """float64 [C]: the q-th percentile of each column's finite values of [N, C], NaN for a column without any."""
    finite = np.isfinite(values)
    out = np.full(values.shape[1], np.nan)
    for col in range(values.shape[1]):
        if finite[:, col].any():
            out[col] = np.percentile(values[finite[:, col], col], q)
    return out


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    return {"p50": _none(_nan_percentile(values, 50)), "p99": _none(_nan_percentile(values, 99)),
            "max": _none(_nan_percentile(values, 100))}


def _none(value) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None
