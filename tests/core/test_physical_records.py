"""The physical-count record (core/physical.py): round trips through stream fields, every refusal one ValueError,
and the per-step sum of a step's ranks into GPU loads."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from moe_monitor import core
from moe_monitor.core.runwrite import PHYSICAL_MAXLEN_MIN, physical_maxlen
from tests.core.test_properties_wire import field_values
from tests.support.properties import property_settings

SETTINGS = property_settings()

COUNTS_LP = np.array([[5, 0, 3, 2, 1, 7], [0, 0, 4, 4, 9, 1]], dtype=np.int32)  # 2 layers, 6 slots


def _record(**changes) -> core.PhysicalRecord:
    fields = dict(run="p", step=5, rank=1, time_s=1.7e9, counts_LP=COUNTS_LP, gpus=3, instance="i-1",
                  source="sglang")
    fields.update(changes)
    return core.PhysicalRecord(**fields)


def _as_redis(fields: dict) -> dict:
    """Stream fields as redis-py hands them over: bytes keys and values."""
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def test_round_trip_through_stream_fields():
    fields = core.encode_physical(_record())
    assert set(fields) == set(core.PHYSICAL_FIELDS) and fields["v"] == core.SCHEMA_VERSION
    assert (fields["L"], fields["P"], fields["gpus"]) == (2, 6, 3)
    assert fields["counts"] == COUNTS_LP.astype("<i4").tobytes()
    for decoded in (core.decode_physical(fields), core.decode_physical(_as_redis(fields))):
        assert (decoded.run, decoded.step, decoded.rank, decoded.time_s, decoded.gpus, decoded.instance,
                decoded.source) == ("p", 5, 1, 1.7e9, 3, "i-1", "sglang")
        assert decoded.counts_LP.dtype == np.int32
        np.testing.assert_array_equal(decoded.counts_LP, COUNTS_LP)
        np.testing.assert_array_equal(decoded.gpu_loads(), [[5, 5, 8], [0, 8, 10]])


def test_key_exports_and_docstring():
    assert core.physical_key("run-1") == "moe:{run-1}:physical"
    with pytest.raises(ValueError, match="run name"):
        core.physical_key("bad name")
    for name in ("PhysicalRecord", "encode_physical", "decode_physical", "physical_key", "PHYSICAL_FIELDS",
                 "PHYSICAL_SOURCES", "measured_gpu_loads"):
        assert name in core.__all__
    assert "moe:R:physical" in (Path(__file__).parents[2] / "docs" / "wire.md").read_text()


def test_integer_like_inputs_are_taken():
    for counts in (COUNTS_LP.astype(np.int64), COUNTS_LP.astype(np.float64), COUNTS_LP.tolist()):
        np.testing.assert_array_equal(core.decode_physical(core.encode_physical(_record(counts_LP=counts))).counts_LP,
                                      COUNTS_LP)


@pytest.mark.parametrize("changes, message", [
    (dict(counts_LP=-COUNTS_LP), "negative"),
    (dict(counts_LP=COUNTS_LP[0]), "2-D"),
    (dict(counts_LP=np.zeros((2, 0), dtype=np.int32)), "2-D"),
    (dict(counts_LP=COUNTS_LP + 0.5), "whole numbers"),
    (dict(counts_LP=np.where(COUNTS_LP > 4, np.nan, COUNTS_LP)), "whole numbers"),
    (dict(counts_LP=COUNTS_LP.astype(np.int64) << 31), "exceeds int32"),
    (dict(counts_LP=np.array([["a"] * 6] * 2)), "number array"),
    (dict(counts_LP=np.zeros((core.MAX_LAYERS + 1, 6), dtype=np.int32)), "outside"),
    (dict(counts_LP=np.zeros((1024, 2048), dtype=np.int32), gpus=1), "exceed"),
    (dict(gpus=4), "do not split evenly"),
    (dict(gpus=0), "do not split evenly"),
    (dict(gpus=True), "do not split evenly"),
    (dict(source="eplb"), "unknown physical-count source"),
    (dict(step=-1), "below 0"),
    (dict(step=core.MAX_STEP), "not below"),
    (dict(rank=core.MAX_WORLD), "not below"),
    (dict(time_s=float("inf")), "not finite"),
    (dict(run="bad name"), "run name"),
    (dict(instance="x" * (core.MAX_NAME_CHARS + 1)), "instance id"),
])
def test_encode_refuses_what_decode_would(changes, message):
    with pytest.raises(ValueError, match=message):
        core.encode_physical(_record(**changes))


def _tampered(**changes) -> dict:
    fields = _as_redis(core.encode_physical(_record()))
    for key, value in changes.items():
        if value is None:
            del fields[key.encode()]
        else:
            fields[key.encode()] = value
    return fields


@pytest.mark.parametrize("changes, message", [
    (dict(v=b"9"), "schema version"),
    (dict(counts=None), "missing field 'counts'"),
    (dict(counts=b"\x00" * 47), "47 bytes"),
    (dict(counts="text"), "must be bytes"),
    (dict(counts=(-COUNTS_LP).astype("<i4").tobytes()), "negative"),
    (dict(L=b"0"), "below 1"),
    (dict(L=b"3"), "bytes, expected 3x6"),
    (dict(P=str(core.MAX_SLOTS + 1).encode()), "not below"),
    (dict(L=b"1024", P=b"2048", gpus=b"1"), "exceed"),
    (dict(gpus=b"4"), "do not split evenly"),
    (dict(gpus=b"7"), "do not split evenly"),
    (dict(source=b"eplb"), "unknown physical-count source"),
    (dict(source=b"\xff"), "UTF-8"),
    (dict(step=b"-3"), "below 0"),
    (dict(rank=b"x"), "not an integer"),
    (dict(t=b"nan"), "not finite"),
    (dict(run=b"a b"), "run name"),
])
def test_decode_refuses_malformed_entries_with_one_value_error(changes, message):
    with pytest.raises(ValueError, match=message):
        core.decode_physical(_tampered(**changes))


def test_a_step_sums_its_ranks_per_gpu():
    other = _record(rank=0, counts_LP=np.ones((2, 6), dtype=np.int32))
    np.testing.assert_array_equal(core.measured_gpu_loads([_record(), other]), [[7, 7, 10], [2, 10, 12]])
    with pytest.raises(ValueError, match="no physical records"):
        core.measured_gpu_loads([])
    with pytest.raises(ValueError, match="disagree"):
        core.measured_gpu_loads([_record(), _record(gpus=2)])


def test_the_stream_is_bounded_by_its_budget():
    assert physical_maxlen(64 << 20, 58, 288) == (64 << 20) // (58 * 288 * 4 + 200)
    assert 900 < physical_maxlen(64 << 20, 58, 288) < 1100
    assert physical_maxlen(1, 58, 288) == PHYSICAL_MAXLEN_MIN


@SETTINGS
@given(st.dictionaries(st.sampled_from(core.PHYSICAL_FIELDS), st.one_of(field_values, st.binary(min_size=44, max_size=52)),
                       min_size=1, max_size=4), st.booleans())
@example({"L": "1024", "P": "1024"}, False)
@example({"counts": b"\xff" * 48}, False)
@example({"gpus": "6", "P": "6"}, True)
@example({"step": str(2**62 - 1)}, True)
def test_any_entry_decodes_within_bounds_or_is_one_value_error(changes, text_keys):
    fields = _as_redis(core.encode_physical(_record()))
    if text_keys:  # text keys, as a client that decodes responses hands them over
        fields = {k.decode(): v for k, v in fields.items()}
    for name, value in changes.items():
        fields[name if text_keys else name.encode()] = value
    try:
        rec = core.decode_physical(fields)
    except ValueError:
        return
    num_layers, num_slots = rec.counts_LP.shape
    assert 1 <= num_layers <= core.MAX_LAYERS and 1 <= num_slots <= core.MAX_SLOTS
    assert num_layers * num_slots <= core.MAX_CELLS and rec.counts_LP.dtype == np.int32 and rec.counts_LP.min() >= 0
    assert num_slots % rec.gpus == 0 and rec.source in core.PHYSICAL_SOURCES and len(rec.instance) <= core.MAX_NAME_CHARS
    assert 0 <= rec.step < core.MAX_STEP and 0 <= rec.rank < core.MAX_WORLD and abs(rec.time_s) < core.MAX_TIME_S
    assert rec.gpu_loads().sum() == rec.counts_LP.astype(np.int64).sum()
