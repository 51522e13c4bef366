"""RollupRecord: the aggregated steps of one time bucket (1 s or 60 s) of a run, kept for hours (written by
the aggregator into core.rollup_key(run, resolution_s), entry id = the bucket start in unix ms).

A sum over a bucket hides how uneven single steps were (a minute can read balancedness 0.99 while its steps
sit at 0.8), so a rollup carries the per-step statistics beside the sum: a histogram of per-step, per-layer
balancedness eta (mergeable: the p50/p99 of any span of buckets come from the summed histograms, exact to
the bin width), and the busiest GPU's load per step (its sum, for the mean, and its peak).

Shape legend: L MoE layers, E logical experts, B = ETA_BINS histogram bins. GPU loads are in tokens, under the
layout in force at each step (the run's metadata and layout changes), over `gpus` GPUs.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .compact import pack_counts, unpack_counts
from .fields import _float_field, _int, _raw, _text, _version
from .keys import (
    LEGACY_PHASE_COUNT,
    MAX_CELLS,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_SLOTS,
    MAX_STEP,
    MAX_TIME_S,
    PHASES,
    check_run_name,
)

ROLLUP_VERSION = 1
ROLLUP_RESOLUTIONS_S = (1, 60)
ETA_BINS = 100  # bin b holds eta in [b / B, (b + 1) / B); eta = 1 goes to the last bin
ROLLUP_FIELDS = ("v", "run", "res", "start", "steps", "tokens", "pt", "pz", "phases", "L", "E", "ct", "cz", "counts",
                 "gpus", "et", "ez", "eta", "maxsum", "meansum", "peak", "missing", "late")


@dataclass(frozen=True)
class RollupRecord:
    """The aggregated steps whose time falls in [start_s, start_s + resolution_s).

    counts_LE: int64 [L, E] tokens per expert summed over the bucket's steps; steps_by_phase: int64 [4] steps
    per phase (core.PHASES order); eta_hist_B: int64 [B] per-(step, layer) balancedness counts;
    max_load_sum / mean_load_sum: over the steps, the layer-mean of the busiest / the mean GPU's tokens
    (their ratio is the bucket's mean per-step imbalance); max_load_peak: the busiest GPU's tokens in any layer
    of any step; missing_rank_steps: ranks absent from steps the aggregator wrote without them; late_rank_steps:
    ranks folded in after their step was written.
    """

    run: str
    resolution_s: int
    start_s: int
    steps: int
    tokens: int
    steps_by_phase: np.ndarray
    counts_LE: np.ndarray
    gpus: int
    eta_hist_B: np.ndarray
    max_load_sum: float
    mean_load_sum: float
    max_load_peak: float
    missing_rank_steps: int = 0
    late_rank_steps: int = 0

    def eta_quantile(self, q: float) -> float:
        """The q-quantile (0..1) of per-step, per-layer balancedness, at the upper edge of its bin (NaN when
        the histogram is empty)."""
        return eta_quantile(self.eta_hist_B, q)


def eta_quantile(hist_B: np.ndarray, q: float) -> float:
    """q-quantile of a balancedness histogram [B] (upper edge of the bin that holds it; NaN when empty)."""
    total = int(hist_B.sum())
    if total == 0:
        return math.nan
    index = int(np.searchsorted(np.cumsum(hist_B), max(q * total, 1), side="left"))  # q=0: the lowest value
    return min(1.0, (min(index, hist_B.size - 1) + 1) / hist_B.size)


def eta_histogram(eta: np.ndarray) -> np.ndarray:
    """Balancedness values (any shape, in [0, 1]; NaN skipped) -> int64 [ETA_BINS] counts."""
    values = eta[np.isfinite(eta)].ravel()
    bins = np.minimum((np.clip(values, 0.0, 1.0) * ETA_BINS).astype(np.int64), ETA_BINS - 1)
    return np.bincount(bins, minlength=ETA_BINS).astype(np.int64)


def merge_rollups(records: Sequence[RollupRecord], resolution_s: int, start_s: int) -> RollupRecord:
    """Buckets of one run and shape -> one bucket [start_s, start_s + resolution_s) holding them all (sums,
    summed histograms, the highest peak). ValueError when empty or when runs or shapes differ."""
    if not records:
        raise ValueError("nothing to merge")
    first = records[0]
    if any(r.run != first.run or r.counts_LE.shape != first.counts_LE.shape for r in records):
        raise ValueError("rollups of different runs or shapes do not merge")
    return RollupRecord(
        run=first.run, resolution_s=int(resolution_s), start_s=int(start_s),
        steps=sum(r.steps for r in records), tokens=sum(r.tokens for r in records),
        steps_by_phase=np.sum([r.steps_by_phase for r in records], axis=0),
        counts_LE=np.asarray(np.sum([r.counts_LE for r in records], axis=0, dtype=np.int64)),
        gpus=max(r.gpus for r in records), eta_hist_B=np.sum([r.eta_hist_B for r in records], axis=0),
        max_load_sum=sum(r.max_load_sum for r in records), mean_load_sum=sum(r.mean_load_sum for r in records),
        max_load_peak=max(r.max_load_peak for r in records),
        missing_rank_steps=sum(r.missing_rank_steps for r in records),
        late_rank_steps=sum(r.late_rank_steps for r in records),
    )


def encode_rollup(rec: RollupRecord) -> dict[str, bytes | str | int]:
    """RollupRecord -> stream entry fields. ValueError when decode_rollup would refuse it."""
    counts = np.asarray(rec.counts_LE)
    if counts.ndim != 2:
        raise ValueError(f"counts_LE must be 2-D [layers, experts], got shape {counts.shape}")
    fields: dict[str, bytes | str | int] = {
        "v": ROLLUP_VERSION, "run": check_run_name(rec.run), "res": int(rec.resolution_s), "start": int(rec.start_s),
        "steps": int(rec.steps), "tokens": int(rec.tokens), "L": counts.shape[0], "E": counts.shape[1],
        "gpus": int(rec.gpus), "maxsum": repr(float(rec.max_load_sum)), "meansum": repr(float(rec.mean_load_sum)),
        "peak": repr(float(rec.max_load_peak)), "missing": int(rec.missing_rank_steps),
        "late": int(rec.late_rank_steps),
    }
    fields["pt"], fields["pz"], fields["phases"] = pack_counts(np.asarray(rec.steps_by_phase), "i8", compress=False)
    fields["ct"], fields["cz"], fields["counts"] = pack_counts(counts, widest="i8")
    fields["et"], fields["ez"], fields["eta"] = pack_counts(np.asarray(rec.eta_hist_B), widest="i8")
    decode_rollup(fields)  # one set of rules: what the reader would refuse is never written
    return fields


def _steps_by_phase(fields: dict) -> np.ndarray:
    """int64 [len(PHASES)]: the bucket's steps per phase; a rollup written before "train" counts 4 phases
    (the same codes), read with a zero for the phases it did not know."""
    type_name, codec, payload = _text(fields, "pt", 8), _text(fields, "pz", 8), _raw(fields, "phases")
    try:
        return unpack_counts(type_name, codec, payload, (len(PHASES),), "<i8")
    except ValueError:
        try:
            legacy = unpack_counts(type_name, codec, payload, (LEGACY_PHASE_COUNT,), "<i8")
        except ValueError:
            legacy = None
        if legacy is None:
            raise
    return np.concatenate([legacy, np.zeros(len(PHASES) - LEGACY_PHASE_COUNT, dtype=np.int64)])


def decode_rollup(fields: dict) -> RollupRecord:
    """Stream entry fields (bytes or str keys) -> RollupRecord. ValueError (never another exception) on any
    malformed entry: unknown version or resolution, a start that is not a multiple of the resolution, payloads
    that are not exactly their cells, negative or non-finite values, bounds of core/keys.py."""
    _version(fields, ROLLUP_VERSION, "rollup")
    resolution = _int(fields, "res", 1, 86_401)
    if resolution not in ROLLUP_RESOLUTIONS_S:
        raise ValueError(f"rollup resolution {resolution} s is not one of {ROLLUP_RESOLUTIONS_S}")
    start = _int(fields, "start", 0, int(MAX_TIME_S))
    if start % resolution:
        raise ValueError(f"bucket start {start} is not a multiple of {resolution} s")
    num_layers, num_experts = _int(fields, "L", 1, MAX_LAYERS + 1), _int(fields, "E", 1, MAX_EXPERTS + 1)
    if num_layers * num_experts > MAX_CELLS:
        raise ValueError(f"counts of {num_layers}x{num_experts} exceed {MAX_CELLS} cells")
    counts = unpack_counts(_text(fields, "ct", 8), _text(fields, "cz", 8), _raw(fields, "counts"),
                           (num_layers, num_experts), "<i8")
    phases = _steps_by_phase(fields)
    hist = unpack_counts(_text(fields, "et", 8), _text(fields, "ez", 8), _raw(fields, "eta"), (ETA_BINS,), "<i8")
    if (counts < 0).any() or (phases < 0).any() or (hist < 0).any():
        raise ValueError("rollup counts, phases or histogram are negative")
    steps = _int(fields, "steps", 0, MAX_STEP)
    if int(phases.sum()) != steps:
        raise ValueError(f"steps per phase add up to {int(phases.sum())}, not {steps}")
    loads = [_float_field(fields, name, 0.0, 1e18) for name in ("maxsum", "meansum", "peak")]
    return RollupRecord(
        run=check_run_name(_text(fields, "run", max_chars=128)), resolution_s=resolution, start_s=start,
        steps=steps, tokens=_int(fields, "tokens", 0, MAX_STEP), steps_by_phase=phases, counts_LE=counts,
        gpus=_int(fields, "gpus", 0, MAX_SLOTS + 1), eta_hist_B=hist, max_load_sum=loads[0],
        mean_load_sum=loads[1], max_load_peak=loads[2], missing_rank_steps=_int(fields, "missing", 0, MAX_STEP),
        late_rank_steps=_int(fields, "late", 0, MAX_STEP),
    )
