"""The cost model against measured time on the CPU EP runtime (demo/ep): experts large enough that weight reads
matter (hidden 2048 x expert 1408 x 3 matrices, fp32: 34.6 MB each), decode- and prefill-sized steps cycled in
one run, routing skewed so that tokens and active experts per rank disagree: rank 0 holds 2 hot experts (and 6
that are never routed), rank 1 holds 8 lukewarm ones. The ranks take turns in each layer's expert compute
(EPConfig.serial_compute): each is timed with the CPU's memory bandwidth to itself, as a GPU has its own HBM.

The profile is fitted (moe-monitor calibrate's reader and core.calibration) on the steps of some batch sizes
and judged on the steps of the others: per regime, the median and p90 relative error of predicted vs measured
per-rank expert-compute time of each (step, layer), and how often the time model and the token count name the
measured busiest rank. Dispatch and combine are left out (fitted apart, reported).

    python -m bench.costmodel [--cycles 16] [--layers 3] [--experts 16] [--hot 0.4]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings

from bench.malloc_env import pin_malloc

DECODE = (1, 2, 4, 8, 16)       # tokens per rank of a decode-like step (batch x 1)
PREFILL = (64, 128, 256, 512)   # tokens per rank of a prefill-like step (batch x 64)
HELD = (2, 8, 128, 512)         # sizes held out of the fit
GOALS = {"median": 0.10, "p90": 0.20}


def _args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.costmodel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=16, help="times every batch size runs")
    parser.add_argument("--warmup-cycles", type=int, default=2, help="first cycles left out")
    parser.add_argument("--layers", type=int, default=3, help="MoE layers")
    parser.add_argument("--experts", type=int, default=16, help="routed experts (a multiple of 8)")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=1408, help="expert intermediate size")
    parser.add_argument("--hot", type=float, default=0.4,
                        help="router bias of the 2 hot experts over the lukewarm ones (sigmoid scores are 0..1)")
    return parser.parse_args(argv)


def _goal(value: float, name: str) -> str:
    return f"<= {GOALS[name]:.0%} " + ("ok" if value <= GOALS[name] else "MISS")


def _shapes() -> tuple[tuple[int, int], ...]:
    return tuple((n, 1) for n in DECODE) + tuple((n // 64, 64) for n in PREFILL)


def main(argv=None) -> int:
    args = _args(argv)
    warnings.filterwarnings("ignore")
    import numpy as np

    from moe_monitor.cli.calibrate import read_run
    from moe_monitor.core.calibration import errors, fit_profile
    from moe_monitor.core.costmodel import TimeModel
    from moe_monitor.demo.ep import EPConfig, launch
    from moe_monitor.demo.localredis import RedisServer

    E, ranks = args.experts, 2
    half = E // ranks
    # rank 0 (experts 0..half-1): 2 hot, the rest never routed; rank 1: all lukewarm
    log_pop = tuple([args.hot] * 2 + [-20.0] * (half - 2) + [0.0] * half)
    shapes = _shapes()
    run = "bench-costmodel"
    server = RedisServer(tempfile.mkdtemp(prefix="moe-bench-costmodel-redis-"))
    try:
        cfg = EPConfig(ranks=ranks, steps=args.cycles * len(shapes), moe_layers=args.layers, strength=1.0,
                       drift_period_s=1e9, redis_url=server.url, run=run, nvml=False, grouped_experts=True,
                       hidden_size=args.hidden, moe_intermediate_size=args.ffn, num_experts=E, top_k=args.top_k,
                       expert_log_pop=log_pop, shapes=shapes, threads=1, timeout_s=600.0,
                       serial_compute=True)
        started = time.monotonic()
        launch(cfg, timeout_s=3600)
        wall_s = time.monotonic() - started
        data = read_run(server.url, run, warmup=args.warmup_cycles * len(shapes))
    finally:
        server.stop()

    tokens_X = np.array([np.prod(shapes[int(s) % len(shapes)]) for s in data.steps_X])
    held = np.isin(tokens_X, HELD)
    fitted = fit_profile(data.dims, data.slot_tokens_XLP[~held], data.compute_s_XLG[~held], data.gpus,
                         name="CPU EP rank", source="bench.costmodel", comm_s_XLG=data.comm_s_XLG[~held])
    profile, dims = fitted.profile, data.dims
    model = TimeModel(dims, profile, data.gpus)

    print(f"cost model vs measured, CPU EP runtime: {ranks} ranks (gloo, 1 thread each), {dims.label()} "
          f"({dims.expert_bytes / 1e6:.1f} MB per expert), {E} experts, top-{args.top_k}, {args.layers} layers; "
          f"{len(data.steps_X)} steps in {wall_s:.0f} s (incl. start-up)")
    print(f"  routing: rank 0 holds 2 hot experts (bias +{args.hot}) and {half - 2} never routed, rank 1 holds "
          f"{half} lukewarm")
    fit_sizes = sorted({int(n) for n in tokens_X[~held]})
    print(f"  fitted on tokens/rank {fit_sizes} ({int((~held).sum())} steps): HBM {profile.hbm / 1e9:.2f} GB/s, "
          f"peak {profile.peak_flops(dims.weight_bytes) / 1e9:.1f} GFLOP/s, overhead "
          f"{profile.overhead_s * 1e3:.2f} ms/layer, ridge {profile.ridge_tokens(dims.weight_bytes):.1f} "
          f"tokens/expert, reads and FLOPs {'overlap (max)' if profile.overlap else 'add (sum)'}; in-sample median "
          f"error {fitted.errors.median_rel:.1%}")
    if fitted.link is not None:
        print(f"  dispatch + combine (fitted apart, not in the table): link {fitted.link.link_bytes_per_s / 1e9:.2f} "
              f"GB/s, latency {fitted.link.latency_s * 1e3:.2f} ms, median error {fitted.link.median_rel:.0%}")
    print(f"  held out, tokens/rank {sorted(HELD)}: predicted vs measured expert-compute time of each (step, layer, "
          "rank); busiest rank of each (step, layer) named by each model")
    print(f"  {'regime':8} {'steps':>5} {'median err':>10} {'goal':>12} {'p90 err':>8} {'goal':>12}   "
          f"{'time model':>10} {'tokens':>7}  goal")
    for regime, sizes in (("decode", DECODE), ("prefill", PREFILL)):
        pick = held & np.isin(tokens_X, sizes)
        e = errors(model, data.slot_tokens_XLP[pick], data.compute_s_XLG[pick])
        goal = ("time > tokens: " + ("ok" if e.straggler_time > e.straggler_tokens else "MISS")) if regime == "decode" \
            else "-"
        print(f"  {regime:8} {int(pick.sum()):>5} {e.median_rel:>10.1%} {_goal(e.median_rel, 'median'):>12} "
              f"{e.p90_rel:>8.1%} {_goal(e.p90_rel, 'p90'):>12}   {e.straggler_time:>10.0%} {e.straggler_tokens:>7.0%}  "
              f"{goal}")
    times = model.gpu_times(data.slot_tokens_XLP)
    other = "sum" if profile.overlap else "max"   # the form calibration did not keep, for comparison
    other_model = TimeModel(dims, fit_profile(dims, data.slot_tokens_XLP[~held], data.compute_s_XLG[~held], data.gpus,
                                              form=other).profile, data.gpus)
    for regime, sizes in (("decode", DECODE), ("prefill", PREFILL)):
        pick = held & np.isin(tokens_X, sizes)
        e = errors(other_model, data.slot_tokens_XLP[pick], data.compute_s_XLG[pick])
        print(f"  the other form, {regime}: reads and FLOPs {'added' if other == 'sum' else 'overlapped (max)'}: "
              f"median err {e.median_rel:.1%}, p90 {e.p90_rel:.1%}")
    for regime, sizes in (("decode", DECODE), ("prefill", PREFILL)):
        pick = np.isin(tokens_X, sizes)
        tok, act = times.tokens[pick].mean(axis=(0, 1)), times.active_slots[pick].mean(axis=(0, 1))
        measured = np.nanmean(data.compute_s_XLG[pick], axis=(0, 1))
        print(f"  {regime}: per rank tokens {np.round(tok, 1).tolist()}, active experts {np.round(act, 1).tolist()}, "
              f"measured compute {np.round(measured * 1e3, 2).tolist()} ms/layer (mean)")
    return 0


if __name__ == "__main__":
    pin_malloc()
    sys.exit(main())
