"""Step records as ready-made XADD commands (core.steps.xadd_bodies, xadd_command): byte for byte what hiredis
and redis-py pack from encode_steps' fields, and through a real redis-server the same entries decode_step reads."""
from __future__ import annotations

from itertools import chain

import numpy as np
import pytest
import redis
from hiredis import pack_command

from moe_monitor import core
from moe_monitor.core import packed
from moe_monitor.core.packed import PackedPipeline
from moe_monitor.core.runwrite import queue_batch
from moe_monitor.core.steps import resp_bulk, xadd_bodies, xadd_command


def _records() -> list[core.StepRecord]:
    """Records that take every branch of the encoding: sampled or not, scope dp-group, raw and zstd counts of every
    count type, large numbers, a time with many digits."""
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


@pytest.mark.parametrize("maxlen", [1, 100_000, 10_000_000])
def test_each_command_is_the_bytes_a_client_packs_from_the_fields(maxlen):
    records = _records()
    key = core.steps_key(records[0].run)
    bodies = xadd_bodies(records)
    assert len(bodies) == len(records)
    packer = redis.Connection()  # redis-py's own packer (no connection is made)
    for rec, (pairs, body, size) in zip(records, bodies):
        fields = core.encode_step(rec)
        args = ("XADD", key, "MAXLEN", "~", maxlen, "*", *chain.from_iterable(fields.items()))
        command = xadd_command(resp_bulk(key), maxlen, pairs, body)
        assert pairs == len(fields)
        assert command == pack_command(args)
        assert command == b"".join(packer.pack_command(*args))
        assert size == len(fields["counts"]) + len(fields.get("sample", b""))


def test_a_malformed_record_is_refused_as_encode_steps_refuses_it():
    good = _records()[0]
    bad = [core.StepRecord(**{**good.__dict__, "phase": "warmup"}),
           core.StepRecord(**{**good.__dict__, "scope": "node"}),
           core.StepRecord(**{**good.__dict__, "run": "bad run"}),
           core.StepRecord(**{**good.__dict__, "sample_ids_LNK": np.zeros((3, 4, 2), np.int16)}),
           core.StepRecord(**{**good.__dict__, "counts_LE": np.zeros(8, np.int32)})]
    for rec in bad:
        with pytest.raises(ValueError) as expected:
            core.encode_steps([good, rec])
        with pytest.raises(ValueError) as got:
            xadd_bodies([good, rec])
        assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("hiredis_packer", [True, False])
def test_queued_commands_land_as_entries_that_decode_to_the_records(redis_url, monkeypatch, hiredis_packer):
    if not hiredis_packer:  # redis-py's own packer for the other commands of the batch
        monkeypatch.setattr(packed, "_hiredis_pack", None)
    client = redis.Redis.from_url(redis_url)
    records = _records()
    by_run: dict[str, list[core.StepRecord]] = {}
    for rec in records:
        by_run.setdefault(rec.run, []).append(rec)
    for run, recs in by_run.items():
        client.delete(core.steps_key(run))
        pipe = PackedPipeline(client)
        queued = queue_batch(pipe, run, step_bodies=xadd_bodies(recs), steps_maxlen=1000)
        pipe.set("after-the-steps", "1")  # a plain command after the ready-made ones
        replies = pipe.execute()
        assert queued == [core.steps_key(run)] * len(recs)
        assert all(isinstance(reply, bytes) and b"-" in reply for reply in replies[:len(recs)])
        assert replies[-1] is True
        entries = client.xrange(core.steps_key(run))
        assert len(entries) == len(recs)
        for (_, fields), rec in zip(entries, recs):
            assert _comparable(core.decode_step(fields)) == _comparable(rec)


def _comparable(rec: core.StepRecord) -> dict:
    """rec's fields with its arrays as (dtype-free) nested lists."""
    out = dict(rec.__dict__)
    out["counts_LE"] = rec.counts_LE.tolist()
    out["sample_ids_LNK"] = None if rec.sample_ids_LNK is None else rec.sample_ids_LNK.tolist()
    return out
