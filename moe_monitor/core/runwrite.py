"""Writing a run's records into Redis, the one way every writer does it (the collectors' RedisSink, the SGLang
bridge through it, `moe-monitor replay`): the streams' caps and the XADDs of one batch queued on a pipeline the
writer sends. The writer keeps what is its own: when the metadata goes, health, moe:runs, what to resend.

A stream whose last entry has the largest id there is (18446744073709551615-18446744073709551615, written by
hand or by a tool that sets ids) takes no entry ever again: Redis refuses every XADD to it ("The stream has
exhausted the last possible ID"). exhausted_stream() tells that refusal from the others, and exhausted_message()
says it once in words a user can act on; the writer goes on retrying (it lands once the stream is deleted)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from . import keys
from .gpu import GpuSample, encode_gpu_sample
from .physical import PhysicalRecord, encode_physical
from .timings import TimingRecord, encode_timing

GPU_MAXLEN = 10_000  # NVML samples kept per run (MAXLEN ~)
LAYOUTS_MAXLEN = 1000  # layout changes kept per run (EPLB rebalances every few minutes: days of history)
PHYSICAL_BUDGET_BYTES = 64 << 20  # what a run's physical-count stream may take when the writer names no budget
PHYSICAL_MAXLEN_MIN = 100  # physical records kept at least (MAXLEN ~): a few steps of every rank
STEPS_MAXLEN = 100_000  # step records kept per run when the writer has no memory budget (MAXLEN ~)
RUNS_INDEX_EVERY_S = 1.0  # how often a writer refreshes its run's time in moe:runs
LAST_POSSIBLE_ID = "18446744073709551615-18446744073709551615"  # a stream's largest id: no entry can follow it
_EXHAUSTED = "exhausted the last possible id"  # Redis's words for an XADD to a stream that holds LAST_POSSIBLE_ID


def exhausted_stream(reply: object) -> bool:
    """Whether a reply (an exception in a pipeline's replies, or one raised) is Redis refusing an XADD because
    the stream holds LAST_POSSIBLE_ID."""
    return isinstance(reply, redis.ResponseError) and _EXHAUSTED in str(reply).lower()


def exhausted_message(key: str) -> str:
    """One line saying that stream key takes no more entries, and what to do."""
    return (f"stream {key} holds the last possible id ({LAST_POSSIBLE_ID}): Redis refuses every new entry in it; "
            f"delete it (DEL {key}: its entries go) or write under a new run name")


def fields_of(encoded: Mapping[str, bytes | str | int]) -> dict[FieldT, EncodableT]:
    """An encoder's field mapping as redis-py's XADD fields."""
    return dict(encoded.items())


def queue_batch(pipe: Any, run: str, *, layouts: Iterable[dict[FieldT, EncodableT]] = (),
                steps: Iterable[Mapping[str, bytes | str | int]] = (), samples: Sequence[GpuSample] = (),
                timings: Sequence[TimingRecord] = (), steps_maxlen: int = STEPS_MAXLEN,
                physical: Sequence[PhysicalRecord] = (), physical_budget_bytes: int = PHYSICAL_BUDGET_BYTES
                ) -> list[str]:
    """Queue one batch's XADDs on pipe, in this order: layout changes (before the steps they precede: a reader
    never sees a step before its layout), step records, NVML samples, layer timings (same MAXLEN as the steps),
    physical counts (MAXLEN ~ physical_maxlen: their [L, P] int32 within physical_budget_bytes).
    layouts and steps are encoded fields (the writer may have measured them); samples, timings and physical
    records.
    Returns the stream key of each XADD queued, in order (the writer tells its replies apart by them)."""
    queued: list[str] = []
    key = keys.layouts_key(run)
    for fields in layouts:
        queue_xadd(pipe, key, fields, LAYOUTS_MAXLEN)
        queued.append(key)
    key = keys.steps_key(run)
    for step_fields in steps:
        queue_xadd(pipe, key, step_fields, steps_maxlen)
        queued.append(key)
    key = keys.gpu_key(run)
    for sample in samples:
        queue_xadd(pipe, key, encode_gpu_sample(sample), GPU_MAXLEN)
        queued.append(key)
    key = keys.timings_key(run)
    for timing in timings:
        queue_xadd(pipe, key, encode_timing(timing), steps_maxlen)
        queued.append(key)
    key = keys.physical_key(run)
    for record in physical:
        maxlen = physical_maxlen(physical_budget_bytes, record.num_layers, record.num_slots)
        queue_xadd(pipe, key, encode_physical(record), maxlen)
        queued.append(key)
    return queued


def queue_xadd(pipe: Any, key: str, fields: Mapping[Any, Any], maxlen: int) -> None:
    """Queue XADD key MAXLEN ~ maxlen * field value ... on pipe (redis-py's pipeline or core.client.ClusterBatch).
    redis-py's xadd() checks its arguments and rebuilds them on every call; the fields here come from our own
    encoders and maxlen from our caps (a positive int)."""
    pipe.execute_command("XADD", key, "MAXLEN", "~", maxlen, "*", *chain.from_iterable(fields.items()))


def physical_maxlen(budget_bytes: int, num_layers: int, num_slots: int) -> int:
    """MAXLEN of a run's physical-count stream: entries of int32 [L, P] (plus ~200 B each) within budget_bytes,
    at least PHYSICAL_MAXLEN_MIN. DeepSeek-V3 (58 x 288 slots, 67 kB an entry) in 64 MiB: about 1,000 entries,
    a few seconds of 32 ranks at 20 steps/s; the dashboard reads the newest."""
    return max(PHYSICAL_MAXLEN_MIN, int(budget_bytes // (num_layers * num_slots * 4 + 200)))
