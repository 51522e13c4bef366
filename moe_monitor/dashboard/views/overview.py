"""Overview: above the fold, the answer (which GPU holds the MoE layers back, what it costs in time, why, what
the advisor would do) and its picture; one click down, every other figure: balancedness three ways, per-step
tails, throughput, health, the latest step's bars, rebalances, the alert rules."""
from __future__ import annotations

import time
import warnings

import numpy as np
import streamlit as st

from moe_monitor.dashboard.analytics import alerts, levels
from moe_monitor.dashboard.analytics import answer as answers
from moe_monitor.dashboard.analytics.timecost import (
    BALANCED_BY_CONSTRUCTION,
    balanced_backend_line,
    layer_regimes,
    router_skew,
    tokens_headline,
)
from moe_monitor.dashboard.figures import answer as answer_figure
from moe_monitor.dashboard.figures import load as load_figures
from moe_monitor.dashboard.figures import rollups as rollup_figures
from moe_monitor.dashboard.figures.units import format_duration, format_number
from moe_monitor.dashboard.live import advice_worker
from moe_monitor.dashboard.live.layout import in_force_note
from moe_monitor.dashboard.live.layout_changes import rebalances_of
from moe_monitor.dashboard.live.snapshot import Snapshot
from moe_monitor.dashboard.views import steptails, timeline
from moe_monitor.dashboard.views.badges import judged_metric, ruled_metric
from moe_monitor.dashboard.views.common import PageData, ago, opening_tick, poll_and_caption
from moe_monitor.dashboard.views.draw import draw
from moe_monitor.dashboard.views.session import REFRESH_S
from moe_monitor.dashboard.whatif import advice as whatif_advice
from moe_monitor.planner.advisor import DEFAULT_WINDOW


def page() -> None:
    st.title("Overview")
    live()


@st.fragment(run_every=REFRESH_S)
def live() -> None:
    current = poll_and_caption()
    if current is not None:
        render(current, whole=not opening_tick("overview"))
    timeline.keep_playing()


def render(current: PageData, whole: bool = True) -> None:
    """The answer and its picture above the fold; every other figure one click down. The rebalance line and
    the alert rules are judged once: a warning above when they call for one, a caption in the details else.
    whole=False: the first screen only (dashboard.views.common.opening_tick)."""
    first_screen(current)  # the chart first: the rest is judged while the browser draws it
    if not whole:
        return
    rebalance, alert = rebalance_line(current), _alert_line(current)
    balanced_backend(current)
    for text, warn in (rebalance, alert):
        if warn:
            st.warning(text)
    with st.expander("Every figure: balancedness, per-step tails, throughput, health, alerts", expanded=False):
        details(current, [text for text, warn in (rebalance, alert) if not warn])


def first_screen(current: PageData) -> None:
    """One sentence (which GPU, what it costs, why, what to do) and one picture (the series it talks about,
    that GPU marked): dashboard.analytics.answer."""
    snap, layout = current.snapshot, current.layout
    who = answers.named(snap.straggler, layout.gpus, snap.time_rows)
    hot = [] if who.gpu is None else answers.hottest_on(snap.view.counts_sum_LE, layout.layout_LP, layout.gpus,
                                                        who.gpu)
    said = answers.answer(who, snap.straggler, layout.gpus, layout.gpus_per_node, snap.idle_share,
                          snap.stats.mean_G, snap.unit, hot, snap.steps_per_s, _advice(current), snap.time_note)
    (st.success if said.tone == "ok" else st.warning)((":red[●] " if said.tone == "bad" else "") + said.sentence)
    st.vega_lite_chart(answer_figure.answer_data(said.series_G, said.gpu, layout.gpus_per_node),
                       answer_figure.answer_spec(said.series_title, said.series_unit), key="overview_answer",
                       width="stretch")
    if snap.time is not None:
        head = snap.time.headline
        st.caption(" · ".join(part for part in (head.light, head.label) if part))
    else:
        st.caption(tokens_headline(snap.time_note or "no time model", snap.idle_share, None, float("nan"),
                                   layout.gpus_per_node)[1])
    drill_down(said.gpu)


def drill_down(gpu: int | None) -> None:
    """Links to the named GPU on Devices, its experts on Experts and its NVML panel (the same three links,
    without a GPU, when none is named: the page keeps its shape between ticks)."""
    where = {} if gpu is None else {"gpu": str(gpu)}
    name = "the GPUs" if gpu is None else f"GPU {gpu}"
    cols = st.columns(3)
    cols[0].page_link("page_files/devices.py", label=f"{name} over time (Devices)", query_params=where)
    cols[1].page_link("page_files/experts.py", label=f"{name}'s experts (Experts)" if gpu is not None
                      else "the experts (Experts)", query_params=where)
    cols[2].page_link("page_files/gpus.py", label=f"{name}'s clocks and memory (GPU panel)" if gpu is not None
                      else "clocks and memory (GPU panel)", query_params=where)


def _advice(current: PageData) -> str:
    """The rebalance advisor's line for the window in view, computed off the page's thread (advice_worker);
    "" until its first answer."""
    snap, layout, window = current.snapshot, current.layout, current.watched.window
    if snap.resolution_s or window is None:
        return "the advisor reads single steps: open What-if at full resolution"
    meta, model, gpus = current.watched.source.meta(), None if snap.time is None else snap.time.model, layout.gpus

    def prepare():  # on this thread, only when a new computation starts: the copies it works on
        counts_TLE = window.counts_CLE[snap.view.slots_T[-DEFAULT_WINDOW:]]  # fancy indexing: a copy
        layout_LP = layout.layout_LP.copy()

        def compute() -> str:
            advice = whatif_advice.advice_on_window(counts_TLE, layout_LP, gpus, meta, model)
            if advice.moves == 0:
                return f"nothing to do ({advice.reason})"
            return whatif_advice.advice_line(advice) + " — What-if shows its layout"
        return compute

    key = (current.settings.monitor_key(), current.phase, layout.gpus, hash(layout.layout_LP.tobytes()))
    return advice_worker.latest(key, prepare)


def details(current: PageData, quiet_lines: list[str]) -> None:
    """The figures under the answer: the time lines, balancedness three ways, per-step tails, throughput,
    health, the latest step's bars, and (quiet_lines) rebalances and the alert rules when they do not warn."""
    snap, watched = current.snapshot, current.watched
    time_lines(snap)
    row = snap.row_name
    latest = f"step {snap.latest_step}" if not snap.resolution_s else f"the {row} starting {snap.x_T[snap.latest]} UTC"
    cols = st.columns(4)
    ruled_metric(cols[0], "balancedness now (p50 over layers)" if not snap.resolution_s else
                 "balancedness, latest bucket sum (p50 over layers)", snap.eta_now.p50, format_number(snap.eta_now.p50),
                 levels.BALANCEDNESS, f"eta = mean/max GPU load of {latest}; min {format_number(snap.eta_now.min)}, "
                 f"p90 {format_number(snap.eta_now.p90)} across layers. 1 is perfect.")
    ruled_metric(cols[1], f"balancedness, window per-{row} mean (p50)", snap.eta_step_mean.p50,
                 format_number(snap.eta_step_mean.p50), levels.BALANCEDNESS,
                 f"per layer, the mean over {row}s of per-{row} eta; min {format_number(snap.eta_step_mean.min)}, "
                 f"p90 {format_number(snap.eta_step_mean.p90)} across layers. The figure to watch; 1 is perfect.")
    ruled_metric(cols[2], "balancedness, window sum (p50)", snap.eta_window_sum.p50,
                 format_number(snap.eta_window_sum.p50), levels.BALANCEDNESS,
                 f"eta of loads summed over the window; min {format_number(snap.eta_window_sum.min)}, "
                 f"p90 {format_number(snap.eta_window_sum.p90)}. A window sum hides the per-step tail: it reads higher "
                 "than the per-step mean.")
    ruled_metric(cols[3], "idle share (1 - eta, window mean)", snap.idle_share, format_number(snap.idle_share, ".1%"),
                 levels.IDLE_SHARE, "share of MoE time the average GPU waits for the busiest one, in tokens: 0 is "
                 "perfect; at 20% a new layout is worth it.")
    steptails.overview_section(current)
    cols = st.columns(4)
    cols[0].metric("steps/s", format_number(snap.steps_per_s, ".2f"))
    cols[1].metric("tokens/s", format_number(snap.tokens_per_s, ",.0f"))
    ruled_metric(cols[2], "dropped steps (collectors)", watched.dropped_steps, f"{watched.dropped_steps:,}",
                 levels.DROPPED_STEPS, "steps the collectors could not publish (their queue was full).")
    skipped = watched.notes().bad_records
    ruled_metric(cols[3], "bad records skipped", skipped, f"{skipped:,}", levels.SKIPPED_RECORDS)
    health = watched.source.health()
    cols = st.columns(4)
    judged_metric(cols[0], "source", "ok" if health.reachable else "down", levels.GOOD if health.reachable else levels.BAD,
                  f"{health.where}; poll round trip "
                  f"{'n/a' if health.latency_ms is None else f'{health.latency_ms:.1f} ms'}")
    ruled_metric(cols[1], "poll round trip", health.latency_ms,
                 "n/a" if health.latency_ms is None else f"{health.latency_ms:.1f} ms", levels.POLL_MS,
                 "in ms; under 10 ms on one host is usual.")
    recorded = _recorded(watched)
    silent_s = None if recorded or health.last_seen_s is None else max(0.0, time.time() - health.last_seen_s)
    ruled_metric(cols[2], "collector last wrote", silent_s, _age(health.last_seen_s, recorded), levels.SILENT_S,
                 "seconds since; a live run writes every step: 15 s or more means it stopped.")
    errors = [f"rank {rank}: {r.get('last_error')}" for rank, r in health.collectors.items() if r.get("last_error")]
    judged_metric(cols[3], "collector errors", str(len(errors)), levels.COLLECTOR_ERRORS.level(len(errors)),
                  ("; ".join(errors) or "none reported") + f". {levels.COLLECTOR_ERRORS.says().capitalize()}.")
    if snap.straggler is not None:
        s = snap.straggler
        st.markdown(f"**Busiest GPU over the window: {snap.gpu_name(s.gpu)}** — busiest in {s.busiest_share:.0%} of "
                    f"the window's {s.basis}, mean load {s.ratio_to_mean:.2f}x the all-GPU mean (GPU load of "
                    f"{snap.load_label}).")
    busiest_now = int(np.argmax(snap.latest_G)) if snap.latest_G.size and snap.latest_G.max() > 0 else None
    draw(load_figures.gpu_load_bars(snap.latest_G, snap.stats, busiest_now, snap.unit, snap.layout.gpus_per_node),
         "overview_bars")
    st.caption("Red: the busiest GPU of the latest step (the bars); the markers are each GPU's window figures.")
    if snap.per_step is not None:
        per_step_section(snap)
    st.markdown(in_force_note(snap.layout))
    for line in quiet_lines:
        st.caption(line)
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
    ruled_metric(cols[0], "per-step balancedness, median", ps.eta_p50, format_number(ps.eta_p50), levels.BALANCEDNESS,
                 "median of per-(step, layer) eta over the window, from the buckets' histograms (exact to the bin "
                 "width, 0.01).")
    ruled_metric(cols[1], f"per-step balancedness, worst {pct}%", ps.eta_tail, format_number(ps.eta_tail),
                 levels.BALANCEDNESS, f"{pct}% of (step, layer) pairs fall below this eta: the per-step tail a bucket "
                 "sum hides.")
    cols[2].metric("busiest GPU per step, mean", format_number(ps.busiest_mean, ",.0f"),
                   help="tokens of the busiest GPU per step (mean over layers), averaged over the window's steps")
    cols[3].metric("busiest GPU per step, peak", format_number(ps.busiest_peak, ",.0f"),
                   help="the busiest GPU's tokens in any layer of any step of the window")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # buckets whose layers are all idle stay NaN
        sum_eta_T = np.nanmedian(snap.eta_TL, axis=1) if snap.eta_TL.size else np.zeros(0)
    for i, panel in enumerate(rollup_figures.per_step_charts(snap.x_T, ps, sum_eta_T, "tokens", snap.axis_marks(),
                                                             snap.x_title)):
        draw(panel, f"overview_per_step_{i}")
    st.caption(f"{ps.steps:,} steps in {snap.view.num_steps:,} buckets. The GPU loads above are per step, each "
               "bucket's mean; balancedness of a bucket's sum reads higher than its steps' (the tail averages away).")


def rebalance_line(current: PageData) -> tuple[str, bool]:
    """(rebalance health from the run's layout changes, whether to warn: rebalancing looks stopped while the
    load stays imbalanced, the rule of MoERebalancingStopped)."""
    watched, snap = current.watched, current.snapshot
    # a recording's "now" is its newest step, not this machine's clock
    now_s = float(snap.view.time_s_T[-1]) if _recorded(watched) and snap.view.num_steps else time.time()
    health = rebalances_of(watched.source.meta(), watched.layouts.changes, now_s)
    text = f"Rebalancing: {health.sentence()}."
    if health.stopped and levels.BALANCEDNESS.level(snap.eta_step_mean.p50) == levels.BAD:
        return text + f" Balancedness stays at {snap.eta_step_mean.p50:.2f}: check the engine's rebalancer.", True
    return text, False


def _alert_line(current: PageData) -> tuple[str, bool]:
    """(the Prometheus alerting rules of deploy/prometheus/alerts.yml judged on this window, in one line;
    whether one fires)."""
    snap, watched = current.snapshot, current.watched
    last_seen = watched.source.health().last_seen_s
    # at a rollup resolution the rule's per-step balancedness comes from the buckets' per-step histograms
    eta = snap.eta_step_mean.p50 if snap.per_step is None else snap.per_step.eta_p50
    statuses = alerts.evaluate(eta, None if last_seen is None else time.time() - last_seen,
                               watched.dropped_steps, snap.straggler.ratio_to_mean if snap.straggler else None,
                               snap.straggler.busiest_share if snap.straggler else None,
                               recorded=_recorded(watched))
    text = " · ".join(f"{'**' + s.name + '** firing' if s.firing else s.name + ' ok'} ({s.detail})" for s in statuses)
    return f"Alerts on this window (the rules of deploy/prometheus/alerts.yml): {text}", any(s.firing for s in statuses)


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
