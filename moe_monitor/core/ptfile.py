"""The one place that reads PyTorch .pt files (SGLang dumps and logical_count files): weights_only=True,
always, on the CPU. torch is imported only when a .pt file is read, so nothing that imports this needs torch
until then, and a machine without torch gets a clear message instead.

Bounded by the decoded-bytes budget (core/budget.py), with core/ptbounds.py: before torch reads anything, the
zip archive's declared entry sizes (the storages torch will read, as 4-byte elements at ELEMENT_BYTES each: what
the check after the load counts them at; the pickle at PICKLE_OBJECT_BYTES bytes of
Python objects per byte); after the weights-only load and before anything is copied out of it, the elements of
every tensor it holds, each time it is held, as int64 (what a parser's copies take)."""
from __future__ import annotations

import os
import pickle
import re
import warnings
from typing import Any

from moe_monitor.core.budget import check_decoded, decoded_budget_bytes
from moe_monitor.core.ptbounds import tensor_elements, zip_declared

PICKLE_OBJECT_BYTES = 64  # Python objects one byte of pickle may build, at most (an empty dict appended: 2 bytes)
ELEMENT_BYTES = 16         # a tensor element as stored (at most 8 bytes) and once copied out (int64 or float64)
# Before the load the archive's storages are counted as elements of this size, each at ELEMENT_BYTES: so a file
# whose tensors the check after the load would refuse (int32 counts, as SGLang writes them) is refused before
# torch inflates it (a 973 KB deflated dump declaring 953 MiB of int32 peaked at 1,189 MiB before this).
SMALLEST_ELEMENT_BYTES = 4


def load_weights_only(path: str, max_decoded_bytes: int | None = None) -> Any:
    """torch.load(path, map_location="cpu", weights_only=True): tensors and plain containers only, never an
    arbitrary pickled object. ValueError (one line, naming the file) when torch is missing, refuses the file
    or cannot read it, or the file decodes to more than max_decoded_bytes (None: the budget of core/budget.py):
    checked before the load from the archive's metadata, and after it on the tensors' elements."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"{path}: reading a .pt file needs torch installed (or save the counts as JSON)") from None

    name = os.path.basename(path)
    budget = decoded_budget_bytes() if max_decoded_bytes is None else max_decoded_bytes
    try:
        declared = zip_declared(path)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    except OSError:
        declared = None  # torch.load says why the file does not read
    if declared is not None:
        check_decoded(f"{name}: its zip entries ({declared.entries}, {declared.total_bytes} bytes)",
                      declared.total_bytes * ELEMENT_BYTES // SMALLEST_ELEMENT_BYTES, budget)
        check_decoded(f"{name}: the Python objects of its {declared.pickle_bytes}-byte pickle",
                      declared.pickle_bytes * PICKLE_OBJECT_BYTES, budget)
    obj = _load(torch, path, name)
    try:
        elements = tensor_elements(obj)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    check_decoded(f"{name}: the {elements} elements of its tensors", elements * ELEMENT_BYTES, budget)
    return obj


def _load(torch, path: str, name: str) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols on some files
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        blocked = re.search(r"unsupported GLOBAL (\S+)", text)
        if blocked:
            raise ValueError(f"{name}: holds a pickled object ({blocked.group(1)}), not only tensors: refused "
                             "(.pt files load weights-only)") from None
        detail = re.search(r"WeightsUnpickler error: \s*(.+)", text)
        raise ValueError(f"{name}: not a torch tensor file, or corrupt (weights-only unpickler: "
                         f"{detail.group(1).strip()[:120] if detail else type(exc).__name__})") from None
    except Exception as exc:  # torch raises many types for truncated and corrupt files
        text = _first_line(exc)
        if "zip archive" in text or isinstance(exc, EOFError):
            raise ValueError(f"{name}: truncated or corrupt (not a complete torch zip archive; read weights-only)") from None
        raise ValueError(f"{name}: cannot be read as a weights-only torch file ({type(exc).__name__}: "
                         f"{text[:200]})") from None


def tensor_array(tensor, path: str):
    """A loaded tensor as a float64 numpy array. ValueError (never another exception) for tensors that hold no
    plain numbers: sparse, nested, meta (no data), quantized, bool or complex tensors."""
    import torch

    layout = getattr(tensor, "layout", None)
    if getattr(tensor, "is_nested", False) or layout != torch.strided:
        kind = "nested" if getattr(tensor, "is_nested", False) else f"{layout}"
        raise ValueError(f"{path}: logical_count is a {kind} tensor; save a dense one (tensor.to_dense())")
    if getattr(tensor, "is_meta", False):
        raise ValueError(f"{path}: logical_count is a meta tensor (shape only, no data)")
    if getattr(tensor, "is_quantized", False):
        raise ValueError(f"{path}: logical_count is a quantized tensor ({tensor.dtype}); save it dequantized "
                         "(tensor.dequantize())")
    dtype = getattr(tensor, "dtype", None)
    if dtype == torch.bool or getattr(dtype, "is_complex", False):
        raise ValueError(f"{path}: logical_count is a {dtype} tensor; counts are integer or real numbers")
    try:
        return tensor.detach().to("cpu", torch.float64).numpy()
    except Exception as exc:  # any other tensor kind torch cannot hand to numpy
        raise ValueError(f"{path}: logical_count tensor cannot be read as numbers ({type(exc).__name__}: "
                         f"{_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""
