"""core.StepRecord lists -> record batches of the step table (core/tracefile/schema.py), with each step's
balancedness computed on the way (core/tracefile/balance.py).

A step's balancedness is known when the records handed over together hold every rank of it (world ranks);
otherwise its rows carry NaN (a timeline shows it as unknown). Records must all have counts [L, E] of the
run's shape: ValueError otherwise (a writer never writes what a reader would refuse: every record goes
through core.encode_step's checks first).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from moe_monitor import core

from .balance import LayoutSchedule, step_balancedness, summed_by_step


def _dict_array(values: list[str]) -> pa.DictionaryArray:
    return pa.array(values, pa.string()).dictionary_encode().cast(pa.dictionary(pa.int32(), pa.string()))


def step_batch(records: Sequence[core.StepRecord], schema: pa.Schema, schedule: LayoutSchedule) -> pa.RecordBatch:
    """One record batch (rows in the order given) of the records; ValueError for a record of another shape
    or one core.encode_step refuses."""
    width = schema.field("counts").type.byte_width
    shape = (schedule.num_layers, schedule.num_experts)
    counts_RLE = np.empty((len(records),) + shape, dtype=core.COUNTS_DTYPE)
    samples: list[bytes | None] = []
    sample_n: list[int | None] = []
    sample_k: list[int | None] = []
    for i, rec in enumerate(records):
        core.encode_step(rec)  # the wire's own checks (phase, scope, shapes, sample ids)
        counts = np.asarray(rec.counts_LE)
        if counts.shape != shape:
            raise ValueError(f"step {rec.step} rank {rec.rank}: counts are {list(counts.shape)}, the trace holds "
                             f"{list(shape)} (layers x experts)")
        counts_RLE[i] = counts
        if rec.sample_ids_LNK is None:
            samples.append(None)
            sample_n.append(None)
            sample_k.append(None)
        else:
            sample = np.ascontiguousarray(rec.sample_ids_LNK, dtype=core.SAMPLE_DTYPE)
            samples.append(sample.tobytes())
            sample_n.append(sample.shape[1])
            sample_k.append(sample.shape[2])
    step_R = np.array([rec.step for rec in records], dtype=np.int64)
    eta_R = np.full(len(records), np.nan)
    if len(records):
        steps_T, summed_TLE, row_step_R = summed_by_step(step_R, counts_RLE)
        eta_T = step_balancedness(steps_T, summed_TLE, schedule)
        ranks_T = np.zeros(len(steps_T), dtype=np.int64)
        np.add.at(ranks_T, row_step_R, 1)
        world_T = np.zeros(len(steps_T), dtype=np.int64)
        world_T[row_step_R] = [rec.world_size for rec in records]
        eta_T[ranks_T < world_T] = np.nan  # not every rank of the step here: unknown
        eta_R = eta_T[row_step_R]
    flat = counts_RLE.reshape(len(records), -1).view(np.uint8).reshape(-1)
    counts = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(records), [None, pa.py_buffer(flat)])
    columns = [
        pa.array(step_R, pa.int64()),
        pa.array([rec.rank for rec in records], pa.int32()),
        pa.array([rec.world_size for rec in records], pa.int32()),
        pa.array([float(rec.time_s) for rec in records], pa.float64()),
        _dict_array([rec.phase for rec in records]),
        pa.array([rec.tokens for rec in records], pa.int64()),
        pa.array([rec.dropped_steps for rec in records], pa.int64()),
        _dict_array([rec.instance for rec in records]),
        _dict_array([rec.scope for rec in records]),
        counts,
        pa.array(samples, pa.binary()),
        pa.array(sample_n, pa.int32()),
        pa.array(sample_k, pa.int32()),
        pa.array(eta_R, pa.float64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
