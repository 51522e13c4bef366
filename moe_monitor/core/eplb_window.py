"""vLLM's saved EPLB load window (`global_expert_load_window_i<n>.safetensors`, written with EPLBConfig
save_load_window / save_dir and read back with load_path) -> expert counts, checked and bounded.

What vLLM saves is its global logical load window: the per-pass expert loads of its sliding window (window_size
rows, a ring buffer: out of time order) mapped to logical experts and summed over the EP ranks, [L, E] (summed
over the window) or [W, L, E] (one row per pass), integer tensors. Tensor names differ between vLLM versions and
hold one window per EPLB model (e.g. the main model and an MTP drafter): any names are read; with several, the
largest (layers x experts) is taken and the others are named in `others`. Headers and sizes are checked before
any tensor byte is read (core/safetensors.py, the decoded-bytes budget of core/budget.py).
Shapes: W window rows, L MoE layers, E logical experts.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from .budget import check_decoded
from .meta import check_sizes
from .safetensors import read_counts, read_index

NAME_RE = re.compile(r"global_expert_load_window(?:_i(\d{1,12}))?\.safetensors")
BUILD_BYTES = 24  # a cell read: its bytes, int64, the float64 a counts reader makes


@dataclass(frozen=True)
class LoadWindow:
    """counts_XLE: int64 [L, E] or [W, L, E]; tensor: its name in the file; others: the other tensors' names."""

    path: str
    tensor: str
    counts_XLE: np.ndarray
    others: tuple[str, ...]

    @property
    def steps(self) -> int:
        return 1 if self.counts_XLE.ndim == 2 else int(self.counts_XLE.shape[0])


def is_load_window(path: str) -> bool:
    """A file named as vLLM saves its load window (any .safetensors file is read as one by the counts readers)."""
    return os.path.isfile(path) and NAME_RE.fullmatch(os.path.basename(path)) is not None


def describe_window(path: str, budget_bytes: int) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """(tensor name, its shape, the other tensors' names) from the header alone; ValueError as read_window."""
    entry, others = _pick(path, budget_bytes)
    return entry.name, entry.shape, others


def read_window(path: str, budget_bytes: int) -> LoadWindow:
    """The window of the file at path. ValueError (one line naming the file) for a malformed header, no tensor
    of rank 2 or 3, sizes outside core's bounds, a count that is not a whole number 0..2**31-1, or cells that
    decode (BUILD_BYTES each) to more than budget_bytes."""
    name = os.path.basename(path)
    entry, others = _pick(path, budget_bytes)
    with open(path, "rb") as handle:
        counts = read_counts(handle, entry, f"{name}: tensor {entry.name[:40]!r}")
    return LoadWindow(path=path, tensor=entry.name, counts_XLE=counts, others=others)


def _pick(path: str, budget_bytes: int):
    name = os.path.basename(path)
    entries, _ = read_index(path, budget_bytes)
    usable = [e for e in entries if len(e.shape) in (2, 3) and all(e.shape)]
    if not usable:
        shapes = ", ".join(f"{e.name[:30]} {list(e.shape)}" for e in entries[:3]) or "none"
        raise ValueError(f"{name}: no [layers, experts] or [window, layers, experts] tensor (found: {shapes})")
    entry = max(usable, key=lambda e: (e.shape[-2] * e.shape[-1], e.cells))
    check_sizes(entry.shape[-2], entry.shape[-1])
    check_decoded(f"{name}: tensor {entry.name[:40]!r} {list(entry.shape)}", entry.cells * BUILD_BYTES, budget_bytes)
    return entry, tuple(e.name for e in entries if e is not entry)
