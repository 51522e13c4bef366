"""The aggregator through a real Redis Cluster (demo/localcluster.py: 3 masters on loopback): two runs on
different shards, each aggregated exactly, a holder killed and its standby taking over; the lease scripts, the
WATCH + MULTI/EXEC commits and XAUTOCLAIM all run on one run's hash slot."""
from __future__ import annotations

import numpy as np
import pytest
from redis.cluster import key_slot

from moe_monitor import core
from moe_monitor.aggregator import Aggregator
from moe_monitor.demo.localcluster import LocalCluster
from tests.support.aggregates import aggregates, drive, options, publish, rank_record

pytestmark = pytest.mark.cluster
L, E, WORLD = 3, 8, 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = LocalCluster(tmp_path_factory.mktemp("aggcluster"), masters=3, replicas=0)
    yield nodes
    nodes.stop()


def records(run: str, steps: range, skip_rank: int | None = None) -> list[core.StepRecord]:
    return [rank_record(run, s, r, np.full((L, E), s + r), WORLD, tokens=4)
            for s in steps for r in range(WORLD) if r != skip_rank]


def test_runs_on_two_shards_are_aggregated_exactly_and_a_standby_takes_over(cluster):
    client = core.connect(cluster.url, timeout_s=2.0)
    runs = ["agg-a"]
    runs.append(next(f"agg-{i}" for i in range(100)
                     if key_slot(core.steps_key(f"agg-{i}").encode()) // 5462
                     != key_slot(core.steps_key("agg-a").encode()) // 5462))
    slow = options(deadline_s=5.0, log_every_s=60.0)
    holders = {run: Aggregator(cluster.url, run, slow, log=lambda _: None) for run in runs}
    standby = Aggregator(cluster.url, runs[0], slow, log=lambda _: None)
    for run in runs:
        publish(client, records(run, range(10)) + records(run, range(10, 14), skip_rank=3))
    assert drive([*holders.values(), standby], lambda: all(h.counters.steps_written == 10 for h in holders.values()),
                 timeout_s=15.0)
    assert client.cluster is True and not standby.holder
    holders[runs[0]].abandon()  # killed with steps 10-13 pending: the standby claims them
    publish(client, [rec for rec in records(runs[0], range(10, 14)) if rec.rank == 3])
    assert drive([standby, holders[runs[1]]], lambda: standby.counters.steps_written == 14, timeout_s=15.0)
    for run, want in ((runs[0], 14), (runs[1], 10)):  # the second run's steps 10-13 wait for rank 3
        steps: dict[int, list[core.AggregateRecord]] = {}
        for rec in aggregates(client, run):
            steps.setdefault(rec.step, []).append(rec)
        assert sorted(steps) == list(range(want))
        for step, entries in steps.items():
            assert [e.late for e in entries] == [False]
            assert entries[0].ranks_R.tolist() == list(range(WORLD))
            assert (entries[0].counts_LE == sum(step + r for r in range(WORLD))).all()
    assert client.get(core.aggregator_key(runs[0])) == standby.consumer.encode()
    standby.close()
    holders[runs[1]].close()
    client.close()
