"""Compact step records (core/compact.py): the narrowest type that holds the counts, zstd where it pays, and
a decoder that refuses every payload that is not exactly the declared cells (no decompression bomb)."""
from __future__ import annotations

import numpy as np
import pytest
import zstandard

from moe_monitor import core


def _record(counts: np.ndarray) -> core.StepRecord:
    return core.StepRecord(run="c", rank=0, world_size=1, step=3, time_s=1.7e9, phase="decode",
                           tokens=64, counts_LE=counts)


@pytest.mark.parametrize("top, type_name", [(0, "u1"), (255, "u1"), (256, "u2"), (65535, "u2"), (65536, "i4"),
                                            (2**31 - 1, "i4")])
def test_the_narrowest_type_that_holds_the_counts_is_chosen_and_round_trips(top, type_name):
    rng = np.random.default_rng(top)
    counts = rng.integers(0, top + 1, size=(58, 256)).astype(np.int32)
    counts[7, 9] = top
    fields = core.encode_step(_record(counts))
    assert fields["ct"] == type_name
    back = core.decode_step(fields).counts_LE
    assert back.dtype == np.dtype("<i4") and np.array_equal(back, counts)


def test_decode_shaped_counts_compress_to_a_tenth_of_int32():
    rng = np.random.default_rng(0)
    popularity = rng.dirichlet(np.full(256, 0.3), size=58)
    counts = np.stack([np.bincount(rng.choice(256, 64 * 8, p=p), minlength=256) for p in popularity]).astype(np.int32)
    fields = core.encode_step(_record(counts))
    assert fields["cz"] == "zstd" and len(fields["counts"]) < 58 * 256 * 4 / 8
    assert np.array_equal(core.decode_step(fields).counts_LE, counts)


def test_noise_that_does_not_compress_goes_raw():
    counts = np.random.default_rng(1).integers(0, 256, size=(4, 64)).astype(np.int32)
    fields = core.encode_step(_record(counts))
    assert (fields["ct"], fields["cz"], len(fields["counts"])) == ("u1", "raw", 4 * 64)


def test_a_frame_that_declares_more_than_the_cells_is_refused_before_decompressing():
    counts = np.zeros((2, 3), np.int32)
    fields = core.encode_step(_record(counts))
    bomb = zstandard.ZstdCompressor().compress(bytes(1 << 24))  # 16 MiB of zeros in a few hundred bytes
    fields.update(cz="zstd", counts=bomb)
    with pytest.raises(ValueError, match="declare 16777216 bytes, expected 6"):
        core.decode_step(fields)
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(6))
    fields.update(counts=no_size)
    with pytest.raises(ValueError, match="declare"):
        core.decode_step(fields)


def test_a_truncated_frame_is_one_value_error():
    counts = np.random.default_rng(2).integers(0, 3, size=(58, 256)).astype(np.int32)
    fields = core.encode_step(_record(counts))
    assert fields["cz"] == "zstd"
    fields["counts"] = fields["counts"][: len(fields["counts"]) // 2]
    with pytest.raises(ValueError, match="decompress"):
        core.decode_step(fields)


def test_pack_counts_refuses_negative_and_oversized_values():
    with pytest.raises(ValueError, match="negative"):
        core.pack_counts(np.array([[1, -1]]))
    with pytest.raises(ValueError, match="do not fit i4"):
        core.pack_counts(np.array([[2**31]], dtype=np.int64))
    assert core.pack_counts(np.array([[2**40]], dtype=np.int64), widest="i8")[0] == "i8"


def test_a_batch_packs_each_record_as_it_would_alone():
    """encode_steps reduces the small records of one shape together (compact.pack_many): each record still gets
    the type, codec and bytes pack_counts gives it alone, whatever its neighbours hold."""
    rng = np.random.default_rng(5)
    small = [rng.integers(0, top + 1, size=(2, 8)) for top in (0, 3, 255, 256, 70_000, 9)]
    for counts, top in zip(small, (0, 3, 255, 256, 70_000, 9)):
        counts[1, 5] = top
    records = [_record(c.astype(np.int64 if i % 2 else np.int32)) for i, c in enumerate(small)]
    records.insert(2, _record(np.full((58, 256), 300, dtype=np.int32)))  # above STACK_CELLS
    records.insert(4, _record(rng.integers(0, 3, size=(4, 64)).astype(np.int32)))  # another small shape
    fields = core.encode_steps(records)
    assert [f["ct"] for f in fields] == ["u1", "u1", "u2", "u1", "u1", "u2", "i4", "u1"]
    for rec, got in zip(records, fields):
        assert (got["ct"], got["cz"], got["counts"]) == core.pack_counts(rec.counts_LE)
        assert np.array_equal(core.decode_step(got).counts_LE, rec.counts_LE)
    bad = _record(np.array([[0, -1]], dtype=np.int32))
    with pytest.raises(ValueError, match="negative"):
        core.encode_steps([records[0], bad, records[1]])
