"""Writing a run into Redis the way a collector does (wire encoders, a core.connect() client; no torch): the
replay CLI's output. One pipelined round trip per batch: the metadata (first batch), layout records, step
records, their layer timings (moe:R:timings, same MAXLEN as the steps), NVML samples, the run's entry in
moe:runs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.typing import EncodableT, FieldT

from moe_monitor import core

STEPS_MAXLEN = 100_000
GPU_MAXLEN = 10_000
LAYOUTS_MAXLEN = 1000


class RunPublisher:
    def __init__(self, url: str, meta: core.RunMeta, timeout_s: float = 5.0):
        self.run = meta.run
        self._client = core.connect(url, timeout_s=timeout_s, retries=2)
        self._meta_json = core.encode_meta(meta)
        self._meta_sent = False

    def publish(self, steps: Sequence[core.StepRecord], layouts: Sequence[core.LayoutRecord] = (),
                samples: Sequence[core.GpuSample] = (), now_s: float = 0.0,
                timings: Sequence[core.TimingRecord] = ()) -> None:
        pipe = self._client.pipeline(transaction=False)
        if not self._meta_sent:
            pipe.set(core.meta_key(self.run), self._meta_json)
        for rec in layouts:
            pipe.xadd(core.layouts_key(self.run), _fields(core.encode_layout_record(rec)), maxlen=LAYOUTS_MAXLEN, approximate=True)
        for step in steps:
            pipe.xadd(core.steps_key(self.run), _fields(core.encode_step(step)), maxlen=STEPS_MAXLEN, approximate=True)
        for timing in timings:
            pipe.xadd(core.timings_key(self.run), _fields(core.encode_timing(timing)), maxlen=STEPS_MAXLEN,
                      approximate=True)
        for sample in samples:
            pipe.xadd(core.gpu_key(self.run), _fields(core.encode_gpu_sample(sample)), maxlen=GPU_MAXLEN, approximate=True)
        pipe.zadd(core.RUNS_KEY, {self.run: now_s})
        pipe.execute()
        self._meta_sent = True

    def close(self) -> None:
        self._client.close()


def _fields(encoded: Mapping[str, bytes | str | int]) -> dict[FieldT, EncodableT]:
    return dict(encoded.items())
