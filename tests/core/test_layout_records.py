"""The layout-change record (core/layouts.py): round trips through stream fields and trace lines, and, for any
input, a decoded record within the bounds of core/keys.py or one ValueError, never another exception."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from moe_monitor import core
from tests.core.test_properties_wire import DEEP, HOSTILE_BYTES, field_values, json_values
from tests.support.properties import property_settings

SETTINGS = property_settings()
MAP_LP = np.array([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 2, 3]], dtype=np.int32)  # 2 layers, 4 experts, 6 slots


def _record(**changes) -> core.LayoutRecord:
    fields = dict(run="p", step=5, time_s=1.7e9, layout_LP=MAP_LP, gpus=2, nodes=1, source="engine",
                  rank=1, instance="i-1")
    fields.update(changes)
    return core.LayoutRecord(**fields)


def _as_redis(fields: dict) -> dict:
    """Stream fields as redis-py hands them over: bytes keys and values."""
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def _good_fields() -> dict:
    return _as_redis(core.encode_layout_record(_record()))


def test_round_trip_through_stream_fields_and_a_trace_line():
    rec = _record(source="apply", nodes=2, instance="abc", rank=3, step=123)
    fields = core.encode_layout_record(rec)
    assert set(fields) == set(core.LAYOUT_FIELDS) and fields["v"] == core.SCHEMA_VERSION
    assert (fields["L"], fields["P"]) == (2, 6) and fields["map"] == MAP_LP.astype("<i4").tobytes()
    for decoded in (core.decode_layout_record(_as_redis(fields)), core.decode_layout_record(fields),
                    core.decode_trace_line(core.trace_line("layout", fields))[1]):
        assert isinstance(decoded, core.LayoutRecord)
        assert (decoded.run, decoded.step, decoded.time_s, decoded.gpus, decoded.nodes, decoded.source,
                decoded.rank, decoded.instance) == ("p", 123, 1.7e9, 2, 2, "apply", 3, "abc")
        assert decoded.layout_LP.dtype == np.int32
        np.testing.assert_array_equal(decoded.layout_LP, MAP_LP)
        assert decoded.validate(4) is decoded and decoded.validate(4, num_layers=2) is decoded
    assert core.decode_trace_line(core.trace_line("layout", fields))[0] == "layout" and "layout" in core.TRACE_KINDS


def test_key_and_exports():
    assert core.layouts_key("run-1") == "moe:{run-1}:layouts"
    with pytest.raises(ValueError, match="run name"):
        core.layouts_key("bad name")
    assert core.LAYOUT_SOURCES == ("initial", "engine", "apply")
    for name in ("LayoutRecord", "encode_layout_record", "decode_layout_record", "layouts_key", "LAYOUT_SOURCES"):
        assert name in core.__all__
    assert "moe:R:layouts" in (Path(__file__).parents[2] / "docs" / "wire.md").read_text()


@pytest.mark.parametrize("changes, message", [
    (dict(layout_LP=np.array([[0, 1, 2, 2, 0, 1], [3, 2, 1, 0, 2, 3]])), "layer 0: expert 3 has no slot"),
    (dict(layout_LP=np.array([[0, 1, 2, 3, 4, 1], [3, 2, 1, 0, 2, 3]])), "layer 0: names expert 4, outside 0..3"),
    (dict(gpus=4), "do not split evenly over 4 GPUs"),
    (dict(gpus=2, nodes=3), "multiple of nodes"),
])
def test_validate_needs_every_expert_and_even_splits(changes, message):
    with pytest.raises(ValueError, match=message):
        _record(**changes).validate(4)
    with pytest.raises(ValueError, match="layout has 2 layers, the model has 3"):
        _record().validate(4, num_layers=3)
    with pytest.raises(ValueError, match="2-D"):
        _record(layout_LP=np.arange(4)).validate(4)


@pytest.mark.parametrize("changes, message", [
    (dict(source="eplb"), "unknown layout source"),
    (dict(gpus=4), "do not split evenly"),
    (dict(nodes=4), "do not split evenly over nodes"),
    (dict(step=-1), "below 0"),
    (dict(step=2**62), "not below"),
    (dict(time_s=float("nan")), "not finite"),
    (dict(instance="i" * 300), "longer than 256"),
    (dict(run="bad run"), "run name"),
    (dict(layout_LP=np.array([0, 1])), "2-D"),
    (dict(layout_LP=np.array([[0.5, 1.0]])), "2-D int"),
    (dict(layout_LP=np.array([[-2, 0]])), "expert ids"),
    (dict(layout_LP=np.array([[70000, 0]])), "expert ids"),
    (dict(layout_LP=np.zeros((0, 2), dtype=np.int32)), "below 1"),
])
def test_encode_refuses_what_a_reader_would_refuse(changes, message):
    with pytest.raises(ValueError, match=message):
        core.encode_layout_record(_record(**changes))


@pytest.mark.parametrize("changes, message", [
    ({b"v": b"2"}, "schema version 2"),
    ({b"L": b"1025"}, "not below 1025"),
    ({b"P": b"65537"}, "not below 65537"),
    ({b"L": b"1024", b"P": b"65536"}, "exceeds"),
    ({b"map": b"\0" * 8}, "expected 2x6 int32"),
    ({b"map": np.full((2, 6), -2, "<i4").tobytes()}, "outside 0..65535"),
    ({b"map": np.full((2, 6), 65536, "<i4").tobytes()}, "outside 0..65535"),
    ({b"gpus": b"4"}, "do not split evenly over gpus=4"),
    ({b"gpus": b"0"}, "below 1"),
    ({b"nodes": b"4"}, "do not split evenly over nodes=4"),
    ({b"source": b"rebalance"}, "unknown layout source"),
    ({b"step": str(2**62).encode()}, "not below"),
    ({b"t": b"inf"}, "not finite"),
    ({b"rank": b"65536"}, "not below 65536"),
    ({b"inst": b"x" * 300}, "longer than 256"),
    ({b"run": b"a b"}, "run name"),
])
def test_decode_refuses_fields_beyond_the_bounds(changes, message):
    fields = _good_fields()
    fields.update(changes)
    with pytest.raises(ValueError, match=message):
        core.decode_layout_record(fields)


@pytest.mark.parametrize("name", [n for n in core.LAYOUT_FIELDS if n != "inst"])
def test_decode_names_a_missing_field(name):
    with pytest.raises(ValueError, match=f"missing field '{name}'"):
        core.decode_layout_record({k: v for k, v in _good_fields().items() if k != name.encode()})
    assert core.decode_layout_record({k: v for k, v in _good_fields().items() if k != b"inst"}).instance == ""


def _check_layout(fields) -> None:
    try:
        rec = core.decode_layout_record(fields)
    except ValueError:
        return
    num_layers, num_slots = rec.layout_LP.shape
    assert 1 <= num_layers <= core.MAX_LAYERS and 1 <= num_slots <= core.MAX_SLOTS
    assert num_layers * num_slots <= core.MAX_CELLS and rec.layout_LP.dtype == np.int32
    assert rec.layout_LP.min() >= -1 and rec.layout_LP.max() < core.MAX_EXPERTS  # -1: an unused slot
    assert num_slots % rec.gpus == 0 and rec.gpus % rec.nodes == 0 and rec.source in core.LAYOUT_SOURCES
    assert 0 <= rec.step < core.MAX_STEP and 0 <= rec.rank < core.MAX_WORLD and abs(rec.time_s) < core.MAX_TIME_S
    assert len(rec.instance) <= core.MAX_NAME_CHARS
    for experts in (1, 4, 7):
        with contextlib.suppress(ValueError):
            rec.validate(experts)


LAYOUT_NAMES = list(core.LAYOUT_FIELDS)


@SETTINGS
@given(st.dictionaries(st.one_of(st.binary(max_size=8), st.text(max_size=8), st.sampled_from(LAYOUT_NAMES),
                                 st.sampled_from([n.encode() for n in LAYOUT_NAMES])), field_values, max_size=14))
def test_decode_layout_record_of_arbitrary_fields(fields):
    _check_layout(fields)


@SETTINGS
@given(st.dictionaries(st.sampled_from(LAYOUT_NAMES), st.one_of(field_values, st.binary(min_size=40, max_size=56)),
                       min_size=1, max_size=4), st.booleans())
@example({"L": "1024", "P": "1024"}, False)
@example({"P": "3", "map": b"\0" * 24}, False)
@example({"gpus": "3"}, True)
@example({"map": b"\xff" * 48}, False)
@example({"step": str(2**62 - 1)}, True)
def test_decode_a_good_layout_record_with_hostile_fields(changes, text_keys):
    fields = _good_fields()
    if text_keys:  # a trace line's fields: text keys
        fields = {k.decode(): v for k, v in fields.items()}
    for name, value in changes.items():
        fields[name if text_keys else name.encode()] = value
    _check_layout(fields)


@SETTINGS
@given(st.one_of(
    json_values.map(lambda v: json.dumps({"kind": "layout", "map_b64": v})),
    st.dictionaries(st.sampled_from([*LAYOUT_NAMES, "map_b64"]), st.one_of(json_values, st.text(max_size=20)),
                    max_size=8).map(lambda f: json.dumps({"kind": "layout", **f})),
))
@example('{"kind": "layout", "map_b64": ' + DEEP + "}")
@example('{"kind": "layout", "map_b64": "\u00e9"}')
def test_decode_layout_trace_lines(line):
    with contextlib.suppress(ValueError):
        kind, rec = core.decode_trace_line(line)
        assert kind == "layout" and isinstance(rec, core.LayoutRecord)


@st.composite
def layouts(draw):
    """(map [L, P] holding every expert of E, E, gpus, nodes)."""
    num_layers, num_experts = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    gpus = draw(st.sampled_from([g for g in (1, 2, 3, 4, 6) if g <= num_experts + 6]))
    num_slots = -(-num_experts // gpus) * gpus + gpus * draw(st.integers(0, 1))
    rows = []
    for _ in range(num_layers):
        row = list(range(num_experts)) + draw(st.lists(st.integers(0, num_experts - 1), min_size=num_slots - num_experts,
                                                       max_size=num_slots - num_experts))
        rows.append(draw(st.permutations(row)))
    nodes = draw(st.sampled_from([n for n in (1, 2, 3) if gpus % n == 0]))
    return np.array(rows, dtype=np.int32), num_experts, gpus, nodes


@SETTINGS
@given(layouts(), st.integers(0, 2**62 - 1), st.sampled_from(core.LAYOUT_SOURCES))
def test_every_valid_layout_round_trips(layout, step, source):
    map_LP, num_experts, gpus, nodes = layout
    rec = core.LayoutRecord(run="r", step=step, time_s=12.5, layout_LP=map_LP, gpus=gpus, nodes=nodes,
                            source=source)
    fields = core.encode_layout_record(rec)
    for decoded in (core.decode_layout_record(_as_redis(fields)),
                    core.decode_trace_line(core.trace_line("layout", fields))[1]):
        np.testing.assert_array_equal(decoded.layout_LP, map_LP)
        assert (decoded.step, decoded.gpus, decoded.nodes, decoded.source) == (step, gpus, nodes, source)
        decoded.validate(num_experts, num_layers=map_LP.shape[0])
        if num_experts > 1:  # one expert fewer: the largest id is then out of range
            with pytest.raises(ValueError, match="every expert"):
                decoded.validate(num_experts - 1)


@SETTINGS
@given(st.lists(st.lists(st.one_of(st.integers(-3, 9), st.sampled_from([2**31 - 1, 2**40])), min_size=1,
                         max_size=6), min_size=1, max_size=3), st.integers(-1, 7), st.integers(-1, 4))
def test_validate_of_arbitrary_maps(rows, experts, gpus):
    width = min(map(len, rows))
    map_LP = np.array([row[:width] for row in rows], dtype=np.int64)
    rec = core.LayoutRecord(run="r", step=0, time_s=0.0, layout_LP=map_LP, gpus=gpus)
    try:
        rec.validate(experts)
    except ValueError:
        return
    assert all(sorted(set(row)) == list(range(experts)) for row in map_LP.tolist())
    assert width % gpus == 0


def test_an_unused_slot_decodes_and_only_readers_that_score_it_take_it():
    """vLLM's -1 (an unused slot) travels; validate() refuses it unless the reader scores it (unused=True)."""
    rec = core.LayoutRecord(run="r", step=3, time_s=1.0, layout_LP=np.array([[0, 1, -1, 2]], dtype=np.int32), gpus=2)
    back = core.decode_layout_record(core.encode_layout_record(rec))
    np.testing.assert_array_equal(back.layout_LP, rec.layout_LP)
    with pytest.raises(ValueError, match="unused"):
        back.validate(3)
    assert back.validate(3, unused=True) is back
    with pytest.raises(ValueError, match="expert 3 has no slot"):
        back.validate(4, unused=True)


def test_hostile_sizes_are_refused_before_reading_the_map():
    fields = _good_fields()
    fields.update({b"L": b"1024", b"P": b"65536", b"map": b""})
    with pytest.raises(ValueError, match="exceeds 1048576 cells"):
        core.decode_layout_record(fields)
    fields.update({b"L": b"1", b"P": b"1", b"map": HOSTILE_BYTES[7]})
    with pytest.raises(ValueError, match="expected 1x1 int32"):
        core.decode_layout_record(fields)
