"""Layout changes from the collector to the dashboard, with real processes: ExpertLoadMonitor.publish_layout()
into a real redis-server (and a trace file), read back by the dashboard's WatchedRun, whose per-step GPU loads
use the layout in force at each step (exact numbers, worked out by hand below); a Redis outage (SIGKILL, a
restart that comes back empty) while a layout waits loses nothing."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor, record_trace
from moe_monitor.dashboard.live.layout import in_force_note, resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.dashboard.sources.trace import TraceSource
from tests.support.redisfaults import FaultyRedis
from tests.support.waiting import wait_until

# 2 layers, 4 experts, 2 GPUs. Until step 3 the metadata's contiguous layout: GPU 0 holds experts 0, 1 and
# GPU 1 experts 2, 3. From step 3 six slots with replicas, three per GPU:
#   layer 0 [2, 3, 0 | 1, 0, 1]: GPU 0 = c2 + c3 + c0/2, GPU 1 = c0/2 + c1
#   layer 1 [1, 0, 3 | 2, 2, 3]: GPU 0 = c1 + c0 + c3/2, GPU 1 = c2 + c3/2
NEW_LP = np.array([[2, 3, 0, 1, 0, 1], [1, 0, 3, 2, 2, 3]])
IDS = [[0, 0, 1, 3], [2, 2, 2, 0], [1]]  # the token ids of steps 0, 1, 2 (counts [2,1,0,1], [1,0,3,0], [0,1,0,0])
WANT_TLG = np.array([
    [[3, 1], [3, 1]], [[1, 3], [1, 3]], [[1, 0], [1, 0]],            # steps 0-2 under the contiguous layout
    [[2, 2], [3.5, 0.5]], [[3.5, 0.5], [1, 3]], [[0, 1], [1, 0]],    # steps 3-5: the same counts, the new layout
])
RUN = "relayout"


def _step(mon: ExpertLoadMonitor, ids: list[int]) -> None:
    for layer in range(2):
        mon.record(layer, torch.tensor(ids).reshape(-1, 1))
    mon.end_step("decode")


def _run_with_a_rebalance(mon: ExpertLoadMonitor) -> None:
    """Steps 0-2, the engine's rebalance (in force from the next step, 3), steps 3-5 with the same ids."""
    for ids in IDS:
        _step(mon, ids)
    mon.publish_layout(NEW_LP)
    for ids in IDS:
        _step(mon, ids)
    mon.close()


def _watch(source) -> WatchedRun:
    watched = WatchedRun(source, window_steps=64)
    for _ in range(5):
        watched.tick()
    return watched


def _check_loads(watched: WatchedRun) -> None:
    window = watched.window
    assert window is not None and watched.bad_records == 0, watched.last_error
    layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size,
                            changes=watched.layouts.changes, at_step=window.newest_step)
    snap = analyse(window, layout, "both")
    assert snap is not None
    assert list(snap.view.step_T) == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(snap.view.loads_TLG, WANT_TLG)
    assert (layout.since_step, layout.source, layout.origin) == (3, "engine", "engine rebalance at step 3")
    np.testing.assert_array_equal(layout.layout_LP, NEW_LP)
    assert snap.step_marks() == [(3.0, "engine rebalanced")]
    assert "engine rebalance since step 3" in in_force_note(layout)
    # the What-if path: a layout the user chose wins over the run's history, for every step
    override = resolve_layout(watched.source.meta(), 2, 4, uploaded=[[0, 1, 2, 3], [0, 1, 2, 3]],
                              changes=watched.layouts.changes)
    assert override.schedule == () and override.hidden_changes == 1
    np.testing.assert_allclose(analyse(window, override, "both").view.loads_TLG[3:], WANT_TLG[:3])


def test_monitor_publishes_a_layout_change_that_the_dashboard_applies_from_its_step(redis_server, redis_url):
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run=RUN, gpus=2, nvml=False, sample_tokens=0)
    _run_with_a_rebalance(mon)
    client = redis_server.client()
    entries = client.xrange(core.layouts_key(RUN))
    assert len(entries) == 1
    rec = core.decode_layout_record(entries[0][1]).validate(4, num_layers=2)
    assert (rec.step, rec.gpus, rec.nodes, rec.source, rec.instance) == (3, 2, 1, "engine", mon.instance)
    np.testing.assert_array_equal(rec.layout_LP, NEW_LP)
    stats = mon.stats()["sinks"]["redis"]
    assert (stats["published_layouts"], stats["queued_layouts"], stats["dropped_layouts"]) == (1, 0, 0)
    assert core.decode_meta(client.get(core.meta_key(RUN))).layout.physical_to_logical_map == [[0, 1, 2, 3]] * 2
    _check_loads(_watch(RedisSource(client, redis_url, RUN, 64)))


def test_a_layout_arriving_after_its_steps_recomputes_them(redis_server, redis_url):
    """The dashboard polls the steps first and the layout change only later: the rows from step 3 on are
    recomputed under the new layout, the others keep their cached loads."""
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run=RUN, gpus=2, nvml=False, sample_tokens=0)
    _run_with_a_rebalance(mon)
    client = redis_server.client()
    layouts = client.xrange(core.layouts_key(RUN))
    client.delete(core.layouts_key(RUN))
    watched = _watch(RedisSource(client, redis_url, RUN, 64))
    layout = resolve_layout(watched.source.meta(), 2, 4, changes=watched.layouts.changes)
    np.testing.assert_allclose(analyse(watched.window, layout, "both").view.loads_TLG, np.concatenate([WANT_TLG[:3]] * 2))
    client.xadd(core.layouts_key(RUN), layouts[0][1])
    watched.tick()
    _check_loads(watched)


def test_trace_file_round_trip_with_a_layout_line(redis_server, redis_url, tmp_path):
    path = tmp_path / "run.jsonl"
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run=RUN, gpus=2, nvml=False, sample_tokens=0,
                            trace_path=str(path))
    _run_with_a_rebalance(mon)
    lines = path.read_text().splitlines()
    kinds = [core.parse_trace_line(line)[0] for line in lines]
    assert kinds.count("layout") == 1 and kinds.count("step") == 6 and kinds[0] == "meta"
    kind, rec = core.decode_trace_line(lines[kinds.index("layout")])
    assert kind == "layout" and rec.step == 3
    np.testing.assert_array_equal(rec.layout_LP, NEW_LP)
    _check_loads(_watch(TraceSource(str(path))))
    dumped = tmp_path / "dump.jsonl"  # a trace recorded from Redis carries the layout stream too
    assert record_trace(redis_url, RUN, str(dumped)) == 6
    _check_loads(_watch(TraceSource(str(dumped))))


def test_a_rotated_trace_file_starts_with_the_layout_in_force(tmp_path):
    path = tmp_path / "rot.jsonl"
    mon = ExpertLoadMonitor(2, 4, 1, gpus=2, nvml=False, sample_tokens=0, trace_path=str(path), trace_max_bytes=2500)
    _step(mon, [0])
    mon.publish_layout(NEW_LP, source="apply")
    for _ in range(12):
        _step(mon, [1, 2])
        time.sleep(0.12)  # a batch each: the file rotates between them
    mon.close()
    head = [core.parse_trace_line(line)[0] for line in path.read_text().splitlines()[:2]]
    assert head == ["meta", "layout"] and (tmp_path / "rot.jsonl.1").exists()
    _, rec = core.decode_trace_line(path.read_text().splitlines()[1])
    assert (rec.step, rec.source) == (1, "apply")


def test_publish_layout_checks_the_map_and_never_waits(redis_server, redis_url):
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run="checks", gpus=2, nvml=False, sample_tokens=0)
    for bad, message in ((np.array([[0, 1, 2, 2], [0, 1, 2, 3]]), "layer 0: expert 3 has no slot"),
                         (np.array([[0, 1, 2, 3]]), "layout has 1 layers, the model has 2"),
                         (np.array([[0, 1, 2, 3, 0], [0, 1, 2, 3, 1]]), "do not split evenly over 2 GPUs"),
                         (np.array([[0, 1, 2, 4], [0, 1, 2, 3]]), "every expert"),
                         ("not a map", "must be an int array, tensor or nested lists"),
                         ([[0, 1, 2, 3], [0, 1, 2]], "layer 1: 3 slots do not split evenly")):
        with pytest.raises(ValueError, match=message):
            mon.publish_layout(bad)
    with pytest.raises(ValueError, match="source must be one of"):
        mon.publish_layout(NEW_LP, source="eplb")
    with pytest.raises(ValueError, match="from_step"):
        mon.publish_layout(NEW_LP, from_step=-1)
    with pytest.raises(ValueError, match="gpus=0"):
        mon.publish_layout(NEW_LP, gpus=0)
    mon.publish_layout(torch.tensor([[3, 2, 1, 0], [0, 1, 2, 3]]), from_step=7, gpus=4)  # a tensor, 4 GPUs
    assert mon.last_layout is not None and (mon.last_layout.step, mon.last_layout.gpus) == (7, 4)
    with pytest.raises(ValueError, match="layer 0: expert 3 has no slot"):
        mon.publish_layout(np.array([[0, 1, 2, -1], [0, 1, 2, 3]]))  # -1 is an unused slot, not an expert
    mon.publish_layout(np.array([[0, 1, -1, 2, 3, -1], [0, 1, 2, 3, 0, 1]]), from_step=8)  # vLLM's -1: fine
    assert mon.last_layout.layout_LP[0].tolist() == [0, 1, -1, 2, 3, -1]
    mon.close()
    with pytest.raises(RuntimeError, match="after close"):
        mon.publish_layout(NEW_LP)
    rec = core.decode_layout_record(redis_server.client().xrange(core.layouts_key("checks"))[0][1])
    assert (rec.step, rec.gpus) == (7, 4) and rec.layout_LP.tolist() == [[3, 2, 1, 0], [0, 1, 2, 3]]
    memory_only = ExpertLoadMonitor(2, 4, 1, gpus=2, nvml=False)
    memory_only.publish_layout(NEW_LP)
    assert memory_only.last_layout is not None and memory_only.last_layout.step == 0


@pytest.fixture
def server(tmp_path):
    srv = FaultyRedis(tmp_path)
    yield srv
    srv.stop()


def test_outage_while_a_layout_waits_loses_nothing(server):
    """Redis SIGKILLed; while it is down the engine rebalances and the model runs on, far past queue_steps:
    the step queue drops its oldest steps (counted), the layout waits in its own queue, and when Redis comes
    back (restarted empty) the layout lands once, with the newest steps."""
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=server.url, run="down", gpus=2, nvml=False, sample_tokens=0,
                            redis_timeout_s=0.5, queue_steps=20)
    for ids in IDS:
        _step(mon, ids)
    assert wait_until(lambda: mon.stats()["published_steps"] == 3)
    server.kill()
    mon.publish_layout(NEW_LP)  # returns at once: nothing waits on the dead Redis
    for _ in range(60):
        _step(mon, [1])
    assert wait_until(lambda: mon.stats()["dropped_steps"] == 40 and "ConnectionError" in mon.stats()["last_error"])
    assert mon.stats()["sinks"]["redis"]["queued_layouts"] == 1
    server.start()
    assert wait_until(lambda: mon.stats()["sinks"]["redis"]["published_layouts"] == 1)
    mon.close()
    client = server.client()
    layouts = [core.decode_layout_record(f) for _, f in client.xrange(core.layouts_key("down"))]
    assert [r.step for r in layouts] == [3]
    np.testing.assert_array_equal(layouts[0].layout_LP, NEW_LP)
    assert [core.decode_step(f).step for _, f in client.xrange(core.steps_key("down"))] == list(range(43, 63))
    stats = mon.stats()["sinks"]["redis"]
    assert (stats["dropped_layouts"], stats["dropped_steps"]) == (0, 40)


def test_a_redis_restarted_empty_gets_the_layout_in_force_back(server):
    """The layout landed; Redis restarts empty between two batches: the layout stream is found missing and the
    layout in force is written again, so a dashboard reading the new Redis computes the right loads."""
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=server.url, run="reborn", gpus=2, nvml=False, sample_tokens=0,
                            redis_timeout_s=0.5)
    _step(mon, [0])
    mon.publish_layout(NEW_LP)
    _step(mon, [1])
    client = server.client()
    assert wait_until(lambda: client.exists(core.layouts_key("reborn")) == 1)
    server.restart()
    client = server.client()
    for _ in range(5):
        _step(mon, [2])
        time.sleep(0.15)
    assert wait_until(lambda: client.exists(core.layouts_key("reborn")) == 1)
    mon.close()
    layouts = [core.decode_layout_record(f) for _, f in client.xrange(core.layouts_key("reborn"))]
    assert [r.step for r in layouts] == [1]
    np.testing.assert_array_equal(layouts[0].layout_LP, NEW_LP)


def test_a_stalled_redis_never_holds_up_publish_layout(server):
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=server.url, run="stall", gpus=2, nvml=False, sample_tokens=0,
                            redis_timeout_s=0.5)
    _step(mon, [0])
    server.stall()
    try:
        started = time.monotonic()
        mon.publish_layout(NEW_LP)
        _step(mon, [1])
        took_s = time.monotonic() - started
        assert server.stalled()
        assert took_s < 0.25, f"publish_layout + a step took {took_s:.3f} s while Redis answered nothing"
    finally:
        server.resume()
    assert wait_until(lambda: mon.stats()["sinks"]["redis"]["published_layouts"] == 1)
    mon.close()
