"""TimingRecord: where the time of one step's MoE layers went on one rank (dispatch, expert compute, combine,
the whole layer), and its stream encoding (four raw little-endian float32 [L] arrays).

Shape legend (README, Conventions): L MoE layers, in model order.
One stream entry per (step, rank), never one per layer: a step of a 58-layer model is one XADD of 4 x 232
bytes. NaN means "not measured" (a phase the engine does not have or did not time, a layer that did not run
on this rank this step); every measured time is finite, >= 0 and below MAX_PHASE_S.
Expected relation (not enforced by the decoder, a reader may check it): dispatch + compute + combine <= layer
(the layer also routes, runs its shared experts and waits).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fields import _instance, _int, _raw, _text, _time, _version
from .keys import MAX_LAYERS, MAX_STEP, MAX_WORLD, SCHEMA_VERSION, check_run_name

TIMING_DTYPE = np.dtype("<f4")
MAX_PHASE_S = 1e6  # one phase of one layer of one step: below ~11.6 days, or the record is refused
TIMING_PHASES = ("dispatch", "compute", "combine", "layer")  # the field names of the four [L] arrays
TIMING_FIELDS = ("v", "run", "inst", "rank", "world", "step", "t", "L", *TIMING_PHASES)


@dataclass(frozen=True)
class TimingRecord:
    """Wall time per MoE layer of one step on one rank, in seconds.

    dispatch_s_L: float32 [L] the all-to-all that sends the tokens to their experts' ranks (with the split-size
    exchange); compute_s_L: float32 [L] this rank's expert FFNs on what it received; combine_s_L: float32 [L]
    the all-to-all back and the weighted sum; layer_s_L: float32 [L] the whole MoE layer. NaN: not measured.
    step: the step id of the StepRecord it belongs to (same run, rank and instance).
    """

    run: str
    rank: int
    world_size: int
    step: int
    time_s: float
    dispatch_s_L: np.ndarray
    compute_s_L: np.ndarray
    combine_s_L: np.ndarray
    layer_s_L: np.ndarray
    instance: str = ""

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(dispatch_s_L, compute_s_L, combine_s_L, layer_s_L), in TIMING_PHASES order."""
        return self.dispatch_s_L, self.compute_s_L, self.combine_s_L, self.layer_s_L


def _check_times(name: str, times_L: np.ndarray) -> None:
    measured = times_L[~np.isnan(times_L)]
    if measured.size and not (np.isfinite(measured).all() and measured.min() >= 0 and measured.max() < MAX_PHASE_S):
        raise ValueError(f"{name} times must be NaN (not measured) or finite, >= 0 and below {MAX_PHASE_S:g} s")


def encode_timing(rec: TimingRecord) -> dict[str, bytes | str | int]:
    """TimingRecord -> stream entry fields (values redis-py can send as they are). ValueError when the record
    is one decode_timing would refuse (arrays not 1-D of one length L in 1..MAX_LAYERS, a time out of range,
    rank not below world)."""
    arrays = [np.ascontiguousarray(a, dtype=TIMING_DTYPE) for a in rec.arrays()]
    if any(a.ndim != 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise ValueError(f"timing arrays must be 1-D [layers] of one length, got {[a.shape for a in arrays]}")
    fields: dict[str, bytes | str | int] = {
        "v": SCHEMA_VERSION, "run": check_run_name(rec.run), "inst": rec.instance, "rank": int(rec.rank),
        "world": int(rec.world_size), "step": int(rec.step), "t": repr(float(rec.time_s)), "L": arrays[0].shape[0],
    }
    for name, times_L in zip(TIMING_PHASES, arrays):
        fields[name] = times_L.tobytes()
    decode_timing(fields)  # one set of rules: what the reader would refuse is never written
    return fields


def decode_timing(fields: dict) -> TimingRecord:
    """Stream entry fields (bytes or str keys) -> TimingRecord. Raises ValueError (never another exception)
    on any malformed entry: wrong schema version, missing field, wrong byte length, a time that is negative,
    infinite or >= MAX_PHASE_S (NaN is allowed: not measured), or a number outside the bounds of core/keys.py
    (L <= MAX_LAYERS, step < MAX_STEP, rank < world <= MAX_WORLD, |t| < MAX_TIME_S, instance id <=
    MAX_NAME_CHARS)."""
    _version(fields, SCHEMA_VERSION)
    num_layers = _int(fields, "L", 1, MAX_LAYERS + 1)
    arrays = []
    for name in TIMING_PHASES:
        raw = _raw(fields, name)
        if len(raw) != num_layers * TIMING_DTYPE.itemsize:
            raise ValueError(f"{name} has {len(raw)} bytes, expected {num_layers} float32")
        times_L = np.frombuffer(raw, dtype=TIMING_DTYPE)
        _check_times(name, times_L)
        arrays.append(times_L)
    world = _int(fields, "world", 1, MAX_WORLD + 1)
    rank = _int(fields, "rank", 0, MAX_WORLD)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world size {world}")
    instance = _instance(fields)
    return TimingRecord(
        run=check_run_name(_text(fields, "run", max_chars=128)), rank=rank, world_size=world,
        step=_int(fields, "step", 0, MAX_STEP), time_s=_time(fields, "t"), dispatch_s_L=arrays[0],
        compute_s_L=arrays[1], combine_s_L=arrays[2], layer_s_L=arrays[3], instance=instance)
