"""What the row groups of a .parquet trace decode to, from the file's metadata, before any page is read:
the reader decodes the step columns (schema.STEP_COLUMNS) only, each row group as a table.

Per column chunk of a row group of R rows: a fixed-width column decodes to R x its width (plus validity),
whatever its encoding (dictionary and RLE pages of one repeated value take almost nothing on disk and decode
to the full R x width all the same); a dictionary column (phase, instance, scope, and the sample column,
which the reader reads as a dictionary) decodes to its int32 indices and at most the chunk's declared
uncompressed size of values. The sample column is counted a second time at the size its rows declare
(sample_n x sample_k x L int16 each: what their records hold once decoded), computed from the small sample_n
/ sample_k columns (sample_bytes_R).

Shape legend: R rows, G row groups.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core

from .schema import STEP_COLUMNS


def group_bytes_G(metadata: pq.FileMetaData, schema: pa.Schema) -> np.ndarray:
    """int64 [G]: bytes the step columns of each row group decode to; ValueError for a row group or column
    chunk declaring negative sizes."""
    out = np.zeros(metadata.num_row_groups, dtype=np.int64)
    wanted = set(STEP_COLUMNS)
    for group in range(metadata.num_row_groups):
        info = metadata.row_group(group)
        rows = info.num_rows
        if rows < 0:
            raise ValueError(f"row group {group} declares {rows} rows")
        total = 0
        for j in range(info.num_columns):
            chunk = info.column(j)
            name = chunk.path_in_schema
            if name not in wanted:
                continue
            kind = schema.field(name).type
            if pa.types.is_dictionary(kind) or not _fixed_width(kind):
                if chunk.total_uncompressed_size < 0:
                    raise ValueError(f"row group {group} column {name} declares {chunk.total_uncompressed_size} bytes")
                total += rows * 4 + chunk.total_uncompressed_size
            else:
                total += rows * kind.byte_width + (rows + 7) // 8
        out[group] = total
    return out


def _fixed_width(kind: pa.DataType) -> bool:
    try:
        return kind.byte_width > 0
    except ValueError:
        return False


def sample_bytes_R(num_layers: int, sample_n: pa.ChunkedArray, sample_k: pa.ChunkedArray) -> np.ndarray:
    """int64 [R]: the sample bytes each row declares, L x sample_n x sample_k x 2 (0 where either is null;
    each clipped to its bound, core/keys.py: a row beyond them is a bad record, its sample never decoded)."""
    n = np.clip(sample_n.fill_null(0).to_numpy().astype(np.int64), 0, core.MAX_CELLS)
    k = np.clip(sample_k.fill_null(0).to_numpy().astype(np.int64), 0, core.MAX_EXPERTS)
    return num_layers * n * k * core.SAMPLE_DTYPE.itemsize


def per_group(values_R: np.ndarray, rows_G: np.ndarray) -> np.ndarray:
    """int64 [G]: values_R summed over the rows of each row group (rows in row-group order)."""
    ends = np.cumsum(rows_G)
    totals = np.concatenate([[0], np.cumsum(values_R, dtype=np.int64)])
    return totals[ends] - totals[ends - rows_G]
