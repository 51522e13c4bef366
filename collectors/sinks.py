"""Where published steps go: one Sink protocol, two sinks (a run's Redis keys, a JSON-lines trace file).

The publisher thread (publisher.py) is the only caller. It hands every sink the same batches, in step
order, and keeps a queue per sink: a write that raises has not landed and is offered again after a
backoff, so a sink never retries on its own and one sink's failure never holds up another.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from redis.typing import EncodableT, FieldT

import wire


class Sink(Protocol):
    """A destination for a run's step records, NVML samples and the publisher's health report."""

    name: str  # names the sink in error messages: "redis", "trace"

    def write(self, records: Sequence[wire.StepRecord], samples: Sequence[wire.GpuSample],
              health: dict[str, object]) -> None:
        """Write one batch (either list may be empty). Raising means the batch did not land."""
        ...

    def close(self) -> None:
        """Release what the sink holds (called once, after the last write)."""
        ...


class RedisSink:
    """Writes StepRecords, GpuSamples and health to one run's keys, one pipelined round trip per batch.
    The metadata goes with the first batch and again with the first after a failure, so a Redis that
    restarted empty gets it back."""

    name = "redis"

    def __init__(self, url: str, meta: wire.RunMeta, maxlen: int, timeout_s: float):
        self._run, self._maxlen = meta.run, maxlen
        self._client = wire.connect(url, timeout_s=timeout_s, retries=0)
        self._meta_json = wire.encode_meta(meta)
        self._needs_meta = True

    def write(self, records: Sequence[wire.StepRecord], samples: Sequence[wire.GpuSample],
              health: dict[str, object]) -> None:
        run = self._run
        pipe = self._client.pipeline(transaction=False)
        if self._needs_meta:
            pipe.set(wire.meta_key(run), self._meta_json)
        for rec in records:
            pipe.xadd(wire.steps_key(run), _fields(wire.encode_step(rec)), maxlen=self._maxlen, approximate=True)
        for sample in samples:
            pipe.xadd(wire.gpu_key(run), _fields(wire.encode_gpu_sample(sample)), maxlen=10_000, approximate=True)
        pipe.hset(wire.health_key(run), str(health["rank"]), json.dumps(health))
        pipe.zadd(wire.RUNS_KEY, {run: time.time()})
        try:
            pipe.execute()
        except Exception:
            self._needs_meta = True  # the connection may have gone, and with it an emptied Redis
            raise
        self._needs_meta = False

    def close(self) -> None:
        self._client.close()


def _fields(encoded: Mapping[str, bytes | str | int]) -> dict[FieldT, EncodableT]:
    return {name: value for name, value in encoded.items()}


class TraceFileSink:
    """Appends the run's metadata once (when opened), then one line per step record and NVML sample, and
    flushes after every batch: a live replay sees it, a killed process loses at most one batch. Health is
    not recorded. A batch written again after a failed write may repeat lines the failure let through;
    the readers skip duplicate steps."""

    name = "trace"

    def __init__(self, path: str | os.PathLike[str], meta: wire.RunMeta):
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (open for the run's lifetime)
        self._file.write(wire.trace_line("meta", {"meta": wire.encode_meta(meta)}) + "\n")

    def write(self, records: Sequence[wire.StepRecord], samples: Sequence[wire.GpuSample],
              health: dict[str, object]) -> None:
        lines = [wire.trace_line("step", wire.encode_step(rec)) for rec in records]
        lines += [wire.trace_line("gpu", wire.encode_gpu_sample(sample)) for sample in samples]
        if lines:
            self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
