"""What every live page does first on each tick: poll the source, show the states a user can meet
(no Redis, no run, stopped run, bad records, no steps in this phase), resolve the layout and the cost model
(dashboard.analytics.timecost.time_model_for), analyse.

At a rollup resolution (Settings.rolled_up) the live run is polled as usual and the pages that can draw buckets
analyse the RollupRun riding on it; pages that need single steps (Time, What-if) ask for full resolution. Each
page's caption says which resolution it shows."""
from __future__ import annotations

import time
from dataclasses import dataclass

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from moe_monitor.dashboard.analytics import answer as answers
from moe_monitor.dashboard.analytics import phases
from moe_monitor.dashboard.analytics.timecost import time_model_for
from moe_monitor.dashboard.figures.units import format_duration
from moe_monitor.dashboard.live.layout import ResolvedLayout, resolve_layout
from moe_monitor.dashboard.live.rollups import full_resolution_line
from moe_monitor.dashboard.live.seeds import SEEDS
from moe_monitor.dashboard.live.snapshot import Snapshot, analyse
from moe_monitor.dashboard.live.watched import RunView
from moe_monitor.dashboard.sources.base import is_seekable
from moe_monitor.dashboard.views import timeline
from moe_monitor.dashboard.views.session import (
    REFRESH_S,
    RESOLVED_PHASE,
    STALE_AFTER_S,
    Settings,
    rollup_run_for,
    runs_at,
    safe_text,
    settings,
    shown_url,
    skipped_runs,
    watched_run_for,
)

_OPENED = "_page_opened"  # session state: the page that ran last


@dataclass
class PageData:
    """A tick's inputs for a page. layout and snapshot are None only for poll_and_analyse(require_steps=False)
    when no step passes the filter yet. watched: the live run (or its paused copy, or a recording's range), or
    the RollupRun at a rollup resolution; resolution: the line saying which ("full resolution: last 600
    steps", "1-minute rollups: last 6 h, 360 buckets of 7,200 steps")."""

    settings: Settings
    watched: RunView
    layout: ResolvedLayout | None
    snapshot: Snapshot | None
    resolution: str = ""
    phase: str = "both"
    phase_note: str = ""


def ago(time_s: float | None) -> str:
    if time_s is None:
        return "never"
    try:
        seconds = max(0.0, time.time() - time_s)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time_s))
    except (OverflowError, OSError, ValueError):  # not a time this machine can show
        return "unknown"
    return f"{stamp} ({format_duration(seconds)} ago)"


def no_redis_message(cfg: Settings, error: str) -> None:
    st.error(f"**No Redis reachable at `{shown_url(cfg.redis_url)}`** ({safe_text(error, cfg.redis_url)}).\n\n"
             "Start Redis where the collectors write (e.g. `redis-server --bind 127.0.0.1`), or point the "
             "dashboard at it: set `REDIS_URL=redis://host:port/db` before `moe-monitor dashboard`, or edit "
             "the Redis URL in the sidebar.")


def poll_and_analyse(require_steps: bool = True, full_resolution: bool = False) -> PageData | None:
    """Poll once and analyse; None (after showing why) when there is nothing to draw. With
    require_steps=False a reachable source without steps still gives a PageData (snapshot None). A page that
    needs single steps passes full_resolution=True: it gets the live run whatever resolution the sidebar chose."""
    cfg = settings()
    if cfg.source == "redis":
        skipped = skipped_runs(cfg.redis_url)
        if skipped:
            st.caption(f"{skipped} entr{'y' if skipped == 1 else 'ies'} of `moe:runs` skipped: not a valid run "
                       "name (or not UTF-8), or a last-write time that is not finite.")
    if cfg.source == "redis" and not cfg.run:
        _, error = runs_at(cfg.redis_url)
        if error:
            no_redis_message(cfg, error)
        else:
            st.info("**No run yet.** Redis is reachable but no collector has written a run. Attach a collector "
                    "to a MoE model (`from moe_monitor.collectors import attach`) and its run appears here.")
        return None
    if cfg.source == "trace" and not cfg.trace_path:
        st.info("No trace file in the trace folder yet: upload one in the sidebar, or record one there "
                "(MOE_TRACE_DIR, else ./recordings).")
        return None
    live = watched_run_for(cfg)
    watched: RunView = live
    resolution = full_resolution_line(live, cfg.window_steps)
    if is_seekable(live.source) and timeline.seekable_now(cfg, live.source):  # the range is the window
        shown = timeline.replay_controls(cfg, live.source)
        if shown is None:
            return None
        watched = shown
        resolution = f"full resolution: {watched.window.size if watched.window else 0:,} steps of the recording"
    else:
        if cfg.source == "redis":
            SEEDS.offer(cfg.monitor_key(), live)  # before the tick: as the last run left it, loads cached
        live.tick()
        rolled = None if full_resolution else rollup_run_for(cfg, live)
        if rolled is not None:  # hours of history: the buckets, beside the live run that keeps polling
            rolled.tick()
            watched, resolution = rolled, rolled.resolution_line()
        elif cfg.source == "redis":  # live: keep polling, show the frozen window while paused
            watched = timeline.live_controls(cfg, live)
            if cfg.rolled_up:
                resolution += " (this page reads single steps; the rollups show on Overview, Devices, Experts, GPU panel)"
    health = watched.source.health()
    if not health.reachable:
        if cfg.source == "redis" and health.answered:
            st.error(f"**Redis at `{shown_url(cfg.redis_url)}` answered with an error** while reading run "
                     f"`{cfg.run}`: {safe_text(health.error, cfg.redis_url)}.\n\nA `moe:{cfg.run}:*` key of the wrong "
                     "type (WRONGTYPE), a Redis that cannot persist (MISCONF) or out of memory (OOM) stops the "
                     "collectors too: fix Redis, the page retries on its own.")
        elif cfg.source == "redis":
            no_redis_message(cfg, health.error)
        else:
            st.error(f"Cannot read the trace `{health.where}`: {health.error}")
        return None
    _status_banners(cfg, watched)
    window = watched.window
    if window is None:
        notes = watched.notes()
        if notes.rollups_read is not None:
            st.info(f"Run `{cfg.run}` has no {resolution.split(':')[0]} bucket in its stream yet "
                    f"({notes.read_error or 'the aggregator writes a bucket once it closes'}).")
        else:
            st.info(f"Run `{cfg.run or cfg.trace_path}` has no step records yet: waiting for the first step.")
        return None if require_steps else PageData(cfg, watched, None, None, resolution)
    meta = watched.source.meta()
    try:
        layout = resolve_layout(meta, window.num_layers, window.num_experts, watched.world_size,
                                gpus=cfg.gpus, gpus_per_node=cfg.gpus_per_node,
                                uploaded=None if cfg.uploaded_layout is None else [list(r) for r in cfg.uploaded_layout],
                                changes=watched.layouts.changes, at_step=window.newest_step)
    except ValueError as exc:
        st.error(f"The layout does not fit this run: {exc}. Fix the override in the sidebar.")
        return None if require_steps else PageData(cfg, watched, None, None, resolution)
    phase, phase_note = shown_phase(cfg.phase, window)
    time_model, time_note = time_model_for(meta, layout.gpus, layout.nodes, watched.gpus.names())
    snap = analyse(window, layout, phase, cfg.layer, cfg.summed, time_model, time_note)
    if snap is None:
        st.info(f"No {phase} steps in the window yet ({window.size} steps of other phases).")
        return None if require_steps else PageData(cfg, watched, layout, None, resolution, phase, phase_note)
    return PageData(settings=cfg, watched=watched, layout=layout, snapshot=snap, resolution=resolution,
                    phase=phase, phase_note=phase_note)


def shown_phase(chosen: str, window) -> tuple[str, str]:
    """(the phase filter the pages apply, a note on it): a rollup bucket sums every phase; "auto" is the phase
    the window spends most of its time in (dashboard.analytics.phases), remembered for the timeline's buttons."""
    if window.resolution_s:
        return "both", "a bucket sums every phase"
    if chosen != phases.AUTO:
        st.session_state[RESOLVED_PHASE] = chosen
        return chosen, ""
    slots = window.ordered_slots()
    seconds = phases.time_by_phase(window.time_s_C[slots], window.phase_C[slots])
    phase = phases.main_phase(seconds, st.session_state.get(RESOLVED_PHASE, ""))
    st.session_state[RESOLVED_PHASE] = phase
    return phase, f"auto: {phases.shares_line(seconds)} of the window's time"


def _status_banners(cfg: Settings, watched: RunView) -> None:
    health = watched.source.health()
    notes = watched.notes()
    if cfg.source == "redis" and health.last_seen_s is not None and time.time() - health.last_seen_s >= STALE_AFTER_S:
        rows = "buckets" if watched.window is not None and watched.window.resolution_s else "steps"
        st.warning(f"**Run `{cfg.run}` stopped writing**: last seen {ago(health.last_seen_s)}. Showing its last "
                   f"{watched.window.size if watched.window else 0} {rows}.")
    if notes.restart_note:
        st.info(f"**{notes.restart_note[0].upper()}{notes.restart_note[1:]}** under the same run name: "
                f"its step ids start again, so the window starts afresh"
                f"{f'; {notes.skipped_old_records} late record(s) of the old collector skipped' if notes.skipped_old_records else ''}.")
    budget_note = getattr(watched.window, "budget_note", "")
    if budget_note:
        st.info(f"**Memory budget**: {budget_note}.")
    stall_note = getattr(watched.source, "stall_note", "")
    if stall_note:
        st.warning(f"**The aggregate stalled**: {stall_note}.")
    if notes.held_note:
        st.warning(f"**{notes.held_note[0].upper()}{notes.held_note[1:]}** ({notes.held_records} record(s) "
                   "held so far; the other ranks' steps go on).")
    if notes.gap_note:
        st.warning(f"**{notes.gap_note}**: the window has holes; shorten the refresh or raise the stream's "
                   "MAXLEN if this keeps happening.")
    if notes.bad_records:
        latest = safe_text(notes.last_error, cfg.redis_url) if cfg.source == "redis" else notes.last_error
        st.warning(f"Skipped {notes.bad_records} bad record(s); the latest: {latest}")
    if notes.read_error:
        st.warning(f"The rollup stream could not be read: {safe_text(notes.read_error, cfg.redis_url)}")


def opening_tick(page: str) -> bool:
    """True on the first run of `page` since it opened (a new session, or back from another page): that run
    draws the page down to its first chart and stops, the next one (a live page's next tick) draws the rest, so
    the browser draws the first chart before every other element. A widget or sidebar change on the same page
    is no opening: what is drawn stays drawn."""
    opened = st.session_state.get(_OPENED) != page
    st.session_state[_OPENED] = page
    return opened


@st.fragment(run_every=REFRESH_S)
def whole_app_next_tick() -> None:
    """Nothing on the run that draws it; on its own first tick a second later, the whole app again: what an
    opening run that left parts undrawn (the sidebar's widgets, the What-if's inputs) calls to draw them."""
    ctx = get_script_run_ctx()
    if ctx is not None and ctx.fragment_ids_this_run:
        st.rerun(scope="app")


def poll_and_caption(require_steps: bool = True) -> PageData | None:
    """poll_and_analyse() with the page caption drawn under it when there is a snapshot: what every live page's
    fragment does first on each tick."""
    current = poll_and_analyse(require_steps)
    if current is not None and current.snapshot is not None:
        caption(current)
    return current


def caption(data: PageData) -> None:
    """One line under each page title: source, resolution, phase, layout and the even-split rule; a warning
    under it when steps in view lack ranks (which ranks, how many rank-steps)."""
    cfg, snap = data.settings, data.snapshot
    what = f"run `{cfg.run}`" if cfg.source == "redis" else f"trace `{cfg.trace_path}`"
    restart_note = data.watched.notes().restart_note
    restart = f" · {restart_note}" if restart_note else ""
    resolution = f" · {data.resolution}" if data.resolution else ""
    if snap.resolution_s:
        rows = f"phase: both (a bucket sums every phase) · {snap.view.num_steps} buckets in window"
    else:
        note = f" ({data.phase_note})" if data.phase_note else ""
        rows = f"phase: {data.phase}{note} · {snap.view.num_steps} steps in window"
    st.caption(f"{what}{restart}{resolution} · {rows} · GPU load of "
               f"{snap.load_label} · layout: {data.layout.origin}, {data.layout.gpus} GPUs on "
               f"{data.layout.nodes} node(s), {data.layout.slots_per_gpu} slots/GPU · replicas share an "
               "expert's tokens evenly")
    missing_line(data)


def missing_line(data: PageData) -> None:
    """A warning naming the ranks absent from complete steps in view (the aggregator gave up on them, or their
    records never arrived), and the rank-steps missing in a rollup window."""
    snap, watched = data.snapshot, data.watched
    if snap.missing.rank_steps:
        ranks = ", ".join(f"{rank} ({steps} step{'' if steps == 1 else 's'})" for rank, steps in snap.missing.by_rank)
        who = ("the aggregator wrote them without those ranks" if watched.notes().feed == "aggregate"
               else "those ranks' records never arrived")
        st.warning(f"**{snap.missing.steps} step(s) still missing ranks**: {snap.missing.rank_steps:,} rank-step(s) "
                   f"missing in the window ({who}); ranks: {ranks}. Their loads count only the ranks present.")
    if snap.per_step is not None and snap.per_step.missing_rank_steps:
        st.warning(f"**{snap.per_step.missing_rank_steps:,} rank-step(s) missing** from the buckets in view: the "
                   f"aggregator wrote those steps without some ranks ({snap.per_step.late_rank_steps:,} folded in late).")


def asked_gpu(widget_key: str) -> None:
    """A `?gpu=N` link (the Overview's drill-down) sets the page's GPU widget once; the parameter is then
    dropped, so the user's own choice holds."""
    asked = st.query_params.get("gpu")
    if asked is None:
        return
    del st.query_params["gpu"]
    if asked.strip().isdigit():  # anything else is not a GPU number: the page keeps its choice
        st.session_state[widget_key] = int(asked)


def overview_named(snap: Snapshot) -> int | None:
    """The GPU the Overview's answer names (dashboard.analytics.answer); None: no persistent straggler."""
    return answers.named(snap.straggler, snap.layout.gpus, snap.time_rows).gpu


def named_or_busiest(snap: Snapshot) -> int:
    """The GPU the Overview's answer names, else the busiest on average."""
    named = overview_named(snap)
    if named is not None:
        return named
    return snap.straggler.gpu if snap.straggler is not None else 0
