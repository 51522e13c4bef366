"""moe-monitor plan | advise | simulate | staleness: the planner's commands (docs/planner.md).

    moe-monitor plan --load FILE --gpus G --redundant R [--nodes M --groups Q] [--policy NAME] --out OUT.json
    moe-monitor advise --trace FILE --gpus G --redundant R [--every N --window W --horizon H] --out SCHEDULE.json
    moe-monitor simulate --trace FILE --schedule SCHEDULE.json [--dispatch NAME] [--out RESULT.json]
    moe-monitor staleness --trace FILE --gpus G (--redundant R | --layout LAYOUT.json) --out CURVE.json

--load / --trace: counts [L, E] / [W, L, E] (SGLang logical_count JSON or .pt) or per-step counts (a trace or
[T, L, E]); input limits: docs/planner.md (Input limits). Every output JSON is strict (no NaN or Infinity);
--json prints it on stdout as well.
"""
from __future__ import annotations

import argparse

import numpy as np

from moe_monitor.planner.api import plan
from moe_monitor.planner.io import load_counts, load_layout, write_json

from .common import add_json, guarded, print_json
from .timeflags import add_dims_flags, add_profile_flags, args_time_model


def register(sub) -> None:
    from moe_monitor.planner.advisor import DEFAULT_EVERY, DEFAULT_HORIZON, DEFAULT_MAX_MOVES, DEFAULT_WINDOW
    from moe_monitor.planner.api import POLICIES
    from moe_monitor.planner.tail import OBJECTIVES

    p = sub.add_parser("plan", help="plan a replica layout and export it for SGLang / vLLM",
                       description="Plan an expert layout (physical_to_logical_map) on recorded counts.")
    p.add_argument("--load", required=True, metavar="FILE",
                   help="logical_count JSON or .pt, [L,E] or [W,L,E], or a trace")
    _shape_flags(p)
    p.add_argument("--policy", default="auto", choices=POLICIES)
    p.add_argument("--decay", type=float, default=1.0,
                   help="weight of each older window relative to the next newer one (1 = equal)")
    p.add_argument("--recent", type=int, default=16, help="newest windows balanced at once")
    p.add_argument("--objective", default="window", choices=OBJECTIVES,
                   help="window: balance the summed counts (default); tail: the per-step p99 of a trace or "
                        "[T, L, E] counts under --dispatch; time: the per-step p99 of the predicted MoE-layer "
                        "time (docs/costmodel.md; needs the model's dimensions and --gpu-profile)")
    _dispatch_flag(p, "dispatch the tail and time objectives score under (default even; other policies need "
                      "--objective tail or time)")
    add_dims_flags(p, time=True)
    add_profile_flags(p, nodes=False)
    p.add_argument("--current", metavar="LAYOUT.json", help="current layout JSON: repair it within --moves moves")
    p.add_argument("--moves", type=int, help="move budget for --current, total over layers: one move = one "
                   "expert's weights (of one layer) copied onto a GPU that did not hold that expert")
    p.add_argument("--out", required=True, help="output JSON with physical_to_logical_map")
    _command(p, _run, _print_summary)

    p = sub.add_parser("advise", help="schedule layout changes that pay for their migration",
                       description="Schedule layout changes that pay for their migration (the rebalance advisor).")
    _trace_flag(p)
    _shape_flags(p, nodes_help="nodes: the initial layout is hierarchical; needs --groups")
    p.add_argument("--initial", metavar="LAYOUT.json",
                   help="layout JSON in force at step 0 (default: planned on the first --window steps)")
    p.add_argument("--every", type=int, default=DEFAULT_EVERY, help="steps between decision points")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="steps each decision looks back on")
    p.add_argument("--horizon", type=int, default=DEFAULT_HORIZON, help="steps a change must pay off over")
    p.add_argument("--max-moves", type=int, default=DEFAULT_MAX_MOVES, help="expert copies per change at most")
    p.add_argument("--out", required=True, help="output schedule JSON")
    _dispatch_flag(p, "how each expert's tokens split over its replicas when straggler time is predicted")
    _cost_flags(p)
    _command(p, _advise, _report_advise)

    p = sub.add_parser("simulate", help="score a schedule or a static layout on a trace",
                       description="Score a schedule (or a layout held static) on a trace: straggler + migration "
                                   "time.")
    _trace_flag(p)
    p.add_argument("--schedule", required=True, help="schedule JSON, or a layout JSON held static")
    p.add_argument("--gpus", type=int, help="GPUs (needed when the schedule JSON does not say)")
    p.add_argument("--out", help="write the per-step result JSON here")
    _dispatch_flag(p, "how each expert's tokens split over its replicas when straggler time is charged")
    _cost_flags(p)
    _command(p, _simulate, _report_simulate)

    p = sub.add_parser("staleness", help="imbalance at t + delta of layouts fitted at t",
                       description="Imbalance at t + delta of layouts fitted at t (placement staleness).")
    _trace_flag(p)
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the EP group (G)")
    p.add_argument("--redundant", type=int, help="redundant slots of the fitted layouts (R)")
    p.add_argument("--policy", default="eplb", choices=POLICIES, help="fitting policy (default eplb)")
    p.add_argument("--layout", help="score this layout JSON (fitted at step 0) instead of fitting")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="steps each fit sees")
    p.add_argument("--every", type=int, help="steps between fits (default: --window)")
    p.add_argument("--out", required=True, help="output curve JSON")
    _command(p, _staleness, _report_staleness)


def _shape_flags(p: argparse.ArgumentParser, nodes_help: str = "nodes (M blocks of consecutive GPUs); needs "
                                                                   "--groups") -> None:
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the EP group (G)")
    p.add_argument("--redundant", type=int, required=True, help="redundant expert slots in total (R)")
    p.add_argument("--nodes", type=int, help=nodes_help)
    p.add_argument("--groups", type=int, help="expert groups (Q blocks of consecutive ids); needs --nodes")


def _dispatch_flag(p: argparse.ArgumentParser, text: str) -> None:
    from moe_monitor.core.dispatch import DISPATCH_POLICIES
    p.add_argument("--dispatch", default="even", choices=[d for d in DISPATCH_POLICIES if d != "ideal"],
                   help=text)


def _trace_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="per-step counts: a trace (.parquet, .arrows, .jsonl) or a counts file [T, L, E]")


def _command(p: argparse.ArgumentParser, run, report) -> None:
    """The handler of one planner command: run(args) -> the JSON payload, then report it (or --json it)."""
    add_json(p)

    def handler(args: argparse.Namespace) -> int:
        def body(args: argparse.Namespace) -> int:
            payload = run(args)
            if args.json:
                print_json(payload)
            else:
                report(args, payload)
            return 0
        return guarded(body, args)
    p.set_defaults(handler=handler)


def _run(args) -> dict:
    steps = time_model = None
    if args.objective in ("tail", "time"):
        from moe_monitor.planner.io import load_trace_steps
        from moe_monitor.planner.windows import split_windows
        steps = load_trace_steps(args.load)
        counts = split_windows(steps)
        if args.objective == "time":
            time_model = _time_model(args)
    else:
        counts = load_counts(args.load)
    if args.current is not None:
        if args.moves is None:
            raise ValueError("--current needs --moves K (expert moves allowed)")
        payload = _repair(counts, args)
    else:
        res = plan(counts, args.gpus, args.redundant, nodes=args.nodes, groups=args.groups,
                   policy=args.policy, decay=args.decay, recent=args.recent, dispatch=args.dispatch,
                   objective=args.objective, steps=steps, time_model=time_model)
        payload = res.to_json()
    write_json(args.out, payload)
    return payload


def _repair(counts, args) -> dict:
    """repair_plan of the --current layout; one with unused slots (-1, vLLM's) or a list per GPU is repaired with
    a phantom expert in its unused slots (core/layouts.py), which the repaired map gives back as -1."""
    from moe_monitor.core.layouts import check_engine_layout, has_unused, unused_back, with_unused_as_expert
    from moe_monitor.planner.io import load_engine_layout
    from moe_monitor.planner.repair import repair_plan
    current, listed_gpus = load_engine_layout(args.current)
    if listed_gpus is not None and listed_gpus != args.gpus:
        raise ValueError(f"--current lists {listed_gpus} GPUs, --gpus says {args.gpus}")
    if not has_unused(current):
        return repair_plan(counts, current, args.gpus, args.moves)
    num_experts = counts.shape[-1]
    check_engine_layout(current, num_experts, args.gpus)
    padded, phantom = with_unused_as_expert(counts, current, args.gpus, distinct=True)
    payload = repair_plan(padded, phantom, args.gpus, args.moves)
    payload["physical_to_logical_map"] = unused_back(np.asarray(payload["physical_to_logical_map"]),
                                                     num_experts).tolist()
    payload["replica_counts"] = [row[:num_experts] for row in payload["replica_counts"]]
    payload["unused_slots"] = int((current < 0).sum())
    return payload


def _time_model(args):
    """The TimeModel of --objective time (cli.timeflags.args_time_model on the trace's metadata); ValueError
    naming what is missing."""
    from .stepsource import trace_meta
    from .timeflags import hint

    found = args_time_model(args, trace_meta(args.load), args.gpus)
    if isinstance(found, list):
        raise ValueError(f"--objective time: {', '.join(found)}: {hint(found)}")
    return found


def _print_summary(args, payload: dict) -> None:
    s = payload.get("summary", {})
    print(f"wrote {args.out}: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in s.items()))


def _cost_flags(p: argparse.ArgumentParser, dims_default: str = "the trace's, else DeepSeek-V3",
                nodes: bool = False) -> None:
    """The advisor's cost flags, the model's dimensions and the GPU profile (cli.timeflags): with both known the
    straggler is priced in predicted time (core.costmodel), otherwise in token-slots at --tflops."""
    from moe_monitor.planner.simulate import DEFAULT_LINK_GBPS, DEFAULT_TFLOPS
    p.add_argument("--link-gbps", type=float, default=DEFAULT_LINK_GBPS,
                   help=f"link bandwidth in Gb/s (1e9 bits/s) shared by a migration's expert copies (default {DEFAULT_LINK_GBPS:g})")
    p.add_argument("--tflops", type=float, default=DEFAULT_TFLOPS,
                   help=f"effective expert TFLOP/s of one GPU: sets seconds per token-slot (default {DEFAULT_TFLOPS:g})")
    add_dims_flags(p, dims_default, time=True)
    add_profile_flags(p, nodes=nodes)
    p.add_argument("--step-seconds", type=float,
                   help="seconds of one step for step-time equivalents (default: the trace's balanced expert time)")


def _cost(args, gpus: int):
    """The advisor's CostModel: in predicted time when the dimensions (flags, else the trace's metadata) and a GPU
    profile (--gpu-profile, else the trace's) are known; else token-slots (token_cost)."""
    from moe_monitor.planner.simulate import CostModel

    from .stepsource import trace_meta

    found = args_time_model(args, trace_meta(args.trace), gpus)
    if not isinstance(found, list):
        return CostModel.in_time(found, link_gbps=args.link_gbps, step_seconds=args.step_seconds)
    return token_cost(args)


def token_cost(args):
    """The advisor's CostModel in token-slots at --tflops, for the dimensions given (DeepSeek-V3's where none is)."""
    from moe_monitor.planner.simulate import CostModel
    from moe_monitor.planner.sizes import DEEPSEEK_V3
    return CostModel.for_sizes(args.hidden or DEEPSEEK_V3.hidden_size,
                               args.moe_intermediate or DEEPSEEK_V3.moe_intermediate_size,
                               args.weight_bytes or DEEPSEEK_V3.dtype_bytes, tflops=args.tflops,
                               link_gbps=args.link_gbps, step_seconds=args.step_seconds)


def _advise(args) -> dict:
    from moe_monitor.planner.advisor import advise
    from moe_monitor.planner.io import load_trace_steps
    counts = load_trace_steps(args.trace)
    initial = None if args.initial is None else load_layout(args.initial)
    if (args.nodes is None) != (args.groups is None):
        raise ValueError("--nodes and --groups go together: give both or neither")
    sched = advise(counts, args.gpus, args.redundant, initial_LP=initial, every=args.every, window=args.window,
                   horizon_steps=args.horizon, max_moves=args.max_moves, cost=_cost(args, args.gpus), nodes=args.nodes,
                   groups=args.groups, dispatch=args.dispatch)
    payload = sched.to_json()
    write_json(args.out, payload)
    return payload


def _report_advise(args, payload: dict) -> None:
    ch = payload["changes"][1:]
    print(f"wrote {args.out}: changes={len(ch)}, moves={sum(c['moves'] for c in ch)}, "
          f"predicted_gain_s={sum(c['predicted_gain_s'] for c in ch):.4f}, "
          f"migration_s={sum(c['predicted_migration_s'] for c in ch):.4f}")


def _simulate(args) -> dict:
    from moe_monitor.planner.io import load_trace_steps
    from moe_monitor.planner.schedule import load_schedule
    from moe_monitor.planner.simulate import simulate
    counts = load_trace_steps(args.trace)
    schedule = load_schedule(args.schedule, args.gpus)
    res = simulate(counts, schedule, _cost(args, schedule.gpus), dispatch=args.dispatch)
    payload = res.to_json()
    if args.out is not None:
        write_json(args.out, payload)
    return payload


def _report_simulate(args, payload: dict) -> None:
    s = payload["summary"]
    print(("" if args.out is None else f"wrote {args.out}: ") + ", ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()))


def _staleness(args) -> dict:
    from moe_monitor.planner.io import load_trace_steps
    from moe_monitor.planner.staleness import StalenessCurve, staleness
    counts = load_trace_steps(args.trace)
    layout = None if args.layout is None else load_layout(args.layout)
    if layout is None and args.redundant is None:
        raise ValueError("staleness needs --redundant R (to fit layouts) or --layout LAYOUT.json")
    curve = staleness(counts, args.gpus, args.redundant, layout_LP=layout, fit_window=args.window,
                      fit_every=args.every, policy=args.policy)
    if not isinstance(curve, StalenessCurve):           # per-phase curves: the CLI gives no phases
        raise ValueError("staleness: expected one curve")
    payload = curve.to_json()
    write_json(args.out, payload)
    return payload


def _report_staleness(args, payload: dict) -> None:
    m = [v for v in payload["mean_imbalance"] if v is not None]
    print(f"wrote {args.out}: fits={len(payload['fit_steps'])}, deltas={len(payload['deltas'])}"
          + (f", imbalance at delta 0 = {m[0]:.4f}, at the last delta = {m[-1]:.4f}" if m else ""))
