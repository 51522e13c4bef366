"""What the collector leaves behind: trace files, NVML status, trimmed streams, health."""
from __future__ import annotations

import json

import numpy as np
import torch

import wire
from collectors import ExpertLoadMonitor, attach, record_trace
from tests.support.tiny_models import build


def _trace(path):
    lines = [wire.parse_trace_line(line) for line in open(path, encoding="utf-8")]
    meta = wire.decode_meta(lines[0][1]["meta"])
    steps = [wire.decode_step(f) for kind, f in lines if kind == "step"]
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
    from_redis = [wire.decode_step(f) for _, f in redis_server.client().xrange(wire.steps_key("traced"))]
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
    import time
    time.sleep(0.8)
    mon.close()
    samples = [wire.decode_gpu_sample(f) for _, f in redis_server.client().xrange(wire.gpu_key("nvml"))]
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
    assert 100 <= client.xlen(wire.steps_key("trim")) < 300  # MAXLEN ~100: trimmed in whole stream nodes
    health = json.loads(client.hget(wire.health_key("trim"), "0"))
    assert health["published_steps"] == 500 and health["dropped_steps"] == 0
    assert client.zscore(wire.RUNS_KEY, "trim") is not None


def test_publisher_survives_a_failing_trace_sink(redis_server, redis_url, tmp_path):
    """A sink that starts failing (its file closed under it) is reported; Redis publishing goes on."""
    mon = ExpertLoadMonitor(1, 4, 1, redis_url=redis_url, run="sinkfail", trace_path=str(tmp_path / "t.jsonl"))
    mon.publisher.extra_sinks[0]._file.close()
    for _ in range(3):
        mon.record(0, torch.tensor([[2]]))
        mon.end_step("decode")
    import time
    deadline = time.monotonic() + 5
    while mon.stats()["published_steps"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = mon.stats()
    mon.close()
    assert stats["published_steps"] == 3 and stats["publisher_alive"]
    assert "trace sink failed" in stats["last_error"]
    assert redis_server.client().xlen(wire.steps_key("sinkfail")) == 3


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
    (rec,) = [wire.decode_step(f) for _, f in redis_server.client().xrange(wire.steps_key("fewer"))]
    assert rec.sample_ids_LNK[0].tolist() == [[1, 2]] * 4
    assert rec.sample_ids_LNK[1].tolist() == [[6, 7], [6, 7], [-1, -1], [-1, -1]]


def test_steps_dropped_in_an_outage_are_counted_before_the_next_published_step(tmp_path):
    """The first record published after an outage carries every drop made while it waited, so the
    reader can tell a gap the collector dropped from steps lost in the stream."""
    import time
    from demo.localredis import RedisServer
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
        records = [wire.decode_step(f) for _, f in server.client().xrange(wire.steps_key("gap"))]
        assert [r.step for r in records] == [5, 6, 7]
        assert records[0].dropped_steps == 5  # steps 0-4: the jump from nothing to step 5 is explained
    finally:
        server.stop()
