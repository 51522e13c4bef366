"""What the collector leaves behind: trace files, NVML status, trimmed streams, health."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor, attach, record_trace
from tests.support.tiny_models import build


def _trace(path):
    with open(path, encoding="utf-8") as lines_file:
        lines = [core.parse_trace_line(line) for line in lines_file]
    meta = core.decode_meta(lines[0][1]["meta"])
    steps = [core.decode_step(f) for kind, f in lines if kind == "step"]
    return meta, steps, [k for k, _ in lines]


def test_trace_file_and_redis_hold_the_same_steps(redis_server, redis_url, tmp_path):
    model = build("olmoe")
    monitor = attach(model, redis_url=redis_url, run="traced", trace_path=str(tmp_path / "live.jsonl"))
    with torch.no_grad():
        for n in (5, 3, 1):
            model(input_ids=torch.randint(3, 90, (2, n)))
    monitor.close()
    meta, steps, kinds = _trace(tmp_path / "live.jsonl")
    assert kinds[0] == "meta" and meta.layer_names == monitor.layer_names
    assert "gpu" in kinds  # the NVML status travels in the live trace too
    from_redis = [core.decode_step(f) for _, f in redis_server.client().xrange(core.steps_key("traced"))]
    assert [s.step for s in steps] == [0, 1, 2] == [s.step for s in from_redis]
    for a, b in zip(steps, from_redis):
        assert np.array_equal(a.counts_LE, b.counts_LE) and a.tokens == b.tokens
    assert [s.tokens for s in steps] == [10, 6, 2]

    written = record_trace(redis_url, "traced", str(tmp_path / "dump.jsonl"))
    meta2, steps2, kinds2 = _trace(tmp_path / "dump.jsonl")
    assert written == 3 and [s.step for s in steps2] == [0, 1, 2] and "gpu" in kinds2
    assert meta2.run == "traced"


def test_nvml_reports_what_the_host_has(redis_server, redis_url):
    mon = ExpertLoadMonitor(1, 2, 1, redis_url=redis_url, run="nvml", nvml=True, nvml_interval_s=0.25)
    mon.record(0, torch.tensor([[1]]))
    mon.end_step()
    time.sleep(0.8)
    mon.close()
    samples = [core.decode_gpu_sample(f) for _, f in redis_server.client().xrange(core.gpu_key("nvml"))]
    assert samples, "the sampler published nothing"
    try:
        import pynvml
        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
    except Exception:
        gpus = 0
    if gpus == 0:  # no GPU / no driver: said once, nothing invented
        assert len(samples) == 1 and samples[0].status == "unavailable" and samples[0].gpus == []
        assert "NVML" in samples[0].reason or "no NVIDIA GPU" in samples[0].reason
    else:
        assert all(s.status == "ok" for s in samples) and len(samples) >= 2
        assert samples[0].gpus[0]["memory_total_bytes"] > 0


def test_stream_is_trimmed_to_the_memory_budget(redis_server, redis_url):
    mon = ExpertLoadMonitor(1, 8, 1, redis_url=redis_url, run="trim", memory_budget_bytes=1, nvml=False,
                            host_slots=600, queue_steps=600)
    for _ in range(500):
        mon.record(0, torch.tensor([[3]]))
        mon.end_step("decode")
    mon.close()
    client = redis_server.client()
    assert mon.stats()["published_steps"] == 500
    assert 100 <= client.xlen(core.steps_key("trim")) < 300  # MAXLEN ~100: trimmed in whole stream nodes
    health = json.loads(client.hget(core.health_key("trim"), "0"))
    assert health["published_steps"] == 500 and health["dropped_steps"] == 0
    assert client.zscore(core.RUNS_KEY, "trim") is not None


def test_publisher_survives_a_failing_trace_sink(redis_server, redis_url):
    """A trace on a full disk (/dev/full: every flush fails) is reported and keeps its steps for a retry;
    Redis publishing goes on, and its records do not count the trace's troubles as dropped steps."""
    mon = ExpertLoadMonitor(1, 4, 1, redis_url=redis_url, run="sinkfail", trace_path="/dev/full", nvml=False)
    for _ in range(3):
        mon.record(0, torch.tensor([[2]]))
        mon.end_step("decode")
    deadline = time.monotonic() + 5  # each sink has its own writer thread: wait for both outcomes
    while (mon.stats()["sinks"]["redis"]["published_steps"] < 3 or not mon.stats()["sinks"]["trace"]["last_error"]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = mon.stats()
    mon.close(timeout_s=0.5)
    assert stats["publisher_alive"] and stats["published_steps"] == 0  # not every sink has them
    redis_stats = {k: stats["sinks"]["redis"][k] for k in ("published_steps", "queued_steps", "dropped_steps",
                                                            "last_error", "failures")}
    assert redis_stats == {"published_steps": 3, "queued_steps": 0, "dropped_steps": 0, "last_error": "", "failures": 0}
    assert stats["sinks"]["trace"]["queued_steps"] == 3
    assert "trace sink failed: OSError" in stats["sinks"]["trace"]["last_error"]
    assert "trace sink failed" in stats["last_error"]
    records = [core.decode_step(f) for _, f in redis_server.client().xrange(core.steps_key("sinkfail"))]
    assert [(r.step, r.dropped_steps) for r in records] == [(0, 0), (1, 0), (2, 0)]
    health = json.loads(redis_server.client().hget(core.health_key("sinkfail"), "0"))
    assert "trace sink failed" in health["last_error"] and health["dropped_steps"] == 0
    after = mon.stats()
    assert after["sinks"]["trace"]["dropped_steps"] == 3 and after["dropped_steps"] == 3


class _MemorySink:
    """A sink that keeps what it is given; every write fails while `down` is set (the test decides when it
    comes back, so nothing depends on how fast the backoff runs)."""

    def __init__(self, name, down: threading.Event | None = None):
        self.name, self.down = name, down or threading.Event()
        self.records, self.samples, self.calls, self.failed, self.closed = [], [], 0, 0, False
        self.layouts = []

    def write(self, records, samples, health, layouts=()):
        self.calls += 1
        if self.down.is_set():
            self.failed += 1
            raise ConnectionError(f"{self.name} is down")
        self.records += [r.step for r in records]
        self.samples += samples
        self.layouts += [rec.step for rec in layouts]

    def close(self):
        self.closed = True


def _record(step):
    return core.StepRecord(run="mem", rank=0, world_size=1, step=step, time_s=float(step), phase="decode",
                           tokens=1, counts_LE=np.zeros((1, 2), dtype=np.int32))


def test_one_failing_sink_does_not_hold_up_another():
    """Every sink gets every step in order: the healthy one at once, the failing one after its backoff."""
    from moe_monitor.collectors.publisher import Publisher, StepJob
    down = threading.Event()
    down.set()
    flaky, steady = _MemorySink("flaky", down), _MemorySink("steady")
    released = []
    pub = Publisher([flaky, steady], decode=lambda jobs: [_record(job.step) for job in jobs], release=released.append, rank=0,
                    flush_interval_s=0.02)
    for step in range(5):
        pub.submit(StepJob(step, float(step), "decode", None, slot=step, facts=None))
    pub.submit_sample(core.GpuSample(0, "h", 1.0, "unavailable", reason="none"))
    deadline = time.monotonic() + 2
    while (steady.records != list(range(5)) or not flaky.failed) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert steady.records == list(range(5)) and flaky.records == [] and len(steady.samples) == 1
    assert "flaky sink failed: ConnectionError: flaky is down" in pub.last_error
    assert pub.sink_stats()["flaky"]["queued_steps"] == 5 and pub.published_steps == 0 and flaky.failed >= 1
    down.clear()  # the flaky sink is back
    assert pub.close(timeout_s=5.0)  # close() retries at once, backoff or not: the flaky sink takes it all
    assert flaky.records == list(range(5)) and len(flaky.samples) == 1 and flaky.calls == flaky.failed + 1
    assert pub.published_steps == 5 and pub.dropped_steps == 0 and pub.last_error == ""
    assert sorted(released) == list(range(5)) and flaky.closed and steady.closed


def test_empty_batches_from_idle_ranks_are_fine():
    mon = ExpertLoadMonitor(2, 4, 2, nvml=False)
    mon.record(0, torch.empty(0, 2, dtype=torch.int64))
    mon.record(1, torch.tensor([[1, 3]]))
    mon.end_step("decode")
    mon.close()
    assert mon.counts().tolist() == [[0, 0, 0, 0], [0, 1, 0, 1]]


def test_sampled_rows_a_layer_did_not_write_read_minus_one(redis_server, redis_url):
    """A layer that sees fewer tokens than the step announced leaves -1 rows, never fake expert-0 rows."""
    mon = ExpertLoadMonitor(2, 8, 2, redis_url=redis_url, run="fewer", sample_tokens=4, sample_every=1,
                            nvml=False)
    mon.begin_step(tokens=8)
    mon.record(0, torch.tensor([[1, 2]] * 8))
    mon.record(1, torch.tensor([[6, 7], [6, 7]]))
    mon.end_step("decode")
    mon.close()
    (rec,) = [core.decode_step(f) for _, f in redis_server.client().xrange(core.steps_key("fewer"))]
    assert rec.sample_ids_LNK[0].tolist() == [[1, 2]] * 4
    assert rec.sample_ids_LNK[1].tolist() == [[6, 7], [6, 7], [-1, -1], [-1, -1]]


def test_steps_dropped_in_an_outage_are_counted_before_the_next_published_step(tmp_path):
    """The first record published after an outage carries every drop made while it waited, so the
    reader can tell a gap the collector dropped from steps lost in the stream."""
    from moe_monitor.demo.localredis import RedisServer

    server = RedisServer(tmp_path)
    mon = ExpertLoadMonitor(1, 2, 1, redis_url=server.url, run="gap", queue_steps=3, nvml=False)
    server.stop()
    for _ in range(8):
        mon.record(0, torch.tensor([[1]]))
        mon.end_step("decode")
    deadline = time.monotonic() + 10
    while mon.stats()["dropped_steps"] < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    import subprocess
    server.proc = subprocess.Popen(server.proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while mon.stats()["published_steps"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        mon.close()
        records = [core.decode_step(f) for _, f in server.client().xrange(core.steps_key("gap"))]
        assert [r.step for r in records] == [5, 6, 7]
        assert records[0].dropped_steps == 5  # steps 0-4: the jump from nothing to step 5 is explained
    finally:
        server.stop()
