"""Writing a run's records into Redis, the one way every writer does it (the collectors' RedisSink, the SGLang
bridge through it, `moe-monitor replay`): the streams' caps and the XADDs of one batch queued on a pipeline the
writer sends. The writer keeps what is its own: when the metadata goes, health, moe:runs, what to resend.

A stream whose last entry has the largest id there is (18446744073709551615-18446744073709551615, written by
hand or by a tool that sets ids) takes no entry ever again: Redis refuses every XADD to it ("The stream has
exhausted the last possible ID"). exhausted_stream() tells that refusal from the others, and exhausted_message()
says it once in words a user can act on; the writer goes on retrying (it lands once the stream is deleted)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from . import keys
from .gpu import GpuSample, encode_gpu_sample
from .timings import TimingRecord, encode_timing

GPU_MAXLEN = 10_000  # NVML samples kept per run (MAXLEN ~)
LAYOUTS_MAXLEN = 1000  # layout changes kept per run (EPLB rebalances every few minutes: days of history)
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
                steps: Iterable[dict[FieldT, EncodableT]] = (), samples: Sequence[GpuSample] = (),
                timings: Sequence[TimingRecord] = (), steps_maxlen: int = STEPS_MAXLEN) -> list[str]:
    """Queue one batch's XADDs on pipe, in this order: layout changes (before the steps they precede: a reader
    never sees a step before its layout), step records, NVML samples, layer timings (same MAXLEN as the steps).
    layouts and steps are encoded fields (the writer may have measured them); samples and timings records.
    Returns the stream key of each XADD queued, in order (the writer tells its replies apart by them)."""
    queued: list[str] = []
    for fields in layouts:
        pipe.xadd(keys.layouts_key(run), fields, maxlen=LAYOUTS_MAXLEN, approximate=True)
        queued.append(keys.layouts_key(run))
    for fields in steps:
        pipe.xadd(keys.steps_key(run), fields, maxlen=steps_maxlen, approximate=True)
        queued.append(keys.steps_key(run))
    for sample in samples:
        pipe.xadd(keys.gpu_key(run), fields_of(encode_gpu_sample(sample)), maxlen=GPU_MAXLEN, approximate=True)
        queued.append(keys.gpu_key(run))
    for timing in timings:
        pipe.xadd(keys.timings_key(run), fields_of(encode_timing(timing)), maxlen=steps_maxlen, approximate=True)
        queued.append(keys.timings_key(run))
    return queued
