"""core.client.PackedPipeline (AutoClient.batch() on a single Redis) against the tests' real redis-server: the
replies are redis-py's pipeline's, in order, a refused command in its place; a connection left with an unread
reply is never used again."""
from __future__ import annotations

import numpy as np
import pytest
import redis

from moe_monitor import core
from moe_monitor.core import client as client_module
from moe_monitor.core.client import PackedPipeline
from moe_monitor.core.runwrite import queue_batch, queue_xadd


def _queue_mix(pipe) -> None:
    """Commands of every reply kind: status, bulk, integer, nil, array with a callback, and a refusal."""
    pipe.set("moe-test:s", b"v\x00\xff")
    pipe.get("moe-test:s")
    pipe.hset("moe-test:h", "f", 7)
    pipe.exists("moe-test:h", "moe-test:none")
    pipe.get("moe-test:none")
    pipe.hset("moe-test:s", "f", 1)  # WRONGTYPE: refused in its place
    queue_xadd(pipe, "moe-test:x", {"a": 1, "b": b"\x01\x02", "c": "text"}, 100)
    pipe.xrange("moe-test:x")
    pipe.zadd("moe-test:z", {"run": 1.5})


def _comparable(replies: list) -> list:
    """Replies with the stream ids (which differ between runs) blanked and exceptions as their type and words."""
    out = []
    for reply in replies:
        if isinstance(reply, Exception):
            out.append((type(reply).__name__, str(reply)))
        elif isinstance(reply, bytes) and b"-" in reply and reply.split(b"-")[0].isdigit():
            out.append("<id>")
        elif isinstance(reply, list) and reply and isinstance(reply[0], tuple):
            out.append([("<id>", fields) for _, fields in reply])
        else:
            out.append(reply)
    return out


def test_replies_are_those_of_redis_pys_pipeline(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    plain = redis.Redis.from_url(redis_url)
    try:
        batch = client.batch()
        assert isinstance(batch, PackedPipeline)
        _queue_mix(batch)
        assert len(batch) == 9
        packed = batch.execute(raise_on_error=False)
        assert len(batch) == 0
        plain.flushdb()
        pipe = plain.pipeline(transaction=False)
        _queue_mix(pipe)
        expected = pipe.execute(raise_on_error=False)
        assert _comparable(packed) == _comparable(expected)
        assert packed[0] is True and packed[1] == b"v\x00\xff" and packed[4] is None
        assert isinstance(packed[5], redis.ResponseError) and "WRONGTYPE" in str(packed[5])
        assert packed[7][0][1] == {b"a": b"1", b"b": b"\x01\x02", b"c": b"text"}
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            client.batch().set("moe-test:t", 1).hset("moe-test:s", "f", 1).execute()
        assert client.get("moe-test:t") == b"1"  # the commands around a refusal still ran
        assert client.batch().execute() == []
    finally:
        client.close()
        plain.close()


def _records() -> list[core.StepRecord]:
    """Step records that take every branch of the encoding: sampled or not, scope dp-group, raw and zstd counts of
    every count type, large numbers, a time with many digits."""
    rng = np.random.default_rng(7)
    small = rng.integers(0, 9, size=(2, 8)).astype(np.int32)
    decode = rng.integers(0, 40, size=(58, 256)).astype(np.int32)   # zstd where it pays
    wide = rng.integers(0, 70_000, size=(3, 16)).astype(np.int32)   # i4, raw
    sample = rng.integers(-1, 8, size=(2, 16, 2)).astype(np.int16)
    return [
        core.StepRecord(run="tiny", rank=0, world_size=1, step=0, time_s=1.7e9, phase="decode", tokens=8,
                        counts_LE=small),
        core.StepRecord(run="tiny", rank=0, world_size=1, step=1, time_s=1733333333.1234567, phase="prefill",
                        tokens=256, counts_LE=small, sample_ids_LNK=sample, dropped_steps=12, instance="1a-2b-3c"),
        core.StepRecord(run="ds-v3.1", rank=31, world_size=32, step=core.MAX_STEP - 1, time_s=-0.5, phase="mixed",
                        tokens=core.MAX_TOKENS - 1, counts_LE=decode, scope="dp-group", instance="x" * 40),
        core.StepRecord(run="wide", rank=1, world_size=2, step=10**9, time_s=0.0, phase="unknown", tokens=0,
                        counts_LE=wide, sample_ids_LNK=rng.integers(-1, 16, size=(3, 4, 2)).astype(np.int16),
                        scope="dp-group"),
    ]


@pytest.mark.parametrize("hiredis_packer", [True, False])
def test_a_step_batch_lands_as_the_readers_decode_it(redis_url, monkeypatch, hiredis_packer):
    """What RedisSink sends through batch(): a batch's XADDs of encoded steps (core.runwrite.queue_batch), then a
    plain command, packed by hiredis or by redis-py's packer; read back with core.decode_step."""
    if not hiredis_packer:
        monkeypatch.setattr(client_module, "_hiredis_pack", None)
    client = core.connect(redis_url, timeout_s=2.0)
    try:
        many = [core.StepRecord(run="packed", rank=1, world_size=2, step=step, time_s=1.0 + step, phase="decode",
                                tokens=8, counts_LE=np.arange(16, dtype=np.int32).reshape(2, 8) * step, instance="i")
                for step in range(50)]
        by_run: dict[str, list[core.StepRecord]] = {"packed": many}
        for rec in _records():
            by_run.setdefault(rec.run, []).append(rec)
        for run, recs in by_run.items():
            client.delete(core.steps_key(run))
            batch = client.batch()
            assert isinstance(batch, PackedPipeline)
            queued = queue_batch(batch, run, steps=core.encode_steps(recs), steps_maxlen=1000)
            batch.set("moe-test:after-the-steps", "1")
            replies = batch.execute()
            assert queued == [core.steps_key(run)] * len(recs)
            assert len(set(replies[:-1])) == len(recs) and replies[-1] is True
            entries = client.xrange(core.steps_key(run))
            assert [_comparable_record(core.decode_step(fields)) for _, fields in entries] == \
                [_comparable_record(rec) for rec in recs]
    finally:
        client.close()


def _comparable_record(rec: core.StepRecord) -> dict:
    """rec's fields with its arrays as (dtype-free) nested lists."""
    out = dict(rec.__dict__)
    out["counts_LE"] = rec.counts_LE.tolist()
    out["sample_ids_LNK"] = None if rec.sample_ids_LNK is None else rec.sample_ids_LNK.tolist()
    return out


def test_a_connection_with_an_unread_reply_is_never_used_again(redis_url):
    """A read that times out leaves the blocked command's reply on its way: that connection is not used again
    (redis-py's connection closes itself on a timeout; PackedPipeline closes it on any failure mid-batch), so the
    next batch reads its own replies, not that one."""
    client = core.connect(redis_url, timeout_s=0.3)
    try:
        with pytest.raises(redis.TimeoutError):
            client.batch().set("moe-test:k", "before").blpop(["moe-test:list"], timeout=1).execute()
        assert client.batch().set("moe-test:k", "after").get("moe-test:k").execute() == [True, b"after"]
        assert client.batch().rpush("moe-test:list", "x").lpop("moe-test:list").execute() == [1, b"x"]
    finally:
        client.close()
