"""Timing records (core/timings.py) and the collector's time_layer() / record_times() (collectors/timing.py):
encoding bounds, trace lines, and real publishing through a redis-server and a trace file."""
from __future__ import annotations

import time

import numpy as np
import pytest
import redis
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor, record_trace
from moe_monitor.collectors.timing import StepTimer


def _record(**changes) -> core.TimingRecord:
    fields = dict(run="r1", rank=1, world_size=4, step=7, time_s=1.7e9,
                  dispatch_s_L=np.array([1e-4, np.nan, 0.0], np.float32), compute_s_L=np.full(3, 2e-4, np.float32),
                  combine_s_L=np.full(3, 1e-4, np.float32), layer_s_L=np.full(3, 5e-4, np.float32), instance="i-1")
    fields.update(changes)
    return core.TimingRecord(**fields)


def test_round_trip_and_trace_line():
    rec = _record()
    fields = core.encode_timing(rec)
    assert set(fields) == set(core.TIMING_FIELDS)
    back = core.decode_timing({k.encode(): v for k, v in fields.items()})  # as redis-py hands it over
    for a, b in zip(rec.arrays(), back.arrays()):
        np.testing.assert_array_equal(a, b)  # NaN == NaN here: not measured survives
    assert (back.run, back.rank, back.world_size, back.step, back.instance) == ("r1", 1, 4, 7, "i-1")
    kind, traced = core.decode_trace_line(core.trace_line("timing", fields))
    assert kind == "timing" and "timing" in core.TRACE_KINDS and isinstance(traced, core.TimingRecord)
    np.testing.assert_array_equal(traced.layer_s_L, rec.layer_s_L)
    assert core.timings_key("r1") == "moe:{r1}:timings"


@pytest.mark.parametrize("changes, message", [
    (dict(compute_s_L=np.array([1.0, -1.0, 0.0], np.float32)), "compute"),
    (dict(layer_s_L=np.array([np.inf, 0.0, 0.0], np.float32)), "layer"),
    (dict(combine_s_L=np.array([2e6, 0.0, 0.0], np.float32)), "combine"),
    (dict(dispatch_s_L=np.zeros(2, np.float32)), "one length"),
    (dict(rank=4), "below world"),
    (dict(run="bad name"), "run name"),
])
def test_encode_refuses_what_readers_refuse(changes, message):
    with pytest.raises(ValueError, match=message):
        core.encode_timing(_record(**changes))


def test_decode_bounds():
    fields = core.encode_timing(_record())
    for name, value in [("L", 2), ("L", 0), ("L", core.MAX_LAYERS + 1), ("v", 99), ("layer", b"\x00" * 5),
                        ("step", -1), ("t", "nan"), ("world", 0)]:
        bad = {**fields, name: value}
        with pytest.raises(ValueError):
            core.decode_timing(bad)
    missing = dict(fields)
    del missing["combine"]
    with pytest.raises(ValueError, match="combine"):
        core.decode_timing(missing)


def test_step_timer_phases_add_up_on_the_cpu():
    timer = StepTimer(2, torch.device("cpu"))
    assert timer.take() is None  # nothing timed: no record
    with timer.layer(1) as layer:
        with layer.dispatch():
            time.sleep(0.002)
        with layer.compute():
            time.sleep(0.003)
        with layer.combine():
            time.sleep(0.001)
    with timer.layer(1).compute():  # a phase timed twice in one step adds up
        time.sleep(0.001)
    times_4L = timer.read(timer.take())
    assert np.isnan(times_4L[:, 0]).all()
    d, c, b, whole = times_4L[:, 1]
    assert d >= 0.002 and c >= 0.004 and b >= 0.001 and whole >= d + 0.003 + b
    with pytest.raises(ValueError):
        timer.layer(2)
    with pytest.raises(ValueError):
        timer.record_times(0, -1.0, None, None, None)
    timer.record_times(0, 0.5, None, float("nan"), 1.0)
    times_4L = timer.read(timer.take())
    assert times_4L[0, 0] == 0.5 and np.isnan(times_4L[1, 0]) and times_4L[3, 0] == 1.0


def test_timings_travel_with_their_steps(redis_url, tmp_path):
    trace = tmp_path / "run.jsonl"
    mon = ExpertLoadMonitor(3, 8, 2, redis_url=redis_url, run="timed", nvml=False, sample_tokens=0,
                            trace_path=str(trace))

    ids = torch.tensor([[0, 1], [2, 3]])
    for step in range(4):
        for layer in range(3):
            if step == 2:  # a step that times nothing: no timing record
                mon.record(layer, ids)
                continue
            with mon.time_layer(layer) as t:
                with t.dispatch():
                    pass
                mon.record(layer, ids)
                with t.compute():
                    time.sleep(0.0005)
                with t.combine():
                    pass
        if step == 3:
            mon.record_times(0, dispatch_s=0.25)  # an engine's own measurement adds to the phase
        mon.end_step(phase="decode")
    mon.close()
    client = redis.Redis.from_url(redis_url)
    timings = [core.decode_timing(f) for _, f in client.xrange(core.timings_key("timed"))]
    steps = [core.decode_step(f) for _, f in client.xrange(core.steps_key("timed"))]
    assert [s.step for s in steps] == [0, 1, 2, 3] and [t.step for t in timings] == [0, 1, 3]
    for t in timings:
        assert t.instance == steps[0].instance and t.world_size == 1
        d, c, b, whole = (a.astype(np.float64) for a in t.arrays())
        assert np.isfinite(whole).all() and (c >= 0.0005).all()
        if t.step != 3:
            assert (d + c + b <= whole + 1e-6).all()
    assert timings[-1].dispatch_s_L[0] >= 0.25
    stats = mon.stats()["sinks"]
    assert stats["redis"]["published_timings"] == 3 and stats["trace"]["published_timings"] == 3
    assert stats["redis"]["dropped_timings"] == 0
    kinds = [core.decode_trace_line(line)[0] for line in trace.read_text().splitlines()]
    assert kinds.count("timing") == 3 and kinds.count("step") == 4
    client.close()
    dumped = tmp_path / "dumped.jsonl"   # record_trace copies the timings stream too
    record_trace(redis_url, "timed", str(dumped))
    copied = [item for kind, item in map(core.decode_trace_line, dumped.read_text().splitlines()) if kind == "timing"]
    assert [t.step for t in copied] == [0, 1, 3]
    np.testing.assert_array_equal(copied[-1].dispatch_s_L, timings[-1].dispatch_s_L)


def test_untimed_run_writes_no_timing_stream(redis_url):

    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run="untimed", nvml=False, sample_tokens=0)
    for _ in range(3):
        mon.record(0, torch.tensor([[1], [2]]))
        mon.end_step()
    mon.close()
    client = redis.Redis.from_url(redis_url)
    assert client.xlen(core.steps_key("untimed")) == 3 and not client.exists(core.timings_key("untimed"))
    client.close()
