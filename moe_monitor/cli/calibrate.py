"""moe-monitor calibrate: a GPU profile fitted to a run's measured expert-compute times (core.calibration).

    moe-monitor calibrate --redis URL --run NAME [--out PROFILE.json] [--holdout 0.25] [--warmup 2]
                          [--steps N] [--tile-tokens 1] [--name NAME] [--json]

Reads the run's metadata (model dimensions, layout, dispatch policy), its step records (ranks summed by
core.assembly's Assembler), its layout changes and its timing records; fits on most steps, reports the errors on
the held-out rest (every 1/holdout-th step) and writes the profile (--gpu-profile FILE reads it back).
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from moe_monitor import core
from moe_monitor.core.assembly import Assembler
from moe_monitor.core.calibration import Calibration, FitErrors, errors, fit_profile
from moe_monitor.core.costmodel import ModelDims, TimeModel
from moe_monitor.core.dispatch import DispatchModel
from moe_monitor.core.timeline import index_in_force
from moe_monitor.dashboard.sources.base import Batch
from moe_monitor.dashboard.sources.streams import StreamEntry, pages_after

from .common import add_json, guarded, print_json

T = TypeVar("T")
PAGE = 1000           # stream entries read at once
READ_ENTRIES = 1 << 22  # entries of one stream read at most
READ_BYTES = 1 << 30  # bytes of one stream read at most (the collectors' memory budget bounds a stream below it)
DEFAULT_HOLDOUT = 0.25
DEFAULT_WARMUP = 2    # first steps of the run left out (first-use allocations, lazily stacked weights)


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit a GPU profile to a run's measured expert-compute times",
                       description="Fit the cost model's HBM bandwidth, FLOP/s and per-layer overhead to a run's "
                                   "timing records (the compute phase), on its step counts and layouts; print "
                                   "the fit's and the held-out steps' errors and write the profile as JSON.")
    p.add_argument("--redis", required=True, metavar="URL", help="the Redis the run publishes to")
    p.add_argument("--run", required=True, metavar="NAME", help="the run's name")
    p.add_argument("--out", metavar="PROFILE.json", help="write the fitted profile here (--gpu-profile reads it)")
    p.add_argument("--holdout", type=float, default=DEFAULT_HOLDOUT,
                   help=f"share of steps held out of the fit, every 1/share-th (default {DEFAULT_HOLDOUT}; 0: none)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"first steps left out (default {DEFAULT_WARMUP})")
    p.add_argument("--steps", type=int, default=0, help="newest steps used (default: all the streams hold)")
    p.add_argument("--tile-tokens", type=int, default=1,
                   help="the grouped GEMM's M tile of the profile (default 1: a CPU's)")
    p.add_argument("--name", help="the profile's name (default: calibrated RUN)")
    add_json(p)
    p.set_defaults(handler=lambda args: guarded(run, args))


@dataclass
class RunTimings:
    """What a run measured, per used step: slot tokens float64 [X, L, P] (ranks summed by the Assembler, under
    the layout in force and the run's dispatch policy; slots padded to the most per GPU), compute and dispatch
    + combine seconds float64 [X, L, G] (NaN: not measured); steps_X the step ids; notes what was left out."""

    meta: core.RunMeta
    dims: ModelDims
    gpus: int
    steps_X: np.ndarray
    slot_tokens_XLP: np.ndarray
    compute_s_XLG: np.ndarray
    comm_s_XLG: np.ndarray
    notes: list[str]


def _pages(client, key: str, notes: list[str]) -> Iterator[list[StreamEntry]]:
    """A stream's entries, oldest first, in pages (dashboard.sources.streams.pages_after), READ_BYTES at most."""
    flags = Batch()
    yield from pages_after(client, key, b"0-0", READ_ENTRIES, PAGE, READ_BYTES, flags)
    if flags.more:
        notes.append(f"{key}: the oldest {READ_BYTES >> 20} MiB read, the newer entries left out")


def _records(client, key: str, decode: Callable[[dict], T], notes: list[str]) -> Iterator[T]:
    """The records of a stream that decode (the others are skipped)."""
    for page in _pages(client, key, notes):
        for _, fields in page:
            try:
                yield decode(fields)
            except ValueError:
                continue


def _assembled(client, run: str, meta: core.RunMeta, notes: list[str]) -> dict[int, np.ndarray]:
    """step -> counts int64 [L, E] summed over every rank (core.assembly.Assembler); steps some rank is missing
    from are left out. The aggregator's sums when the run's raw step stream is empty."""
    assembler = Assembler(run)
    assembler.meta_world = meta.world_size
    found: dict[int, np.ndarray] = {}

    def keep(out) -> None:
        for emitted in out.emitted:
            rec = emitted.record
            if not rec.late and not rec.missing_ranks.size:
                found[rec.step] = rec.counts_LE

    for page in _pages(client, core.steps_key(run), notes):
        decoded = []
        for entry_id, fields in page:
            try:
                decoded.append((entry_id, core.decode_step(fields)))
            except ValueError as exc:
                assembler.bad(entry_id, str(exc))
        keep(assembler.add(decoded, 0.0))
    keep(assembler.due(math.inf))
    if not found:
        for agg in _records(client, core.aggregate_key(run), core.decode_aggregate, notes):
            if not agg.missing_ranks.size:
                found[agg.step] = agg.counts_LE
    return found


def read_run(url: str, run: str, steps: int = 0, warmup: int = 0) -> RunTimings:
    """A run's measured compute times and the slot tokens they came from (see RunTimings). ValueError with one
    line when the run lacks what a fit needs: metadata, model dimensions, timing records, steps."""
    core.check_run_name(run)
    client = core.connect(url, timeout_s=5.0)
    try:
        client.ping()
        raw_meta = client.get(core.meta_key(run))
        if raw_meta is None:
            raise ValueError(f"run {run!r} has no metadata in Redis")
        meta = core.decode_meta(raw_meta)
        dims = ModelDims.from_meta(meta)
        if dims is None:
            raise ValueError(f"run {run!r} does not declare its model dimensions (hidden_size, "
                             "moe_intermediate_size, dtype_bytes): nothing to fit")
        notes: list[str] = []
        timings = {(rec.step, rec.rank): rec for rec in _records(client, core.timings_key(run), core.decode_timing,
                                                                 notes)}
        if not timings:
            raise ValueError(f"run {run!r} has no timing records (the collectors' time_layer): nothing to fit")
        counts = _assembled(client, run, meta, notes)

        def checked_layout(fields: dict) -> core.LayoutRecord:
            return core.decode_layout_record(fields).validate(meta.num_experts, num_layers=len(meta.layer_names), unused=True)

        layouts = list(_records(client, core.layouts_key(run), checked_layout, notes))
    finally:
        client.close()
    return _tables(meta, dims, counts, timings, layouts, steps, warmup, notes)


def _tables(meta: core.RunMeta, dims: ModelDims, counts: dict[int, np.ndarray],
            timings: dict[tuple[int, int], core.TimingRecord], layouts: list[core.LayoutRecord], steps: int,
            warmup: int, notes: list[str]) -> RunTimings:
    run, L, E, gpus = meta.run, len(meta.layer_names), meta.num_experts, meta.layout.gpus
    if meta.world_size != gpus:
        raise ValueError(f"run {run!r} has {meta.world_size} ranks on {gpus} GPUs: calibrate needs one rank per "
                         "GPU (rank r timed GPU r)")
    timed = sorted({step for step, _ in timings})
    first = timed[0] + max(warmup, 0) if timed else 0
    used = [s for s in timed if s >= first and s in counts and counts[s].shape == (L, E)
            and any(timings[(s, r)].compute_s_L.shape == (L,) for r in range(gpus) if (s, r) in timings)]
    if steps > 0:
        used = used[-steps:]
    if not used:
        raise ValueError(f"run {run!r} has no step with counts from every rank and timing records of {L} layers")
    changes = sorted((rec for rec in layouts if rec.gpus == gpus), key=lambda rec: rec.step)
    if len(changes) < len(layouts):
        notes = notes + [f"{len(layouts) - len(changes)} layout change(s) on other GPU counts left out"]
    initial = np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64)
    groups: dict[int, tuple[np.ndarray, list[int]]] = {}  # index of the change in force (-1: the metadata's) -> steps
    for step, k in zip(used, index_in_force([rec.step for rec in changes], used).tolist()):
        layout = initial if k < 0 else np.asarray(changes[k].layout_LP, dtype=np.int64)
        groups.setdefault(k, (layout, []))[1].append(step)
    slots = max(layout.shape[1] // gpus for layout, _ in groups.values())
    tokens: dict[int, np.ndarray] = {}
    for layout, group in groups.values():
        model = DispatchModel(layout, E, gpus, meta.dispatch)
        loads_XLP = model.slot_loads(np.stack([counts[s] for s in group]).astype(np.float64))
        per_gpu = layout.shape[1] // gpus
        padded = np.zeros(loads_XLP.shape[:2] + (gpus, slots))
        padded[..., :per_gpu] = loads_XLP.reshape(loads_XLP.shape[:2] + (gpus, per_gpu))
        tokens.update(zip(group, padded.reshape(loads_XLP.shape[:2] + (gpus * slots,))))
    compute = np.full((len(used), L, gpus), np.nan)
    comm = np.full((len(used), L, gpus), np.nan)
    for x, step in enumerate(used):
        for rank in range(gpus):
            rec = timings.get((step, rank))
            if rec is not None and rec.compute_s_L.shape == (L,):
                compute[x, :, rank] = rec.compute_s_L
                comm[x, :, rank] = rec.dispatch_s_L.astype(np.float64) + rec.combine_s_L
    if not np.isfinite(compute).any():
        raise ValueError(f"the timing records of run {run!r} hold no compute times (only whole layers timed)")
    return RunTimings(meta, dims, gpus, np.asarray(used), np.stack([tokens[s] for s in used]), compute, comm, notes)


def split(steps: int, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """(fit, held) bool [steps]: every round(1 / holdout)-th step held out (none for holdout 0)."""
    held = np.zeros(steps, dtype=bool)
    if holdout > 0:
        every = max(2, round(1.0 / holdout))
        held[every - 1::every] = True
    return ~held, held


def run(args: argparse.Namespace) -> int:
    if not 0.0 <= args.holdout < 1.0:
        raise ValueError(f"--holdout must be in [0, 1), got {args.holdout}")
    if args.tile_tokens < 1:
        raise ValueError(f"--tile-tokens must be >= 1, got {args.tile_tokens}")
    data = read_run(args.redis, args.run, args.steps, args.warmup)
    fit, held = split(len(data.steps_X), args.holdout)
    if args.holdout > 0 and (fit.sum() < 1 or held.sum() < 1):
        raise ValueError(f"run {args.run!r} has {len(data.steps_X)} usable step(s): too few to hold some out "
                         "(give --holdout 0)")
    steps_X = data.steps_X
    source = f"calibrated on run {args.run}, steps {steps_X[fit][0]}..{steps_X[fit][-1]} ({int(fit.sum())} steps)"
    result = fit_profile(data.dims, data.slot_tokens_XLP[fit], data.compute_s_XLG[fit], data.gpus,
                         name=args.name or f"calibrated {args.run}", source=source, tile_tokens=args.tile_tokens,
                         comm_s_XLG=data.comm_s_XLG[fit])
    held_errors = None
    if held.any():
        held_errors = errors(TimeModel(data.dims, result.profile, data.gpus), data.slot_tokens_XLP[held],
                             data.compute_s_XLG[held])
    if args.out:
        Path(args.out).write_text(result.profile.to_json() + "\n")
    payload = {"run": args.run, "steps": int(len(steps_X)), "fit_steps": int(fit.sum()),
               "held_steps": int(held.sum()), "layers": int(data.compute_s_XLG.shape[1]), "gpus": data.gpus, "model": data.dims.label(),
               "profile": asdict(result.profile), "fit": _clean(result.errors.to_json()),
               "held_out": _clean(held_errors.to_json()) if held_errors else None,
               "link": _clean(asdict(result.link)) if result.link else None, "out": args.out, "notes": data.notes}
    if args.json:
        print_json(payload)
    else:
        print(report(data, result, held_errors, args.out))
    return 0


def _clean(values: dict) -> dict:
    """NaN -> None (the --json output is strict JSON)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()}


def _errors_line(label: str, e: FitErrors) -> str:
    line = f"{label}: median error {e.median_rel:.1%}, p90 {e.p90_rel:.1%} over {e.cells} (step, layer, GPU) cells"
    if e.layer_cells:
        line += (f"; busiest GPU named by the time model {e.straggler_time:.0%}, by tokens {e.straggler_tokens:.0%} "
                 f"of {e.layer_cells} (step, layer) cells")
    return line


def report(data: RunTimings, result: Calibration, held: FitErrors | None, out: str | None) -> str:
    """The human text of a calibration."""
    p, dims = result.profile, data.dims
    peak = p.peak_flops(dims.weight_bytes)
    lines = [f"run {data.meta.run}: {len(data.steps_X)} steps x {data.compute_s_XLG.shape[1]} layers x {data.gpus} "
             f"GPUs ({dims.label()})",
             f"fitted: HBM {p.hbm / 1e9:.2f} GB/s, peak {peak / 1e9:.2f} GFLOP/s, overhead {p.overhead_s * 1e3:.3f} ms "
             f"per layer, tile {p.tile_tokens}; ridge {p.ridge_tokens(dims.weight_bytes):.1f} tokens per expert"]
    if result.link is not None:
        lines.append(f"link (dispatch + combine, fitted apart): {result.link.link_bytes_per_s / 1e9:.3f} GB/s, "
                     f"latency {result.link.latency_s * 1e3:.3f} ms, median error {result.link.median_rel:.1%}")
    else:
        lines.append("link: dispatch and combine not measured (not fitted)")
    lines.append(_errors_line("fit", result.errors))
    lines.append(_errors_line("held out", held) if held is not None else "held out: none (--holdout 0)")
    lines += data.notes
    lines.append(f"profile written to {out}" if out else "profile not written (give --out PROFILE.json)")
    return "\n".join(lines)
