"""The timeline in the pages (streamlit.testing.v1.AppTest on the real app.py): a recording replayed like a
video (seek, step, the worst step, the next rebalance; every page analyses the range), on a seekable
recording of tests/support/listsource.py and on a real trace file through dashboard.sources.trace; a live run
paused while steps keep arriving in Redis, and resumed with nothing lost; the staleness figure."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from moe_monitor import core
from moe_monitor.dashboard.live import playback
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.base import is_seekable
from moe_monitor.dashboard.sources.trace import TraceSource
from moe_monitor.dashboard.views import timeline
from tests.support import synthfill
from tests.support.apptest import app_test, open_page, whole
from tests.support.listsource import recording, write_jsonl

WIDTH = 20


def _window(at) -> tuple[int, int, int]:
    """(first step, last step, steps) of the replay window the page says it shows."""
    text = next(m.value for m in at.markdown if m.value.startswith("**Replay window"))
    first, last, steps = re.search(r"steps (\d+)–(\d+) \((\d+) steps\)", text).groups()
    return int(first), int(last), int(steps)


def _in_window(at) -> int:
    caption = next(c.value for c in at.caption if "steps in window" in c.value)
    return int(re.search(r"(\d+) steps in window", caption).group(1))


def _ok(at) -> AppTest:
    assert not at.exception, at.exception
    return at


@pytest.fixture(params=["listsource", "tracefile"])
def replay_app(request, tmp_path, monkeypatch):
    """The app on a 120-step recording (worst step 70, rebalance at 90), window WIDTH steps."""
    src = recording()
    write_jsonl(src, tmp_path / "rec.jsonl")
    monkeypatch.setenv("MOE_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    at = app_test()
    at.session_state["source_kind"] = "Trace file"
    at.session_state["window_steps"] = WIDTH
    if request.param == "listsource":
        at.session_state["watched_run"] = (("trace", "rec.jsonl", WIDTH), WatchedRun(src, WIDTH))
    at = _ok(whole(at.run()))
    if request.param != "listsource":   # the real TraceSource the page built can seek
        source = at.session_state["watched_run"][1].source
        assert isinstance(source, TraceSource) and is_seekable(source)
    return at


def _range_slider(at):
    """The timeline's range slider (its key names the range it was drawn at: timeline.range_key)."""
    return next(s for s in at.slider if s.label == timeline.RANGE_LABEL)


def test_seek_and_step_move_the_window_every_page_analyses(replay_app):
    at = replay_app
    assert _window(at) == (100, 119, WIDTH) and _in_window(at) == WIDTH
    _ok(_range_slider(at).set_value((30, 59)).run())
    assert _window(at) == (30, 59, 30) and _in_window(at) == 30
    _ok(at.button(key="timeline_forward").click().run())
    assert _window(at) == (31, 60, 30)
    _ok(at.button(key="timeline_back").click().run())
    _ok(at.button(key="timeline_back").click().run())
    assert _window(at) == (29, 58, 30)
    held = [shown for shown in ((100, 119), (30, 59), (31, 60), (29, 58)) if timeline.range_key(shown) in at.session_state]
    assert held == [(29, 58)]  # the slider's state of the range shown only, however often the range moved
    for page in ("devices", "experts", "gpus"):
        _ok(open_page(at, f"page_files/{page}.py"))
        assert _window(at) == (29, 58, 30)
        if page != "gpus":
            assert _in_window(at) == 30


def test_jump_to_the_worst_step_and_to_the_next_rebalance(replay_app):
    at = replay_app
    _ok(at.button(key="timeline_worst").click().run())
    first, last, steps = _window(at)
    assert first <= 70 <= last and steps == WIDTH and abs((first + last) / 2 - 70) <= 1
    assert any("Worst step: 70 (balancedness 0.250)" in c.value for c in at.caption)
    _ok(at.run())  # a refresh: the answer stays until the next move
    assert any("Worst step: 70 (balancedness 0.250)" in c.value for c in at.caption)
    _ok(at.button(key="timeline_rebalance").click().run())
    first, last, _ = _window(at)
    assert first < 90 <= last and any("in force from step 90" in c.value for c in at.caption)
    assert any("engine rebalance since step 90" in m.value for m in at.markdown)
    _ok(at.button(key="timeline_rebalance").click().run())
    assert any("No later layout change" in c.value for c in at.caption)
    _ok(at.button(key="timeline_back").click().run())  # the next move ends it
    assert not any("No later layout change" in c.value for c in at.caption)


def test_the_worst_step_follows_the_phase_filter(replay_app):
    at = replay_app
    _ok(at.sidebar.radio(key="phase").set_value("decode").run())
    _ok(at.button(key="timeline_worst").click().run())
    note = next(c.value for c in at.caption if c.value.startswith("Worst step"))
    worst = int(re.search(r"Worst step: (\d+)", note).group(1))
    assert worst % 2 == 1  # a decode step, never the prefill step 70
    first, last, _ = _window(at)
    assert first <= worst <= last


def test_play_advances_the_window(replay_app):
    at = replay_app
    _ok(_range_slider(at).set_value((0, 19)).run())
    at.radio(key="timeline_speed").set_value("10x")
    _ok(at.button(key="timeline_play").click().run())
    before = _window(at)
    _ok(at.run())
    after = _window(at)
    assert after[0] > before[0] and after[2] == before[2]
    _ok(at.button(key="timeline_pause").click().run())
    held = _window(at)
    _ok(at.run())
    assert _window(at) == held


def test_a_click_delivered_twice_plays_once_and_pauses_once():
    """Streamlit can deliver one click twice (a run_every tick that fires between the click and the browser's
    flush of it carries the click too): the second delivery changes nothing, where a toggle undid the first."""
    import streamlit as st

    tl = recording().timeline()
    state = timeline._Replay(("a recording",), SimpleNamespace(timeline=tl), playback.initial(tl, WIDTH))
    st.session_state[timeline._STATE] = state
    try:
        timeline._on_play()
        played = state.pb
        timeline._on_play()
        assert played.playing and state.pb == played
        timeline._on_replay_pause()
        paused = state.pb
        timeline._on_replay_pause()
        assert not paused.playing and state.pb == paused and (paused.first, paused.last) == (played.first, played.last)
    finally:
        del st.session_state[timeline._STATE]


def test_the_staleness_figure_on_experts_and_whatif(replay_app):
    at = replay_app
    _ok(open_page(at, "page_files/experts.py"))
    assert len(at.get("vega_lite_chart")) == 3 and not any("Placement staleness" in c.value for c in at.caption)
    _ok(at.toggle(key="experts_staleness").set_value(True).run())   # asked for: it costs a few plans
    charts = at.get("vega_lite_chart")
    assert len(charts) == 4
    assert any("Placement staleness" in c.value for c in at.caption)
    _ok(open_page(at, "page_files/whatif.py"))
    assert any("Placement staleness" in c.value for c in at.caption)


def test_a_live_run_paused_keeps_its_window_and_resume_shows_every_new_step(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "pause-run", steps=30, num_layers=2, num_experts=8, gpus=2)
    monkeypatch.setenv("REDIS_URL", redis_url)
    at = whole(_ok(app_test().run()))  # the sidebar's widgets drawn
    at.sidebar.selectbox(key="run").set_value("pause-run")
    _ok(at.run())
    assert _in_window(at) == 30
    _ok(at.button(key="live_pause_button").click().run())
    synthfill.fill(client, "pause-run", steps=12, num_layers=2, num_experts=8, gpus=2, first_step=30, seed=1)
    _ok(at.run())
    assert _in_window(at) == 30  # the view is frozen ...
    assert any("Paused" in i.value and "12 new steps waiting" in i.value for i in at.info)  # ... polling is not
    _ok(open_page(at, "page_files/devices.py"))
    assert _in_window(at) == 30
    _ok(at.button(key="live_resume_button").click().run())
    assert _in_window(at) == 42  # nothing lost
    assert not any("Paused" in i.value for i in at.info)


def test_a_recording_raises_no_live_collector_alert(replay_app):
    """A replayed recording's collectors wrote long ago by this machine's clock: that is not a silent collector."""
    at = replay_app
    line = next(c.value for c in [*at.caption, *at.warning] if c.value.startswith("Alerts on this window"))
    assert "MoECollectorSilent ok (a recording: no live collector)" in line
    assert next(m for m in at.metric if m.label == "collector last wrote").value == "a recording"
