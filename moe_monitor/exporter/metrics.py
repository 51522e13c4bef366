"""A watched run's numbers as Prometheus metric families, computed by the same analytics as the pages
(dashboard.live.snapshot.analyse): one implementation of every number.

Names carry their unit (Prometheus conventions); labels are bounded: run, phase, the window a statistic
covers, the statistic, and gpu (at most max_gpus values per run and phase: the busiest by window-mean load and
the straggler; the others summed up in moe_gpu_load_rest_tokens_per_step and counted in moe_gpu_rest_gpus).
Per-layer and per-expert series only on request and capped (per_layer: L series per run and phase;
top_experts: N), so a 58-layer x 256-expert x 32-GPU run costs a few hundred series by default, not the
L x E x ranks that stalls per-expert metrics elsewhere, and a run declaring 65,536 GPUs no more than 64 of them.
Where the run's cost model is known (Snapshot.time: its dimensions and a GPU profile), the Overview's verdict in
time as moe_predicted_* gauges; moe_time_model_available says which runs have one, or why not.
"""
from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from moe_monitor.core.steptails import StepTails
from moe_monitor.dashboard.analytics.timing import TimingSummary
from moe_monitor.dashboard.live.snapshot import Snapshot
from moe_monitor.dashboard.sources.base import Health
from moe_monitor.exporter.caps import DEFAULT_MAX_GPUS, top_gpus
from moe_monitor.planner.advisor import Advice
from moe_monitor.planner.rebalances import RebalanceHealth

PHASES = ("both", "prefill", "decode")


def _value(x: float | None) -> float:
    return float(x) if x is not None and math.isfinite(float(x)) else math.nan


def run_families(run: str, snapshots: dict[str, Snapshot | None], steps_read: int,
                 dropped_steps: int, bad_records: int, health: Health, now_s: float | None = None,
                 per_layer: bool = False, top_experts: int = 0,
                 advice: dict[str, Advice | None] | None = None,
                 timings: dict[str, TimingSummary | None] | None = None,
                 max_gpus: int = DEFAULT_MAX_GPUS,
                 tails: dict[str, StepTails | None] | None = None,
                 rebalance: RebalanceHealth | None = None) -> list[Metric]:
    """Metric families of one run. snapshots: phase -> analyse() of the window for that phase (None when no
    step of the phase is in the window; its gauges are then left out, never invented). per_layer: also each
    layer's mean per-step balancedness; top_experts: also the N hottest experts' tokens per step (summed
    over layers); advice: phase -> the rebalance advisor's latest decision on that phase's window
    (planner.advisor.advise_now; None or absent: no gauge for that phase); timings: phase -> the layer timings of
    that phase's window (dashboard.analytics.timing.summarise; None or absent: no timing series, as for a run
    whose engine does not time its layers); max_gpus: GPUs with series of their own per phase (exporter.caps.
    top_gpus), the others summed up in the rest series; tails: phase -> the per-step figures of that phase's window
    under the run's dispatch policy (dashboard.live.steptails; None or absent: no per-step series for it);
    rebalance: the run's layout changes (planner.rebalances; None: no moe_layout_change_* series)."""
    now_s = time.time() if now_s is None else now_s
    eta = GaugeMetricFamily("moe_balancedness_ratio", "Balancedness eta = mean/max GPU load across layers "
                            "(window: latest_step, step_mean = mean of per-step eta, window_sum = eta of summed "
                            "loads; stat: min/p50/p90 over layers)", labels=["run", "phase", "window", "stat"])
    idle = GaugeMetricFamily("moe_idle_share_ratio", "1 - balancedness, window mean of per-step eta",
                             labels=["run", "phase"])
    load = GaugeMetricFamily("moe_gpu_load_tokens_per_step", "Per-GPU expert load in tokens per step, per-layer "
                             "view (each GPU's busiest layer; even split across replicas); stat: latest/mean/"
                             "p99/max over the window", labels=["run", "phase", "gpu", "stat"])
    straggler = GaugeMetricFamily("moe_straggler_gpu", "GPU that is busiest in most (step, layer) pairs; -1 none",
                                  labels=["run", "phase"])
    straggler_ratio = GaugeMetricFamily("moe_straggler_load_to_mean_ratio", "The straggler's load over the "
                                        "mean GPU load", labels=["run", "phase"])
    rate = GaugeMetricFamily("moe_steps_per_second", "Steps per second over the window", labels=["run", "phase"])
    tokens = GaugeMetricFamily("moe_tokens_per_second", "Tokens per second over the window",
                               labels=["run", "phase"])
    layer_eta = GaugeMetricFamily("moe_layer_balancedness_ratio", "Mean over the window's steps of one layer's "
                                  "balancedness (only with --per-layer)", labels=["run", "phase", "layer"])
    rest = GaugeMetricFamily("moe_gpu_load_rest_tokens_per_step", "The GPUs without series of their own (beyond "
                             "the busiest --max-gpus): stat mean = the mean of their window-mean loads; latest, p99, "
                             "max = the highest among them", labels=["run", "phase", "stat"])
    rest_gpus = GaugeMetricFamily("moe_gpu_rest_gpus", "GPUs summed up in moe_gpu_load_rest_tokens_per_step",
                                  labels=["run", "phase"])
    hot = GaugeMetricFamily("moe_expert_tokens_per_step", "Tokens per step of the hottest experts, summed over "
                            "layers (only with --top-experts N)", labels=["run", "phase", "expert"])
    for phase, snap in snapshots.items():
        if snap is None:
            continue
        if per_layer:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a layer idle in every step stays NaN
                eta_L = np.nanmean(snap.eta_TL, axis=0)
            for layer, value in enumerate(eta_L):
                layer_eta.add_metric([run, phase, str(layer)], _value(value))
        if top_experts > 0:
            per_step_E = snap.view.counts_sum_LE.sum(axis=0) / max(1, snap.view.num_steps)
            for expert in np.argsort(-per_step_E, kind="stable")[:top_experts]:
                hot.add_metric([run, phase, str(int(expert))], float(per_step_E[expert]))
        for window, spread in (("latest_step", snap.eta_now), ("step_mean", snap.eta_step_mean),
                               ("window_sum", snap.eta_window_sum)):
            for stat in ("min", "p50", "p90"):
                eta.add_metric([run, phase, window, stat], _value(getattr(spread, stat)))
        idle.add_metric([run, phase], _value(snap.idle_share))
        per_stat = (("latest", snap.latest_G), ("mean", snap.stats.mean_G), ("p99", snap.stats.p99_G),
                    ("max", snap.stats.max_G))
        listed = top_gpus(snap.stats.mean_G, max_gpus, snap.straggler.gpu if snap.straggler else None)
        for gpu in listed.tolist():
            for stat, values in per_stat:
                load.add_metric([run, phase, str(gpu), stat], _value(values[gpu]))
        if listed.size < snap.latest_G.size:
            others = np.ones(snap.latest_G.size, dtype=bool)
            others[listed] = False
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # NaN loads stay NaN
                for stat, values in per_stat:
                    pick = np.nanmean if stat == "mean" else np.nanmax
                    rest.add_metric([run, phase, stat], _value(pick(values[others])))
            rest_gpus.add_metric([run, phase], float(others.sum()))
        straggler.add_metric([run, phase], float(snap.straggler.gpu) if snap.straggler else -1.0)
        straggler_ratio.add_metric([run, phase], _value(snap.straggler.ratio_to_mean) if snap.straggler else 1.0)
        rate.add_metric([run, phase], _value(snap.steps_per_s))
        tokens.add_metric([run, phase], _value(snap.tokens_per_s))
    gain = GaugeMetricFamily("moe_rebalance_predicted_gain_ratio", "Rebalance advisor: straggler time a repair "
                             "of the layout in force would save over the next horizon steps if the window repeats, "
                             "as a share of those steps' expert time (recomputed at most every 30 s)",
                             labels=["run", "phase"])
    moves = GaugeMetricFamily("moe_rebalance_moves", "Rebalance advisor: expert copies its candidate layout needs "
                              "(0: no repair moves anything)", labels=["run", "phase"])
    migration = GaugeMetricFamily("moe_rebalance_migration_cost_ratio", "Rebalance advisor: time serving waits "
                                  "for the candidate's copies, as a share of the horizon's expert time (rebalance "
                                  "when the predicted gain exceeds it)", labels=["run", "phase"])
    for phase, decision in (advice or {}).items():
        if decision is None:
            continue
        gain.add_metric([run, phase], _value(decision.gain_ratio))
        moves.add_metric([run, phase], float(decision.moves))
        migration.add_metric([run, phase], _value(decision.migration_ratio))
    share = GaugeMetricFamily("moe_alltoall_share_ratio", "All-to-all time as a share of MoE layer time over the "
                              "window (kind: dispatch or combine; measured layer timings)",
                              labels=["run", "phase", "kind"])
    overlap = GaugeMetricFamily("moe_overlap_ratio", "Achieved overlap of expert compute and all-to-all: mean of "
                                "(compute + comm - layer) / min(compute, comm), clipped to [0, 1]",
                                labels=["run", "phase"])
    layer_s = GaugeMetricFamily("moe_layer_seconds", "MoE layer wall time per (step, layer), its slowest rank "
                                "(stat: mean or p99 over the window)", labels=["run", "phase", "stat"])
    for phase, summary in (timings or {}).items():
        if summary is None:
            continue
        share.add_metric([run, phase, "dispatch"], _value(summary.dispatch_share))
        share.add_metric([run, phase, "combine"], _value(summary.combine_share))
        overlap.add_metric([run, phase], _value(summary.overlap))
        layer_s.add_metric([run, phase, "mean"], _value(summary.layer_mean_s))
        layer_s.add_metric([run, phase, "p99"], _value(summary.layer_p99_s))
    timed = [share, overlap, layer_s] if any(v is not None for v in (timings or {}).values()) else []
    step_imbalance = GaugeMetricFamily("moe_step_imbalance_ratio", "Per-step imbalance: max/mean GPU load of "
                                       "each (step, layer) pair with tokens under the run's dispatch policy "
                                       "(stat: p99 over the window's pairs)", labels=["run", "phase", "dispatch", "stat"])
    skew = GaugeMetricFamily("moe_expert_skew_ratio", "Expert skew inside a GPU: per (step, layer), the worst GPU's "
                             "busiest expert slot over its mean slot, under the run's dispatch policy (stat: p99 over "
                             "the window's pairs)", labels=["run", "phase", "dispatch", "stat"])
    for phase, figures in (tails or {}).items():
        if figures is None or figures.steps == 0:
            continue
        step_imbalance.add_metric([run, phase, figures.policy, "p99"],
                                  _value(figures.imbalance_summary()["p99"]))
        skew.add_metric([run, phase, figures.policy, "p99"], _value(figures.skew_summary()["p99"]))
    per_step = [step_imbalance, skew] if step_imbalance.samples else []
    in_time = time_families(run, snapshots)
    steps = CounterMetricFamily("moe_steps", "Step records read (one per step and rank)", labels=["run"])
    steps.add_metric([run], float(steps_read))
    dropped = GaugeMetricFamily("moe_dropped_steps", "Steps the collectors dropped (their own count)",
                                labels=["run"])
    dropped.add_metric([run], float(dropped_steps))
    bad = CounterMetricFamily("moe_bad_records", "Records the reader skipped as malformed", labels=["run"])
    bad.add_metric([run], float(bad_records))
    up = GaugeMetricFamily("moe_collector_up", "1 when the run's Redis keys were readable at the last poll",
                           labels=["run"])
    up.add_metric([run], 1.0 if health.reachable else 0.0)
    age = GaugeMetricFamily("moe_collector_last_write_age_seconds", "Seconds since a collector of the run "
                            "last wrote", labels=["run"])
    if health.last_seen_s is not None:
        age.add_metric([run], max(0.0, now_s - health.last_seen_s))
    extra = ([layer_eta] if per_layer else []) + ([hot] if top_experts > 0 else [])
    extra += [rest, rest_gpus] if rest.samples else []
    advised = [gain, moves, migration] if advice else []
    changes = layout_change_families(run, rebalance) if rebalance is not None else []
    return [eta, idle, load, straggler, straggler_ratio, rate, tokens, steps, dropped, bad, up, age, *advised,
            *changes, *per_step, *in_time, *timed, *extra]


def layout_change_families(run: str, health: RebalanceHealth) -> list[Metric]:
    """Rebalance health of one run from its layout changes (engine or apply): changes in the last hour, experts
    they copied, and, once seen, the age of the newest change and the median gap between changes (the alert
    MoERebalancingStopped compares the two)."""
    hour = GaugeMetricFamily("moe_layout_changes_last_hour", "Layout changes (an engine's rebalance or an applied "
                             "layout) in the last hour", labels=["run"])
    hour.add_metric([run], health.per_hour)
    moved = GaugeMetricFamily("moe_layout_change_experts_moved", "Experts copied onto a GPU by the layout changes "
                              "the monitor has seen (one expert of one layer onto a GPU without it)", labels=["run"])
    moved.add_metric([run], float(health.moves))
    out: list[Metric] = [hour, moved]
    if health.last_age_s is not None:
        age = GaugeMetricFamily("moe_layout_change_age_seconds", "Seconds since the newest layout change",
                                labels=["run"])
        age.add_metric([run], health.last_age_s)
        out.append(age)
    if health.interval_s is not None:
        gap = GaugeMetricFamily("moe_layout_change_interval_seconds", "Median seconds between layout changes",
                                labels=["run"])
        gap.add_metric([run], health.interval_s)
        out.append(gap)
    return out


def time_families(run: str, snapshots: dict[str, Snapshot | None]) -> list[Metric]:
    """The time gauges of one run: per phase with a verdict in time (Snapshot.time, all layers), the predicted
    MoE seconds per step, the seconds lost waiting for the busiest GPU and their share, the straggler and its
    cause, the speed-up and tokens/s if every GPU finished at the mean, the memory-bound share; and
    moe_time_model_available{run, gpu_profile, model, reason}: 1 with them, 0 and why not (none without steps)."""
    labels = ["run", "phase"]
    moe_s = GaugeMetricFamily("moe_predicted_moe_seconds", "Predicted MoE time per step: over layers, the slowest "
                              "GPU's predicted seconds (core.costmodel), mean over the window's steps", labels=labels)
    lost_s = GaugeMetricFamily("moe_predicted_lost_seconds", "Predicted seconds per step the other GPUs wait for the "
                               "busiest: over layers, slowest minus mean GPU", labels=labels)
    lost = GaugeMetricFamily("moe_predicted_lost_ratio", "moe_predicted_lost_seconds over moe_predicted_moe_seconds",
                             labels=labels)
    gpu = GaugeMetricFamily("moe_predicted_straggler_gpu", "GPU that holds the layers back longest in predicted "
                            "time; -1 none", labels=labels)
    cause = GaugeMetricFamily("moe_predicted_straggler_cause", "1 for why the straggler is slow: cause = tokens, "
                              "active experts or traffic (its largest excess over the mean GPU)",
                              labels=[*labels, "cause"])
    speedup = GaugeMetricFamily("moe_predicted_speedup_ratio", "MoE time over what it would be if every GPU "
                                "finished at the mean", labels=labels)
    light = GaugeMetricFamily("moe_predicted_light_tokens_per_second", "Tokens per second if every GPU finished "
                              "at the mean (the measured rate, less the predicted wait)", labels=labels)
    bound = GaugeMetricFamily("moe_predicted_memory_bound_ratio", "Share of active experts below the ridge point "
                              "(weight reads, not FLOPs, set their time)", labels=labels)
    available = GaugeMetricFamily("moe_time_model_available", "1 when the run's time gauges are exported "
                                  "(gpu_profile, model: what they are predicted for), 0 and reason when not",
                                  labels=["run", "gpu_profile", "model", "reason"])
    notes = []
    for phase, snap in snapshots.items():
        if snap is None:
            continue
        if snap.time is None:
            notes.append(snap.time_note)
            continue
        found, head = snap.time.headline.verdict, snap.time.headline
        moe_s.add_metric([run, phase], _value(found.moe_s))
        lost_s.add_metric([run, phase], _value(found.lost_s))
        lost.add_metric([run, phase], _value(found.lost_share))
        gpu.add_metric([run, phase], -1.0 if found.gpu is None else float(found.gpu))
        if found.cause is not None:
            cause.add_metric([run, phase, found.cause], 1.0)
        speedup.add_metric([run, phase], _value(found.speedup))
        if math.isfinite(head.light_tokens_per_s):
            light.add_metric([run, phase], head.light_tokens_per_s)
        bound.add_metric([run, phase], _value(found.memory_bound_share))
    timed = [snap.time for snap in snapshots.values() if snap is not None and snap.time is not None]
    if timed:
        model = timed[0].model
        available.add_metric([run, model.profile.name, model.dims.label(), ""], 1.0)
    elif notes:
        available.add_metric([run, "", "", notes[0] or "no time model"], 0.0)
    families: list[Metric] = [moe_s, lost_s, lost, gpu, cause, speedup, light, bound, available]
    return [f for f in families if f.samples]


def gpu_series_dropped(snapshots: dict[str, Snapshot | None], max_gpus: int = DEFAULT_MAX_GPUS) -> int:
    """Per-GPU series run_families leaves out under max_gpus (4 statistics for each GPU not listed, per phase)."""
    return sum(4 * max(0, snap.latest_G.size - max_gpus) for snap in snapshots.values() if snap is not None)


def series_count(families: Iterable[Metric]) -> int:
    """Number of time series (samples) the families expose."""
    return sum(len(family.samples) for family in families)
