"""moe-monitor diagnose: should I turn EPLB on, and is LP dispatch worth it?

    moe-monitor diagnose (--trace FILE | --redis URL --run NAME [--steps N]) [--gpus G] [--redundant R]
                         [--layout LAYOUT.json] [--dispatch P] [--every N] [--max-moves K] [--hot-experts K]
                         [cost flags] [--gpu-profile NAME|FILE] [--nodes M] [model dimensions] [--json]

Per-step counts [T, L, E] from a trace or counts file (planner.io.load_trace_steps) or a live run's newest --steps
steps; the analytics are planner.diagnose's, with the layout in force's predicted MoE-layer time where the model's
dimensions and a GPU profile are known (cli.timeflags). Flags, layout defaults and figures: docs/diagnose.md.
"""
from __future__ import annotations

import argparse

from moe_monitor.core.dispatch import DISPATCH_POLICIES
from moe_monitor.core.layouts import check_engine_layout, has_unused, with_unused_as_expert

from .common import add_json, guarded, print_json
from .planner import _cost_flags, token_cost
from .stepsource import (
    add_source_flags,
    check_source_flags,
    check_steps_shape,
    contiguous_layout_LP,
    read_live,
    read_trace,
)
from .timeflags import args_time_model, hint, time_lines


def register(sub) -> None:
    from moe_monitor.planner.advisor import DEFAULT_MAX_MOVES
    from moe_monitor.planner.diagnose import DEFAULT_EVERY
    p = sub.add_parser("diagnose", help="should EPLB re-plan, and is LP dispatch worth it (held-out)",
                       description="Persistent vs transient imbalance, how long hot experts stay hot, expert "
                                   "skew, and held-out lost time of the layout in force, EPLB and our re-plans, "
                                   "our repairs within --max-moves copies and the advisor's decisions, LP "
                                   "dispatch and the ideal; a verdict.")
    add_source_flags(p, "--trace", "per-step counts: a trace (.parquet, .arrows, .jsonl) or a counts file [T, L, E]")
    p.add_argument("--gpus", type=int, help="GPUs in the EP group (default: the trace's or run's layout)")
    p.add_argument("--redundant", type=int,
                   help="redundant slots per layer of the re-plans (default: the layout in force's P - E)")
    p.add_argument("--layout", metavar="LAYOUT.json", help="the layout in force (default: see above)")
    p.add_argument("--dispatch", default="even", choices=DISPATCH_POLICIES,
                   help="dispatch policy of the layout in force (default even)")
    p.add_argument("--every", type=int, default=DEFAULT_EVERY,
                   help=f"steps per window: the re-plan interval (default {DEFAULT_EVERY})")
    p.add_argument("--max-moves", type=int, default=DEFAULT_MAX_MOVES,
                   help=f"expert copies per change of the repair and advisor candidates (default "
                        f"{DEFAULT_MAX_MOVES}, the advisor's)")
    p.add_argument("--hot-experts", type=int, help="size of a layer's hot set (default E / 16)")
    _cost_flags(p, "the run's metadata for the time figures (unknown without it), DeepSeek-V3's for the "
                   "advisor's costs", nodes=True)
    add_json(p)
    p.set_defaults(handler=lambda args: guarded(run, args))


def run(args: argparse.Namespace) -> int:
    from moe_monitor.planner.diagnose import diagnose
    from moe_monitor.planner.io import load_engine_layout
    check_source_flags(args)
    given, given_gpus = load_engine_layout(args.layout) if args.layout else (None, None)
    if args.redis:
        src = read_live(args.redis, args.run, args.steps)
    else:
        gpus = args.gpus if args.gpus is not None else given_gpus
        if gpus is not None:  # the shape before any count is read (a trace's metadata and timeline)
            check_steps_shape(args.trace, gpus, given, replan=True, redundant=args.redundant)
        src = read_trace(args.trace)
    counts = src.counts_TLE
    T, L, E = counts.shape
    gpus = args.gpus if args.gpus is not None else given_gpus if given_gpus is not None else src.gpus
    if gpus is None:
        raise ValueError("give --gpus G (the counts file holds no layout)")
    if given_gpus is not None and given_gpus != gpus:
        raise ValueError(f"the layout lists {given_gpus} GPUs, --gpus says {gpus}")
    layout = given if given is not None else src.layout_LP
    notes = list(src.notes)
    if layout is not None and args.layout is None and src.gpus != gpus:
        notes.append(f"the recorded layout is for {src.gpus} GPUs, not {gpus}: the contiguous layout is used")
        layout = None
    if layout is None:
        if E % gpus:
            raise ValueError(f"{E} experts do not split evenly over {gpus} GPUs: give --layout")
        layout = contiguous_layout_LP(L, E)
        notes.append("layout in force: contiguous (P = E)")
    if layout.shape[0] != L:
        raise ValueError(f"the layout has {layout.shape[0]} layers, the counts have {L}")
    redundant = args.redundant if args.redundant is not None else int(layout.shape[1] - E)
    if has_unused(layout):  # an unused slot (-1) holds nothing: a phantom expert without tokens (core/layouts.py)
        check_engine_layout(layout, E, gpus)
        unused = int((layout < 0).sum())
        try:  # a phantom per unused slot of a GPU, so repairs may fill them (no GPU holds one expert twice)
            counts, layout = with_unused_as_expert(counts, layout, gpus, distinct=True)
        except ValueError:  # layers differ in unused slots per GPU: one phantom; such layers are not repaired
            counts, layout = with_unused_as_expert(counts, layout, gpus)
            notes.append("layers differ in unused slots per GPU: where a GPU has two, repairs leave the layer as it is")
        phantoms = counts.shape[-1] - E
        notes.append(f"{unused} unused slot(s) (-1) hold nothing: scored as {phantoms} phantom expert(s) without "
                     f"tokens, which take {phantoms} slot(s) of each re-plan")
        redundant = max(0, redundant - phantoms)
    if redundant == 0:
        notes.append("the re-plans get no redundant slots (pass --redundant R)")
    model = args_time_model(args, src.meta, gpus, src.device_names)
    result = diagnose(counts, layout, gpus, redundant, every=args.every, dispatch=args.dispatch, cost=token_cost(args),
                      hot_experts=args.hot_experts, notes=notes, max_moves=args.max_moves, time_model=model,
                      time_hint=hint(model if isinstance(model, list) else []))
    payload = result.to_json()
    if args.json:
        print_json(payload)
    else:
        print(report(payload))
    return 0


def _f(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def report(payload: dict) -> str:
    """The human text of a diagnosis payload."""
    ranks, hot, skew, v = (payload["rank_persistence"], payload["hot_persistence"], payload["expert_skew"],
                           payload["verdict"])
    lines = [f"{payload['steps']} steps, windows of {payload['every']} steps, {payload['gpus']} GPUs, re-plans with "
             f"{payload['redundant']} redundant slots, repairs within {payload['max_moves']} copies per change, "
             f"dispatch {payload['dispatch']}"]
    lines += [f"note: {n}" for n in payload["notes"]]
    lines += [
        f"rank imbalance: {_f(ranks['persistent_share'])} of the per-step excess survives the window sum "
        f"(per-step {_f(ranks['mean_step_excess'])}, window {_f(ranks['mean_window_excess'])}); same busiest GPU "
        f"as the step before {_f(ranks['same_busiest_share'])}, the layer's usual one {_f(ranks['modal_busiest_share'])} "
        f"(chance {_f(ranks['chance_share'])})",
        f"hot experts (top {hot['hot_experts']}): consecutive windows share {_f(hot['hot_overlap'])} of them, "
        f"an expert stays hot {_f(hot['hot_run_steps'], 0)} steps on average",
        f"expert skew inside GPUs: p50 {_f(skew['p50'])}, p99 {_f(skew['p99'])}",
        f"{'candidate':<16}{'p99 imbalance':>14}{'straggler s':>13}{'migration s':>13}{'lost s':>10}"
        f"{'copies':>9}{'changes':>9}  (seconds per 1,000 steps)"]
    for c in payload["candidates"]:
        lines.append(f"{c['name']:<16}{_f(c['per_step_imbalance_p99']):>14}{_f(c['straggler_s_per_1000_steps']):>13}"
                     f"{_f(c['migration_s_per_1000_steps']):>13}{_f(c['lost_s_per_1000_steps']):>10}"
                     f"{c['moves']:>9}{c['changes']:>9}")
    lines.append("verdict: " + v["text"])
    if "time" in payload:
        lines += [line.replace("time", "time of the layout in force", 1) for line in time_lines(payload["time"])]
    return "\n".join(lines)
