"""The outage queue is sized in seconds of steps within a byte bound: a fast decode loop keeps
as many seconds of history while Redis is down as a slow one, and never more than queue_bytes of records."""
from __future__ import annotations

import numpy as np

from moe_monitor import core
from tests.collectors.test_faults import (
    _monitor,
    _records,
    _steps,
    _steps_within_slots,
    server,  # noqa: F401 (a fixture)
)
from tests.support.waiting import wait_until


def _record(step: int, time_s: float, num_layers: int = 2, num_experts: int = 8) -> core.StepRecord:
    return core.StepRecord(run="q", rank=0, world_size=1, step=step, time_s=time_s, phase="decode", tokens=1,
                           counts_LE=np.zeros((num_layers, num_experts), np.int32))


def test_a_fast_loop_keeps_its_outage_by_default(server):  # noqa: F811
    """Redis SIGKILLed, then 3,000 steps at 1,000 steps/s (3 s): with the default options
    every one is kept and arrives once Redis is back, in order (a queue of 1,024 steps dropped 1,976)."""
    during = 3000
    mon = _monitor(server.url, "fast-outage")
    _steps(mon, 5, 400)
    assert wait_until(lambda: mon.stats()["published_steps"] == 5)
    server.kill()
    _steps_within_slots(mon, during, 1000)
    assert wait_until(lambda: mon.stats()["queued_steps"] + mon.stats()["dropped_steps"] == during
                      and "ConnectionError" in mon.stats()["last_error"])
    stats = mon.stats()
    assert (stats["queued_steps"], stats["dropped_steps"]) == (during, 0), stats
    server.start()
    assert wait_until(lambda: mon.stats()["published_steps"] == 5 + during, timeout_s=30.0)
    mon.close()
    assert [r.step for r in _records(server.client(), "fast-outage")] == list(range(5, 5 + during))  # restarted empty


def test_the_queue_keeps_seconds_at_any_rate_within_its_bytes():
    """Records at 190 steps/s for 100 s keep the last 60 s (11,400 steps); at 1 step/s, the newest 1,024 (more
    than 60 s); a byte bound keeps what fits; a fixed count keeps that count."""
    from moe_monitor.collectors.publisher import QUEUE_MIN_STEPS, RecordQueue, record_bytes

    def fill(queue, rate_hz: float, seconds: float):
        count = int(rate_hz * seconds)
        for first in range(0, count, 500):
            queue.extend(_record(i, i / rate_hz) for i in range(first, min(count, first + 500)))
        return queue

    fast = fill(RecordQueue(None, None, keep_s=60.0), 190, 100)
    span_s = fast.waiting[-1].time_s - fast.waiting[0].time_s
    assert span_s <= 60.0 < span_s + 1.5 / 190 and fast.dropped == 19000 - len(fast)   # 60 s: 11,400 steps
    slow = fill(RecordQueue(None, None, keep_s=60.0), 1, 2000)
    assert len(slow) == QUEUE_MIN_STEPS and slow.dropped == 2000 - QUEUE_MIN_STEPS
    each = record_bytes(_record(0, 0.0))
    small = fill(RecordQueue(None, 500 * each, keep_s=60.0), 190, 100)
    assert len(small) == 500 and small.held_bytes == 500 * each
    counted = fill(RecordQueue(700), 190, 100)
    assert len(counted) == 700 and counted.dropped == 19000 - 700
    sent = small.take(100)                      # a failed write gives its batch back at the head: bounded again
    small.extend([_record(19000, 100.0)])
    small.settle(sent, landed=set())
    assert len(small) == 500 and small.held_bytes == 500 * each and small.waiting[-1].step == 19000
