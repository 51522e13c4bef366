"""Physical-slot counts from ExpertLoadMonitor.record_physical() into a real redis-server: read back from
moe:{R}:physical as the engine gave them, bad input refused with one ValueError (nothing else lost), a full
queue drops and counts, a run that reports none never writes the stream."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import redis
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor

# 2 layers, 4 experts, 2 GPUs; from step 1 six slots with replicas (three per GPU)
NEW_LP = np.array([[2, 3, 0, 1, 0, 1], [1, 0, 3, 2, 2, 3]])


def _entries(url: str, run: str) -> list[core.PhysicalRecord]:
    client = redis.Redis.from_url(url)
    try:
        return [core.decode_physical(fields) for _, fields in client.xrange(core.physical_key(run))]
    finally:
        client.close()


def _step(mon: ExpertLoadMonitor, ids: list[int]) -> None:
    for layer in range(2):
        mon.record(layer, torch.tensor(ids).reshape(-1, 1))
    mon.end_step("decode")


def test_physical_counts_reach_redis_beside_their_steps(redis_url):
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run="phys", gpus=2, nvml=False)
    _step(mon, [0, 1, 1, 3])
    mon.record_physical(np.array([[1, 2, 0, 1], [1, 2, 0, 1]]))           # step 0, contiguous layout: P = 4
    mon.publish_layout(NEW_LP)
    _step(mon, [0, 0, 2])
    mon.record_physical(torch.tensor([[0, 0, 1, 0, 1, 0], [0, 1, 0, 1, 1, 0]]), source="sglang")  # step 1
    mon.record_physical([[0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], step=1)  # a second report of step 1
    with pytest.raises(ValueError, match="negative"):
        mon.record_physical(np.array([[0, 0, -1, 0, 0, 0], [0, 0, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"the layout in force is \[2, 6\]"):
        mon.record_physical(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="2-D integer"):
        mon.record_physical(np.zeros((2, 6)))
    with pytest.raises(ValueError, match="source must be"):
        mon.record_physical(np.zeros((2, 6), dtype=np.int64), source="eplb")
    with pytest.raises(ValueError, match="step must be"):
        mon.record_physical(np.zeros((2, 6), dtype=np.int64), step=-1)
    mon.close()
    stats = mon.stats()["sinks"]["redis"]
    assert (stats["published_physical"], stats["dropped_physical"], stats["published_steps"]) == (3, 0, 2)
    got = _entries(redis_url, "phys")
    assert [(r.step, r.rank, r.gpus, r.source, r.instance) for r in got] == [
        (0, 0, 2, "engine", mon.instance), (1, 0, 2, "sglang", mon.instance), (1, 0, 2, "engine", mon.instance)]
    np.testing.assert_array_equal(got[0].counts_LP, [[1, 2, 0, 1], [1, 2, 0, 1]])
    np.testing.assert_array_equal(core.measured_gpu_loads(got[1:]), [[1, 1], [2, 2]])
    with pytest.raises(RuntimeError, match="after close"):
        mon.record_physical(np.zeros((2, 6), dtype=np.int64))


def test_a_run_without_physical_counts_writes_no_stream(redis_url):
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run="nophys", gpus=2, nvml=False)
    _step(mon, [0, 1])
    mon.close()
    client = redis.Redis.from_url(redis_url)
    assert client.exists(core.steps_key("nophys")) == 1 and client.exists(core.physical_key("nophys")) == 0
    client.close()


def test_a_full_inbox_drops_and_counts(redis_url):
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run="physfull", gpus=2, nvml=False, queue_steps=4)
    _step(mon, [0])
    publisher = mon.publisher
    assert publisher is not None
    publisher._physical.bound = 0  # as if the publisher thread had stopped draining
    mon.record_physical(np.ones((2, 4), dtype=np.int64))
    mon.close()
    assert mon.stats()["sinks"]["redis"]["dropped_physical"] == 1 and _entries(redis_url, "physfull") == []


class _PartialSink:
    """Takes physical records; its first write of more than one lands only the first of them (PartialWrite),
    every other write all. No write ends before the test has submitted every record (`submitted`), so a
    write of more than one comes whatever the threads' timing."""

    name, keeps_health = "partial", False  # the publisher's own errors stay in last_error

    def __init__(self):
        self.steps: list[int] = []
        self.calls = 0
        self.refused = False
        self.submitted = threading.Event()

    def write(self, records, samples, health, layouts=(), physical=()):
        from moe_monitor.collectors.sinks import PartialWrite
        self.submitted.wait(10)
        self.calls += 1
        if not self.refused and len(physical) > 1:
            self.refused = True
            self.steps.append(physical[0].step)
            raise PartialWrite("1 of 2 commands: OOM", frozenset(), True, physical_landed=frozenset({0}))
        self.steps += [rec.step for rec in physical]

    def close(self):
        pass


def test_what_landed_of_a_partial_write_is_not_sent_again():
    import time

    from moe_monitor.collectors.physical import PhysicalJob
    from moe_monitor.collectors.publisher import Publisher

    sink = _PartialSink()
    pub = Publisher([sink], decode=lambda jobs: [], release=lambda slot: None, rank=0, flush_interval_s=0.02)
    for step in range(3):
        pub.submit_physical(PhysicalJob(run="pw", step=step, rank=0, time_s=1.0, gpus=2, instance="i",
                                        source="engine", counts=np.ones((2, 4), dtype=np.int32)))
    pub.submit_physical(PhysicalJob(run="pw", step=9, rank=0, time_s=1.0, gpus=2, instance="i", source="engine",
                                    counts=-np.ones((2, 4), dtype=np.int32)))  # refused on the publisher thread
    sink.submitted.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(sink.steps) < 3:
        threading.Event().wait(0.02)
    pub.close(2.0)
    assert sink.steps == [0, 1, 2] and sink.calls >= 2
    stats = pub.sink_stats()["partial"]
    assert (stats["published_physical"], stats["dropped_physical"]) == (3, 1)
    assert "physical counts refused: ValueError: physical counts must not be negative" in pub.last_error
    assert "partial sink refused 1 of 2 commands" in stats["last_failure"]
