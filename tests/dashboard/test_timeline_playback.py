"""The timeline's pure parts: playback moves (dashboard.live.playback), the range window filled by seek()
(dashboard.live.replay: a forward move seeks only the new steps) and a paused live run (dashboard.live.pause)."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live import playback
from moe_monitor.dashboard.live.pause import Paused
from moe_monitor.dashboard.live.replay import RangeReplay
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.base import Batch, is_seekable
from tests.support.listsource import ListSource, recording


def test_moves_keep_the_width_and_stay_inside_the_recording():
    tl = recording().timeline()
    pb = playback.initial(tl, 20)
    assert (pb.first, pb.last) == (100, 119)
    assert playback.shift(pb, 5, tl) == pb  # already at the end
    back = playback.shift(pb, -200, tl)
    assert (back.first, back.last) == (0, 19)
    centred = playback.centre_on(pb, 50, tl)
    assert (centred.first, centred.last) == (40, 59)
    seek = playback.seek_steps(pb, tl, 30, 44)
    assert (seek.first, seek.last, seek.width) == (30, 44, 15)
    assert playback.seek_steps(pb, tl, 0, 119, max_width=50).first == 70


def test_a_window_as_wide_as_the_recording_still_moves():
    tl = recording().timeline()  # 120 steps
    pb = playback.initial(tl, 600)
    assert (pb.first, pb.last) == (0, 119)  # the whole recording, as the window asks
    assert (playback.shift(pb, 1, tl).first, playback.shift(pb, 1, tl).last) == (1, 119)  # its oldest step left
    back = playback.shift(pb, -1, tl)
    assert (back.first, back.last) == (0, 118) and (playback.shift(back, -1, tl).first, back.width) == (0, 119)
    playing = playback.play(pb, tl)
    assert playing.playing and (playing.first, playing.last) == (0, 59)  # half: room to move
    assert playback.advance(playing, tl, 1e6).last > 59


def test_worst_step_follows_the_phase_filter_and_rebalances_are_found():
    tl = recording(worst_step=70).timeline()
    assert playback.worst_index(tl, "both") == 70 and tl.balancedness_T[70] == pytest.approx(0.25)
    decode = playback.worst_index(tl, "decode")
    assert decode % 2 == 1 and decode == int(np.nanargmin(np.where(tl.phase_T == "decode", tl.balancedness_T, np.inf)))
    assert playback.next_rebalance_index(tl, 10) == 90
    assert playback.next_rebalance_index(tl, 90) is None


def test_play_advances_through_the_recordings_time_and_stops_at_its_end():
    tl = recording(step_s=0.1).timeline()
    pb = playback.play(playback.Playback(0, 9), tl)
    one = playback.advance(pb, tl, 1.0)  # 1 s at 1x: 10 steps of 0.1 s
    assert (one.first, one.last) == (10, 19) and one.playing
    ten = playback.advance(playback.Playback(0, 9, True, "10x"), tl, 1.0)
    assert ten.last == 109
    fast = playback.advance(playback.Playback(0, 49, True, "max"), tl, 0.0)
    assert fast.first == 5  # a tenth of the width per frame
    end = playback.advance(playback.Playback(100, 109, True, "10x"), tl, 5.0)
    assert end.last == 119 and not end.playing
    assert playback.play(end, tl).first == 0  # play at the end starts again


def test_the_range_window_holds_exactly_the_range_and_a_forward_move_seeks_only_new_steps():
    src = recording()
    assert is_seekable(src) and not is_seekable(ListSource([]))
    replay = RangeReplay(src, 5000)
    watched = replay.show(80, 99)
    window = watched.window
    assert window.size == 20 and sorted(window.step_C.tolist()) == list(range(80, 100))
    assert int(window.ranks_C.min()) == 2  # both ranks of every step
    assert [c.step for c in watched.layouts.changes] == [90]
    moved = replay.show(83, 102)
    assert moved is watched and src.seeks[-1] == (100, 102)
    assert sorted(moved.window.step_C.tolist()) == list(range(83, 103))
    back = replay.show(10, 29)
    assert src.seeks[-1] == (10, 29) and sorted(back.window.step_C.tolist()) == list(range(10, 30))
    assert back.layouts.changes == ()  # the rebalance at 90 is not in force yet
    assert "recording: showing steps 10–29" in back.source.health().note


def test_a_paused_run_keeps_its_window_while_the_live_one_goes_on():
    src = recording(steps=60)
    records = src.records
    live = WatchedRun(ListSource([Batch(steps=[r for r in records if r.step < 30]),
                                  Batch(steps=[r for r in records if r.step >= 30])]), 600)
    live.tick()
    paused = Paused.of(live)
    live.tick()
    assert paused.frozen.window.size == 30 and live.window.size == 60
    assert paused.waiting(live) == (30, False)
    assert paused.frozen.window.newest_step == 29 and paused.at_step == 29
    timed = core.TimingRecord(run="r", rank=0, world_size=1, step=60, time_s=1.7e9,
                              dispatch_s_L=np.ones(2, np.float32), compute_s_L=np.ones(2, np.float32),
                              combine_s_L=np.ones(2, np.float32), layer_s_L=np.ones(2, np.float32))
    live.timings.add(timed)   # the live run's layer timings go on too, the frozen copy's do not
    assert live.timings.records == 1 and paused.frozen.timings.records == 0
