"""How many rows one step of a columnar trace may hold: at most its world size per collector instance, of at
most MAX_INSTANCES_PER_STEP instances. A recorder writes one row per (step, rank) of each instance (a
restarted collector numbers its steps again under a new instance id, so a step id may come back from another
instance); a step with more rows is not a recording but a file built to make a reader decode and dedupe
rows without end, and the whole file is refused with one ValueError, before any counts are read.

Shape legend: R rows, T distinct steps.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

MAX_INSTANCES_PER_STEP = 64


def _ints(column: pa.ChunkedArray) -> np.ndarray:
    return column.fill_null(-1).to_numpy().astype(np.int64, copy=False)


def instance_codes(column: pa.ChunkedArray) -> np.ndarray:
    """int64 [R]: one code per distinct collector instance id (-1 for a null) of a dictionary<string>
    column, its chunks' dictionaries unified first."""
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    unified = pa.chunked_array(column.chunks, type=column.type).unify_dictionaries()
    parts = [chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) for chunk in unified.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def check_rows_per_step(table: pa.Table) -> None:
    """ValueError naming the first step (by id) whose rows break the bound; table: the step, world and
    instance columns of every row of the trace."""
    step_R, world_R = _ints(table["step"]), _ints(table["world"])
    if not len(step_R):
        return
    code_R = instance_codes(table["instance"])
    order = np.lexsort((code_R, step_R))
    step_R, code_R, world_R = step_R[order], code_R[order], world_R[order]
    new_step_R = np.ones(len(step_R), dtype=bool)
    new_step_R[1:] = step_R[1:] != step_R[:-1]
    new_instance_R = new_step_R.copy()
    new_instance_R[1:] |= code_R[1:] != code_R[:-1]
    first_T = np.flatnonzero(new_step_R)
    rows_T = np.diff(np.append(first_T, len(step_R)))
    instances_T = np.add.reduceat(new_instance_R.astype(np.int64), first_T)
    world_T = np.maximum(np.minimum.reduceat(world_R, first_T), 1)
    bad_T = rows_T > world_T * np.minimum(instances_T, MAX_INSTANCES_PER_STEP)
    if bad_T.any():
        t = int(np.argmax(bad_T))
        raise ValueError(f"step {int(step_R[first_T[t]])} holds {int(rows_T[t])} rows from {int(instances_T[t])} "
                         f"collector instance(s) in a world of {int(world_T[t])}: at most the world size per "
                         f"instance (of at most {MAX_INSTANCES_PER_STEP}) is a trace")
