"""The exporter's bounds on series, pure: which GPUs get series of their own, and the global series cap.

Per run and phase the exporter lists at most `max_gpus` GPUs (the busiest by window-mean load, the straggler
always among them) and sums up the rest in a few series; over all runs it serves at most `max_series` series.
When the global cap bites, every run keeps its essential families first (balancedness, idle share, straggler,
rates, counters, collector health: a few dozen series a run), then the rest (per-GPU loads, advisor, timings,
per-layer and per-expert series) in the order of the runs (newest first) while room is left. What is left out
is counted per run, so the exporter can say so (moe_exporter_truncated, moe_exporter_series_dropped_total).

Shape legend: G GPUs.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from prometheus_client.core import Metric

DEFAULT_MAX_GPUS = 64  # GPUs listed per run and phase
DEFAULT_MAX_SERIES = 20_000  # series one exporter serves at most
MIN_MAX_SERIES = 100  # the exporter's own series and one run's essentials fit
# families every run keeps before anything else under the global cap
ESSENTIAL = frozenset({
    "moe_balancedness_ratio", "moe_idle_share_ratio", "moe_straggler_gpu", "moe_straggler_load_to_mean_ratio",
    "moe_steps_per_second", "moe_tokens_per_second", "moe_steps", "moe_dropped_steps", "moe_bad_records",
    "moe_collector_up", "moe_collector_last_write_age_seconds",
})


def top_gpus(mean_G: np.ndarray, max_gpus: int, keep: int | None = None) -> np.ndarray:
    """int64 [N <= max_gpus]: the GPUs with the highest mean_G (float [G]; NaN counts lowest, ties to the lower
    id), ascending by id; `keep` (the straggler) is always among them. All GPUs when G <= max_gpus."""
    if max_gpus < 1:
        raise ValueError(f"max_gpus must be at least 1, got {max_gpus}")
    mean_G = np.asarray(mean_G, dtype=np.float64)
    gpus = mean_G.size
    if gpus <= max_gpus:
        return np.arange(gpus, dtype=np.int64)
    score_G = np.where(np.isnan(mean_G), -np.inf, mean_G)
    order = np.lexsort((np.arange(gpus), -score_G))  # highest first, lower id on ties
    chosen = order[:max_gpus]
    if keep is not None and 0 <= keep < gpus and keep not in chosen:
        chosen = np.append(chosen[:-1], keep)
    return np.sort(chosen).astype(np.int64)


def cap_series(runs: Sequence[tuple[str, list[Metric]]], max_series: int) -> tuple[list[Metric], dict[str, int]]:
    """(families, dropped per run): the families of every run (run name, its families; newest run first) with
    at most max_series samples in all, essential families first (ESSENTIAL), then the others, each tier in
    the runs' order; families that lose every sample are left out. Families come back as new objects; the
    input is not changed."""
    if max_series < 0:
        raise ValueError(f"max_series must be >= 0, got {max_series}")
    left = max_series
    dropped = {name: 0 for name, _ in runs}
    kept: dict[tuple[str, int], list] = {}
    for essential in (True, False):
        for name, families in runs:
            for index, family in enumerate(families):
                if (family.name in ESSENTIAL) != essential:
                    continue
                take = min(left, len(family.samples))
                left -= take
                dropped[name] += len(family.samples) - take
                if take:
                    kept[(name, index)] = family.samples[:take]
    out: list[Metric] = []
    for name, families in runs:
        for index, family in enumerate(families):
            samples = kept.get((name, index))
            if samples is None:
                continue
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = list(samples)
            out.append(copy)
    return out, dropped
