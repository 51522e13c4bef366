"""Which routed rows a vLLM worker counts under data parallelism, and who publishes under sequence-parallel
MoE (collectors/vllm/rules.py): pure rules, the layouts vLLM 0.32's own capturer tells apart."""
from __future__ import annotations

from moe_monitor.collectors.vllm.rules import local_span, publishing_rule


def test_local_span_of_each_batch_layout():
    assert local_span(7, 0, None) == (0, 7, 0)                       # no data parallelism: every row
    assert local_span(12, 1, [5, 7]) == (5, 7, 0)                    # all ranks gathered: rank 1 after rank 0's 5
    assert local_span(12, 0, [5, 7]) == (0, 5, 0)
    assert local_span(7, 1, [5, 7]) == (0, 7, 0)                     # routed before the dispatch: own rows only
    assert local_span(4, 1, [5, 7], tp_rank=1, tp_size=2) == (0, 4, 4)   # SP shard 1 of ceil(7 / 2) = 4 rows
    assert local_span(3, 1, [5, 7], tp_rank=1, tp_size=2) is None    # fits no layout: not counted
    assert local_span(5, 3, [5, 7]) is None


def test_sequence_parallel_moe_publishes_every_shard_once():
    tp, dp = 2, 2
    rules = [publishing_rule(t, tp, d, dp, 1, True, sequence_parallel_moe=True) for d in range(dp) for t in range(tp)]
    assert all(r.publishes and r.scope == "rank" and r.world_size == tp * dp for r in rules)
    assert sorted(r.rank for r in rules) == list(range(tp * dp)) and {r.gpus for r in rules} == {tp * dp}
    plain = [publishing_rule(t, tp, d, dp, 1, True) for d in range(dp) for t in range(tp)]
    assert sorted(r.rank for r in plain if r.publishes) == [0, 1]    # TP attention: one publisher per DP group
