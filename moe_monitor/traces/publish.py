"""Writing a run into Redis the way a collector does (core.runwrite's batch on a core.connect() client; no torch): the
replay CLI's output. One pipelined round trip per batch: the metadata (first batch), layout records, step
records, their layer timings (moe:R:timings, same MAXLEN as the steps), NVML samples, the run's entry in
moe:runs. A command Redis refuses fails the batch (the first refusal is raised); a stream holding the last
possible id is named in the error, with what to do (core.runwrite.exhausted_message).
"""
from __future__ import annotations

from collections.abc import Sequence

import redis

from moe_monitor import core
from moe_monitor.core.runwrite import exhausted_message, exhausted_stream, fields_of, queue_batch


class RunPublisher:
    def __init__(self, url: str, meta: core.RunMeta, timeout_s: float = 5.0):
        self.run = meta.run
        self._client = core.connect(url, timeout_s=timeout_s, retries=2)
        self._meta_json = core.encode_meta(meta)
        self._meta_sent = False

    def publish(self, steps: Sequence[core.StepRecord], layouts: Sequence[core.LayoutRecord] = (),
                samples: Sequence[core.GpuSample] = (), now_s: float = 0.0,
                timings: Sequence[core.TimingRecord] = (), physical: Sequence[core.PhysicalRecord] = ()) -> None:
        pipe = self._client.pipeline(transaction=False)
        if not self._meta_sent:
            pipe.set(core.meta_key(self.run), self._meta_json)
        streams = queue_batch(pipe, self.run, layouts=[fields_of(core.encode_layout_record(rec)) for rec in layouts],
                    steps=core.encode_steps(steps), samples=samples, timings=timings,
                    physical=physical)
        pipe.zadd(core.RUNS_KEY, {self.run: now_s})
        replies = pipe.execute(raise_on_error=False)
        meta_replies = 0 if self._meta_sent else 1  # the SET of the metadata, queued first
        stream_replies = replies[meta_replies:meta_replies + len(streams)]
        for key, reply in zip(streams, stream_replies):
            if exhausted_stream(reply):
                raise redis.ResponseError(exhausted_message(key))
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        self._meta_sent = True

    def close(self) -> None:
        self._client.close()
