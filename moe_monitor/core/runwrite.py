"""Writing a run's records into Redis, the one way every writer does it (the collectors' RedisSink, the SGLang
bridge through it, `moe-monitor replay`): the streams' caps and the XADDs of one batch queued on a pipeline the
writer sends. The writer keeps what is its own: when the metadata goes, health, moe:runs, what to resend."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from redis.typing import EncodableT, FieldT

from . import keys
from .gpu import GpuSample, encode_gpu_sample
from .timings import TimingRecord, encode_timing

GPU_MAXLEN = 10_000  # NVML samples kept per run (MAXLEN ~)
LAYOUTS_MAXLEN = 1000  # layout changes kept per run (EPLB rebalances every few minutes: days of history)
STEPS_MAXLEN = 100_000  # step records kept per run when the writer has no memory budget (MAXLEN ~)
RUNS_INDEX_EVERY_S = 1.0  # how often a writer refreshes its run's time in moe:runs


def fields_of(encoded: Mapping[str, bytes | str | int]) -> dict[FieldT, EncodableT]:
    """An encoder's field mapping as redis-py's XADD fields."""
    return dict(encoded.items())


def queue_batch(pipe: Any, run: str, *, layouts: Iterable[dict[FieldT, EncodableT]] = (),
                steps: Iterable[dict[FieldT, EncodableT]] = (), samples: Sequence[GpuSample] = (),
                timings: Sequence[TimingRecord] = (), steps_maxlen: int = STEPS_MAXLEN) -> None:
    """Queue one batch's XADDs on pipe, in this order: layout changes (before the steps they precede: a reader
    never sees a step before its layout), step records, NVML samples, layer timings (same MAXLEN as the steps).
    layouts and steps are encoded fields (the writer may have measured them); samples and timings records."""
    for fields in layouts:
        pipe.xadd(keys.layouts_key(run), fields, maxlen=LAYOUTS_MAXLEN, approximate=True)
    for fields in steps:
        pipe.xadd(keys.steps_key(run), fields, maxlen=steps_maxlen, approximate=True)
    for sample in samples:
        pipe.xadd(keys.gpu_key(run), fields_of(encode_gpu_sample(sample)), maxlen=GPU_MAXLEN, approximate=True)
    for timing in timings:
        pipe.xadd(keys.timings_key(run), fields_of(encode_timing(timing)), maxlen=steps_maxlen, approximate=True)
