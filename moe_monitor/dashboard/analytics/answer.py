"""The Overview's answer, pure: which GPU holds the MoE layers back (or that none does persistently), what it
costs, why, and what to do, in one sentence; and the per-GPU series its picture marks that GPU on.

In time (a cost model): the GPU the layers wait for longest, and the series is the wait charged to each GPU.
In tokens (no cost model): the straggler of the window's loads, and the series is each GPU's mean load.
Thresholds in docs/dashboard.md ("The first screen"); the tone's are analytics.levels'. Shape legend: T rows,
L layers, E experts, G GPUs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moe_monitor.core.costmodel import ReducedTimes, Verdict, verdict_of
from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.dashboard.analytics.balance import Straggler
from moe_monitor.dashboard.analytics.levels import IDLE_SHARE, LOST_SHARE
from moe_monitor.dashboard.analytics.timecost import duration_text, share_text

MIN_RATIO = 1.05         # a token straggler carries at least this times the mean GPU's load ...
CHANCE_MULTIPLE = 3.0    # ... and is the busiest GPU this many times as often as chance (1/G) would make it
MIN_LOST_SHARE = 0.02    # in time: waiting under this share of MoE time is no straggler worth naming
HOT_LISTED = 3           # experts named in the why


@dataclass(frozen=True)
class Hot:
    """An expert of one layer on a GPU and its share of that GPU's tokens over the window."""

    layer: int
    expert: int
    share: float


@dataclass(frozen=True)
class Answer:
    """gpu: the straggler the picture marks (None: no persistent straggler); sentence: markdown, one line;
    tone "ok" / "warn" / "bad"; series_G float [G] with its title and unit: what the picture draws (in time
    the wait charged to each GPU, in tokens each GPU's mean load)."""

    gpu: int | None
    sentence: str
    tone: str
    series_G: np.ndarray
    series_title: str
    series_unit: str


def fair_share(gpus: int) -> float:
    """The busiest-share a straggler must reach: CHANCE_MULTIPLE / G, at most one half."""
    return min(0.5, CHANCE_MULTIPLE / max(gpus, 1))


def persistent(straggler: Straggler | None, gpus: int) -> bool:
    """Whether a token straggler is one: MIN_RATIO times the mean load and busiest at least fair_share(G)."""
    return (straggler is not None and straggler.ratio_to_mean >= MIN_RATIO
            and straggler.busiest_share >= fair_share(gpus))


def wait_by_gpu(rows: ReducedTimes) -> np.ndarray:
    """float64 [G]: seconds per row the other GPUs wait for each GPU (slowest minus mean, charged to the slowest
    of each (row, layer)); they sum to the verdict's lost_s."""
    lost_TL = np.maximum(rows.slowest_TL - rows.mean_TL, 0.0)
    steps = max(rows.slowest_TL.shape[0], 1)
    return np.bincount(rows.busiest_TL.ravel(), weights=lost_TL.ravel(), minlength=rows.gpus)[:rows.gpus] / steps


def gpu_share(layout_LP: np.ndarray, num_experts: int, gpus: int, gpu: int) -> np.ndarray:
    """float64 [L, E]: the share of each expert's tokens GPU `gpu` serves (core.loadmodel's even split over
    replicas), from that GPU's slots alone: O(L x P), not the [L, E, G] weights of every GPU."""
    lay = np.asarray(layout_LP, dtype=np.int64)
    per_gpu = lay.shape[1] // gpus
    replicas_LE = replica_counts(lay, num_experts)
    share_LE = np.zeros((lay.shape[0], num_experts))
    mine = lay[:, gpu * per_gpu:(gpu + 1) * per_gpu]
    rows = np.repeat(np.arange(lay.shape[0]), mine.shape[1])
    experts, used = mine.ravel(), mine.ravel() >= 0   # -1: an unused slot serves nothing
    rows, experts = rows[used], experts[used]
    np.add.at(share_LE, (rows, experts), 1.0 / replicas_LE[rows, experts])
    return share_LE


def hottest_on(counts_LE: np.ndarray, layout_LP: np.ndarray, gpus: int, gpu: int, top: int = HOT_LISTED) -> list[Hot]:
    """The experts that give GPU `gpu` most of its tokens (counts [L, E] summed over the window, replicas
    sharing evenly), with their share of its tokens; [] when it has none."""
    counts_LE = np.asarray(counts_LE, dtype=np.float64)
    load_LE = counts_LE * gpu_share(layout_LP, counts_LE.shape[1], gpus, gpu)
    total = float(load_LE.sum())
    if total <= 0:
        return []
    flat = load_LE.ravel()
    picked = np.argsort(-flat, kind="stable")[:top]
    return [Hot(int(i // counts_LE.shape[1]), int(i % counts_LE.shape[1]), float(flat[i] / total))
            for i in picked if flat[i] > 0]


@dataclass(frozen=True)
class Named:
    """Which GPU an answer names (None: no persistent straggler), and in time what it was judged on: the
    verdict and the wait charged to each GPU (wait_by_gpu, float [G]); both None in tokens."""

    gpu: int | None
    verdict: Verdict | None = None
    wait_G: np.ndarray | None = None


def named(straggler: Straggler | None, gpus: int, rows: ReducedTimes | None) -> Named:
    """The GPU the answer names. In tokens (rows None): the window's straggler when persistent(). In time:
    the verdict's GPU when the wait is at least MIN_LOST_SHARE of MoE time and that GPU accounts for at least
    fair_share(G) of it."""
    if rows is None:
        return Named(straggler.gpu if straggler is not None and persistent(straggler, gpus) else None)
    verdict, wait_G = verdict_of(rows), wait_by_gpu(rows)
    total = float(wait_G.sum())
    gpu = verdict.gpu
    if gpu is None or verdict.lost_share < MIN_LOST_SHARE or total <= 0 or wait_G[gpu] < fair_share(gpus) * total:
        gpu = None
    return Named(gpu, verdict, wait_G)


def answer(who: Named, straggler: Straggler | None, gpus: int, gpus_per_node: int, idle_share: float,
           mean_load_G: np.ndarray, load_unit: str, hot: list[Hot], steps_per_s: float = float("nan"),
           advice: str = "", time_note: str = "") -> Answer:
    """The answer of a window, from named() (in time when it holds a verdict); straggler the window's token
    straggler, mean_load_G float [G] each GPU's mean load in load_unit (the picture in tokens); hot the named
    GPU's hottest experts (hottest_on); advice the advisor's line ("" while it has none)."""
    if who.verdict is not None and who.wait_G is not None:
        return _in_time(who.gpu, who.verdict, who.wait_G, gpus_per_node, hot, steps_per_s, advice)
    return _in_tokens(who.gpu, straggler, gpus_per_node, idle_share, mean_load_G, load_unit, hot, advice,
                      time_note)


def _in_time(gpu: int | None, verdict: Verdict, wait_G: np.ndarray, per_node: int, hot: list[Hot],
             steps_per_s: float, advice: str) -> Answer:
    gpus = wait_G.size
    hours = verdict.gpu_hours_per_day(steps_per_s, gpus) if steps_per_s > 0 else float("nan")
    cost = (f"{share_text(verdict.lost_share)} of MoE time waiting — {duration_text(verdict.lost_s)} per step"
            + (f", {_hours(hours)} GPU-hours a day" if math.isfinite(hours) else ""))
    title, unit = "Predicted wait for each GPU (ms per step)", "ms per step"
    total = float(wait_G.sum())
    if gpu is None:
        spread = "" if total <= 0 else f"; no GPU accounts for more than {share_text(float(wait_G.max() / total))} of it"
        sentence = f"**No persistent straggler**: the MoE layers lose {cost}{spread}. {_to_do(advice)}"
        return Answer(None, sentence, "ok" if verdict.lost_share < LOST_SHARE.bad else "warn", wait_G * 1e3, title, unit)
    why = verdict.why + (f"; its hottest experts: {_hot(hot)}" if hot and verdict.cause != "slow GPU" else "")
    sentence = (f"**{_gpu(gpu, per_node)} holds the MoE layers back**: they lose {cost}, "
                f"{share_text(float(wait_G[gpu] / total))} of it waiting for this GPU. Why: {why}. "
                f"{_to_do(advice)}")
    return Answer(gpu, sentence, "bad" if verdict.lost_share >= LOST_SHARE.bad else "warn", wait_G * 1e3, title, unit)


def _in_tokens(gpu: int | None, straggler: Straggler | None, per_node: int, idle_share: float,
               mean_load_G: np.ndarray, load_unit: str, hot: list[Hot], advice: str, time_note: str) -> Answer:
    idle = "n/a" if not math.isfinite(idle_share) else share_text(idle_share)
    note = f" (in tokens: {time_note})" if time_note else " (in tokens)"
    title, series = "Mean load of each GPU over the window", np.asarray(mean_load_G, dtype=np.float64)
    if gpu is None or straggler is None:
        near = ("" if straggler is None else f"; the busiest, {_gpu(straggler.gpu, per_node)}, carries "
                f"{straggler.ratio_to_mean:.2f}× the mean and is busiest in {share_text(straggler.busiest_share)} of "
                f"{straggler.basis}")
        sentence = (f"**No persistent straggler**{note}: GPUs idle {idle} of the time waiting{near}. "
                    f"{_to_do(advice)}")
        return Answer(None, sentence, "ok" if not idle_share >= IDLE_SHARE.bad else "warn", series, title, load_unit)
    why = f"its hottest experts: {_hot(hot)}" if hot else "it holds more of the routed experts"
    sentence = (f"**{_gpu(gpu, per_node)} holds the MoE layers back**{note}: busiest in "
                f"{share_text(straggler.busiest_share)} of {straggler.basis} at {straggler.ratio_to_mean:.2f}× the "
                f"mean load; GPUs idle {idle} of the time waiting. Why: {why}. {_to_do(advice)}")
    return Answer(gpu, sentence, "bad" if idle_share >= IDLE_SHARE.bad else "warn", series, title, load_unit)


def _hours(hours: float) -> str:
    """1234.5 -> '1,234.5', 0.0123 -> '0.012' (two significant digits under one)."""
    return f"{hours:,.1f}" if hours >= 1 else f"{hours:.2g}"


def _to_do(advice: str) -> str:
    if not advice:
        return "To do: the rebalance advisor is weighing the window."
    return f"To do: {advice[:1].lower()}{advice[1:]}."


def _hot(hot: list[Hot]) -> str:
    return ", ".join(f"layer {h.layer} expert {h.expert} ({share_text(h.share)} of its tokens)" for h in hot)


def _gpu(gpu: int, per_node: int) -> str:
    return f"GPU {gpu} (node {gpu // max(per_node, 1)})"

