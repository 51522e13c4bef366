"""The wire format: round trips, and one clear ValueError for every kind of malformed entry."""
from __future__ import annotations

import json

import numpy as np
import pytest

from moe_monitor import core


def _record(**over):
    base = dict(run="r1", rank=1, world_size=2, step=7, time_s=1.5e9, phase="decode", tokens=3,
                counts_LE=np.array([[1, 0, 2], [0, 3, 0]]), dropped_steps=4,
                sample_ids_LNK=np.array([[[0, 2]], [[1, -1]]]))
    base.update(over)
    return core.StepRecord(**base)


def _bytes_keys(fields):  # what redis-py hands back
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def test_step_round_trip_through_redis_shaped_fields():
    assert core.decode_step(_bytes_keys(core.encode_step(_record(instance="abc-1")))).instance == "abc-1"
    rec = core.decode_step(_bytes_keys(core.encode_step(_record())))
    assert (rec.run, rec.rank, rec.world_size, rec.step, rec.phase, rec.tokens, rec.dropped_steps) == \
        ("r1", 1, 2, 7, "decode", 3, 4)
    assert rec.counts_LE.dtype == np.dtype("<i4") and rec.counts_LE.tolist() == [[1, 0, 2], [0, 3, 0]]
    assert rec.sample_ids_LNK.tolist() == [[[0, 2]], [[1, -1]]]
    fields = core.encode_step(_record())
    assert (fields["v"], fields["ct"], fields["cz"], len(fields["counts"])) == (2, "u1", "raw", 2 * 3)  # uint8 bytes


def test_version_one_entries_are_still_read():
    """Version 1 (written before 0.3, no longer): raw little-endian int32 counts, no "ct" or "cz"."""
    old = {b"v": b"1", b"run": b"r1", b"inst": b"abc-1", b"rank": b"1", b"world": b"2", b"step": b"7",
           b"t": b"1500000000.0", b"phase": b"decode", b"tokens": b"3", b"L": b"2", b"E": b"3",
           b"counts": np.array([[1, 0, 2], [0, 3, 0]], "<i4").tobytes(), b"dropped": b"4",
           b"sample_n": b"1", b"sample_k": b"2", b"sample": np.array([0, 2, 1, -1], "<i2").tobytes()}
    rec = core.decode_step(old)
    assert (rec.run, rec.instance, rec.rank, rec.world_size, rec.step, rec.time_s, rec.phase, rec.tokens,
            rec.dropped_steps) == ("r1", "abc-1", 1, 2, 7, 1.5e9, "decode", 3, 4)
    assert rec.counts_LE.dtype == np.dtype("<i4") and rec.counts_LE.tolist() == [[1, 0, 2], [0, 3, 0]]
    assert rec.sample_ids_LNK.tolist() == [[[0, 2]], [[1, -1]]]
    with pytest.raises(ValueError, match="expected 2x3 int32"):
        core.decode_step({**old, b"counts": old[b"counts"][:-1]})


@pytest.mark.parametrize("mutate, message", [
    (lambda f: f.update({b"v": b"99"}), "schema version 99"),
    (lambda f: f.pop(b"counts"), "missing field 'counts'"),
    (lambda f: f.update({b"counts": f[b"counts"][:-1]}), "expected 2x3 u1"),
    (lambda f: f.update({b"ct": b"i4", b"counts": np.array([1, -5, 0, 0, 0, 0], "<i4").tobytes()}), "negative"),
    (lambda f: f.update({b"ct": b"f4"}), "unknown counts type 'f4'"),
    (lambda f: f.update({b"ct": b"i8", b"counts": bytes(48)}), "not i8"),
    (lambda f: f.update({b"cz": b"gzip"}), "unknown counts codec 'gzip'"),
    (lambda f: f.update({b"cz": b"zstd"}), "not a zstd frame"),
    (lambda f: f.update({b"v": b"1"}), "expected 2x3 int32"),
    (lambda f: f.update({b"phase": b"warmup"}), "unknown phase"),
    (lambda f: f.update({b"L": b"x"}), "not an integer"),
    (lambda f: f.update({b"rank": b"2"}), "rank 2 is not below world size 2"),
    (lambda f: f.update({b"sample": np.array([0, 9, 1, 1], "<i2").tobytes()}), "outside"),
    (lambda f: f.update({b"t": b"nan"}), "not finite"),
    (lambda f: f.update({b"run": b"bad name!"}), "run name"),
])
def test_malformed_step_entries_raise_one_clear_error(mutate, message):
    fields = _bytes_keys(core.encode_step(_record()))
    mutate(fields)
    with pytest.raises(ValueError, match=message):
        core.decode_step(fields)


def test_meta_round_trip_and_bad_layouts():
    layout = core.Layout(gpus=2, nodes=1, physical_to_logical_map=[[0, 1, 2, 0], [2, 1, 0, 1]])
    meta = core.RunMeta(run="m", model_name="x", layer_names=["a", "b"], num_experts=3, top_k=2,
                        hidden_size=8, moe_intermediate_size=4, dtype_bytes=2, layout=layout)
    back = core.decode_meta(core.encode_meta(meta))
    assert back.layout.physical_to_logical_map == layout.physical_to_logical_map and back.top_k == 2
    with pytest.raises(ValueError, match="every expert"):
        core.Layout(2, 1, [[0, 1, 1, 1]]).validate(1, 3)
    with pytest.raises(ValueError, match="split evenly"):
        core.Layout(2, 1, [[0, 1, 2]]).validate(1, 3)
    with pytest.raises(ValueError, match="not JSON"):
        core.decode_meta("{not json")
    good = json.loads(core.encode_meta(meta))
    for field, value in (("layer_names", 5), ("num_experts", "3"), ("top_k", True), ("started_s", "x")):
        with pytest.raises(ValueError, match=field):
            core.decode_meta(json.dumps({**good, field: value}))
    for layout in ({"gpus": "2", "nodes": 1, "physical_to_logical_map": [[0, 1, 2, 0]] * 2},
                   {"gpus": 2, "nodes": 1, "physical_to_logical_map": [[[0], 1, 2, 0]] * 2}, []):
        with pytest.raises(ValueError, match="layout"):
            core.decode_meta(json.dumps({**good, "layout": layout}))
    with pytest.raises(ValueError, match="unknown field"):
        core.decode_meta(json.dumps({**good, "evil": 1}))


def test_gpu_sample_round_trip_keeps_missing_values_missing():
    sample = core.GpuSample(0, "h", 1.0, "ok", [{"index": 0, "name": "H200", "power_usage_w": None,
                                                  "gpu_utilization_percent": 87}])
    back = core.decode_gpu_sample(_bytes_keys(core.encode_gpu_sample(sample)))
    assert back.gpus[0]["gpu_utilization_percent"] == 87 and back.gpus[0]["power_usage_w"] is None
    assert set(back.gpus[0]) == set(core.GPU_FIELDS)
    with pytest.raises(ValueError, match="unknown GPU status"):
        core.decode_gpu_sample({**_bytes_keys(core.encode_gpu_sample(sample)), b"status": b"melted"})
    fields = _bytes_keys(core.encode_gpu_sample(sample))
    for gpu in ({"index": 0, "power_usage_w": "x"}, {"index": 0, "temperature_c": -3},
                {"index": 0.5}, {"name": "no index"}, {"index": 0, "name": 7}):
        with pytest.raises(ValueError, match="GPU"):
            core.decode_gpu_sample({**fields, b"gpus": json.dumps([gpu]).encode()})
    with pytest.raises(ValueError, match="not finite"):
        core.decode_gpu_sample({**fields, b"t": b"nan"})


def test_trace_lines_round_trip_and_reject_garbage():
    kind, fields = core.parse_trace_line(core.trace_line("step", core.encode_step(_record())))
    assert kind == "step" and core.decode_step(fields).counts_LE.tolist() == [[1, 0, 2], [0, 3, 0]]
    for bad in ("not json", '{"kind": "pickle"}', '{"kind": "step", "counts_b64": "@@@"}'):
        with pytest.raises(ValueError):
            core.parse_trace_line(bad)


def test_stream_length_budget():
    assert core.maxlen_for_budget(256 << 20, 58, 256) == (256 << 20) // (58 * 256 * 4 + 200)
    assert core.maxlen_for_budget(1, 58, 256) == 100
