"""Out-of-range numbers in a record: refused at decode with one ValueError, refused by the window before it
changes anything, and a tick that meets any failing record counts it and goes on with the rest of its poll.
Sums over ranks are exact (no int32 wrap); per-rank and per-instance maps stay bounded."""
from __future__ import annotations

import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.gpu_history import GpuHistory
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.live.window import StepWindow
from moe_monitor.dashboard.sources.base import Batch
from moe_monitor.dashboard.sources.redis import RedisSource
from tests.support import synthfill
from tests.support.assembled import add_rank
from tests.support.listsource import ListSource


def _rec(step, counts=((1, 2),), rank=0, world=1, phase="decode", tokens=4, instance="", t=None):
    return core.StepRecord(run="b", rank=rank, world_size=world, step=step,
                           time_s=float(100 + step if t is None else t), phase=phase, tokens=tokens,
                           counts_LE=np.asarray(counts, dtype=np.int32), instance=instance)


def _entry(**over) -> dict:
    fields = {k.encode(): v if isinstance(v, bytes) else str(v).encode()
              for k, v in core.encode_step(_rec(3)).items()}
    fields.update({k.encode(): str(v).encode() for k, v in over.items()})
    return fields


@pytest.mark.parametrize("over, message", [
    ({"step": 2**62}, "'step'"),
    ({"step": 2**64}, "'step'"),
    ({"tokens": 2**40}, "'tokens'"),
    ({"world": 65537}, "'world'"),
    ({"world": 2**64, "rank": 2**63}, "'world'"),
    ({"dropped": 2**62}, "'dropped'"),
    ({"t": "1e300"}, "time"),
    ({"step": "1" * 5000}, "'step'"),
    ({"step": "²"}, "'step'"),
    ({"inst": "x" * 1000}, "instance"),
])
def test_out_of_range_fields_are_one_value_error_at_decode(over, message):
    with pytest.raises(ValueError, match=message):
        core.decode_step(_entry(**over))


def test_the_largest_allowed_values_decode():
    rec = core.decode_step(_entry(step=core.MAX_STEP - 1, tokens=core.MAX_TOKENS - 1, world=core.MAX_WORLD,
                                  rank=core.MAX_WORLD - 1, dropped=core.MAX_STEP - 1))
    assert (rec.step, rec.tokens, rec.world_size, rec.rank) == (2**62 - 1, 2**40 - 1, 65536, 65535)


def _state(w: StepWindow):
    return (w.counts_CLE.copy(), w.step_C.copy(), w.tokens_C.copy(), w.ranks_C.copy(), w.sums_by_phase_LE.copy(),
            dict(w._slot_of_step), w.head, w.size, dict(w.dropped_by_rank), [set(s) for s in w._ranks_seen])


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))


@pytest.mark.parametrize("bad", [
    _rec(2**70), _rec(5, tokens=2**70), _rec(5, rank=2**40, world=2**41), _rec(5, phase="warmup"),
    _rec(5, counts=((1, -2),)), _rec(5, t=float("nan")), _rec(1, tokens=2**70, rank=1, world=2),
    core.StepRecord(run="b", rank=0, world_size=1, step=5, time_s=1.0, phase="decode", tokens=1,
                    counts_LE=np.asarray([[1.5, 2.0]])),
])  # a rank's counts beyond int32 are refused where the reader takes records (test_properties_wire)
def test_window_refuses_a_bad_record_before_changing_anything(bad):
    w = StepWindow(2, 1, 2)
    add_rank(w, _rec(0))
    add_rank(w, _rec(1, rank=0, world=2))
    before = _state(w)
    with pytest.raises(ValueError):
        add_rank(w, bad)
    assert _same(before, _state(w))
    add_rank(w, _rec(2))  # the window still works: the ring moves on
    add_rank(w, _rec(3))
    assert list(w.view("both", [[0, 1]], 1, now_s=1e9).step_T) == [2, 3]


def test_a_tick_counts_any_failing_record_and_keeps_the_rest_of_its_poll():
    broken = core.StepRecord(run="b", rank=0, world_size=1, step=2, time_s=102.0, phase="decode", tokens=1,
                             counts_LE=None)  # type: ignore[arg-type]
    first = Batch(steps=[_rec(0), _rec(1), _rec(2**70), broken, _rec(3, t=float("inf")), _rec(4)])
    watched = WatchedRun(ListSource([first, Batch(steps=[_rec(5), _rec(6)])]), window_steps=10)
    tick = watched.tick()
    assert tick.bad == 3 and watched.bad_records == 3
    assert list(watched.window.view("both", [[0, 1]], 1, now_s=1e9).step_T) == [0, 1, 4]
    watched.tick()  # later ticks with new steps keep working
    assert list(watched.window.view("both", [[0, 1]], 1, now_s=1e9).step_T) == [0, 1, 4, 5, 6]


def test_an_out_of_range_step_in_redis_costs_one_record_not_the_poll(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "big", steps=3)
    fields = core.encode_step(core.StepRecord(run="big", rank=0, world_size=1, step=3, time_s=time.time(),
                                              phase="decode", tokens=1,
                                              counts_LE=np.ones((4, 16), dtype=np.int32)))
    client.xadd(core.steps_key("big"), {**fields, "step": str(2**64)})
    synthfill.fill(client, "big", steps=2, first_step=4, meta=False)
    watched = WatchedRun(RedisSource(client, redis_url, "big", window_steps=20), window_steps=20)
    watched.tick()
    assert watched.bad_records == 1 and "'step'" in watched.last_error
    assert watched.window.size == 5
    synthfill.fill(client, "big", steps=2, first_step=6, meta=False)
    watched.tick()
    assert watched.window.size == 7 and watched.bad_records == 1


def test_sums_over_ranks_do_not_wrap():
    big = 2**31 - 1
    w = StepWindow(2, 1, 2)
    add_rank(w, _rec(0, counts=((big, 1),), rank=0, world=3))
    add_rank(w, _rec(0, counts=((big, 1),), rank=1, world=3))
    add_rank(w, _rec(0, counts=((big, 1),), rank=2, world=3))
    view = w.view("both", [[0, 1]], 2, now_s=1e9)
    assert view.counts_sum_LE.tolist() == [[3 * big, 3]]
    assert w.counts_CLE[view.slots_T[0]].tolist() == [[3 * big, 3]]
    assert w.layer_counts(view.slots_T, 0).tolist() == [[3 * big, 3]]
    np.testing.assert_allclose(view.loads_TLG[0, 0], [3 * big, 3], rtol=1e-6)
    add_rank(w, _rec(1, counts=((7, 8),)))
    add_rank(w, _rec(2, counts=((9, 10),)))  # the overflowing step leaves the ring
    assert w.view("both", [[0, 1]], 2, now_s=1e9).counts_sum_LE.tolist() == [[16, 18]]


def test_ordinary_windows_keep_int32_counts():
    w = StepWindow(600, 58, 256)
    assert w.counts_CLE.dtype == np.int32 and w.counts_CLE.nbytes == 600 * 58 * 256 * 4


def test_ranks_above_the_world_cap_never_reach_the_maps():
    w = StepWindow(4, 1, 2)
    with pytest.raises(ValueError, match="rank|world size"):
        add_rank(w, _rec(0, rank=70_000, world=70_001))
    assert w.dropped_by_rank == {} and w.size == 0


def test_retired_instances_are_bounded():
    watched = WatchedRun(ListSource([]), window_steps=4)
    watched.tick()
    batches = [Batch(steps=[_rec(i, instance="current", t=1000.0 + i)]) for i in range(2)]
    batches += [Batch(steps=[_rec(100 + i, instance=f"old-{j}", t=1.0) for j in range(i * 1000, i * 1000 + 1000)])
                for i in range(6)]
    watched.source = ListSource(batches)
    for _ in batches:
        watched.tick()
    assert watched.skipped_old_records == 6000
    assert len(watched.assembler.retired) <= 4096


def test_gpu_devices_are_bounded():
    history = GpuHistory(max_samples=2)
    for host in range(3000):
        history.add(core.GpuSample(rank=0, host=f"h{host}", time_s=1.0, status="ok", gpus=[{"index": 0}]))
        history.add(core.GpuSample(rank=1, host=f"h{host}", time_s=1.0, status="unavailable", reason="x"))
    assert len(history.series) <= 1024 and len(history.unavailable) <= 1024
    assert ("h2999", 0) in history.series  # the newest stay
