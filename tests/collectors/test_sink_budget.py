"""The steps stream's memory budget follows the records' real size: compact records (a tenth of int32) keep
about ten times as many steps in the same memory, never fewer than the int32 sizing gave."""
from __future__ import annotations

import numpy as np

from moe_monitor import core
from moe_monitor.collectors.sinks import RedisSink
from moe_monitor.core.health import HealthReport

L, E = 58, 256


def _records(n: int) -> list[core.StepRecord]:
    rng = np.random.default_rng(0)
    popularity = rng.dirichlet(np.full(E, 0.3), size=L)
    counts = np.stack([np.bincount(rng.choice(E, 64 * 8, p=p), minlength=E) for p in popularity]).astype(np.int32)
    return [core.StepRecord(run="budget", rank=0, world_size=1, step=i, time_s=1.7e9 + i, phase="decode",
                            tokens=64, counts_LE=counts) for i in range(n)]


def _meta(run: str) -> core.RunMeta:
    return core.RunMeta(run=run, model_name="m", layer_names=[f"l{i}" for i in range(L)], num_experts=E, top_k=8,
                        hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=2,
                        layout=core.Layout(32, 1, core.contiguous_layout(L, E)))


def test_compact_records_stretch_the_stream_within_the_same_budget(redis_url):
    budget = 100 * (L * E * 4 + 200)  # 100 int32 entries
    int32_maxlen = core.maxlen_for_budget(budget, L, E)
    assert int32_maxlen == 100
    client = core.connect(redis_url, timeout_s=2.0)
    records = _records(600)
    fixed = RedisSink(redis_url, _meta("budget"), int32_maxlen, 2.0)  # no budget: the int32 sizing holds
    adaptive = RedisSink(redis_url, _meta("budget2"), int32_maxlen, 2.0, memory_budget_bytes=budget)
    for first in range(0, 600, 50):
        fixed.write(records[first:first + 50], [], HealthReport(rank=0))
        adaptive.write([core.StepRecord(**{**r.__dict__, "run": "budget2"}) for r in records[first:first + 50]],
                       [], HealthReport(rank=0))
    kept_fixed, kept_adaptive = client.xlen(core.steps_key("budget")), client.xlen(core.steps_key("budget2"))
    assert kept_fixed < 200 and kept_adaptive == 600  # ~6 kB entries: the budget holds ~1,000 of them
    used = client.memory_usage(core.steps_key("budget2"))
    assert used < 1.2 * budget
    fixed.close()
    adaptive.close()
