"""The aggregator through a real Redis Cluster (demo/localcluster.py: 3 masters on loopback): two runs on
different shards, each aggregated exactly, a holder killed and its standby taking over; the lease scripts, the
WATCH + MULTI/EXEC commits and XAUTOCLAIM all run on one run's hash slot."""
from __future__ import annotations

import time

import numpy as np
import pytest
from redis.cluster import key_slot

import wire
from collectors.aggregate import AggregateOptions, Aggregator
from demo.localcluster import LocalCluster

pytestmark = pytest.mark.slow
L, E, WORLD = 3, 8, 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = LocalCluster(tmp_path_factory.mktemp("aggcluster"), masters=3, replicas=0)
    yield nodes
    nodes.stop()


def records(run: str, steps: range, skip_rank: int | None = None) -> list[wire.StepRecord]:
    return [wire.StepRecord(run=run, rank=r, world_size=WORLD, step=s, time_s=time.time(), phase="decode", tokens=4,
                            counts_LE=np.full((L, E), s + r, dtype=np.int32), instance="c")
            for s in steps for r in range(WORLD) if r != skip_rank]


def drive(aggregators, until, timeout_s: float = 15.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for agg in aggregators:
            agg.step()
        if until():
            return True
        time.sleep(0.005)
    return bool(until())


def test_runs_on_two_shards_are_aggregated_exactly_and_a_standby_takes_over(cluster):
    client = wire.connect(cluster.url, timeout_s=2.0)
    runs = ["agg-a"]
    runs.append(next(f"agg-{i}" for i in range(100)
                     if key_slot(wire.steps_key(f"agg-{i}").encode()) // 5462
                     != key_slot(wire.steps_key("agg-a").encode()) // 5462))
    options = AggregateOptions(deadline_s=5.0, lease_s=0.6, block_ms=20, log_every_s=60.0, rollup_grace_s=0.3)
    holders = {run: Aggregator(cluster.url, run, options, log=lambda _: None) for run in runs}
    standby = Aggregator(cluster.url, runs[0], options, log=lambda _: None)
    for run in runs:
        for rec in records(run, range(10)) + records(run, range(10, 14), skip_rank=3):
            client.xadd(wire.steps_key(run), wire.encode_step(rec))
    assert drive([*holders.values(), standby], lambda: all(h.counters.steps_written == 10 for h in holders.values()))
    assert client.cluster is True and not standby.holder
    holders[runs[0]].abandon()  # killed with steps 10-13 pending: the standby claims them
    for rec in records(runs[0], range(10, 14)):
        if rec.rank == 3:
            client.xadd(wire.steps_key(runs[0]), wire.encode_step(rec))
    assert drive([standby, holders[runs[1]]], lambda: standby.counters.steps_written == 14)
    for run, want in ((runs[0], 14), (runs[1], 10)):  # the second run's steps 10-13 wait for rank 3
        steps: dict[int, list[wire.AggregateRecord]] = {}
        for _, fields in client.xrange(wire.aggregate_key(run)):
            rec = wire.decode_aggregate(fields)
            steps.setdefault(rec.step, []).append(rec)
        assert sorted(steps) == list(range(want))
        for step, entries in steps.items():
            assert [e.late for e in entries] == [False]
            assert entries[0].ranks_R.tolist() == list(range(WORLD))
            assert (entries[0].counts_LE == sum(step + r for r in range(WORLD))).all()
    assert client.get(wire.aggregator_key(runs[0])) == standby.consumer.encode()
    standby.close()
    holders[runs[1]].close()
    client.close()
