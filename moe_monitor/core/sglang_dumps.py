"""SGLang expert-distribution dump files -> checked numpy arrays (pure: no Redis, no clock).

- stat (and stat_approx): rank 0's `expert_distribution_recorder_<unix time>.pt` = {"logical_count": int
  [T, L, E] summed over ranks (a ring buffer: rows out of time order, unfilled rows zero), ...}.
- per_pass, per_token: every rank's `..._<rank>.pt` = {"records": [a dict per forward pass, with
  "global_physical_count" int [L, P]; per_token adds "topk_ids_of_layer" int [L, N, K'] physical slot ids, -1
  unrouted, and "forward_mode"], "last_physical_to_logical_map": int [L, P]}.
Files load with torch.load(weights_only=True) only (core.ptfile), bounded by size and by what they decode to
(core/budget.py); every problem is one ValueError naming the file. Checked against sglang 0.5.23's own writer.
Shapes: T passes (or stat rows), L layers, E logical experts, P physical slots, N tokens of a pass, K top-k.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_monitor import core
from moe_monitor.core.ptfile import load_weights_only

NAME_RE = re.compile(r"^expert_distribution_recorder_(\d{1,12}(?:\.\d{1,9})?)(?:_(\d{1,5}))?\.pt$")
INT32_MAX = (1 << 31) - 1
MAX_PASS_ID = 1 << 52          # forward_pass_id bound (a counter of the server's lifetime)
MAX_TOKENS_PER_PASS = 1 << 24  # tokens of one pass on one rank (topk_ids rows)
MAX_ID_WIDTH = 256             # K' of topk_ids_of_layer
MAX_RECORDS = 1 << 20          # forward passes in one file

# SGLang's ForwardMode (an IntEnum numbered from 1) -> our phase; names are accepted too
_PHASE_OF_MODE = {1: "prefill", 2: "decode", 3: "mixed"}
_PHASE_OF_NAME = {"EXTEND": "prefill", "PREFILL": "prefill", "DECODE": "decode", "MIXED": "mixed"}


@dataclass(frozen=True)
class DumpName:
    """What a dump's file name says: the unix time it was written and, for per_pass / per_token, the rank."""

    time_s: float
    rank: int | None


def parse_name(name: str) -> DumpName | None:
    """DumpName of an SGLang dump file name (`expert_distribution_recorder_<time>[_<rank>].pt`), else None."""
    match = NAME_RE.match(name)
    if match is None:
        return None
    rank = match.group(2)
    return DumpName(time_s=float(match.group(1)), rank=None if rank is None else int(rank))


@dataclass(frozen=True)
class StatDump:
    """A stat-mode dump. logical_count_TLE: int64 [buffered rows, L, E], summed over ranks, ring order (not
    time order), unfilled rows zero."""

    logical_count_TLE: np.ndarray

    @property
    def num_layers(self) -> int:
        return int(self.logical_count_TLE.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.logical_count_TLE.shape[2])


@dataclass(frozen=True)
class PassDump:
    """A per_pass / per_token dump of one rank, passes in forward_pass_id order.

    pass_id_T: int64 [T] ascending SGLang forward_pass_id; physical_count_TLP: int32 [T, L, P] this rank's
    tokens per physical slot; phase_T: our phase of each pass ("unknown" when the dump does not say);
    tokens_T: int64 [T] tokens of the pass on this rank (len(input_ids)), -1 when the dump does not say;
    topk_ids_T: per_token only, one int32 [L, N, K'] of physical slot ids per pass (-1 = none), else None;
    layout_LP: int64 [L, P] SGLang's last_physical_to_logical_map (every expert 0..E-1 in
    every row); num_experts: E, the largest logical id + 1.
    """

    rank: int
    mode: str  # "per_pass" or "per_token"
    pass_id_T: np.ndarray
    physical_count_TLP: np.ndarray
    phase_T: tuple[str, ...]
    tokens_T: np.ndarray
    topk_ids_T: tuple[np.ndarray, ...] | None
    layout_LP: np.ndarray
    num_experts: int

    @property
    def num_layers(self) -> int:
        return int(self.layout_LP.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.layout_LP.shape[1])


Dump = StatDump | PassDump


def read_dump(path: str | os.PathLike[str], max_bytes: int, max_decoded_bytes: int | None = None) -> Dump:
    """Load and check one dump file. ValueError (one line, naming the file) when it is larger than
    max_bytes, decodes to more than max_decoded_bytes (None: the budget of core/budget.py), cannot be read
    as a weights-only torch file, or is not a well-formed dump."""
    path = os.fspath(path)
    name = os.path.basename(path)
    size = os.stat(path).st_size
    if size > max_bytes:
        raise ValueError(f"{name}: {size} bytes is over the {max_bytes}-byte limit (--max-file-mib)")
    obj = load_weights_only(path, max_decoded_bytes)
    try:
        return parse_dump(obj, name)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    except Exception as exc:  # anything torch or numpy raises on a strange object is a bad file, not a crash
        raise ValueError(f"{name}: not a well-formed dump ({type(exc).__name__}: {_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


def parse_dump(obj: Any, name: str = "") -> Dump:
    """A loaded dump object -> StatDump or PassDump; ValueError saying what is wrong. `name` (the file name)
    supplies the rank a per-pass file is written for, when it has one, to check the records against."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"holds a {type(obj).__name__}, not an SGLang expert-distribution dump (a dict)")
    if "logical_count" in obj:
        return parse_stat(obj)
    if "records" in obj:
        named = parse_name(name) if name else None
        return parse_passes(obj, None if named is None else named.rank)
    raise ValueError("has neither 'logical_count' (stat mode) nor 'records' (per_pass / per_token mode)")


def parse_stat(obj: Mapping) -> StatDump:
    """A stat dump {"rank", "logical_count" [T, L, E] (or [L, E]), ...} -> StatDump."""
    counts = int_array(obj["logical_count"], "logical_count", lo=0, hi=INT32_MAX)
    if counts.ndim == 2:
        counts = counts[None]
    if counts.ndim != 3 or 0 in counts.shape[1:]:
        raise ValueError(f"logical_count must be [buffered steps, layers, experts], got shape {tuple(counts.shape)}")
    core.check_sizes(counts.shape[1], counts.shape[2])
    return StatDump(logical_count_TLE=counts)


def parse_passes(obj: Mapping, file_rank: int | None = None) -> PassDump:
    """A per_pass / per_token dump {"records": [...], "last_physical_to_logical_map": [L, P]} -> PassDump."""
    if "last_physical_to_logical_map" not in obj:
        raise ValueError("per_pass dump without 'last_physical_to_logical_map'")
    layout_LP = int_array(obj["last_physical_to_logical_map"], "last_physical_to_logical_map", lo=0,
                          hi=core.MAX_EXPERTS - 1)
    if layout_LP.ndim != 2 or 0 in layout_LP.shape:
        raise ValueError(f"last_physical_to_logical_map must be [layers, slots], got shape {tuple(layout_LP.shape)}")
    num_layers, num_slots = layout_LP.shape
    core.check_sizes(num_layers, 1, num_slots)
    num_experts = int(layout_LP.max()) + 1
    core.check_layout_map(layout_LP, 1, 1, num_layers, num_experts)  # every expert 0..E-1 in every layer
    records = obj["records"]
    if not isinstance(records, (list, tuple)):
        raise ValueError(f"'records' must be a list, got {type(records).__name__}")
    if len(records) > MAX_RECORDS:
        raise ValueError(f"{len(records)} records, at most {MAX_RECORDS} are read from one file")
    parsed = [_pass_record(rec, i, num_layers, num_slots) for i, rec in enumerate(records)]
    ranks = {p[1] for p in parsed}
    if len(ranks) > 1:
        raise ValueError(f"records of several ranks {sorted(ranks)[:4]} in one file")
    rank = ranks.pop() if ranks else (file_rank if file_rank is not None else 0)
    if file_rank is not None and rank != file_rank:
        raise ValueError(f"records are of rank {rank}, the file name says rank {file_rank}")
    with_ids = {p[5] is not None for p in parsed}
    if len(with_ids) > 1:
        raise ValueError("some records have 'topk_ids_of_layer' and some do not")
    parsed.sort(key=lambda p: p[0])
    pass_id_T = np.array([p[0] for p in parsed], dtype=np.int64)
    if pass_id_T.size > 1 and (np.diff(pass_id_T) == 0).any():
        repeated = int(pass_id_T[np.flatnonzero(np.diff(pass_id_T) == 0)[0]])
        raise ValueError(f"forward_pass_id {repeated} appears twice (two-batch-overlap dumps are not supported)")
    per_token = with_ids == {True}
    count_TLP = np.zeros((len(parsed), num_layers, num_slots), dtype=np.int32)
    for t, p in enumerate(parsed):
        count_TLP[t] = p[2]
    return PassDump(
        rank=rank, mode="per_token" if per_token else "per_pass", pass_id_T=pass_id_T,
        physical_count_TLP=count_TLP, phase_T=tuple(p[3] for p in parsed),
        tokens_T=np.array([p[4] for p in parsed], dtype=np.int64),
        topk_ids_T=tuple(p[5] for p in parsed) if per_token else None,
        layout_LP=layout_LP, num_experts=num_experts)


def _pass_record(rec: Any, index: int, num_layers: int, num_slots: int):
    """One record -> (pass id, rank, counts [L, P], phase, tokens or -1, topk ids [L, N, K'] or None)."""
    where = f"record {index}"
    if not isinstance(rec, Mapping):
        raise ValueError(f"{where} is a {type(rec).__name__}, not a dict")
    for key in ("forward_pass_id", "global_physical_count"):
        if key not in rec:
            raise ValueError(f"{where} has no {key!r}")
    pass_id = _plain_int(rec["forward_pass_id"], f"{where} forward_pass_id", 0, MAX_PASS_ID)
    where = f"forward pass {pass_id}"
    rank = _plain_int(rec.get("rank", 0), f"{where} rank", 0, core.MAX_WORLD - 1)
    counts_LP = int_array(rec["global_physical_count"], f"{where} global_physical_count", lo=0, hi=INT32_MAX)
    if counts_LP.shape != (num_layers, num_slots):
        raise ValueError(f"{where}: global_physical_count is {tuple(counts_LP.shape)}, the map is "
                         f"[{num_layers}, {num_slots}]")
    phase = phase_of(rec.get("forward_mode"))
    tokens = -1
    ids_LNK = None
    if "input_ids" in rec:
        tokens = _length(rec["input_ids"], f"{where} input_ids")
    if "topk_ids_of_layer" in rec:
        ids_LNK = int_array(rec["topk_ids_of_layer"], f"{where} topk_ids_of_layer", lo=-1, hi=num_slots - 1)
        if ids_LNK.ndim != 3 or ids_LNK.shape[0] != num_layers or ids_LNK.shape[2] > MAX_ID_WIDTH \
                or ids_LNK.shape[1] > MAX_TOKENS_PER_PASS:
            raise ValueError(f"{where}: topk_ids_of_layer must be [{num_layers}, tokens, k], got "
                             f"{tuple(ids_LNK.shape)}")
        if tokens >= 0 and ids_LNK.shape[1] != tokens:
            raise ValueError(f"{where}: topk_ids_of_layer has {ids_LNK.shape[1]} tokens, input_ids {tokens}")
        tokens = int(ids_LNK.shape[1])
        ids_LNK = ids_LNK.astype(np.int32)
    return pass_id, rank, counts_LP, phase, tokens, ids_LNK


def phase_of(forward_mode: Any) -> str:
    """Our phase for SGLang's forward_mode (its ForwardMode int, or a name such as "DECODE" or
    "ForwardMode.DECODE"): EXTEND -> prefill, DECODE -> decode, MIXED -> mixed, anything else (IDLE,
    speculative modes, absent) -> unknown."""
    if isinstance(forward_mode, bool) or forward_mode is None:
        return "unknown"
    if isinstance(forward_mode, int):
        return _PHASE_OF_MODE.get(forward_mode, "unknown")
    if isinstance(forward_mode, str):
        return _PHASE_OF_NAME.get(forward_mode.rsplit(".", 1)[-1].upper()[:32], "unknown")
    return "unknown"


def int_array(value: Any, what: str, lo: int, hi: int) -> np.ndarray:
    """A dense torch tensor of whole numbers in lo..hi as int64 numpy; ValueError for anything else (not a
    tensor, sparse, meta, quantized, bool or complex, NaN or infinite, fractional, out of range)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{what} must be a tensor, got {type(value).__name__}")
    if value.is_nested or value.layout != torch.strided or value.is_meta or value.is_quantized:
        raise ValueError(f"{what} must be a dense tensor with data")
    if value.dtype == torch.bool or value.dtype.is_complex:
        raise ValueError(f"{what} is a {value.dtype} tensor; counts and ids are integers")
    if value.numel() > core.MAX_CELLS * 64:
        raise ValueError(f"{what} has {value.numel()} elements, too many to be a dump's")
    if value.dtype.is_floating_point:
        data = value.detach().to("cpu", torch.float64).numpy()
        if not np.isfinite(data).all():
            raise ValueError(f"{what} holds NaN or infinite values")
        if data.size and (data != np.floor(data)).any():
            raise ValueError(f"{what} holds fractional values")
    else:
        data = value.detach().to("cpu", torch.int64).numpy()  # an int64 tensor's own storage: copied below
    if data.size and (data.min() < lo or data.max() > hi):
        if lo == 0 and data.min() < 0:
            raise ValueError(f"{what} holds negative values")
        raise ValueError(f"{what} holds values outside {lo}..{hi}")
    if value.dtype.is_floating_point or value.dtype == torch.int64:
        return data.astype(np.int64)  # the one copy: never a view of the loaded storage
    return data  # already a new int64 array (converted from a narrower type)


def _plain_int(value: Any, what: str, lo: int, hi: int) -> int:
    """A Python int, numpy integer or one-element integer tensor within lo..hi; ValueError otherwise."""
    if hasattr(value, "numel") and value.numel() == 1 and not value.dtype.is_floating_point:
        value = value.item()
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{what} must be an integer in {lo}..{hi}, got {str(value)[:40]}")
    return value


def _length(value: Any, what: str) -> int:
    """Length of a list or 1-D tensor (input_ids: only how many there are is used)."""
    if isinstance(value, (list, tuple)):
        return len(value)
    if hasattr(value, "shape") and len(value.shape) == 1:
        return int(value.shape[0])
    raise ValueError(f"{what} must be a list or a 1-D tensor, got {type(value).__name__}")
