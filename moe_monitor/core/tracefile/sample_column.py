"""The sample column of a batch of the step table, row by row, without expanding it: an .arrows batch holds it
as binary, a .parquet row group is read with it as dictionary<binary> (so a value repeated on many rows is
decoded once, whatever the file's encoding). Lengths come from the offsets; a row's int16 values are copied
out only for a row that is kept (a record owns its sample).

Shape legend: R rows of the batch, D distinct values of a dictionary column.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moe_monitor import core


class SampleColumn:
    """present_R: bool [R], the row has a sample; length_R: int64 [R], its bytes (0 without one)."""

    def __init__(self, column: pa.Array):
        rows = len(column)
        if pa.types.is_dictionary(column.type):
            self._values = column.dictionary
            index_R = column.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            self._values = column
            index_R = np.arange(rows, dtype=np.int64)
        valid_D = self._values.is_valid().to_numpy(zero_copy_only=False)
        length_D = pc.binary_length(self._values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        ok_R = index_R >= 0
        safe_R = np.where(ok_R, index_R, 0)
        self._index_R = index_R
        self.present_R = ok_R & column.is_valid().to_numpy(zero_copy_only=False) & (
            valid_D[safe_R] if len(valid_D) else np.zeros(rows, dtype=bool))
        self.length_R = np.where(self.present_R, length_D[safe_R] if len(length_D) else 0, 0).astype(np.int64)

    def any(self) -> bool:
        return bool(self.present_R.any())

    def ids(self, r: int, num_layers: int, tokens: int, top_k: int) -> np.ndarray:
        """int16 [L, N, K] of row r (a copy; the caller checked that the row's length is L*N*K*2)."""
        value = self._values[int(self._index_R[r])].as_buffer()
        return np.frombuffer(value, dtype=core.SAMPLE_DTYPE).reshape(num_layers, tokens, top_k).copy()
