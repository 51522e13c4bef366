"""Reading expert counts and writing layouts.

Inputs: SGLang ``logical_count`` JSON ({"logical_count": [[E numbers] x L]} or a bare nested list) or a
``.pt`` file (a tensor, or a dict with "logical_count"), of shape [L, E] or [T, L, E] (T windows,
oldest first). ``.pt`` files are read with ``torch.load(..., weights_only=True)`` only; torch is
imported inside that loader, never at module level (the dashboard must run without torch).
Hook for project traces: ``register_loader(".suffix", fn)`` where ``fn(path) -> array [L,E] | [T,L,E]``;
the trace reader will register itself there when it lands.
Output: {"physical_to_logical_map": [[P ints] x L], ...} which SGLang's --init-expert-location reads.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from .loads import as_counts

_LOADERS: dict[str, Callable[[Path], object]] = {}


def register_loader(suffix: str, fn: Callable[[Path], object]) -> None:
    """Teach ``load_counts`` a new file type (e.g. the project's trace files)."""
    _LOADERS[suffix.lower()] = fn


def _from_obj(obj, path: Path):
    if isinstance(obj, dict):
        if "logical_count" not in obj:
            raise ValueError(f"{path}: no 'logical_count' key (found: {', '.join(map(str, obj)) or 'none'})")
        obj = obj["logical_count"]
    if hasattr(obj, "detach"):  # a torch tensor
        obj = obj.detach().cpu().double().numpy()
    return obj


def _load_json(path: Path):
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return _from_obj(obj, path)


def _load_pt(path: Path):
    import torch  # lazily: the dashboard package never imports torch at module level

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt / unsafe files
        raise ValueError(f"{path}: cannot read as a weights-only torch file ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return _from_obj(obj, path)


register_loader(".json", _load_json)
register_loader(".pt", _load_pt)
register_loader(".pth", _load_pt)


def load_counts(path) -> np.ndarray:
    """Expert counts from a file, float64 [L, E] or [T, L, E]."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    loader = _LOADERS.get(p.suffix.lower())
    if loader is None:
        raise ValueError(f"{p}: unknown file type '{p.suffix}' (expected one of {', '.join(sorted(_LOADERS))})")
    obj = loader(p)
    try:
        arr = np.asarray(obj, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{p}: logical_count must be a rectangular array of numbers "
                         "[layers][experts] or [windows][layers][experts]") from None
    return as_counts(arr, f"{p.name}: logical_count", ndim=(2, 3))


def load_layout(path) -> np.ndarray:
    """A layout JSON ({"physical_to_logical_map": [[...]]}) as int64 [L, P]."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict) or "physical_to_logical_map" not in obj:
        raise ValueError(f"{p}: no 'physical_to_logical_map' key")
    try:
        return np.asarray(obj["physical_to_logical_map"], dtype=np.int64)
    except (TypeError, ValueError):
        raise ValueError(f"{p}: physical_to_logical_map must be a rectangular array of ints") from None


def write_json(path, payload: dict) -> None:
    """Write a plan (see PlanResult.to_json) as JSON."""
    Path(path).write_text(json.dumps(payload))
