"""Overview: first, in time, what the busiest GPU costs (core.costmodel, or why not: then in tokens); then
balancedness now and over the window, throughput, health, per-GPU bars, the straggler."""
from __future__ import annotations

import time
import warnings

import numpy as np
import streamlit as st

from moe_monitor.dashboard.analytics import alerts
from moe_monitor.dashboard.analytics.timecost import (
    BALANCED_BY_CONSTRUCTION,
    balanced_backend_line,
    layer_regimes,
    router_skew,
    tokens_headline,
)
from moe_monitor.dashboard.figures import load as load_figures
from moe_monitor.dashboard.figures import rollups as rollup_figures
from moe_monitor.dashboard.figures.units import format_duration, format_number
from moe_monitor.dashboard.live.layout import in_force_note
from moe_monitor.dashboard.live.layout_changes import rebalances_of
from moe_monitor.dashboard.live.snapshot import Snapshot
from moe_monitor.dashboard.views import steptails, timeline
from moe_monitor.dashboard.views.common import PageData, ago, poll_and_caption
from moe_monitor.dashboard.views.session import REFRESH_S


def page() -> None:
    st.title("Overview")
    live()


@st.fragment(run_every=REFRESH_S)
def live() -> None:
    current = poll_and_caption()
    if current is not None:
        render(current)
    timeline.keep_playing()


def render(current: PageData) -> None:
    snap, watched = current.snapshot, current.watched
    time_lines(snap)
    balanced_backend(current)
    row = snap.row_name
    latest = f"step {snap.latest_step}" if not snap.resolution_s else f"the {row} starting {snap.x_T[snap.latest]} UTC"
    cols = st.columns(4)
    cols[0].metric("balancedness now (p50 over layers)" if not snap.resolution_s else
                   "balancedness, latest bucket sum (p50 over layers)", format_number(snap.eta_now.p50),
                   help=f"eta = mean/max GPU load of {latest}; min {format_number(snap.eta_now.min)}, "
                        f"p90 {format_number(snap.eta_now.p90)} across layers")
    cols[1].metric(f"balancedness, window per-{row} mean (p50)", format_number(snap.eta_step_mean.p50),
                   help=f"per layer, the mean over {row}s of per-{row} eta; min {format_number(snap.eta_step_mean.min)}, "
                        f"p90 {format_number(snap.eta_step_mean.p90)} across layers")
    cols[2].metric("balancedness, window sum (p50)", format_number(snap.eta_window_sum.p50),
                   help=f"eta of loads summed over the window; min {format_number(snap.eta_window_sum.min)}, "
                        f"p90 {format_number(snap.eta_window_sum.p90)}. A window sum hides the per-step tail.")
    cols[3].metric("idle share (1 - eta, window mean)", format_number(snap.idle_share, ".1%"))
    st.caption(f"Balancedness across layers — now: min {format_number(snap.eta_now.min)} · p50 {format_number(snap.eta_now.p50)} · "
               f"p90 {format_number(snap.eta_now.p90)}; window (per-step mean): min {format_number(snap.eta_step_mean.min)} · "
               f"p50 {format_number(snap.eta_step_mean.p50)} · p90 {format_number(snap.eta_step_mean.p90)}; window sum: "
               f"min {format_number(snap.eta_window_sum.min)} · p50 {format_number(snap.eta_window_sum.p50)} · "
               f"p90 {format_number(snap.eta_window_sum.p90)}")
    steptails.overview_section(current)
    cols = st.columns(4)
    cols[0].metric("steps/s", format_number(snap.steps_per_s, ".2f"))
    cols[1].metric("tokens/s", format_number(snap.tokens_per_s, ",.0f"))
    cols[2].metric("dropped steps (collectors)", f"{watched.dropped_steps:,}")
    cols[3].metric("bad records skipped", f"{watched.notes().bad_records:,}")
    health = watched.source.health()
    cols = st.columns(4)
    cols[0].metric("source", "ok" if health.reachable else "down",
                   help=f"{health.where}; poll round trip "
                        f"{'n/a' if health.latency_ms is None else f'{health.latency_ms:.1f} ms'}")
    cols[1].metric("poll round trip", "n/a" if health.latency_ms is None else f"{health.latency_ms:.1f} ms")
    cols[2].metric("collector last wrote", _age(health.last_seen_s, _recorded(watched)))
    errors = [f"rank {rank}: {r.get('last_error')}" for rank, r in health.collectors.items() if r.get("last_error")]
    cols[3].metric("collector errors", str(len(errors)), help="; ".join(errors) or "none reported")
    if snap.straggler is not None:
        s = snap.straggler
        st.markdown(f"**Straggler: {snap.gpu_name(s.gpu)}** — busiest GPU in {s.busiest_share:.0%} of the window's "
                    f"{s.basis}, mean load {s.ratio_to_mean:.2f}x the all-GPU mean (GPU load of {snap.load_label}).")
    st.plotly_chart(load_figures.gpu_load_bars(snap.latest_G, snap.stats, None if snap.straggler is None
                                          else snap.straggler.gpu, snap.unit), key="overview_bars")
    if snap.per_step is not None:
        per_step_section(snap)
    st.markdown(in_force_note(snap.layout))
    rebalance_line(current)
    _alert_line(current)
    health_panel(current)


def time_lines(snap: Snapshot) -> None:
    """The page's first lines: what waiting for the busiest GPU costs in time, the speed-of-light line and
    what they are predicted for; without a cost model, why not, and the token figures."""
    if snap.time is None:
        s = snap.straggler
        first, hint = tokens_headline(snap.time_note or "no time model", snap.idle_share, None if s is None else s.gpu,
                                      float("nan") if s is None else s.ratio_to_mean, snap.layout.gpus_per_node)
        st.markdown(f"**{first}**")
        st.caption(hint)
        return
    head = snap.time.headline
    st.markdown(f"**{head.first}**" + (f"  \n{head.light}" if head.light else ""))
    st.caption(f"{head.label}. Token figures below.")


def balanced_backend(current: PageData) -> None:
    """For an engine that evens GPU tokens by construction: the router's skew and active experts instead."""
    meta, snap = current.watched.source.meta(), current.snapshot
    if meta is None or meta.dispatch not in BALANCED_BY_CONSTRUCTION:  # nothing to say: compute nothing
        return
    regimes = None if snap.time is None else layer_regimes(snap.time.rows, snap.time.model.ridge_tokens)
    st.info(balanced_backend_line(meta.dispatch, router_skew(snap.view.counts_sum_LE), regimes))


def per_step_section(snap: Snapshot) -> None:
    """At a rollup resolution: what the bucket sums hide, from the buckets' per-step statistics."""
    ps = snap.per_step
    if ps is None:
        return
    pct = int(round(ps.tail_q * 100))
    cols = st.columns(4)
    cols[0].metric("per-step balancedness, median", format_number(ps.eta_p50),
                   help="median of per-(step, layer) eta over the window, from the buckets' histograms "
                        "(exact to the bin width, 0.01)")
    cols[1].metric(f"per-step balancedness, worst {pct}%", format_number(ps.eta_tail),
                   help=f"{pct}% of (step, layer) pairs fall below this eta: the per-step tail a bucket sum hides")
    cols[2].metric("busiest GPU per step, mean", format_number(ps.busiest_mean, ",.0f"),
                   help="tokens of the busiest GPU per step (mean over layers), averaged over the window's steps")
    cols[3].metric("busiest GPU per step, peak", format_number(ps.busiest_peak, ",.0f"),
                   help="the busiest GPU's tokens in any layer of any step of the window")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # buckets whose layers are all idle stay NaN
        sum_eta_T = np.nanmedian(snap.eta_TL, axis=1) if snap.eta_TL.size else np.zeros(0)
    st.plotly_chart(rollup_figures.per_step_figure(snap.x_T, ps, sum_eta_T, "tokens", snap.axis_marks(),
                                                   snap.x_title), key="overview_per_step")
    st.caption(f"{ps.steps:,} steps in {snap.view.num_steps:,} buckets. The GPU loads above are per step, each "
               "bucket's mean; balancedness of a bucket's sum reads higher than its steps' (the tail averages away).")


def rebalance_line(current: PageData) -> None:
    """Rebalance health from the run's layout changes; a warning when rebalancing looks stopped while the load
    stays imbalanced (the rule of MoERebalancingStopped)."""
    watched, snap = current.watched, current.snapshot
    # a recording's "now" is its newest step, not this machine's clock
    now_s = float(snap.view.time_s_T[-1]) if _recorded(watched) and snap.view.num_steps else time.time()
    health = rebalances_of(watched.source.meta(), watched.layouts.changes, now_s)
    text = f"Rebalancing: {health.sentence()}."
    if health.stopped and snap.eta_step_mean.p50 < 0.8:
        st.warning(text + f" Balancedness stays at {snap.eta_step_mean.p50:.2f}: check the engine's rebalancer.")
    else:
        st.caption(text)


def _alert_line(current: PageData) -> None:
    """The Prometheus alerting rules (deploy/prometheus/alerts.yml) judged on this window, in one line."""
    snap, watched = current.snapshot, current.watched
    last_seen = watched.source.health().last_seen_s
    # at a rollup resolution the rule's per-step balancedness comes from the buckets' per-step histograms
    eta = snap.eta_step_mean.p50 if snap.per_step is None else snap.per_step.eta_p50
    statuses = alerts.evaluate(eta, None if last_seen is None else time.time() - last_seen,
                               watched.dropped_steps, snap.straggler.ratio_to_mean if snap.straggler else None,
                               snap.straggler.busiest_share if snap.straggler else None,
                               recorded=_recorded(watched))
    firing = [s for s in statuses if s.firing]
    text = " · ".join(f"{'**' + s.name + '** firing' if s.firing else s.name + ' ok'} ({s.detail})" for s in statuses)
    line = f"Alerts on this window (the rules of deploy/prometheus/alerts.yml): {text}"
    if firing:
        st.warning(line)
    else:
        st.caption(line)


def _recorded(watched) -> bool:
    """Whether the run in view is a replayed recording (its collectors are not live)."""
    return bool(getattr(watched.source, "recorded", False))


def _age(time_s: float | None, recorded: bool = False) -> str:
    if recorded:
        return "a recording"
    return "unknown" if time_s is None else f"{format_duration(max(0.0, time.time() - time_s))} ago"


def _feed(watched) -> str:
    """Where the window's steps come from, and what was read this session."""
    notes = watched.notes()
    parts = [f"step records read this session: {notes.steps_read:,}"]
    if notes.feed == "aggregate" or notes.aggregates_read:
        parts.append(f"aggregated steps read: {notes.aggregates_read:,} (ranks summed by the aggregator"
                     f"{'' if notes.feed == 'aggregate' else '; now summed here again'})")
    if notes.late_outside:
        parts.append(f"{notes.late_outside:,} late rank entries for steps no longer in the window")
    if notes.skipped_overlap:
        parts.append(f"{notes.skipped_overlap:,} steps skipped when the source switched between per-rank records "
                     "and the aggregate (the window held them already)")
    if notes.duplicate_records:
        parts.append(f"{notes.duplicate_records:,} records that arrived twice (a retried write) skipped")
    if notes.rollups_read is not None:
        parts.append(f"rollup buckets read: {notes.rollups_read:,}")
    return "; ".join(parts)


def health_panel(current: PageData) -> None:
    health = current.watched.source.health()
    tick = current.watched.last_tick
    notes = current.watched.notes()
    with st.expander("Redis and collector health", expanded=False):
        latency = "n/a" if health.latency_ms is None else f"{health.latency_ms:.1f} ms"
        st.markdown(f"- source: `{health.where}` — reachable, poll round trip {latency}\n"
                    f"- collector last wrote: {ago(health.last_seen_s)}{' · ' + health.note if health.note else ''}\n"
                    f"- this tick: {tick.steps_in} step entries, {tick.aggregates_in} aggregated steps, "
                    f"{tick.gpu_in} GPU samples{' (more waiting)' if tick.more else ''}, {tick.ms:.1f} ms\n"
                    f"- {_feed(current.watched)}; ranks per step: {current.watched.world_size}"
                    + (f"\n- {notes.restart_note}" if notes.restart_note else "")
                    + (f"\n- {notes.gap_note}" if notes.gap_note else ""))
        for rank, report in sorted(health.collectors.items(), key=lambda kv: str(kv[0])):
            st.markdown(f"- collector rank {rank}: dropped {report.get('dropped_steps', 'n/a')}, queued "
                        f"{report.get('queued', 'n/a')}, last error: {report.get('last_error') or 'none'}")
