"""Hostile trace and dump files, built for real with pyarrow and torch (no mocks): each is small on disk and
decodes to far more than its size. The bound tests open them in a child process and measure its peak memory
(tests/core/test_tracefile_bounds.py); the upload tests hand them to the dashboard's upload
(tests/dashboard/test_upload_sandbox.py).

Shape legend: R rows, L layers, E experts, N sampled tokens, K top-k, T buffered steps, P physical slots.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core
from moe_monitor.core.tracefile.schema import schema_metadata, step_schema
from tests.support.synthfill import make_meta


def _dictionary(value: str, rows: int) -> pa.DictionaryArray:
    """A dictionary<string> column of `rows` copies of value (indices all 0)."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array([value]))


def step_rows(schema: pa.Schema, step_R: np.ndarray, world: int = 1, sample: bytes | None = None,
              sample_nk: tuple[int, int] = (0, 0)) -> pa.RecordBatch:
    """A record batch of the step table: one row per entry of step_R (int64 [R]), rank 0 of `world`, zero
    counts, every row holding the same `sample` bytes (with sample_n, sample_k = sample_nk) when given."""
    rows = len(step_R)
    width = schema.field("counts").type.byte_width
    zeros = pa.py_buffer(bytes(rows * width))
    counts = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), rows, [None, zeros])
    if sample is None:
        samples = pa.nulls(rows, pa.binary())
        n = k = pa.nulls(rows, pa.int32())
    else:
        samples = pa.array([sample] * rows, pa.binary())  # one value: a dictionary of one entry in Parquet
        n = pa.array(np.full(rows, sample_nk[0], np.int32))
        k = pa.array(np.full(rows, sample_nk[1], np.int32))
    columns = [pa.array(step_R, pa.int64()), pa.array(np.zeros(rows, np.int32)),
               pa.array(np.full(rows, world, np.int32)), pa.array(1000.0 + step_R.astype(np.float64)),
               _dictionary("decode", rows), pa.array(np.ones(rows, np.int64)), pa.array(np.zeros(rows, np.int64)),
               _dictionary("inst", rows), _dictionary("rank", rows), counts, samples, n, k,
               pa.array(np.full(rows, np.nan))]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def trace_schema(num_layers: int, num_experts: int) -> pa.Schema:
    return step_schema(num_layers, num_experts, schema_metadata(make_meta("hostile", num_layers, num_experts, 1), []))


def zstd_arrows(path: Path, batches: int = 4, rows_per_batch: int = 2048, num_layers: int = 4,
                num_experts: int = 8192) -> int:
    """An .arrows recording whose record batches are zstd-compressed IPC bodies of zero counts: 256 MiB of
    counts per batch by default (2048 rows x 4 x 8192 int32), about 10 KB on disk. Returns the counts bytes."""
    schema = trace_schema(num_layers, num_experts)
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(str(path), schema, options=options) as writer:
        for b in range(batches):
            step_R = np.arange(b * rows_per_batch, (b + 1) * rows_per_batch, dtype=np.int64)
            writer.write_batch(step_rows(schema, step_R))
    return batches * rows_per_batch * num_layers * num_experts * 4


def repeated_step_parquet(path: Path, row_groups: int, rows_per_group: int, num_layers: int = 2,
                          num_experts: int = 8) -> int:
    """A .parquet trace whose every row is step 0 of rank 0 in a world of 1: dictionary / RLE columns of one
    value each, so any number of rows takes almost nothing on disk. Returns the rows."""
    schema = trace_schema(num_layers, num_experts)
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        batch = step_rows(schema, np.zeros(rows_per_group, np.int64))
        for _ in range(row_groups):
            writer.write_table(pa.Table.from_batches([batch]), row_group_size=rows_per_group)
    return row_groups * rows_per_group


def big_sample_parquet(path: Path, steps: int = 600, tokens: int = 65536, top_k: int = 8, num_layers: int = 2,
                       num_experts: int = 8) -> int:
    """A .parquet trace of `steps` well-formed steps, each with the same sample of L x N x K int16 ids (2 MiB
    by default): one dictionary value on disk. Returns the sample bytes of all rows."""
    schema = trace_schema(num_layers, num_experts)
    sample = np.zeros((num_layers, tokens, top_k), core.SAMPLE_DTYPE).tobytes()
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        for first in range(0, steps, 64):
            step_R = np.arange(first, min(steps, first + 64), dtype=np.int64)
            batch = step_rows(schema, step_R, sample=sample, sample_nk=(tokens, top_k))
            writer.write_table(pa.Table.from_batches([batch]), row_group_size=64)
    return steps * len(sample)


def deflated_stat_dump(path: Path, buffered: int = 400, num_layers: int = 61, num_experts: int = 4096) -> int:
    """An SGLang stat dump (torch.save of {"rank", "logical_count" int32 [T, L, E] of zeros}) whose zip
    entries are then deflated: a few hundred KB on disk for 400 MB of storage. Returns the tensor elements."""
    import torch

    plain = path.with_suffix(".plain")
    torch.save({"rank": 0, "logical_count": torch.zeros((buffered, num_layers, num_experts), dtype=torch.int32),
                "average_utilization_rate_over_window": None}, plain)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    plain.unlink()
    return buffered * num_layers * num_experts


def shared_storage_dump(path: Path, records: int = 500, num_layers: int = 61, num_slots: int = 16384) -> int:
    """An SGLang per_pass dump whose every record's global_physical_count is the layout tensor itself (one
    storage, int64 [L, P], P experts each once per layer): the file holds it once, a parser that copies each
    record's counts makes `records` copies. Returns the tensor elements a parser would copy."""
    import torch

    layout_LP = torch.arange(num_slots, dtype=torch.int64).repeat(num_layers, 1)
    dump = {"records": [{"forward_pass_id": i, "rank": 0, "gatherer_key": "primary",
                         "global_physical_count": layout_LP} for i in range(records)],
            "last_physical_to_logical_map": layout_LP}
    torch.save(dump, path)
    return (records + 1) * num_layers * num_slots


def late_sample_parquet(path: Path, heavy_rows: int = 3, tokens: int = 1 << 20, top_k: int = 32,
                        num_layers: int = 2, num_experts: int = 8) -> int:
    """A .parquet trace whose first step has no sample and whose next heavy_rows steps each hold a sample of
    L x N x K int16 ids (128 MiB by default; zeros, a few KB on disk): a check that reads the first step only
    sees none of them. One row group per step. Returns the sample bytes the rows declare."""
    schema = trace_schema(num_layers, num_experts)
    sample = np.zeros((num_layers, tokens, top_k), core.SAMPLE_DTYPE).tobytes()
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        writer.write_table(pa.Table.from_batches([step_rows(schema, np.zeros(1, np.int64))]))
        for step in range(1, heavy_rows + 1):
            batch = step_rows(schema, np.array([step], np.int64), sample=sample, sample_nk=(tokens, top_k))
            writer.write_table(pa.Table.from_batches([batch]))
    return heavy_rows * len(sample)


def late_sample_arrows(path: Path, heavy_rows: int = 3, tokens: int = 1 << 20, top_k: int = 32,
                       num_layers: int = 2, num_experts: int = 8) -> int:
    """late_sample_parquet as an .arrows recording (zstd-compressed IPC bodies, one record batch per step)."""
    schema = trace_schema(num_layers, num_experts)
    sample = np.zeros((num_layers, tokens, top_k), core.SAMPLE_DTYPE).tobytes()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(str(path), schema, options=options) as writer:
        writer.write_batch(step_rows(schema, np.zeros(1, np.int64)))
        for step in range(1, heavy_rows + 1):
            writer.write_batch(step_rows(schema, np.array([step], np.int64), sample=sample, sample_nk=(tokens, top_k)))
    return heavy_rows * len(sample)
