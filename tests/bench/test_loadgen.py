"""bench.harness.loadgen: simulated ranks write real-shaped step records through collectors.sinks.RedisSink into a real
redis-server, paced per rank; every scheduled record lands, decodes with its shape, and carries its step id."""
from __future__ import annotations

import numpy as np

from bench import routing
from bench.harness import loadgen
from moe_monitor import core


def test_each_token_picks_k_distinct_experts_from_a_skewed_popularity():
    base_LE = routing.popularity_LE()
    assert base_LE.shape == (58, 256) and np.allclose(base_LE.sum(axis=1), 1.0)
    assert (base_LE.max(axis=1) * 256).mean() > 3  # the real DeepSeek-V3 counts: hot experts several x the mean
    mix_LE = routing.rank_mix_LE(base_LE, rank=5)
    assert not np.allclose(mix_LE, base_LE) and np.allclose(mix_LE, routing.rank_mix_LE(base_LE, rank=5))
    ids_LNK = routing.draw_topk_ids(mix_LE, tokens=64, top_k=8, rng=np.random.default_rng(0))
    assert ids_LNK.shape == (58, 64, 8) and (np.diff(ids_LNK, axis=2) > 0).all()  # 8 distinct per token
    counts_LE = routing.counts_from_ids(ids_LNK, 256)
    assert counts_LE.dtype == np.int32 and (counts_LE.sum(axis=1) == 64 * 8).all()


def _stream(url: str, run: str) -> list[core.StepRecord]:
    client = core.connect(url, timeout_s=5.0)
    entries = client.xrange(core.steps_key(run))
    client.close()
    return [core.decode_step(fields) for _, fields in entries]


def test_sixteen_ranks_in_three_processes_land_every_step(redis_url):
    ranks, rate, seconds, tokens = 16, 10.0, 4.0, 64
    report = loadgen.run_load(redis_url, "lg", ranks, rate, seconds, processes=3, tokens_per_rank=tokens)
    steps = int(rate * seconds)
    assert report.ok, report.summary()
    assert (report.written, report.failed, len(report.processes)) == (ranks * steps, 0, 3)
    assert sorted(r for p in report.processes for r in p.ranks) == list(range(ranks))
    assert 0 < report.write_s[0] < 0.5 and report.lateness_s[2] < 2.0 and report.cpu_s > 0

    records = _stream(redis_url, "lg")
    assert len(records) == ranks * steps  # within MAXLEN: nothing trimmed
    by_rank: dict[int, list[core.StepRecord]] = {}
    for rec in records:
        by_rank.setdefault(rec.rank, []).append(rec)
    assert sorted(by_rank) == list(range(ranks))
    t0 = records[0].time_s - records[0].step / rate
    for recs in by_rank.values():
        assert [r.step for r in recs] == list(range(steps))  # in order, none lost, none twice
        assert len({r.instance for r in recs}) == 1
        for rec in recs:
            assert rec.counts_LE.shape == (58, 256) and (rec.counts_LE.sum(axis=1) == tokens * 8).all()
            assert (rec.world_size, rec.tokens, rec.phase) == (ranks, tokens, "decode")
            assert abs(rec.time_s - (t0 + rec.step / rate)) < 1e-3  # the scheduled time, same on every rank
    assert len({rec.instance for rec in records}) == ranks
    # the same step differs between ranks (each its own mix), and a rank's pool cycles
    assert not np.array_equal(by_rank[0][0].counts_LE, by_rank[1][0].counts_LE)
    client = core.connect(redis_url, timeout_s=5.0)
    meta = core.decode_meta(client.get(core.meta_key("lg")))
    health = client.hgetall(core.health_key("lg"))
    client.close()
    assert (meta.world_size, meta.num_experts, meta.top_k, len(meta.layer_names)) == (ranks, 256, 8, 58)
    assert len(health) == ranks

