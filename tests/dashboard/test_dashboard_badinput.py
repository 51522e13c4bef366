"""Bad input gives one clear message, never a traceback: malformed metadata, binary and truncated traces,
Redis error replies (WRONGTYPE), NVML fields of the wrong type. Real redis-server, real files."""
import gzip
import json

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.dashboard.sources.trace import TraceSource
from tests.support import synthfill
from tests.support.apptest import run_app


def step_line(step: int) -> str:
    rec = core.StepRecord(run="t", rank=0, world_size=1, step=step, time_s=100.0 + step, phase="decode", tokens=4,
                          counts_LE=np.full((2, 8), step, dtype=np.int32))
    return core.trace_line("step", core.encode_step(rec))


def meta_line() -> str:
    return core.trace_line("meta", {"meta": core.encode_meta(synthfill.make_meta("t", 2, 8, gpus=2))})


def test_malformed_metadata_in_redis_is_a_bad_record(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "bm", steps=3, meta=False)
    raw = json.loads(core.encode_meta(synthfill.make_meta("bm", 4, 16, gpus=4)))
    raw["num_experts"] = "16"  # a string where an int belongs
    client.set(core.meta_key("bm"), json.dumps(raw))
    watched = WatchedRun(RedisSource(client, redis_url, "bm", window_steps=10), window_steps=10)
    watched.tick()
    assert watched.bad_records == 1 and "run metadata" in watched.last_error and "num_experts" in watched.last_error
    watched.source._meta_read_at = float("-inf")  # force the periodic re-read: the same bad text counts once
    watched.tick()
    assert watched.bad_records == 1 and watched.window.size == 3


def test_malformed_metadata_in_a_trace_is_a_bad_record(tmp_path):
    raw = json.loads(core.encode_meta(synthfill.make_meta("t", 2, 8, gpus=2)))
    raw["layout"]["gpus"] = [2]
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"kind": "meta", "meta": raw}) + "\n" + step_line(0) + "\n")
    watched = WatchedRun(TraceSource(str(path)), window_steps=10)
    watched.tick()
    assert watched.bad_records == 1 and "layout" in watched.last_error and watched.window.size == 1


def test_binary_trace_is_reported_once_as_not_text(tmp_path, monkeypatch):
    path = tmp_path / "counts.pt.gz"
    path.write_bytes(gzip.compress(bytes(range(256)) * 64) + b"\n\xff\xfe\n")
    source = TraceSource(str(path))
    watched = WatchedRun(source, window_steps=10)
    watched.tick()
    watched.tick()
    assert watched.bad_records == 1 and "not a text trace" in watched.last_error
    assert not source.health().reachable and "not a text trace" in source.health().error and source.finished
    monkeypatch.setenv("MOE_TRACE_DIR", str(tmp_path))  # the trace folder: names are taken inside it
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    at.sidebar.radio(key="source_kind").set_value("Trace file").run()
    at.sidebar.selectbox(key="trace_path").set_value(path.name).run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error if "not a text trace" in e.value]


def test_truncated_trace_reports_its_last_line_once_the_file_stops_growing(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text(meta_line() + "\n" + step_line(0) + "\n" + step_line(1)[:40])
    source = TraceSource(str(path), stall_s=0.0)
    watched = WatchedRun(source, window_steps=10)
    watched.tick()
    assert watched.window.size == 1 and watched.bad_records == 0 and not source.finished  # may still grow
    watched.tick()
    watched.tick()  # no growth across two polls
    assert watched.bad_records == 1 and "last line incomplete (truncated trace)" in watched.last_error
    assert source.finished and "replay finished" in source.health().note


def test_complete_last_line_without_newline_is_taken_once_the_file_stops_growing(tmp_path):
    path = tmp_path / "nonl.jsonl"
    path.write_text(meta_line() + "\n" + step_line(0) + "\n" + step_line(1))
    source = TraceSource(str(path), stall_s=0.0)
    watched = WatchedRun(source, window_steps=10)
    for _ in range(3):
        watched.tick()
    assert watched.window.size == 2 and watched.bad_records == 0 and source.finished


def test_redis_error_reply_is_a_source_error(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "wt", steps=3)
    client.delete(core.steps_key("wt"))
    client.set(core.steps_key("wt"), "not a stream")  # WRONGTYPE on XRANGE
    source = RedisSource(client, redis_url, "wt", window_steps=10)
    assert source.poll(10).steps == []
    health = source.health()
    assert not health.reachable and health.answered and "WRONGTYPE" in health.error
    at = run_app(redis_url, monkeypatch)
    message = next(e.value for e in at.error if "answered with an error" in e.value)
    assert "WRONGTYPE" in message and redis_url in message


def test_nvml_fields_of_the_wrong_type_are_bad_records(redis_url, tmp_path):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "nv", steps=2)
    bad = {"v": core.SCHEMA_VERSION, "rank": 0, "host": "h", "t": "1.0", "status": "ok", "reason": "",
           "gpus": json.dumps([{"index": 0, "power_usage_w": "high"}])}
    client.xadd(core.gpu_key("nv"), bad)
    watched = WatchedRun(RedisSource(client, redis_url, "nv", window_steps=10), window_steps=10)
    watched.tick()
    assert watched.bad_records == 1 and "power_usage_w" in watched.last_error
    path = tmp_path / "nv.jsonl"
    path.write_text(meta_line() + "\n" + core.trace_line("gpu", bad) + "\n")
    trace = WatchedRun(TraceSource(str(path)), window_steps=10)
    trace.tick()
    assert trace.bad_records == 1 and "power_usage_w" in trace.last_error and not trace.gpus.series


def _all_text(at) -> str:
    parts = [e.value for kind in ("error", "warning", "info", "caption", "markdown") for e in getattr(at, kind)]
    parts += [e.value for e in at.sidebar.caption]
    return "\n".join(map(str, parts))


def test_passwords_never_reach_the_page(monkeypatch):
    at = run_app("http://admin:s3cret@127.0.0.1:1/0", monkeypatch)  # connect() refuses the scheme
    field = at.sidebar.text_input(key="redis_url")
    assert field.proto.type == field.proto.PASSWORD  # the field itself is masked
    text = _all_text(at)
    assert "s3cret" not in text and "http://admin:***@127.0.0.1:1/0" in text, text
