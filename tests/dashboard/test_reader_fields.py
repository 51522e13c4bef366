"""Bad fields in the health hash, the metadata, a GPU sample or an uploaded layout: one counted bad record
or one ValueError, never an exception out of a poll. Hostile sizes in the metadata (a 245-byte record that
claims 10^9 experts) are refused before anything is allocated; identical metadata bytes decode once."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from tests.support import synthfill

ROOT = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000


def _watch(client, url, run):
    return WatchedRun(RedisSource(client, url, run, window_steps=10), window_steps=10)


@pytest.mark.parametrize("field, value", [
    (b"\xff\xfe", b'{"dropped_steps": 1}'),
    ("²".encode(), b'{"dropped_steps": 1}'),
    (b"1" * 5000, b'{"dropped_steps": 1}'),
    (b"70000", b'{"dropped_steps": 1}'),
    (b"1", DEEP.encode()),
    (b"1", b'{"dropped_steps": ' + b"9" * 5000 + b"}"),
    (b"1", b'{"dropped_steps": ' + b"9" * 4000 + b"}"),
    (b"1", b'{"dropped_steps": "many", "queued": [1]}'),
    (b"1", b"\xff\xfe"),
    (b"1", b'{"last_error": ' + json.dumps([[[[1]]]]).encode() + b"}"),
])
def test_a_bad_health_field_is_one_bad_record(redis_url, field, value):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "hh", steps=3)
    client.hset(core.health_key("hh"), mapping={b"0": json.dumps({"dropped_steps": 2, "queued": 0, "last_error": "",
                                                                  "time_s": 1.0}), field: value})
    watched = _watch(client, redis_url, "hh")
    for _ in range(3):
        watched.tick()  # the same bad entry is counted once, not at every poll
    health = watched.source.health()
    assert health.reachable and watched.window.size == 3
    assert watched.bad_records == 1 and "health" in watched.last_error, watched.last_error
    assert health.collectors[0]["dropped_steps"] == 2
    assert all(isinstance(rank, int) and 0 <= rank < core.MAX_WORLD for rank in health.collectors)
    for report in health.collectors.values():
        assert all(isinstance(v, (int, float, str, type(None))) for v in report.values()), report


@pytest.mark.parametrize("score", [float("inf"), float("-inf")])
def test_a_non_finite_last_seen_time_is_unknown(redis_url, score):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "nf", steps=2)
    client.zadd(core.RUNS_KEY, {"nf": score})
    watched = _watch(client, redis_url, "nf")
    watched.tick()
    assert watched.source.health().last_seen_s is None


@pytest.mark.parametrize("text", [
    DEEP,
    '{"run": "x", "layout": ' + DEEP + "}",
    '{"run": "x", "num_experts": ' + "9" * 5000 + ', "layout": {}}',
    b"\xff\xfe{}",
])
def test_metadata_that_breaks_the_json_parser_is_a_bad_record(redis_url, text):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "bj", steps=3, meta=False)
    client.set(core.meta_key("bj"), text)
    with pytest.raises(ValueError):
        core.decode_meta(text)
    watched = _watch(client, redis_url, "bj")
    watched.tick()
    assert watched.bad_records == 1 and "run metadata" in watched.last_error and watched.window.size == 3


def _meta_json(**over) -> dict:
    raw = json.loads(core.encode_meta(synthfill.make_meta("m", 2, 8, gpus=2)))
    raw.update(over)
    return raw


@pytest.mark.parametrize("over, message", [
    ({"started_s": 10**4000}, "started_s"),
    ({"started_s": float("inf")}, "started_s"),
    ({"hidden_size": 10**30}, "hidden_size"),
    ({"world_size": 0}, "world_size"),
    ({"world_size": 70000}, "world_size"),
    ({"layout": {"gpus": 2, "nodes": 1, "physical_to_logical_map": [[0, 1, 2, 3, 4, 5, 6, 2**70]] * 2}}, "expert"),
    ({"layout": {"gpus": 2, "nodes": 1, "physical_to_logical_map": [[0, 1, 2, 3, 4, 5, 6, -1]] * 2}}, "expert"),
    ({"layout": {"gpus": 10**30, "nodes": 1, "physical_to_logical_map": [[0, 1, 2, 3, 4, 5, 6, 7]] * 2}}, "gpus"),
    ({"instance": "i" * 1000}, "instance"),
])
def test_out_of_range_metadata_is_one_value_error(over, message):
    with pytest.raises(ValueError, match=message):
        core.decode_meta(json.dumps(_meta_json(**over)))


@pytest.mark.parametrize("gpus", [DEEP, json.dumps([{"index": 10**4000}]), json.dumps([{"index": 0, "power_usage_w": 10**400}]),
                                  json.dumps([{"index": 0, "name": "n" * 10_000}]), json.dumps([{"index": 0}] * 5000)])
def test_a_gpu_sample_that_breaks_the_parser_is_a_bad_record(redis_url, gpus):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "gj", steps=2)
    client.xadd(core.gpu_key("gj"), {"v": core.SCHEMA_VERSION, "rank": 0, "host": "h", "t": "1.0", "status": "ok",
                                     "reason": "", "gpus": gpus})
    watched = _watch(client, redis_url, "gj")
    watched.tick()
    assert watched.bad_records == 1 and "gpu entry" in watched.last_error and watched.window.size == 2


@pytest.mark.parametrize("text", [
    DEEP, '{"physical_to_logical_map": ' + DEEP + "}", '{"physical_to_logical_map": [[' + "9" * 5000 + "]]}",
    '{"physical_to_logical_map": [[' + "9" * 4000 + "]]}", '{"physical_to_logical_map": [[-1, 0]]}',
    '{"physical_to_logical_map": [' + ",".join(["[0]"] * 2000) + "]}",
])
def test_a_layout_file_that_breaks_the_parser_is_one_value_error(text):
    with pytest.raises(ValueError):
        core.parse_layout_json(text)


HOSTILE = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from moe_monitor import core
def meta(experts, slots=1):
    return json.dumps({"run": "x", "model_name": "m", "layer_names": ["a"], "num_experts": experts, "top_k": 1,
                       "hidden_size": 1, "moe_intermediate_size": 1, "dtype_bytes": 2,
                       "layout": {"gpus": 1, "nodes": 1, "physical_to_logical_map": [[0] * slots]}})
texts = [meta(10**8), meta(10**9), meta(10**12), meta(8, 0)]
lines = [json.dumps({"kind": "meta", "meta": t}) for t in texts]
started = time.perf_counter()
for decode, items in ((core.decode_meta, texts), (core.decode_trace_line, lines)):
    for item in items:
        try:
            decode(item)
        except ValueError as exc:
            print("refused:", str(exc)[:100])
        else:
            raise SystemExit("accepted " + item[:80])
print("seconds", time.perf_counter() - started)
"""


def _baseline_as() -> int:
    probe = "import resource, moe_monitor.core; print(open('/proc/self/statm').read().split()[0])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True,
                         env=_env())
    return int(out.stdout.split()[0]) * 4096


def _env() -> dict:
    import os

    return dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def test_a_tiny_metadata_record_claiming_huge_sizes_allocates_nothing():
    limit = _baseline_as() + (256 << 20)  # what importing wire takes, plus 256 MiB
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(HOSTILE), str(limit)], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.count("refused:") == 8
    assert float(result.stdout.split("seconds")[1]) < 2.0


def test_identical_metadata_bytes_decode_once(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "mc", steps=2)
    calls = []
    real = core.decode_meta
    monkeypatch.setattr(core, "decode_meta", lambda raw: calls.append(1) or real(raw))
    watched = _watch(client, redis_url, "mc")
    for _ in range(4):
        watched.source._meta_read_at = float("-inf")  # force the periodic re-read
        watched.tick()
    assert len(calls) == 1 and watched.source.meta().num_experts == 16
    client.set(core.meta_key("mc"), core.encode_meta(synthfill.make_meta("mc", 4, 16, gpus=8)))
    watched.source._meta_read_at = float("-inf")
    watched.tick()
    assert len(calls) == 2 and watched.source.meta().layout.gpus == 8


def test_a_layout_of_the_whole_cell_budget_is_checked_and_its_bad_layer_named():
    rows = np.tile(np.arange(1024), (1024, 1)).tolist()  # 1024 layers x 1024 slots: the cell budget
    # how long the check takes: bench.layout_check
    core.Layout(gpus=8, nodes=1, physical_to_logical_map=rows).validate(1024, 1024)
    rows[700][5] = 6
    with pytest.raises(ValueError, match="layer 700"):
        core.Layout(gpus=8, nodes=1, physical_to_logical_map=rows).validate(1024, 1024)
