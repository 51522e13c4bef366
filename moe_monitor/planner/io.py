"""Reading expert counts and writing layouts.

Inputs, [L, E] or [W, L, E] (W windows, oldest first): SGLang ``logical_count`` JSON (or a bare nested list), a
``.pt`` file (``torch.load(weights_only=True)``, torch imported inside that loader only), or a project trace
(steps summed over ranks, split into up to MAX_WINDOWS contiguous windows); others: ``register_loader(".suffix",
fn)`` with ``fn(path) -> [L, E] | [T, L, E]``. Counts are checked by core.counts.as_counts; a malformed file
gives one ValueError naming it. Output: strict JSON {"physical_to_logical_map": [[P ints] x L], ...}, which
SGLang's --init-expert-location reads.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moe_monitor import core
from moe_monitor.core.counts import as_counts

from .loads import CHUNK_STEPS, MAX_SLOTS
from .windows import MAX_WINDOWS, split_windows

_LOADERS: dict[str, Callable[[Path], object]] = {}


def register_loader(suffix: str, fn: Callable[[Path], object]) -> None:
    """Teach ``load_counts`` a new file type (e.g. the project's trace files)."""
    _LOADERS[suffix.lower()] = fn


def _from_obj(obj, path: Path):
    if isinstance(obj, dict):
        if "logical_count" not in obj:
            raise ValueError(f"{path}: no 'logical_count' key (found: {', '.join(map(str, obj)) or 'none'})")
        obj = obj["logical_count"]
    return _tensors_to_arrays(obj, path)


def _tensors_to_arrays(obj, path: Path, depth: int = 0):
    """obj with every torch tensor (at the top or inside lists, as a .pt may hold them) as a float64 array;
    as_counts checks the rest."""
    if hasattr(obj, "detach"):  # a torch tensor: only a .pt file holds one, so torch is loaded
        from moe_monitor.core.ptfile import tensor_array

        return tensor_array(obj, str(path))
    if isinstance(obj, (list, tuple)) and depth < 3:
        return [_tensors_to_arrays(x, path, depth + 1) for x in obj]
    return obj


def _load_json(path: Path):
    try:
        with path.open("r", encoding="utf-8") as handle:
            first = handle.readline()
        if _is_trace_line(first):
            return _load_trace(path)
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (a JSON file is text)") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply (counts are [layers][experts] or "
                         "[windows][layers][experts])") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's limit on digits
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return _from_obj(obj, path)


def _load_pt(path: Path):
    from moe_monitor.core.ptfile import load_weights_only  # lazily: torch is needed only for .pt input

    return _from_obj(load_weights_only(str(path)), path)


def _is_trace_line(line: str) -> bool:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("kind") in ("meta", "step", "gpu")


def _load_trace(path: Path) -> np.ndarray:
    """A trace (JSON lines, .parquet or .arrows) -> float64 [W, L, E]: every step's counts with its ranks summed,
    in step order, split into W = min(MAX_WINDOWS, steps) contiguous windows of (nearly) equal step counts, each
    summed (read through the trace containers, core.tracefile, as every reader of a trace does)."""
    return split_windows(_trace_counts(path), MAX_WINDOWS)


register_loader(".json", _load_json)
register_loader(".jsonl", _load_trace)
register_loader(".trace", _load_trace)
register_loader(".parquet", _load_trace)
register_loader(".arrows", _load_trace)
register_loader(".pt", _load_pt)
register_loader(".pth", _load_pt)


def load_counts(path) -> np.ndarray:
    """Expert counts from a file, float64 [L, E] or [W, L, E]."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    loader = _LOADERS.get(p.suffix.lower())
    if loader is None:
        raise ValueError(f"{p}: unknown file type '{p.suffix}' (expected one of {', '.join(sorted(_LOADERS))})")
    return as_counts(loader(p), f"{p.name}: logical_count", ndim=(2, 3))


def load_layout(path) -> np.ndarray:
    """A layout JSON ({"physical_to_logical_map": [[...]]}) as int64 [L, P]."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    try:
        rows = core.parse_layout_json(p.read_bytes())
    except RecursionError:
        raise ValueError(f"{p}: layout JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None
    if len({len(row) for row in rows}) != 1:
        raise ValueError(f"{p}: physical_to_logical_map must have the same number of slots in every layer")
    if not rows[0]:
        raise ValueError(f"{p}: physical_to_logical_map has layers without slots")
    if not all(type(v) is int and 0 <= v < MAX_SLOTS for row in rows for v in row):
        raise ValueError(f"{p}: physical_to_logical_map must hold whole expert ids 0..{MAX_SLOTS - 1}")
    return np.asarray(rows, dtype=np.int64)


def write_json(path, payload: dict) -> None:
    """Write a plan (see PlanResult.to_json) as strict JSON: ValueError, and nothing written, when it holds
    NaN or an infinity (JSON has neither; Python would write NaN / Infinity, which SGLang cannot read)."""
    try:
        text = json.dumps(payload, allow_nan=False)
    except ValueError:
        raise ValueError(f"{path}: the plan holds NaN or infinite numbers; nothing written") from None
    Path(path).write_text(text)


def load_trace_steps(path) -> np.ndarray:
    """Per-step counts float64 [T, L, E] from a file: a project trace read through tracefile.open_trace (a columnar
    ``.parquet`` / ``.arrows`` trace, or JSON lines: ``.jsonl`` / ``.trace`` or a ``.json`` whose first line is
    a trace line; ranks summed, steps in order, a repeated record once; a line or row that does not decode is
    refused, naming the file) or a counts file planner.io.load_counts reads with shape [T, L, E]. The one
    reader of the advisor and the simulator. ValueError naming the file otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    trace = p.suffix.lower() in (".jsonl", ".trace", ".parquet", ".arrows")
    if p.suffix.lower() == ".json":
        try:
            with p.open("r", encoding="utf-8") as handle:
                trace = _is_trace_line(handle.readline())
        except UnicodeDecodeError:
            raise ValueError(f"{p}: not UTF-8 text (a JSON file is text)") from None
    if trace:
        return as_counts(_trace_counts(p), f"{p.name}: counts", ndim=(3,))
    counts = load_counts(p)
    if counts.ndim != 3:
        raise ValueError(f"{p}: counts are one [layers, experts] table; the advisor and the simulator need "
                         "per-step counts [steps, layers, experts] or a trace")
    return counts


def _trace_counts(p: Path) -> np.ndarray:
    """int64 [T, L, E] of a trace through tracefile.open_trace, ranks summed; ValueError on any bad record."""
    from moe_monitor.core.tracefile import open_trace  # pyarrow: only for a trace

    with open_trace(p) as reader:
        steps_T = reader.timeline().step_T
        if reader.bad_records:
            raise ValueError(f"{p.name}: {reader.bad_records} record(s) do not decode ({reader.last_error})")
        if steps_T.size == 0:
            raise ValueError(f"{p.name}: the trace holds no step lines")
        counts_TLE = np.zeros((steps_T.size, len(reader.meta.layer_names), reader.meta.num_experts), dtype=np.int64)
        for a in range(0, steps_T.size, CHUNK_STEPS):
            b = min(steps_T.size, a + CHUNK_STEPS) - 1
            for rec in reader.read_steps(int(steps_T[a]), int(steps_T[b])):
                counts_TLE[np.searchsorted(steps_T, rec.step)] += rec.counts_LE
        if reader.bad_records:
            raise ValueError(f"{p.name}: {reader.bad_records} record(s) do not decode ({reader.last_error})")
    return counts_TLE
