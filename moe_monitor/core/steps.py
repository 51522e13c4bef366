"""StepRecord: one step of one rank, and its stream encoding.

Version 2 (written since 0.3): counts in the narrowest integer type that holds them, zstd-compressed where that
pays (core/compact.py; fields "ct" and "cz"). Version 1 (raw little-endian int32 counts) is still read."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .compact import pack_many, unpack_counts
from .fields import _get, _instance, _int, _raw, _scope, _text, _time, _version
from .keys import (
    COUNTS_DTYPE,
    MAX_CELLS,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_SAMPLE_EXPERTS,
    MAX_STEP,
    MAX_TOKENS,
    MAX_WORLD,
    PHASES,
    SAMPLE_DTYPE,
    SCHEMA_VERSION,
    check_run_name,
)

STEP_VERSION = 2  # what encode_step writes; decode_step reads STEP_VERSIONS (1: raw int32 counts)
STEP_VERSIONS = (SCHEMA_VERSION, STEP_VERSION)

# Whose tokens a step record counts: "rank", the tokens this rank routed (one process, or data-parallel
# attention where every rank has its own); "dp-group", a data-parallel group's tokens published by one of its
# tensor-parallel ranks on behalf of all (they route the same tokens). Either way the reader's sum over the
# run's ranks counts every token once.
SCOPES = ("rank", "dp-group")


@dataclass(frozen=True)
class StepRecord:
    """Expert counts of one step on one rank.

    counts_LE: int32 [L, E] tokens routed to each logical expert in each MoE layer during this step.
    sample_ids_LNK: int16 [L, N, K] top-k expert ids of N sampled tokens per layer (-1 = masked), or None.
    dropped_steps: steps this rank's writer has dropped so far (queue full / Redis down), cumulative.
    instance: the collector process that wrote it (steps restart at 0 when a collector restarts under the
    same run name: a new instance tells the reader to start a new window).
    scope: whose tokens the record counts (SCOPES); travels only when it is not "rank".
    """

    run: str
    rank: int
    world_size: int
    step: int
    time_s: float
    phase: str
    tokens: int
    counts_LE: np.ndarray
    dropped_steps: int = 0
    sample_ids_LNK: np.ndarray | None = None
    instance: str = ""
    scope: str = "rank"


def new_instance_id() -> str:
    """A short id unique to one collector process (time + pid + randomness)."""
    import os
    import secrets
    import time

    return f"{int(time.time()):x}-{os.getpid():x}-{secrets.token_hex(3)}"


def encode_step(rec: StepRecord) -> dict[str, bytes | str | int]:
    """StepRecord -> stream entry fields, version 2 (values redis-py can send as they are)."""
    return encode_steps([rec])[0]


def encode_steps(records: Sequence[StepRecord]) -> list[dict[str, bytes | str | int]]:
    """encode_step of each record, in order, with the counts of a batch packed together (compact.pack_many).
    ValueError when any record is malformed."""
    counts = [_checked_counts(rec) for rec in records]
    out: list[dict[str, bytes | str | int]] = []
    for rec, counts_LE, (type_name, codec, payload) in zip(records, counts, pack_many(counts)):
        scope, sample = _checked_extras(rec, counts_LE)
        fields: dict[str, bytes | str | int] = {
            "v": STEP_VERSION, "run": check_run_name(rec.run), "inst": rec.instance, "rank": int(rec.rank),
            "world": int(rec.world_size), "step": int(rec.step), "t": repr(float(rec.time_s)), "phase": rec.phase,
            "tokens": int(rec.tokens), "L": counts_LE.shape[0], "E": counts_LE.shape[1], "counts": payload,
            "dropped": int(rec.dropped_steps), "ct": type_name, "cz": codec}
        if scope is not None:
            fields["scope"] = scope
        if sample is not None:
            fields.update(sample_n=sample.shape[1], sample_k=sample.shape[2], sample=sample.tobytes())
        out.append(fields)
    return out


def _checked_counts(rec: StepRecord) -> np.ndarray:
    """rec's counts as contiguous int32 [L, E]; ValueError when they are not 2-D or the phase is unknown."""
    counts = np.ascontiguousarray(rec.counts_LE, dtype=COUNTS_DTYPE)
    if counts.ndim != 2:
        raise ValueError(f"counts_LE must be 2-D [layers, experts], got shape {counts.shape}")
    if rec.phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {rec.phase!r}")
    return counts


def _checked_extras(rec: StepRecord, counts: np.ndarray) -> tuple[str | None, np.ndarray | None]:
    """rec's scope where it travels (None for "rank") and its sampled rows as contiguous int16 [L, N, K] (None
    without); ValueError when either is malformed (counts: int32 [L, E])."""
    scope = None
    if rec.scope != "rank":
        if rec.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {rec.scope!r}")
        scope = rec.scope
    if rec.sample_ids_LNK is None:
        return scope, None
    if counts.shape[1] > MAX_SAMPLE_EXPERTS:
        raise ValueError(f"sampled rows need E <= {MAX_SAMPLE_EXPERTS} (int16 ids), got E={counts.shape[1]}")
    sample = np.ascontiguousarray(rec.sample_ids_LNK, dtype=SAMPLE_DTYPE)
    if sample.ndim != 3 or sample.shape[0] != counts.shape[0]:
        raise ValueError(f"sample_ids_LNK must be [L={counts.shape[0]}, N, K], got {sample.shape}")
    return scope, sample


def decode_step(fields: dict) -> StepRecord:
    """Stream entry fields (bytes or str keys) -> StepRecord. Raises ValueError (never another exception) on
    any malformed entry: wrong schema version, missing field, wrong byte length, negative counts, or a number
    outside the bounds in core/keys.py (L <= MAX_LAYERS, E <= MAX_EXPERTS, L x E <= MAX_CELLS, step < MAX_STEP,
    tokens < MAX_TOKENS, rank < world <= MAX_WORLD, |t| < MAX_TIME_S, instance id <= MAX_NAME_CHARS)."""
    version = _version(fields, STEP_VERSIONS)
    num_layers, num_experts = _int(fields, "L", 1, MAX_LAYERS + 1), _int(fields, "E", 1, MAX_EXPERTS + 1)
    if num_layers * num_experts > MAX_CELLS:
        raise ValueError(f"counts of {num_layers}x{num_experts} exceed {MAX_CELLS} cells")
    raw = _raw(fields, "counts")
    if version == SCHEMA_VERSION:
        if len(raw) != num_layers * num_experts * COUNTS_DTYPE.itemsize:
            raise ValueError(f"counts has {len(raw)} bytes, expected {num_layers}x{num_experts} int32")
        counts = np.frombuffer(raw, dtype=COUNTS_DTYPE).reshape(num_layers, num_experts)
    else:
        type_name, codec = _text(fields, "ct", max_chars=8), _text(fields, "cz", max_chars=8)
        if type_name == "i8":
            raise ValueError("a step's counts travel as u1, u2 or i4, not i8")
        counts = unpack_counts(type_name, codec, raw, (num_layers, num_experts))
    if (counts < 0).any():
        raise ValueError("counts contain negative values")
    phase = _text(fields, "phase", max_chars=16)
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    time_s = _time(fields, "t")
    sample = None
    if _get(fields, "sample") is not None:
        n, k = _int(fields, "sample_n", 0, MAX_CELLS + 1), _int(fields, "sample_k", 1, MAX_EXPERTS + 1)
        raw_sample = _raw(fields, "sample")
        if len(raw_sample) != num_layers * n * k * SAMPLE_DTYPE.itemsize:
            raise ValueError(f"sample has {len(raw_sample)} bytes, expected {num_layers}x{n}x{k} int16")
        sample = np.frombuffer(raw_sample, dtype=SAMPLE_DTYPE).reshape(num_layers, n, k)
        if ((sample < -1) | (sample >= num_experts)).any():
            raise ValueError("sample holds expert ids outside [-1, E)")
    world = _int(fields, "world", 1, MAX_WORLD + 1)
    rank = _int(fields, "rank", 0, MAX_WORLD)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world size {world}")
    scope = _scope(fields, SCOPES)
    instance = _instance(fields)
    return StepRecord(
        run=check_run_name(_text(fields, "run", max_chars=128)), rank=rank, world_size=world,
        step=_int(fields, "step", 0, MAX_STEP), time_s=time_s, phase=phase,
        tokens=_int(fields, "tokens", 0, MAX_TOKENS), counts_LE=counts,
        dropped_steps=_int(fields, "dropped", 0, MAX_STEP), sample_ids_LNK=sample, instance=instance,
        scope=scope,
    )

