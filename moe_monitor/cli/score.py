"""moe-monitor score: per-step tails of recorded counts under a layout and a dispatch policy.

    moe-monitor score (--load COUNTS | --redis URL --run NAME [--steps N]) [--layout LAYOUT.json] [--gpus G]
                      [--dispatch even|round_robin|lp|ideal] [--gpu-profile NAME|FILE] [--hidden H ...] [--json]

COUNTS: per-step counts [T, L, E] (SGLang logical_count JSON or a project trace, ranks summed per step:
planner.io.load_trace_steps). The figures are core.steptails' per-step tails and, with the model's dimensions
and a GPU profile, planner.timecost's predicted MoE-layer time. Flags, defaults, fields: docs/diagnose.md.
"""
from __future__ import annotations

import argparse

import numpy as np

from moe_monitor.core.dispatch import DISPATCH_POLICIES

from .common import add_json, guarded, print_json
from .stepsource import (
    add_source_flags,
    check_source_flags,
    check_steps_shape,
    contiguous_layout_LP,
    load_steps,
    read_live,
    trace_meta,
)
from .timeflags import add_dims_flags, add_profile_flags, args_time_model, hint, time_lines


def register(sub) -> None:
    p = sub.add_parser("score", help="per-step imbalance of recorded counts under a layout and dispatch policy",
                       description="Per-step imbalance, ideal fraction and expert skew of per-step counts under "
                                   "a layout and a dispatch policy.")
    add_source_flags(p, "--load", "per-step counts: logical_count JSON [T, L, E] or a trace (.parquet, .arrows, .jsonl)")
    p.add_argument("--layout", metavar="LAYOUT.json",
                   help="physical_to_logical_map JSON (default: the contiguous layout, P = E; a live run: its own)")
    p.add_argument("--gpus", type=int, help="GPUs in the EP group (G; needed with --load, a live run's by default)")
    p.add_argument("--dispatch", default="even", choices=DISPATCH_POLICIES,
                   help="how an expert's tokens split over its replicas (default even)")
    add_profile_flags(p)
    add_dims_flags(p)
    add_json(p)
    p.set_defaults(handler=lambda args: guarded(score, args))


def score_payload(counts_TLE: np.ndarray, layout_LP: np.ndarray | None, gpus: int, dispatch: str,
                  time_model=None) -> dict:
    """StepTails.to_json() of counts [T, L, E] under layout_LP [L, P] (None: contiguous) on `gpus` GPUs, and
    `time`: planner.timecost.time_payload under time_model (a TimeModel, or the reasons there is none; None:
    no `time`)."""
    from moe_monitor.core.steptails import step_tails
    from moe_monitor.planner.timecost import time_payload
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
    from moe_monitor.core.layouts import check_engine_layout
    layout_LP = check_engine_layout(layout_LP, E, gpus)  # -1, an unused slot, serves nothing under every policy
    payload = step_tails(counts_TLE, layout_LP, gpus, dispatch).to_json()
    payload.update(layers=int(L), experts=int(E), slots=int(layout_LP.shape[1]), gpus=int(gpus),
                   unused_slots=int((layout_LP < 0).sum()))
    if time_model is not None:
        missing = [] if not isinstance(time_model, list) else time_model
        payload["time"] = time_payload(counts_TLE, layout_LP, gpus, dispatch, time_model, hint(missing))
    return payload


def score(args: argparse.Namespace) -> int:
    from moe_monitor.planner.io import load_engine_layout
    check_source_flags(args)
    layout = layout_gpus = None
    if args.layout is not None:  # read first: a bad layout is said before the counts are loaded
        layout, layout_gpus = load_engine_layout(args.layout)
    if args.redis is not None:
        src = read_live(args.redis, args.run, args.steps)
        counts, gpus = src.counts_TLE, args.gpus if args.gpus is not None else src.gpus
        if args.layout is None:  # the run's layout is for its own GPUs: another --gpus scores contiguous
            layout = src.layout_LP if args.gpus is None or args.gpus == src.gpus else None
        meta, names = src.meta, src.device_names
    else:
        gpus = args.gpus if args.gpus is not None else layout_gpus
        if gpus is None:
            raise ValueError("--load needs --gpus G")
        check_steps_shape(args.load, gpus, layout)
        counts = load_steps(args.load)
        meta, names = trace_meta(args.load), []
    if gpus is None:
        raise ValueError(f"run {args.run!r} does not say its GPUs: give --gpus G")
    if layout_gpus is not None and layout_gpus != gpus:
        raise ValueError(f"the layout lists {layout_gpus} GPUs, --gpus says {gpus}")
    payload = score_payload(counts, layout, gpus, args.dispatch, args_time_model(args, meta, gpus, names))
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
        f"expert skew: p50 {_f(skew['p50'])}, p99 {_f(skew['p99'])}, max {_f(skew['max'])}",
        *(time_lines(payload["time"]) if "time" in payload else [])])
