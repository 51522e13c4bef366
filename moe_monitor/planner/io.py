"""Reading expert counts and layouts, and writing layouts.

Inputs, [L, E] or [W, L, E] (W windows, oldest first): SGLang ``logical_count`` JSON (or a bare nested list), a
``.pt`` file (``torch.load(weights_only=True)``, torch imported inside that loader only), vLLM's saved EPLB load
window (``.safetensors``, core/eplb_window.py), or a project trace (steps summed over ranks, split into up to
MAX_WINDOWS contiguous windows); others: ``register_loader(".suffix", fn)`` with ``fn(path) -> [L, E] | [T, L,
E]``. Every input is bounded by the decoded-bytes budget (core/budget.py) before it is decoded: JSON by its worst
case (core/jsonbudget.py), a trace by its steps x layers x experts (COUNTS_CELL_BYTES each). Counts are checked by
core.counts.as_counts; a malformed file gives one ValueError naming it. Layouts: SGLang's map, vLLM's with -1
(an unused slot) or a list per GPU (core.layouts.engine_layout). Output: strict JSON {"physical_to_logical_map":
[[P ints] x L], ...}, which SGLang's --init-expert-location reads.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moe_monitor.core.budget import check_decoded, decoded_budget_bytes
from moe_monitor.core.counts import as_counts
from moe_monitor.core.jsonbudget import numbers_array, read_bounded, read_head
from moe_monitor.core.layouts import UNUSED, parse_engine_layout_json

from .loads import CHUNK_STEPS, MAX_SLOTS
from .windows import MAX_WINDOWS, split_windows

_LOADERS: dict[str, Callable[[Path], object]] = {}
COUNTS_CELL_BYTES = 24  # a cell of a trace's counts loaded: int64 sums, the float64 counts, one temporary
_TRACE_HEAD = re.compile(rb'\s*\{\s*"kind"\s*:\s*"(meta|step|gpu|layout|timing)"')


def register_loader(suffix: str, fn: Callable[[Path], object]) -> None:
    """Teach ``load_counts`` a new file type (e.g. the project's trace files)."""
    _LOADERS[suffix.lower()] = fn


def _from_obj(obj, path: Path):
    if isinstance(obj, dict):
        if "logical_count" not in obj:
            raise ValueError(f"{path}: no 'logical_count' key (found: {', '.join(map(str, list(obj)[:8])) or 'none'})")
        obj = obj["logical_count"]
    if isinstance(obj, list) and not any(hasattr(x, "detach") for x in obj[:1]):
        return numbers_array(obj, f"{path.name}: logical_count")
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
    if looks_like_trace(path):
        return _load_trace(path)
    try:
        obj = read_bounded(str(path), path.name, decoded_budget_bytes())
    except ValueError as exc:
        text = str(exc)
        if " is not JSON: " not in text:
            raise
        detail = text.split(" is not JSON: ", 1)[1]
        if "utf-8" in detail.lower():
            raise ValueError(f"{path}: not UTF-8 text (a JSON file is text)") from None
        raise ValueError(f"{path}: not valid JSON ({detail})") from None
    return _from_obj(obj, path)


def _load_pt(path: Path):
    from moe_monitor.core.ptfile import load_weights_only  # lazily: torch is needed only for .pt input

    return _from_obj(load_weights_only(str(path)), path)


def _load_window(path: Path) -> np.ndarray:
    """vLLM's saved EPLB load window: [L, E] or [W, L, E] counts (core/eplb_window.py)."""
    from moe_monitor.core.eplb_window import read_window

    return read_window(str(path), decoded_budget_bytes()).counts_XLE.astype(np.float64)


def looks_like_trace(path) -> bool:
    """Whether a file starts as a project trace's JSON line does ({"kind": "meta", ...}), from its first bytes."""
    return _TRACE_HEAD.match(read_head(str(path), 256)) is not None


def _is_trace_line(line: str) -> bool:
    """Whether a line starts as a trace line (its first bytes only; the line is never parsed here)."""
    return _TRACE_HEAD.match(line[:256].encode("utf-8", "replace")) is not None


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
register_loader(".safetensors", _load_window)


def load_counts(path) -> np.ndarray:
    """Expert counts from a file, float64 [L, E] or [W, L, E]."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    loader = _LOADERS.get(p.suffix.lower())
    if loader is None:
        raise ValueError(f"{p}: unknown file type '{p.suffix}' (expected one of {', '.join(sorted(_LOADERS))})")
    return as_counts(loader(p), f"{p.name}: logical_count", ndim=(2, 3))


def load_layout(path, unused: bool = False) -> np.ndarray:
    """A layout JSON ({"physical_to_logical_map": ...}) as int64 [L, P]: SGLang's [L][P], vLLM's with -1 (an
    unused slot; refused unless `unused`, for readers that score it with core.layouts.with_unused_as_expert) or
    a list per GPU [L][G][slots] (padded with -1). load_engine_layout also gives the GPUs a per-GPU map lists."""
    return load_engine_layout(path, unused)[0]


def load_engine_layout(path, unused: bool = True) -> tuple[np.ndarray, int | None]:
    """(int64 [L, P] with -1 for an unused slot, the GPUs of a per-GPU map or None) of a layout JSON; ValueError
    naming the file for anything else, and for -1 slots unless `unused`."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    try:
        layout_LP, gpus = parse_engine_layout_json(p.read_bytes())
    except RecursionError:
        raise ValueError(f"{p}: layout JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None
    if layout_LP.max() >= MAX_SLOTS:
        raise ValueError(f"{p}: physical_to_logical_map must hold whole expert ids 0..{MAX_SLOTS - 1}")
    if not unused and layout_LP.min() == UNUSED:
        raise ValueError(f"{p}: the layout leaves slots unused (-1) or GPUs with fewer slots; this command needs "
                         "an expert in every slot (score, diagnose, plan --current and apply read such layouts)")
    return layout_LP, gpus


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
        trace = looks_like_trace(p)
    if trace:
        return as_counts(_trace_counts(p), f"{p.name}: counts", ndim=(3,))
    counts = load_counts(p)
    if counts.ndim != 3:
        raise ValueError(f"{p}: counts are one [layers, experts] table; the advisor and the simulator need "
                         "per-step counts [steps, layers, experts] or a trace")
    return counts


def steps_shape(path) -> tuple[int, int, int] | None:
    """(T steps, L layers, E experts) of a trace from its timeline and metadata, before any count is read; None
    for a counts file (its shape is known once read, within the budget)."""
    p = Path(path)
    if not p.is_file():
        return None
    if p.suffix.lower() not in (".jsonl", ".trace", ".parquet", ".arrows") and not (
            p.suffix.lower() == ".json" and looks_like_trace(p)):
        return None
    from moe_monitor.core.tracefile import open_trace  # pyarrow: only for a trace

    with open_trace(p) as reader:
        return int(reader.timeline().step_T.size), len(reader.meta.layer_names), int(reader.meta.num_experts)


def check_counts_shape(name: str, steps: int, layers: int, num_experts: int, budget_bytes: int | None = None) -> None:
    """ValueError when loading steps x layers x experts counts (COUNTS_CELL_BYTES a cell) is over the budget."""
    budget = decoded_budget_bytes() if budget_bytes is None else budget_bytes
    check_decoded(f"{name}: the counts of {steps} steps x {layers} layers x {num_experts} experts",
                  steps * layers * num_experts * COUNTS_CELL_BYTES, budget)


def _trace_counts(p: Path) -> np.ndarray:
    """int64 [T, L, E] of a trace through tracefile.open_trace, ranks summed; ValueError on any bad record, or a
    shape whose counts are over the decoded-bytes budget (checked before any step is read)."""
    from moe_monitor.core.tracefile import open_trace  # pyarrow: only for a trace

    with open_trace(p) as reader:
        steps_T = reader.timeline().step_T
        if reader.bad_records:
            raise ValueError(f"{p.name}: {reader.bad_records} record(s) do not decode ({reader.last_error})")
        if steps_T.size == 0:
            raise ValueError(f"{p.name}: the trace holds no step lines")
        check_counts_shape(p.name, steps_T.size, len(reader.meta.layer_names), reader.meta.num_experts)
        counts_TLE = np.zeros((steps_T.size, len(reader.meta.layer_names), reader.meta.num_experts), dtype=np.int64)
        for a in range(0, steps_T.size, CHUNK_STEPS):
            b = min(steps_T.size, a + CHUNK_STEPS) - 1
            for rec in reader.read_steps(int(steps_T[a]), int(steps_T[b])):
                counts_TLE[np.searchsorted(steps_T, rec.step)] += rec.counts_LE
        if reader.bad_records:
            raise ValueError(f"{p.name}: {reader.bad_records} record(s) do not decode ({reader.last_error})")
    return counts_TLE
