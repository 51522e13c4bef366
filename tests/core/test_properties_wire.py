"""Property tests of every reader-side decoder and validator: for any input, success (within the bounds of
core/keys.py) or one ValueError, never another exception; hostile sizes decode in bounded memory (checked
under RLIMIT_AS in a fresh interpreter); and a bad record followed by good ones never hides the good ones."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from moe_monitor import core
from moe_monitor.core.health import decode_health_rank, decode_health_report
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.live.window import StepWindow
from moe_monitor.dashboard.sources.base import Batch
from moe_monitor.dashboard.sources.redis import _collector_health
from tests.support.assembled import add_rank
from tests.support.listsource import ListSource
from tests.support.properties import property_settings

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = property_settings()
DEEP = "[" * 50_000 + "]" * 50_000

# values a hostile or corrupt writer could put in a field, as Redis hands them over (bytes) and as JSON would
HOSTILE_BYTES = [b"", b"-1", b"0", b"1", b"2", "²".encode(), "٣".encode(), b"1" * 5000, b"9" * 30, b" 7 ", b"0x10",
                 b"1_000", str(2**62).encode(), str(2**62 - 1).encode(), str(2**64).encode(), str(2**40).encode(),
                 b"65536", b"65537", b"nan", b"inf", b"-inf", b"1e308", b"1e11", b"\xff\xfe", b"decode", b"prefill",
                 DEEP.encode(), b"[]", b"{}", b"null", b"\x00" * 24]
HOSTILE_JSON = [None, True, False, -1, 0, 2**31, 2**62, 2**64, 10**30, 10**4000, 1.5, float("nan"), float("inf"), "",
                "x" * 10_000, [], {}, [[0]], [[2**70]], {"a": 1}]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.sampled_from(HOSTILE_JSON),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30)
field_values = st.one_of(st.binary(max_size=64), st.text(max_size=30), st.integers(), st.floats(), st.none(),
                         st.booleans(), st.sampled_from(HOSTILE_BYTES), st.sampled_from(HOSTILE_JSON))


def _good_step_fields(sample: bool = True) -> dict:
    rec = core.StepRecord(run="p", rank=1, world_size=2, step=5, time_s=1.7e9, phase="decode", tokens=9,
                          counts_LE=np.array([[1, 0, 2], [0, 3, 0]], dtype=np.int32), dropped_steps=1,
                          sample_ids_LNK=np.array([[[0, 2]], [[1, -1]]], dtype=np.int16) if sample else None,
                          instance="i-1")
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in core.encode_step(rec).items()}


STEP_NAMES = [*core.STEP_FIELDS, *core.COMPACT_FIELDS, *core.SAMPLE_FIELDS]


def _check_step(fields: dict) -> None:
    try:
        rec = core.decode_step(fields)
    except ValueError:
        return
    assert 0 <= rec.step < core.MAX_STEP and 0 <= rec.tokens < core.MAX_TOKENS
    assert 0 <= rec.rank < rec.world_size <= core.MAX_WORLD and 0 <= rec.dropped_steps < core.MAX_STEP
    num_layers, num_experts = rec.counts_LE.shape
    assert num_layers <= core.MAX_LAYERS and num_experts <= core.MAX_EXPERTS
    assert num_layers * num_experts <= core.MAX_CELLS and rec.counts_LE.min() >= 0
    assert abs(rec.time_s) < core.MAX_TIME_S and len(rec.instance) <= core.MAX_NAME_CHARS


@SETTINGS
@given(st.dictionaries(st.one_of(st.binary(max_size=8), st.text(max_size=8), st.sampled_from(STEP_NAMES),
                                 st.sampled_from([n.encode() for n in STEP_NAMES])), field_values, max_size=16))
def test_decode_step_of_arbitrary_fields(fields):
    _check_step(fields)


@SETTINGS
@given(st.booleans(), st.dictionaries(st.sampled_from(STEP_NAMES), field_values, min_size=1, max_size=4),
       st.booleans())
@example(True, {"step": str(2**62)}, False)
@example(True, {"tokens": str(2**40)}, False)
@example(True, {"world": "65537", "rank": "65536"}, False)
@example(False, {"t": "1e11"}, True)
def test_decode_step_of_a_good_entry_with_hostile_fields(sample, changes, text_keys):
    fields = _good_step_fields(sample)
    if text_keys:  # a trace line's fields: text keys (the bytes ones are looked up too)
        fields = {k.decode(): v for k, v in fields.items()}
    for name, value in changes.items():
        fields[name if text_keys else name.encode()] = value
    _check_step(fields)


def _good_meta() -> dict:
    layout = core.Layout(gpus=2, nodes=1, physical_to_logical_map=[[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 2, 3]])
    meta = core.RunMeta(run="p", model_name="m", layer_names=["a", "b"], num_experts=4, top_k=2, hidden_size=8,
                        moe_intermediate_size=4, dtype_bytes=2, layout=layout, world_size=2, started_s=1.7e9)
    return json.loads(core.encode_meta(meta))


META_NAMES = [*_good_meta(), "gpus", "nodes", "physical_to_logical_map", "evil"]


def _check_meta(text) -> None:
    try:
        meta = core.decode_meta(text)
    except ValueError:
        return
    rows = np.asarray(meta.layout.physical_to_logical_map)
    assert rows.shape[0] == len(meta.layer_names) <= core.MAX_LAYERS and rows.size <= core.MAX_CELLS
    assert 1 <= meta.num_experts <= core.MAX_EXPERTS and 1 <= meta.world_size <= core.MAX_WORLD


@SETTINGS
@given(st.one_of(json_values.map(json.dumps), st.binary(max_size=200), st.text(max_size=200)))
@example(DEEP)
@example('{"layout": ' + DEEP + "}")
@example(b"\xff\xfe{}")
def test_decode_meta_of_arbitrary_text(text):
    _check_meta(text)


@SETTINGS
@given(st.dictionaries(st.sampled_from(META_NAMES), json_values, min_size=1, max_size=4), st.booleans())
@example({"num_experts": 10**9}, False)
@example({"num_experts": 10**8, "physical_to_logical_map": [[0]]}, True)
@example({"started_s": 10**4000}, False)
@example({"physical_to_logical_map": [[0, 1, 2, 2**70, 0, 1]] * 2}, True)
def test_decode_meta_of_a_good_record_with_hostile_fields(changes, in_layout):
    raw = _good_meta()
    layout = raw["layout"]
    for name, value in changes.items():
        (layout if in_layout or name in ("gpus", "nodes", "physical_to_logical_map") else raw)[name] = value
    _check_meta(json.dumps(raw))
    _check_trace_line(json.dumps({"kind": "meta", "meta": raw}))


@SETTINGS
@given(st.one_of(st.binary(max_size=12), st.text(max_size=12), st.sampled_from(HOSTILE_BYTES)),
       st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=100),
                 st.sampled_from(HOSTILE_BYTES),
                 st.dictionaries(st.sampled_from(["rank", "dropped_steps", "published_steps", "queued", "last_error",
                                                  "time_s", "x"]), json_values).map(lambda d: json.dumps(d).encode())))
@example("²".encode(), b"{}")
@example(b"1", DEEP.encode())
def test_health_entries(field, value):
    for decode, arg in ((decode_health_rank, field), (decode_health_report, value)):
        with contextlib.suppress(ValueError):
            decode(arg)
    reports, bad = _collector_health({field: value, b"0": b'{"dropped_steps": 3}'})
    assert reports[0] == {"dropped_steps": 3}
    assert all(isinstance(rank, int) and 0 <= rank < core.MAX_WORLD for rank in reports)
    for report in reports.values():
        assert all(isinstance(v, (int, float, str, type(None))) for v in report.values())
        assert len(str(report.get("last_error") or "")) <= 2000


def _good_gpu_fields() -> dict:
    sample = core.GpuSample(0, "h", 1.0, "ok", [{"index": 0, "name": "H200", "memory_used_bytes": 10**11}])
    return {k.encode(): str(v).encode() for k, v in core.encode_gpu_sample(sample).items()}


GPU_NAMES = ["v", "rank", "host", "t", "status", "reason", "gpus"]


def _check_gpu(fields) -> None:
    try:
        sample = core.decode_gpu_sample(fields)
    except ValueError:
        return
    assert 0 <= sample.rank < core.MAX_WORLD and len(sample.gpus) <= core.MAX_GPUS_PER_SAMPLE


@SETTINGS
@given(st.dictionaries(st.sampled_from(GPU_NAMES), st.one_of(field_values, json_values.map(json.dumps),
                                                                st.lists(st.dictionaries(
                                                                    st.sampled_from([*core.GPU_FIELDS, "x"]),
                                                                    json_values), max_size=3).map(json.dumps)),
                       min_size=1, max_size=4))
@example({"gpus": DEEP})
@example({"gpus": json.dumps([{"index": 10**4000}])})
@example({"gpus": json.dumps([{"index": 0, "power_usage_w": 10**400}])})
def test_decode_gpu_sample(changes):
    fields = _good_gpu_fields()
    for name, value in changes.items():
        fields[name.encode()] = value
    _check_gpu(fields)
    _check_gpu({k.decode(): v for k, v in fields.items()})


def _check_trace_line(line) -> None:
    with contextlib.suppress(ValueError):
        core.decode_trace_line(line)


@SETTINGS
@given(st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.tuples(st.sampled_from(core.TRACE_KINDS), st.dictionaries(
        st.sampled_from([*STEP_NAMES, "counts_b64", "sample_b64", "meta", "gpus", *GPU_NAMES]),
        st.one_of(json_values, st.text(max_size=20)), max_size=8)).map(lambda kf: json.dumps({"kind": kf[0], **kf[1]})),
))
@example(DEEP)
@example('{"kind": "meta", "meta": ' + DEEP + "}")
@example('{"kind": "gpu", "gpus": ' + DEEP + "}")
@example('{"kind": "step", "counts_b64": "\u00e9"}')
def test_decode_trace_line(line):
    _check_trace_line(line)


@SETTINGS
@given(st.one_of(json_values.map(json.dumps), st.binary(max_size=100),
                 st.lists(st.lists(st.one_of(st.integers(), st.sampled_from(HOSTILE_JSON)), max_size=6), max_size=4)
                 .map(lambda rows: json.dumps({"physical_to_logical_map": rows}))))
@example(DEEP)
@example('{"physical_to_logical_map": [[' + "9" * 4000 + "]]}")
def test_parse_and_validate_layouts(text):
    try:
        rows = core.parse_layout_json(text)
    except ValueError:
        return
    assert len(rows) <= core.MAX_LAYERS and sum(map(len, rows)) <= core.MAX_CELLS
    for gpus in (1, 2):
        with contextlib.suppress(ValueError):
            core.Layout(gpus=gpus, nodes=1, physical_to_logical_map=rows).validate(len(rows), 2)


@SETTINGS
@given(st.integers(), st.integers(), st.one_of(st.integers(), st.none()))
@example(10**9, 10**9, None)
@example(1, 10**9, 1)
def test_sizes_and_contiguous_layouts(layers, experts, slots):
    try:
        rows = core.contiguous_layout(layers, experts, slots)
    except ValueError:
        return
    assert len(rows) * len(rows[0]) <= core.MAX_CELLS


def _two_layer_meta() -> core.RunMeta:
    """The run's metadata: [2 layers, 3 experts], 2 ranks."""
    return core.RunMeta(run="w", model_name="m", layer_names=["a", "b"], num_experts=3, top_k=1,
                        hidden_size=1, moe_intermediate_size=1, dtype_bytes=2,
                        layout=core.Layout(1, 1, core.contiguous_layout(2, 3)), world_size=2)


bad_values = {
    "step": st.sampled_from([-1, 2**62, 2**70, 1.5, "7", None]),
    "rank": st.sampled_from([-1, 2, 2**16, 2**70, None]),
    "world_size": st.sampled_from([0, 2**17, 2**70, None]),
    "tokens": st.sampled_from([-1, 2**40, 2**70, None]),
    "time_s": st.sampled_from([float("nan"), float("inf"), 1e300, "x", None]),
    "phase": st.sampled_from(["warmup", "", None, 3]),
    "dropped_steps": st.sampled_from([-1, 2**62, None]),
    "instance": st.sampled_from([None, 7, "i" * 1000]),
    "counts_LE": st.sampled_from([None, np.zeros((3, 3), np.int32), np.full((2, 3), -1, np.int32),
                                  np.full((2, 3), 2**40), np.full((2, 3), 0.5), [[1, 2, 3], [4, 5, 6]]]),
    "sample_ids_LNK": st.sampled_from(["x", np.zeros((2, 2)), np.full((2, 1, 1), 2**20)]),
}


@st.composite
def records(draw):
    """A sequence of (record, good?) with step ids increasing; bad ones break one field."""
    out = []
    for step in range(draw(st.integers(1, 12))):
        fields = dict(run="w", rank=0, world_size=2, step=step, time_s=100.0 + step, phase="decode", tokens=3,
                      counts_LE=np.full((2, 3), step, dtype=np.int32), instance="i")
        broken = draw(st.one_of(st.none(), st.sampled_from(sorted(bad_values))))
        if broken is not None:
            fields[broken] = draw(bad_values[broken])
        out.append((core.StepRecord(**fields), broken is None))
    return out


@SETTINGS
@given(records(), st.integers(1, 4))
def test_bad_records_never_hide_the_good_ones(recs, per_batch):
    batches = [Batch(steps=[r for r, _ in recs[i:i + per_batch]]) for i in range(0, len(recs), per_batch)]
    # deadline 0: every step is assembled at the tick that read it (rank 1 never comes)
    watched = WatchedRun(ListSource(batches, _two_layer_meta()), window_steps=64, deadline_s=0.0)
    for _ in batches:
        watched.tick()
    good = [r.step for r, ok in recs if ok]
    shown = [] if watched.window is None else list(watched.window.view("both", [[0, 1, 2]] * 2, 1, now_s=1e9).step_T)
    assert shown == good
    assert watched.bad_records == len(recs) - len(good)
    window = StepWindow(8, 2, 3)
    for rec, ok in recs:  # the window alone: a refused record leaves it as it was
        before = (window.counts_CLE.copy(), window.size, window.head, dict(window._slot_of_step))
        try:
            add_rank(window, rec)
        except ValueError:
            assert not ok or rec.sample_ids_LNK is not None
            after = (window.counts_CLE, window.size, window.head, window._slot_of_step)
            assert np.array_equal(before[0], after[0]) and before[1:] == after[1:]


HOSTILE_SIZES = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
import numpy as np
from moe_monitor import core
from moe_monitor.core.health import decode_health_report

def meta(experts=8, layers=1, slots=None, world=1):
    return {"run": "x", "model_name": "m", "layer_names": ["l"] * layers, "num_experts": experts, "top_k": 1,
            "hidden_size": 1, "moe_intermediate_size": 1, "dtype_bytes": 2, "world_size": world,
            "layout": {"gpus": 1, "nodes": 1, "physical_to_logical_map": [[0] * (slots or 1)] * layers}}

step = {"v": b"1", "run": b"x", "rank": b"0", "world": b"1", "step": b"0", "t": b"1.0", "phase": b"decode",
        "tokens": b"1", "dropped": b"0", "counts": b"\0" * 4}
attempts = [
    (core.decode_meta, json.dumps(meta(10**9))), (core.decode_meta, json.dumps(meta(10**12))),
    (core.decode_meta, json.dumps(meta(8, 2000))), (core.decode_meta, json.dumps(meta(8, 1, 10**5))),
    (core.decode_meta, json.dumps(meta(world=10**9))), (core.decode_meta, " " * (core.MAX_META_BYTES + 1)),
    (core.parse_layout_json, json.dumps({"physical_to_logical_map": [[0] * 70000]})),
    (core.decode_trace_line, json.dumps({"kind": "meta", "meta": meta(10**9)})),
    (core.decode_trace_line, " " * (core.MAX_TRACE_LINE_BYTES + 1)),
    (core.decode_step, {**step, "L": b"1024", "E": b"65536"}), (core.decode_step, {**step, "L": b"1", "E": b"1",
                                                                                "sample": b"", "sample_n": b"1" * 30,
                                                                                "sample_k": b"1"}),
    (core.decode_gpu_sample, {"v": b"1", "rank": b"0", "host": b"h", "t": b"1", "status": b"ok", "reason": b"",
                              "gpus": json.dumps([{"index": 0}] * 100000).encode()}),
    (decode_health_report, b'{"queued": ' + b"1" * 4000 + b"}"),
    (lambda n: core.contiguous_layout(n, n), 10**9), (lambda n: core.Layout(1, 1, [[0]]).validate(1, n), 10**9),
]
for decode, item in attempts:
    try:
        decode(item)
    except ValueError:
        print("refused")
    else:
        raise SystemExit(f"accepted {str(item)[:80]}")
"""


def test_hostile_sizes_decode_in_bounded_memory():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    probe = "import moe_monitor.core, moe_monitor.dashboard.sources.redis; print(open('/proc/self/statm').read().split()[0])"
    base = int(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=True).stdout.split()[0]) * 4096
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(HOSTILE_SIZES), str(base + (160 << 20))],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.split().count("refused") == 15
