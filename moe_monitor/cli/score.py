"""moe-monitor score: per-step tails of recorded counts under a layout and a dispatch policy.

    moe-monitor score --load COUNTS [--layout LAYOUT.json] --gpus G [--dispatch even|round_robin|lp|ideal] [--json]

COUNTS: per-step counts [T, L, E]: SGLang logical_count JSON (one [L, E] entry per step) or a project trace
(ranks summed per step; planner.io.load_trace_steps). LAYOUT.json: {"physical_to_logical_map": [[...]]}; without
it the contiguous layout (P = E, expert e on GPU e // (E / G)). The figures are core.steptails' (docs/diagnose.md):
per-step imbalance p50 / p99 / max over the (step, layer) pairs with tokens, the window imbalance, the ideal
fraction and the expert skew.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from moe_monitor.core.dispatch import DISPATCH_POLICIES

from .common import add_json, guarded, print_json


def register(sub) -> None:
    p = sub.add_parser("score", help="per-step imbalance of recorded counts under a layout and dispatch policy",
                       description="Per-step imbalance, ideal fraction and expert skew of per-step counts under "
                                   "a layout and a dispatch policy.")
    p.add_argument("--load", required=True, metavar="COUNTS",
                   help="per-step counts: logical_count JSON [T, L, E] or a trace (.parquet, .arrows, .jsonl)")
    p.add_argument("--layout", metavar="LAYOUT.json",
                   help="physical_to_logical_map JSON (default: the contiguous layout, P = E)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the EP group (G)")
    p.add_argument("--dispatch", default="even", choices=DISPATCH_POLICIES,
                   help="how an expert's tokens split over its replicas (default even)")
    add_json(p)
    p.set_defaults(handler=lambda args: guarded(score, args))


TRACE_SUFFIXES = (".parquet", ".arrows", ".jsonl", ".trace")


def is_trace(path) -> bool:
    """Whether the file is a project trace (a trace container, or a .json whose first line is a trace line)."""
    from moe_monitor.planner.io import _is_trace_line
    p = Path(path)
    if p.suffix.lower() in TRACE_SUFFIXES:
        return True
    if p.suffix.lower() != ".json" or not p.is_file():
        return False
    try:
        with p.open("r", encoding="utf-8") as handle:
            return _is_trace_line(handle.readline())
    except UnicodeDecodeError:
        return False


def load_steps(path) -> np.ndarray:
    """Per-step counts float64 [T, L, E] of a trace or a counts file (planner.io.load_trace_steps); a counts file
    holding one [L, E] table is refused with words for score and diagnose."""
    from moe_monitor.planner.io import load_counts, load_trace_steps
    if is_trace(path) or not Path(path).is_file():
        return load_trace_steps(path)
    counts = load_counts(path)
    if counts.ndim != 3:
        raise ValueError(f"{path}: one [layers, experts] table has no steps; give per-step counts "
                         "[steps, layers, experts] (one entry per step) or a trace")
    return counts


def contiguous_layout_LP(layers: int, num_experts: int) -> np.ndarray:
    """The default layout int64 [L, E]: slot p holds expert p in every layer."""
    return np.tile(np.arange(num_experts, dtype=np.int64), (layers, 1))


def score_payload(counts_TLE: np.ndarray, layout_LP: np.ndarray | None, gpus: int, dispatch: str) -> dict:
    """StepTails.to_json() of counts [T, L, E] under layout_LP [L, P] (None: contiguous) on `gpus` GPUs."""
    from moe_monitor.core.steptails import step_tails
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {gpus}")
    T, L, E = counts_TLE.shape
    if T == 0:
        raise ValueError("the counts hold no step")
    if layout_LP is None:
        if E % gpus:
            raise ValueError(f"{E} experts do not split evenly over {gpus} GPUs: give --layout")
        layout_LP = contiguous_layout_LP(L, E)
    elif layout_LP.shape[0] != L:
        raise ValueError(f"the layout has {layout_LP.shape[0]} layers, the counts have {L}")
    payload = step_tails(counts_TLE, layout_LP, gpus, dispatch).to_json()
    payload.update(layers=int(L), experts=int(E), slots=int(layout_LP.shape[1]), gpus=int(gpus))
    return payload


def score(args: argparse.Namespace) -> int:
    from moe_monitor.planner.io import load_layout
    counts = load_steps(args.load)
    layout = None if args.layout is None else load_layout(args.layout)
    payload = score_payload(counts, layout, args.gpus, args.dispatch)
    if args.json:
        print_json(payload)
    else:
        print(report(payload))
    return 0


def _f(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def report(payload: dict) -> str:
    """The short human text of a score payload."""
    imb, skew = payload["per_step_imbalance"], payload["expert_skew"]
    return "\n".join([
        f"{payload['steps']} steps x {payload['layers']} layers, {payload['gpus']} GPUs, {payload['slots']} slots, "
        f"dispatch {payload['dispatch']}",
        f"per-step imbalance (max/mean GPU load): p50 {_f(imb['p50'])}, p99 {_f(imb['p99'])}, max {_f(imb['max'])}",
        f"window imbalance {_f(payload['window_imbalance'])}, ideal fraction {_f(payload['ideal_fraction'])}",
        f"expert skew: p50 {_f(skew['p50'])}, p99 {_f(skew['p99'])}, max {_f(skew['max'])}"])
