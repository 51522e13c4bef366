"""The timeline on top of every page: a recording (a seekable source) replayed like a video, and a live run
paused and resumed (docs/dashboard.md, "Replay like a video, pause a live run"). Thin: the range logic is
dashboard.live.playback, the range's window dashboard.live.replay, the pause dashboard.live.pause.

Session state owned here: "timeline" ((source key, RangeReplay, Playback, playback clock)), "timeline_failed"
((source key, when, why) of a timeline that could not be read), "live_pause" ((run key, Paused)),
"timeline_note" (a callback's one-run message), "timeline_frame" (this run drew a playing recording) and the
widgets' keys timeline_*, live_pause_button / live_resume_button.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from moe_monitor import core
from moe_monitor.dashboard.live import playback
from moe_monitor.dashboard.live.pause import Paused
from moe_monitor.dashboard.live.replay import RangeReplay
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.live.window import MAX_CAPACITY, MAX_WINDOW_BYTES
from moe_monitor.dashboard.views.session import REFRESH_S, RESOLVED_PHASE, Settings

_STATE, _PAUSE, _NOTE, _FAILED = "timeline", "live_pause", "timeline_note", "timeline_failed"
_PAUSE_ERROR = "live_pause_error"  # why the last pause was refused (shown once)
_FRAME = "timeline_frame"  # this run drew a playing recording (replay_controls sets it, keep_playing takes it)
RETRY_S = 10.0  # a recording whose timeline could not be read is asked again after this long
_RANGE, _SPEED = "timeline_range", "timeline_speed"
RANGE_LABEL = "Range of the recording (steps)"
DEFAULT_MAX_STEPS = 5000  # widest range before the run's sizes are known


@dataclass
class _Replay:
    key: tuple
    replay: RangeReplay
    pb: playback.Playback
    clock_s: float = 0.0  # time.monotonic() of the last advance while playing


def max_range_steps(meta: core.RunMeta | None) -> int:
    """Widest range the window may hold: the step window's own caps for the run's [L, E]."""
    if meta is None or not meta.layer_names or not meta.num_experts:
        return DEFAULT_MAX_STEPS
    return max(1, min(MAX_CAPACITY, MAX_WINDOW_BYTES // (len(meta.layer_names) * meta.num_experts * 4)))


def _held(key: tuple) -> _Replay | None:
    held = st.session_state.get(_STATE)
    return held if isinstance(held, _Replay) and held.key == key else None


def seekable_now(cfg: Settings, source) -> bool:
    """Whether the recording's timeline can be read (read once per source, and kept); when it cannot (not a
    trace, no step yet) the page replays the file forward instead, as a live run, and this is asked again
    after RETRY_S."""
    key = (cfg.monitor_key(), id(source))
    if _held(key) is not None:
        return True
    failed = st.session_state.get(_FAILED)
    if failed is not None and failed[0] == key and time.monotonic() - failed[1] < RETRY_S:
        return False
    try:
        replay = RangeReplay(source, max_range_steps(source.meta()))
        if replay.size == 0:
            raise ValueError("the recording has no steps yet")
    except (OSError, ValueError) as exc:
        st.session_state[_FAILED] = (key, time.monotonic(), str(exc))
        return False
    st.session_state.pop(_FAILED, None)
    st.session_state.pop(_NOTE, None)  # another recording: the last one's answer is not about it
    st.session_state[_STATE] = _Replay(key, replay, playback.initial(replay.timeline, cfg.window_steps))
    return True


def replay_controls(cfg: Settings, source) -> WatchedRun | None:
    """Draw the recording's timeline and return the WatchedRun of the range shown (None after saying why
    when the range cannot be shown). Call after seekable_now() said True."""
    state = _held((cfg.monitor_key(), id(source)))
    if state is None:
        return None
    timeline = state.replay.timeline
    if state.pb.playing:
        now = time.monotonic()
        state.pb = playback.advance(state.pb, timeline, now - state.clock_s)
        state.clock_s = now
        st.session_state[_FRAME] = True  # keep_playing asks for the next frame at the end of this run
    _draw(state, cfg)
    try:
        return state.replay.show(state.pb.first, state.pb.last)
    except ValueError as exc:
        st.error(f"Cannot show this range: {exc}")
        return None


def _draw(state: _Replay, cfg: Settings) -> None:
    timeline, pb = state.replay.timeline, state.pb
    step_T = state.replay.step_T
    with st.container(border=True):
        st.markdown(f"**Replay window: {playback.range_label(pb, timeline)}**"
                    + (" · playing" if pb.playing else " · paused"))
        if step_T.size > 1:
            shown = _shown(state)
            key = range_key(shown)
            st.session_state[key] = shown
            st.slider(RANGE_LABEL, min_value=int(step_T[0]), max_value=int(step_T[-1]),
                      key=key, on_change=_on_range, args=(shown,), label_visibility="collapsed",
                      help="Every page analyses the steps of this range. Drag either end, or the range.")
        cols = st.columns([1, 1, 1, 1, 3, 2, 2])
        cols[0].button("◀ step", key="timeline_back", on_click=_on_shift, args=(-1,), help="One step back")
        # both always drawn, neither a toggle: a click delivered twice plays (or pauses) once
        cols[1].button("▶ play", key="timeline_play", on_click=_on_play, disabled=pb.playing)
        cols[2].button("⏸ pause", key="timeline_pause", on_click=_on_replay_pause, disabled=not pb.playing)
        cols[3].button("step ▶", key="timeline_forward", on_click=_on_shift, args=(1,), help="One step forward")
        if _SPEED not in st.session_state:
            st.session_state[_SPEED] = pb.speed
        cols[4].radio("speed", playback.SPEEDS, key=_SPEED, horizontal=True, on_change=_on_speed,
                      label_visibility="collapsed", help="1x: the recording's own pace; 10x; max: as fast as "
                      "the page renders (a tenth of the window per frame)")
        cols[5].button("worst step", key="timeline_worst", on_click=_on_worst,
                       help="Centre the window on the step with the lowest balancedness (of the phase in view)")
        cols[6].button("next rebalance", key="timeline_rebalance", on_click=_on_rebalance,
                       help="Centre the window on the next layout change (an engine rebalance or an applied layout)")
        note = st.session_state.get(_NOTE)  # an answer stays until the next move
        if note:
            st.caption(note)


def _state() -> _Replay | None:
    held = st.session_state.get(_STATE)
    return held if isinstance(held, _Replay) else None


def range_key(shown: tuple[int, int]) -> str:
    """The range slider's widget key, named by the range (first step, last step) it was drawn at."""
    return f"{_RANGE}:{shown[0]}:{shown[1]}"


def _shown(state: _Replay) -> tuple[int, int]:
    step_T = state.replay.step_T
    return int(step_T[state.pb.first]), int(step_T[state.pb.last])


def _on_range(drawn: tuple[int, int]) -> None:
    """A drag of the slider drawn at range `drawn`. Taken only while that is still the range held: a browser
    that has not yet received a moved range (play, a step, a new width) sends the old slider's value with its
    next rerun, and Streamlit reads it as a change; taken, it would move the range back."""
    state, value = _state(), st.session_state.get(range_key(drawn))
    if state is None or not value or _shown(state) != tuple(drawn):
        return
    st.session_state.pop(_NOTE, None)
    state.pb = playback.seek_steps(state.pb, state.replay.timeline, value[0], value[1], state.replay.max_steps)


def _on_shift(by: int) -> None:
    st.session_state.pop(_NOTE, None)
    state = _state()
    if state is not None:
        state.pb = replace(playback.shift(state.pb, by, state.replay.timeline), playing=False)


def _on_play() -> None:
    """Play; nothing when already playing. Streamlit can deliver one click twice (a run_every tick that fires
    between the click and the browser's flush of it carries the click too), so neither button toggles."""
    st.session_state.pop(_NOTE, None)
    state = _state()
    if state is not None and not state.pb.playing:
        state.pb = playback.play(state.pb, state.replay.timeline)
        state.clock_s = time.monotonic()


def _on_replay_pause() -> None:
    """Pause the replay; nothing when already paused (see _on_play)."""
    st.session_state.pop(_NOTE, None)
    state = _state()
    if state is not None and state.pb.playing:
        state.pb = replace(state.pb, playing=False)


def _on_speed() -> None:
    state = _state()
    if state is not None:
        state.pb = replace(state.pb, speed=str(st.session_state.get(_SPEED, "1x")))


def _on_worst() -> None:
    state = _state()
    if state is None:
        return
    phase = st.session_state.get(RESOLVED_PHASE, "both")
    index = playback.worst_index(state.replay.timeline, phase)
    if index is None:
        st.session_state[_NOTE] = f"No {phase} step with a known balancedness in the recording."
        return
    state.pb = replace(playback.centre_on(state.pb, index, state.replay.timeline), playing=False)
    eta = float(state.replay.timeline.balancedness_T[index])
    st.session_state[_NOTE] = f"Worst step: {int(state.replay.step_T[index])} (balancedness {eta:.3f})."


def _on_rebalance() -> None:
    state = _state()
    if state is None:
        return
    timeline = state.replay.timeline
    index = playback.next_rebalance_index(timeline, playback.centre_step(state.pb, timeline))
    if index is None:
        st.session_state[_NOTE] = "No later layout change in the recording."
        return
    state.pb = replace(playback.centre_on(state.pb, index, timeline), playing=False)
    st.session_state[_NOTE] = f"Layout change in force from step {int(state.replay.step_T[index])}."


def keep_playing() -> None:
    """At the end of a page's fragment: while the recording drawn in this run plays, this run asks for the next
    frame itself (at max speed now, else once REFRESH_S has passed since this frame's advance), so play never
    rests on the fragment's run_every alone: that is a browser-side timer, dropped by every full run and armed
    again only when a full run reaches the fragment. A full run cannot ask (Streamlit refuses a fragment-scoped
    rerun there) and needs not: it arms the timer itself."""
    state, drawn = _state(), st.session_state.pop(_FRAME, False)
    ctx = get_script_run_ctx()
    if state is None or not drawn or not state.pb.playing or ctx is None or not ctx.fragment_ids_this_run:
        return
    if state.pb.speed != playback.MAX_SPEED:
        time.sleep(max(0.0, min(REFRESH_S, state.clock_s + REFRESH_S - time.monotonic())))
    st.rerun(scope="fragment")


def live_controls(cfg: Settings, watched: WatchedRun) -> WatchedRun:
    """Pause / resume for a live run; returns what the pages show (the frozen copy while paused)."""
    key = cfg.monitor_key()
    held = st.session_state.get(_PAUSE)
    if held is not None and held[0] != key:
        del st.session_state[_PAUSE]
        held = None
    if held is None:
        if watched.window is not None:
            refused = st.session_state.pop(_PAUSE_ERROR, "")
            if refused:
                st.warning(refused)
            st.button("⏸ pause the view", key="live_pause_button", on_click=_on_pause, args=(key,),
                      help="Freeze what the pages show; new steps keep arriving and are shown on resume")
        return watched
    paused: Paused = held[1]
    new, more = paused.waiting(watched)
    left, right = st.columns([1, 5])
    left.button("▶ resume", key="live_resume_button", on_click=_on_resume)
    right.info(f"**Paused** at step {paused.at_step} — {'at least ' if more else ''}{new} new step"
               f"{'' if new == 1 else 's'} waiting (still polling; resume shows them).")
    return paused.frozen


def _on_pause(key: tuple) -> None:
    held = st.session_state.get("watched_run")
    if held is not None and held[0] == key:
        try:
            st.session_state[_PAUSE] = (key, Paused.of(held[1]))
        except ValueError as exc:  # the memory budget cannot hold the frozen copy of the window
            st.session_state[_PAUSE_ERROR] = f"Cannot pause: {exc}"


def _on_resume() -> None:
    st.session_state.pop(_PAUSE, None)
