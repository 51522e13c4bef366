"""core.packed.PackedPipeline (AutoClient.batch() on a single Redis) against the tests' real redis-server: the
replies are redis-py's pipeline's, in order, a refused command in its place; a connection left with an unread
reply is never used again."""
from __future__ import annotations

import numpy as np
import pytest
import redis

from moe_monitor import core
from moe_monitor.core.packed import PackedPipeline
from moe_monitor.core.runwrite import queue_xadd


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


def test_a_step_batch_lands_as_the_readers_decode_it(redis_url):
    """What RedisSink sends through batch(): XADDs of encoded steps, read back with core.decode_step."""
    client = core.connect(redis_url, timeout_s=2.0)
    try:
        batch = client.batch()
        for step in range(50):
            counts = np.arange(16, dtype=np.int32).reshape(2, 8) * step
            record = core.StepRecord(run="packed", rank=1, world_size=2, step=step, time_s=1.0 + step,
                                     phase="decode", tokens=8, counts_LE=counts, instance="inst")
            queue_xadd(batch, core.steps_key("packed"), core.encode_step(record), 1000)
        replies = batch.execute()
        assert len(replies) == 50 and len(set(replies)) == 50
        steps = [core.decode_step(fields) for _, fields in client.xrange(core.steps_key("packed"))]
        assert [s.step for s in steps] == list(range(50))
        assert all((s.counts_LE == np.arange(16).reshape(2, 8) * s.step).all() for s in steps)
    finally:
        client.close()


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
