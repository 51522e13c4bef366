"""AggregateRecord: one step of a run with its ranks summed (written by the aggregator, read by dashboards
in place of summing every rank themselves), and its stream encoding.

One entry per step in core.aggregate_key(run). A rank whose record arrives after its step was written is folded
in by a second entry for the same step holding only the late ranks (late=1): a reader sums the entries of a step,
and no rank is in two entries of one step (the present-rank masks are disjoint).

Shape legend: L MoE layers, E logical experts, W ranks (the world size), R ranks present in the record.
Counts travel compact (core/compact.py, up to int64: a sum over many ranks); the present ranks as a bit mask
(numpy packbits, rank 0 first); their tokens and cumulative dropped steps as compact integer arrays [R].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .compact import pack_counts, unpack_counts
from .fields import _instance, _int, _raw, _scope, _text, _time, _version
from .keys import (
    MAX_CELLS,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_STEP,
    MAX_TOKENS,
    MAX_WORLD,
    PHASES,
    check_run_name,
)
from .steps import SCOPES

AGGREGATE_VERSION = 1
AGGREGATE_FIELDS = ("v", "run", "inst", "step", "t", "phase", "world", "L", "E", "ct", "cz", "counts", "ranks",
                    "tt", "tz", "tokens", "dt", "dz", "dropped", "late")


@dataclass(frozen=True)
class AggregateRecord:
    """The ranks of one step, summed.

    counts_LE: int64 [L, E] tokens routed to each expert in each layer, summed over the present ranks.
    ranks_R: int64 [R] the ranks summed here, ascending; tokens_R: int64 [R] the tokens each routed this step;
    dropped_R: int64 [R] each one's cumulative dropped steps, as its record said.
    time_s: the newest time among the ranks; phase: theirs when they agree, else "mixed".
    instance: the aggregator's epoch for the run (a new one when the collectors restarted and their step ids
    started again); late: this entry folds late ranks into a step written before.
    """

    run: str
    step: int
    time_s: float
    phase: str
    world_size: int
    counts_LE: np.ndarray
    ranks_R: np.ndarray
    tokens_R: np.ndarray
    dropped_R: np.ndarray
    instance: str = ""
    late: bool = False
    scope: str = "rank"

    @property
    def tokens(self) -> int:
        return int(self.tokens_R.sum())

    @property
    def missing_ranks(self) -> np.ndarray:
        """int64 [W - R] the ranks of the world not in this record, ascending."""
        present = np.zeros(self.world_size, dtype=bool)
        present[self.ranks_R] = True
        return np.flatnonzero(~present)


def encode_aggregate(rec: AggregateRecord) -> dict[str, bytes | str | int]:
    """AggregateRecord -> stream entry fields. ValueError when decode_aggregate would refuse the record."""
    counts = np.asarray(rec.counts_LE)
    ranks = np.asarray(rec.ranks_R, dtype=np.int64)
    if counts.ndim != 2 or counts.dtype.kind not in "iu":
        raise ValueError(f"counts_LE must be a 2-D int array [layers, experts], got {counts.dtype} {counts.shape}")
    if ranks.ndim != 1 or ranks.size == 0 or np.asarray(rec.tokens_R).shape != ranks.shape \
            or np.asarray(rec.dropped_R).shape != ranks.shape:
        raise ValueError("ranks_R, tokens_R and dropped_R must be 1-D arrays of the same length >= 1")
    if ranks.min() < 0 or ranks.max() >= rec.world_size or np.any(np.diff(ranks) <= 0):
        raise ValueError(f"ranks_R must be ascending, distinct and in 0..{rec.world_size - 1}")
    present = np.zeros(rec.world_size, dtype=bool)
    present[ranks] = True
    fields: dict[str, bytes | str | int] = {
        "v": AGGREGATE_VERSION, "run": check_run_name(rec.run), "inst": rec.instance, "step": int(rec.step),
        "t": repr(float(rec.time_s)), "phase": rec.phase, "world": int(rec.world_size),
        "L": counts.shape[0], "E": counts.shape[1], "ranks": np.packbits(present).tobytes(),
        "late": int(bool(rec.late)),
    }
    fields["ct"], fields["cz"], fields["counts"] = pack_counts(counts, widest="i8")
    fields["tt"], fields["tz"], fields["tokens"] = pack_counts(np.asarray(rec.tokens_R), widest="i8")
    fields["dt"], fields["dz"], fields["dropped"] = pack_counts(np.asarray(rec.dropped_R), widest="i8")
    if rec.scope != "rank":
        fields["scope"] = rec.scope
    decode_aggregate(fields)  # one set of rules: what the reader would refuse is never written
    return fields


def decode_aggregate(fields: dict) -> AggregateRecord:
    """Stream entry fields (bytes or str keys) -> AggregateRecord. Raises ValueError (never another exception)
    on any malformed entry: unknown version, missing field, a payload that is not exactly its cells, a mask
    without ranks or with ranks beyond the world, negative values, bounds of core/keys.py (L, E, cells, step,
    world, tokens per rank, time, instance id)."""
    _version(fields, AGGREGATE_VERSION, "aggregate")
    num_layers, num_experts = _int(fields, "L", 1, MAX_LAYERS + 1), _int(fields, "E", 1, MAX_EXPERTS + 1)
    if num_layers * num_experts > MAX_CELLS:
        raise ValueError(f"counts of {num_layers}x{num_experts} exceed {MAX_CELLS} cells")
    world = _int(fields, "world", 1, MAX_WORLD + 1)
    mask = _raw(fields, "ranks")
    if len(mask) != (world + 7) // 8:
        raise ValueError(f"rank mask has {len(mask)} bytes, expected {(world + 7) // 8} for {world} ranks")
    bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8))
    if bits[world:].any():
        raise ValueError(f"rank mask names ranks beyond the world size {world}")
    ranks = np.flatnonzero(bits[:world]).astype(np.int64)
    if ranks.size == 0:
        raise ValueError("rank mask names no rank")
    counts = unpack_counts(_text(fields, "ct", 8), _text(fields, "cz", 8), _raw(fields, "counts"),
                           (num_layers, num_experts), "<i8")
    tokens = unpack_counts(_text(fields, "tt", 8), _text(fields, "tz", 8), _raw(fields, "tokens"), (ranks.size,), "<i8")
    dropped = unpack_counts(_text(fields, "dt", 8), _text(fields, "dz", 8), _raw(fields, "dropped"), (ranks.size,),
                            "<i8")
    if (counts < 0).any() or (tokens < 0).any() or (dropped < 0).any():
        raise ValueError("counts, tokens or dropped steps are negative")
    if tokens.max() >= MAX_TOKENS or dropped.max() >= MAX_STEP:
        raise ValueError("a rank's tokens or dropped steps are out of range")
    phase = _text(fields, "phase", max_chars=16)
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    scope = _scope(fields, SCOPES)
    instance = _instance(fields, "aggregator")
    return AggregateRecord(
        run=check_run_name(_text(fields, "run", max_chars=128)), step=_int(fields, "step", 0, MAX_STEP),
        time_s=_time(fields, "t"), phase=phase, world_size=world, counts_LE=counts, ranks_R=ranks,
        tokens_R=tokens, dropped_R=dropped, instance=instance, late=bool(_int(fields, "late", 0, 2)), scope=scope,
    )
