"""TensorRT-LLM expert statistics (an EXPERT_STATISTIC_PATH folder) -> per-iteration counts, checked and bounded.

The folder: meta_info.json (rank 0: num_experts E, num_experts_per_token k), rank{r}.safetensors (one [E] tensor
per "{iter}_{layer}": tokens routed to each id on that rank) and, in some versions, rank{r}_numtokens.json. E is
the MoE module's slot count (slot ids when TensorRT-LLM's load balancer is on). Rank files are summed key by
key, as TensorRT-LLM's own reader does; layers keep the model's indices. Headers, JSON and the decoded-bytes
budget (core/budget.py) are checked before any tensor byte is read; every problem is one ValueError naming the file.

Shape legend: R rank files, T iterations, L MoE layers, E slots (experts when the load balancer is off).
docs/traces.md (TensorRT-LLM expert statistics).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core.budget import check_decoded
from moe_monitor.core.safetensors import Entry, header_length, read_counts, read_index

META_NAME = "meta_info.json"
RANK_FILE = re.compile(r"rank(\d{1,6})\.safetensors")
KEY = re.compile(r"(\d{1,18})_(\d{1,6})")
HEADER_BYTE_COST = 16  # a byte of header JSON parsed, at least (each file's header: core/jsonbudget.py's worst case)
MAX_JSON_BYTES = 16 << 20
MAX_RANK_FILES = 4096
CELL_BYTES = 24  # a cell of [T, L, E] built: the int64 sums, convert's int32 step records and their copies


@dataclass(frozen=True)
class Tensor:
    """One declared tensor of a rank file: key "{iter}_{layer}", and where its counts lie (core.safetensors)."""

    iteration: int
    layer: int
    entry: Entry


@dataclass(frozen=True)
class Statistic:
    """A folder read: counts_TLE int64 [T, L, E] (rank files summed), iter_T int64 [T] iterations, layer_L int64
    [L] the model's layer indices, tokens_T int64 [T] (from rank{r}_numtokens.json, ranks summed) or None,
    ranks: the rank of each file read, meta_info: meta_info.json as written."""

    folder: str
    num_slots: int
    top_k: int
    ranks: tuple[int, ...]
    iter_T: np.ndarray
    layer_L: np.ndarray
    counts_TLE: np.ndarray
    tokens_T: np.ndarray | None
    meta_info: dict


def is_statistic_folder(path: str) -> bool:
    """True for a folder holding meta_info.json or a rank{r}.safetensors (what convert then reads as one)."""
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    return META_NAME in names or any(RANK_FILE.fullmatch(n) for n in names)


def read_statistic(folder: str, budget_bytes: int) -> Statistic:
    """The folder's counts, summed over its rank files. ValueError (one line naming the file) for a missing
    meta_info.json or rank file, a malformed header, a tensor that is not [E] whole numbers >= 0, an iteration
    missing a layer, a truncated file, or declared tensors that decode to more than budget_bytes."""
    names = sorted(os.listdir(folder))
    meta_info = _meta_info(os.path.join(folder, META_NAME))
    num_slots, top_k = meta_info["num_experts"], meta_info["num_experts_per_token"]
    ranks = sorted(int(m.group(1)) for m in map(RANK_FILE.fullmatch, names) if m)
    if not ranks:
        raise ValueError(f"{folder}: holds no rank<r>.safetensors (TensorRT-LLM writes one per rank)")
    if len(ranks) > MAX_RANK_FILES:
        raise ValueError(f"{folder}: {len(ranks)} rank files, at most {MAX_RANK_FILES} are read")
    files = {r: os.path.join(folder, f"rank{r}.safetensors") for r in ranks}
    check_decoded(f"{folder}: its safetensors headers (parsed at {HEADER_BYTE_COST} bytes a byte)",
                  HEADER_BYTE_COST * sum(header_length(p) for p in files.values()), budget_bytes)
    index = {r: tensor_index(files[r], num_slots, budget_bytes) for r in ranks}
    iters = sorted({t.iteration for ts in index.values() for t in ts})
    layers = sorted({t.layer for ts in index.values() for t in ts})
    if not iters:
        raise ValueError(f"{folder}: its rank files hold no tensor (no iteration was recorded)")
    core.check_sizes(len(layers), num_slots)
    declared = sum(t.entry.stop - t.entry.start for ts in index.values() for t in ts)
    check_decoded(f"{folder}: its tensors and the [{len(iters)} iterations x {len(layers)} layers x {num_slots} "
                  f"experts] built of them", declared + len(iters) * len(layers) * num_slots * CELL_BYTES, budget_bytes)
    _check_grid(folder, index, iters, layers)
    t_of = {it: i for i, it in enumerate(iters)}
    l_of = {layer: i for i, layer in enumerate(layers)}
    counts_TLE = np.zeros((len(iters), len(layers), num_slots), dtype=np.int64)
    for r in ranks:
        for t, counts_E in _tensors(files[r], index[r]):
            counts_TLE[t_of[t.iteration], l_of[t.layer]] += counts_E
    if counts_TLE.max(initial=0) > np.iinfo(np.int32).max:
        raise ValueError(f"{folder}: a count summed over the ranks exceeds 2**31 tokens")
    tokens_T = _tokens(folder, names, ranks, iters, t_of)
    return Statistic(folder=folder, num_slots=num_slots, top_k=top_k, ranks=tuple(ranks),
                     iter_T=np.asarray(iters, dtype=np.int64), layer_L=np.asarray(layers, dtype=np.int64),
                     counts_TLE=counts_TLE, tokens_T=tokens_T, meta_info=meta_info)


def tensor_index(path: str, num_slots: int, budget_bytes: int = 1 << 30) -> list[Tensor]:
    """The tensors a safetensors file declares (its header only, core/safetensors.py: bounded, no two sharing
    bytes), each checked: key "{iter}_{layer}", shape [num_slots]. ValueError naming the file otherwise."""
    name = os.path.basename(path)
    entries, _ = read_index(path, budget_bytes)
    out = []
    for e in entries:
        where = f"{name}: tensor {e.name[:40]!r}"
        m = KEY.fullmatch(e.name)
        if m is None:
            raise ValueError(f"{where}: not an \"{{iter}}_{{layer}}\" key (TensorRT-LLM's expert statistic)")
        if e.shape != (num_slots,):
            raise ValueError(f"{where}: shape {list(e.shape)}, meta_info.json says [{num_slots}] (num_experts)")
        out.append(Tensor(iteration=int(m.group(1)), layer=int(m.group(2)), entry=e))
    return out


def _tensors(path: str, tensors: list[Tensor]):
    """(tensor, int64 [E] counts) for each declared tensor, read by its offsets; ValueError for a count that
    is negative, NaN or fractional, or bytes missing (a file cut short after it was indexed)."""
    name = os.path.basename(path)
    with open(path, "rb") as handle:
        for t in tensors:
            yield t, read_counts(handle, t.entry, f"{name}: tensor {t.iteration}_{t.layer}")


def _check_grid(folder: str, index: dict[int, list[Tensor]], iters: list[int], layers: list[int]) -> None:
    """Every iteration holds every layer in some rank file (TensorRT-LLM's reader asserts the same)."""
    have = {(t.iteration, t.layer) for ts in index.values() for t in ts}
    if len(have) < len(iters) * len(layers):
        missing = next((i, lay) for i in iters for lay in layers if (i, lay) not in have)
        raise ValueError(f"{folder}: iteration {missing[0]} lacks layer {missing[1]} in every rank file "
                         f"({len(iters)} iterations x {len(layers)} layers expected, {len(have)} found)")


def _meta_info(path: str) -> dict:
    name = os.path.basename(path)
    if not os.path.isfile(path):
        raise ValueError(f"{os.path.dirname(path)}: lacks {name} (TensorRT-LLM's rank 0 writes it)")
    if _size(path) > MAX_JSON_BYTES:
        raise ValueError(f"{name}: larger than {MAX_JSON_BYTES} bytes")
    with open(path, "rb") as handle:
        info = core.parse_json(handle.read(), name)
    if not isinstance(info, dict):
        raise ValueError(f"{name}: holds {type(info).__name__}, not an object (did rank 0 record no iteration?)")
    num_slots, top_k = info.get("num_experts"), info.get("num_experts_per_token")
    if type(num_slots) is not int or not 1 <= num_slots <= core.MAX_EXPERTS:
        raise ValueError(f"{name}: num_experts {str(num_slots)[:20]} is not 1..{core.MAX_EXPERTS}")
    if type(top_k) is not int or not 1 <= top_k <= num_slots:
        raise ValueError(f"{name}: num_experts_per_token {str(top_k)[:20]} is not 1..{num_slots}")
    return info


def _tokens(folder: str, names: list[str], ranks: list[int], iters: list[int], t_of: dict[int, int]):
    """int64 [T] tokens per iteration from every rank's rank{r}_numtokens.json (each rank's busiest layer,
    ranks summed); None unless every rank file has one."""
    paths = [os.path.join(folder, f"rank{r}_numtokens.json") for r in ranks]
    if not all(os.path.basename(p) in names for p in paths):
        return None
    tokens_T = np.zeros(len(iters), dtype=np.int64)
    for path in paths:
        name = os.path.basename(path)
        if _size(path) > MAX_JSON_BYTES:
            raise ValueError(f"{name}: larger than {MAX_JSON_BYTES} bytes")
        with open(path, "rb") as handle:
            found = core.parse_json(handle.read(), name)
        if not isinstance(found, dict):
            raise ValueError(f"{name}: not an object of \"{{iter}}_{{layer}}\": tokens")
        rank_T = np.zeros(len(iters), dtype=np.int64)
        for key, tokens in found.items():
            m = KEY.fullmatch(key)
            if m is None or type(tokens) is not int or not 0 <= tokens < core.MAX_TOKENS:
                raise ValueError(f"{name}: entry {key[:40]!r}: {str(tokens)[:20]} is not a token count")
            t = t_of.get(int(m.group(1)))
            if t is not None:
                rank_T[t] = max(rank_T[t], tokens)
        tokens_T += rank_T
    return tokens_T


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or 'cannot be read'}") from None
