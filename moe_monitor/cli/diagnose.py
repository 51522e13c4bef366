"""moe-monitor diagnose: should I turn EPLB on, and is LP dispatch worth it?

    moe-monitor diagnose (--trace FILE | --redis URL --run NAME [--steps N]) [--gpus G] [--redundant R]
                         [--layout LAYOUT.json] [--dispatch P] [--every N] [--max-moves K] [--hot-experts K]
                         [cost flags] [--json]

Per-step counts [T, L, E] come from a trace or counts file (planner.io.load_trace_steps) or from a live run's newest
--steps steps in Redis (ranks summed per step; the aggregator's summed steps when it runs). The layout in force is
--layout, else the trace's or run's layout in force at the first step (its metadata's, or the last layout change
before), else the contiguous layout over --gpus. The analytics are planner.diagnose's (docs/diagnose.md); the cost
flags are `moe-monitor advise`'s.
"""
from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moe_monitor import core
from moe_monitor.core.dispatch import DISPATCH_POLICIES

from .common import add_json, guarded, print_json
from .planner import _cost, _cost_flags
from .score import is_trace, load_steps

LIVE_WINDOW_STEPS = 2000      # --steps default: the newest steps read from Redis
LIVE_READ_S = 60.0            # a live read gives up after this long


def register(sub) -> None:
    from moe_monitor.planner.advisor import DEFAULT_MAX_MOVES
    from moe_monitor.planner.diagnose import DEFAULT_EVERY
    p = sub.add_parser("diagnose", help="should EPLB re-plan, and is LP dispatch worth it (held-out)",
                       description="Persistent vs transient imbalance, how long hot experts stay hot, expert "
                                   "skew, and held-out lost time of the layout in force, EPLB and our re-plans, "
                                   "our repairs within --max-moves copies and the advisor's decisions, LP "
                                   "dispatch and the ideal; a verdict.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="FILE",
                     help="per-step counts: a trace (.parquet, .arrows, .jsonl) or a counts file [T, L, E]")
    src.add_argument("--redis", metavar="URL", help="read a live run from this Redis (with --run)")
    p.add_argument("--run", metavar="NAME", help="the live run's name (with --redis)")
    p.add_argument("--steps", type=int, default=LIVE_WINDOW_STEPS,
                   help=f"newest steps of the live run read (default {LIVE_WINDOW_STEPS})")
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
    _cost_flags(p)
    add_json(p)
    p.set_defaults(handler=lambda args: guarded(run, args))


@dataclass
class Source:
    """Per-step counts float64 [T, L, E], the layout in force at the first step (None: unknown) and its GPUs."""
    counts_TLE: np.ndarray
    layout_LP: np.ndarray | None
    gpus: int | None
    notes: list[str]


def run(args: argparse.Namespace) -> int:
    from moe_monitor.planner.diagnose import diagnose
    from moe_monitor.planner.io import load_layout
    if args.redis is not None and args.run is None:
        raise ValueError("--redis needs --run NAME")
    if args.redis is None and args.run is not None:
        raise ValueError("--run goes with --redis URL")
    src = read_live(args.redis, args.run, args.steps) if args.redis else read_trace(args.trace)
    counts = src.counts_TLE
    T, L, E = counts.shape
    gpus = args.gpus if args.gpus is not None else src.gpus
    if gpus is None:
        raise ValueError("give --gpus G (the counts file holds no layout)")
    layout = load_layout(args.layout) if args.layout else src.layout_LP
    notes = list(src.notes)
    if layout is not None and args.layout is None and src.gpus != gpus:
        notes.append(f"the recorded layout is for {src.gpus} GPUs, not {gpus}: the contiguous layout is used")
        layout = None
    if layout is None:
        if E % gpus:
            raise ValueError(f"{E} experts do not split evenly over {gpus} GPUs: give --layout")
        layout = np.tile(np.arange(E, dtype=np.int64), (L, 1))
        notes.append("layout in force: contiguous (P = E)")
    if layout.shape[0] != L:
        raise ValueError(f"the layout has {layout.shape[0]} layers, the counts have {L}")
    redundant = args.redundant if args.redundant is not None else int(layout.shape[1] - E)
    if redundant == 0:
        notes.append("the re-plans get no redundant slots (pass --redundant R)")
    result = diagnose(counts, layout, gpus, redundant, every=args.every, dispatch=args.dispatch, cost=_cost(args),
                      hot_experts=args.hot_experts, notes=notes, max_moves=args.max_moves)
    payload = result.to_json()
    if args.json:
        print_json(payload)
    else:
        print(report(payload))
    return 0


def read_trace(path: str) -> Source:
    """A trace's per-step counts and the layout in force at its first step; a counts file's counts alone."""
    counts = load_steps(path)
    if not is_trace(path):
        return Source(counts, None, None, [])
    from moe_monitor.core.tracefile import open_trace
    with open_trace(Path(path)) as reader:
        steps_T = reader.timeline().step_T
        meta = reader.meta
        layout, gpus = np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64), meta.layout.gpus
        records = reader.layouts_in_force(int(steps_T[0]), int(steps_T[-1]))
    return _with_changes(Source(counts, layout, gpus, []), records, int(steps_T[0]))


def _with_changes(src: Source, records: list[core.LayoutRecord], first_step: int) -> Source:
    """The layout record in force at first_step (when any) replaces the metadata's; later changes are noted."""
    fitting = [rec for rec in records if rec.gpus == src.gpus and rec.num_layers == src.counts_TLE.shape[1]]
    if fitting and fitting[0].step <= first_step:
        src.layout_LP = np.asarray(fitting[0].physical_to_logical_LP, dtype=np.int64)
        fitting = fitting[1:]
    if fitting:
        src.notes.append(f"{len(fitting)} layout change(s) inside the window are not followed: the layout in force "
                         "at the first step is held")
    return src


def read_live(url: str, run: str, steps: int) -> Source:
    """The newest ``steps`` steps of a live run (ranks summed per step, or the aggregator's sums) and the layout in
    force at the first of them. ValueError when the run has no metadata or no steps; Redis errors propagate."""
    from moe_monitor.dashboard.sources.redis import RedisSource  # the dashboard's own reader of a live run
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    core.check_run_name(run)
    client = core.connect(url, timeout_s=5.0)
    try:
        client.ping()
        source = RedisSource(client, url, run, steps)
        per_step: dict[int, np.ndarray] = {}
        ranks: dict[int, int] = {}                      # per-rank records of each step (aggregates: the world)
        layouts: list[core.LayoutRecord] = []
        deadline = time.monotonic() + LIVE_READ_S
        quiet = 0
        while time.monotonic() < deadline:
            batch = source.poll(4000)
            health = source.health()
            if not health.reachable:
                raise ValueError(f"Redis: {health.error}")
            for rec in batch.steps:
                _add(per_step, rec.step, rec.counts_LE)
                ranks[rec.step] = ranks.get(rec.step, 0) + 1
            for agg in batch.aggregates:
                _add(per_step, agg.step, agg.counts_LE)
                ranks[agg.step] = 1 << 30
            layouts.extend(batch.layouts)
            got = bool(batch.steps or batch.aggregates)
            quiet = 0 if batch.more or got else quiet + 1
            if quiet >= 2:                              # the window is read (or the run has none)
                break
            if not batch.more and not got:
                time.sleep(0.05)
    finally:
        client.close()
    meta = source.meta()
    if meta is None:
        raise ValueError(f"run {run!r} has no metadata in Redis" + (f" ({source.meta_error})" if source.meta_error
                                                                     else ""))
    shape = (len(meta.layer_names), meta.num_experts)
    kept = sorted(s for s, c in per_step.items() if c.shape == shape)
    if len(kept) > 1 and ranks[kept[-1]] < meta.world_size:  # the newest step: not every rank has written it yet
        kept = kept[:-1]
    kept = kept[-steps:]
    if not kept:
        raise ValueError(f"run {run!r} has no step records in Redis")
    counts = np.stack([per_step[s] for s in kept]).astype(np.float64)
    valid: list[core.LayoutRecord] = []
    for change in layouts:
        with contextlib.suppress(ValueError):       # a change that does not fit the run: left out
            valid.append(change.validate(meta.num_experts, num_layers=len(meta.layer_names)))
    before = [change for change in valid if change.step <= kept[0]][-1:]
    src = Source(counts, np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64), meta.layout.gpus,
                 [f"live run {run}: steps {kept[0]}..{kept[-1]}"])
    return _with_changes(src, before + [c for c in valid if kept[0] < c.step <= kept[-1]], kept[0])


def _add(per_step: dict[int, np.ndarray], step: int, counts_LE: np.ndarray) -> None:
    counts = np.asarray(counts_LE, dtype=np.int64)
    held = per_step.get(step)
    per_step[step] = counts if held is None or held.shape != counts.shape else held + counts


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
    return "\n".join(lines)
