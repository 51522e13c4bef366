"""The aggregator's tests against a real Redis (tests/aggregator/): ranks' step records and their
publishing to a run's steps stream, AggregateOptions with test timings, rounds of aggregators until a condition
holds, the aggregate stream read back decoded."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

from moe_monitor import core
from moe_monitor.aggregator import AggregateOptions, Aggregator


def rank_record(run: str, step: int, rank: int, counts_LE, world_size: int, time_s: float | None = None,
                tokens: int = 16, instance: str = "c", phase: str = "decode") -> core.StepRecord:
    """One rank's record of a step: counts_LE (layers x experts, made int32), time_s (unix s; now when None)."""
    return core.StepRecord(run=run, rank=rank, world_size=world_size, step=step,
                           time_s=time.time() if time_s is None else time_s, phase=phase, tokens=tokens,
                           counts_LE=np.asarray(counts_LE, dtype=np.int32), instance=instance)


def publish(client, records: Iterable[core.StepRecord]) -> None:
    """XADD each record to its run's steps stream, in order, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for rec in records:
        pipe.xadd(core.steps_key(rec.run), core.encode_step(rec))
    pipe.execute()


def options(**change) -> AggregateOptions:
    """AggregateOptions with short test timings (deadline 0.3 s, lease 0.6 s, ...), `change` applied."""
    base = dict(deadline_s=0.3, lease_s=0.6, block_ms=20, log_every_s=0.3, rollup_grace_s=0.3)
    base.update(change)
    return AggregateOptions(**base)


def drive(aggregators: Iterable[Aggregator], until: Callable[[], object], timeout_s: float = 10.0) -> bool:
    """Round after round of every aggregator (Aggregator.step) until until() holds; its value one last time
    after timeout_s."""
    aggregators = list(aggregators)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for agg in aggregators:
            agg.step()
        if until():
            return True
        time.sleep(0.005)
    return bool(until())


def aggregates(client, run: str) -> list[core.AggregateRecord]:
    """The run's aggregate stream, decoded, oldest first."""
    return [core.decode_aggregate(fields) for _, fields in client.xrange(core.aggregate_key(run))]
