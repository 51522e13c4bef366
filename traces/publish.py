"""Writing a run into Redis the way a collector does (wire encoders, a wire.connect() client; no torch): the
replay CLI's output. One pipelined round trip per batch: the metadata (first batch), layout records, step
records, their layer timings (moe:R:timings, same MAXLEN as the steps), NVML samples, the run's entry in
moe:runs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.typing import EncodableT, FieldT

import wire

STEPS_MAXLEN = 100_000
GPU_MAXLEN = 10_000
LAYOUTS_MAXLEN = 1000


class RunPublisher:
    def __init__(self, url: str, meta: wire.RunMeta, timeout_s: float = 5.0):
        self.run = meta.run
        self._client = wire.connect(url, timeout_s=timeout_s, retries=2)
        self._meta_json = wire.encode_meta(meta)
        self._meta_sent = False

    def publish(self, steps: Sequence[wire.StepRecord], layouts: Sequence[wire.LayoutRecord] = (),
                samples: Sequence[wire.GpuSample] = (), now_s: float = 0.0,
                timings: Sequence[wire.TimingRecord] = ()) -> None:
        pipe = self._client.pipeline(transaction=False)
        if not self._meta_sent:
            pipe.set(wire.meta_key(self.run), self._meta_json)
        for rec in layouts:
            pipe.xadd(wire.layouts_key(self.run), _fields(wire.encode_layout_record(rec)), maxlen=LAYOUTS_MAXLEN, approximate=True)
        for step in steps:
            pipe.xadd(wire.steps_key(self.run), _fields(wire.encode_step(step)), maxlen=STEPS_MAXLEN, approximate=True)
        for timing in timings:
            pipe.xadd(wire.timings_key(self.run), _fields(wire.encode_timing(timing)), maxlen=STEPS_MAXLEN,
                      approximate=True)
        for sample in samples:
            pipe.xadd(wire.gpu_key(self.run), _fields(wire.encode_gpu_sample(sample)), maxlen=GPU_MAXLEN, approximate=True)
        pipe.zadd(wire.RUNS_KEY, {self.run: now_s})
        pipe.execute()
        self._meta_sent = True

    def close(self) -> None:
        self._client.close()


def _fields(encoded: Mapping[str, bytes | str | int]) -> dict[FieldT, EncodableT]:
    return dict(encoded.items())
