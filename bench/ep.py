"""The EP runtime (demo/ep) on the CPU: what a planned layout buys in measured MoE layer time, beside what the
planner predicts, and what the timing records cost, all in one run.

One run of `--ranks` processes (torch.distributed, gloo) with the demo's skewed traffic (no drift during the
run, so the windows before and after compare like with like), publishing to a private redis-server.
- Layout: contiguous for the first `--window` steps; then the counts of that window (all ranks summed) go
  through planner.plan(gpus=ranks, redundant=--redundant) and the layout is switched live (weights moved
  point to point). Measured: mean over steps and layers of the MoE layer time (the slowest rank's, from the
  timing records) and of the expert compute time, before and after (the first `--warmup` steps of each side
  left out). Predicted: the mean over layers of the max GPU load (even split over replicas), contiguous over
  planned, on the first window's counts (in sample) and on the counts after the switch (out of sample).
- Timing overhead: timing on and off alternate step by step (timings on even steps) for the whole run; the
  ratio of the medians of rank 0's step time, on over off (steps are synchronous across ranks).

    python -m bench.ep [--ranks 4] [--window 30] [--after 30] [--redundant 32]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings

from bench.malloc_env import pin_malloc


def _args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--window", type=int, default=30, help="steps on the contiguous layout (the plan's input)")
    parser.add_argument("--after", type=int, default=30, help="steps on the planned layout")
    parser.add_argument("--warmup", type=int, default=4, help="steps left out at the start of each side")
    parser.add_argument("--redundant", type=int, default=32, help="spare slots for the planner")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--strength", type=float, default=0.05, help="skew of the routers' bias (demo: 0.05)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    warnings.filterwarnings("ignore")
    import numpy as np
    import redis

    from moe_monitor import core
    from moe_monitor.core import loadmodel
    from moe_monitor.demo.ep import EPConfig, launch
    from moe_monitor.demo.localredis import RedisServer

    server = RedisServer(tempfile.mkdtemp(prefix="moe-bench-ep-redis-"))
    try:
        cfg = EPConfig(ranks=args.ranks, steps=args.window + args.after, batch=args.batch, seq_len=args.seq_len,
                       strength=args.strength, drift_period_s=1e9, auto_plan_at_step=args.window,
                       auto_plan_redundant=args.redundant, timing_toggle_every=1, redis_url=server.url,
                       run="bench-ep", nvml=False, grouped_experts=True)
        started = time.monotonic()
        results = launch(cfg, timeout_s=3600)
        wall_s = time.monotonic() - started
        client = redis.Redis.from_url(server.url)
        timings = [core.decode_timing(f) for _, f in client.xrange(core.timings_key(cfg.run))]
        steps = [core.decode_step(f) for _, f in client.xrange(core.steps_key(cfg.run))]
        client.close()
    finally:
        server.stop()

    rank0 = results[0]
    switch = rank0["applied"][0]
    from_step = switch["from_step"]
    layer_max, compute_max = {}, {}  # step -> [L] slowest rank's time
    for t in timings:
        layer_max[t.step] = np.fmax(layer_max.get(t.step, np.full_like(t.layer_s_L, np.nan)), t.layer_s_L)
        compute_max[t.step] = np.fmax(compute_max.get(t.step, np.full_like(t.compute_s_L, np.nan)), t.compute_s_L)

    def side(table: dict, lo: int, hi: int) -> float:
        return float(np.mean([table[s].mean() for s in sorted(table) if lo + args.warmup <= s < hi]))

    before_layer, after_layer = side(layer_max, 0, from_step), side(layer_max, from_step, rank0["steps"])
    before_compute, after_compute = side(compute_max, 0, from_step), side(compute_max, from_step, rank0["steps"])

    counts_LE = np.asarray(rank0["plan_counts_LE"], dtype=np.float64)
    planned_LP = np.asarray(rank0["plan_layout_LP"], dtype=np.int64)
    contiguous_LP = np.tile(np.arange(counts_LE.shape[1]), (counts_LE.shape[0], 1))
    after_counts_LE = sum(s.counts_LE.astype(np.float64) for s in steps if s.step >= from_step)

    def max_load(counts, layout_LP) -> float:
        return float(loadmodel.gpu_loads(counts, layout_LP, args.ranks).max(axis=1).mean())

    predicted_in = max_load(counts_LE, contiguous_LP) / max_load(counts_LE, planned_LP)
    predicted_out = max_load(after_counts_LE, contiguous_LP) / max_load(after_counts_LE, planned_LP)
    eta_before = float(loadmodel.balancedness(loadmodel.gpu_loads(counts_LE, contiguous_LP, args.ranks)).mean())
    eta_after = float(loadmodel.balancedness(loadmodel.gpu_loads(counts_LE, planned_LP, args.ranks)).mean())

    from moe_monitor.dashboard.analytics.timing import summarise  # the Time page's numbers (numpy only)

    def shares(lo: int, hi: int):
        """The Time page's summary of steps lo..hi-1 (warm-up left out): arrays [T, R, L]."""
        picked = sorted({t.step for t in timings if lo + args.warmup <= t.step < hi})
        arrays = {name: np.full((len(picked), args.ranks, len(timings[0].layer_s_L)), np.nan)
                  for name in ("dispatch_s_L", "compute_s_L", "combine_s_L", "layer_s_L")}
        row = {step: i for i, step in enumerate(picked)}
        for t in timings:
            if t.step in row:
                for name, out in arrays.items():
                    out[row[t.step], t.rank] = getattr(t, name)
        return summarise(*arrays.values())

    timed_before, timed_after = shares(0, from_step), shares(from_step, rank0["steps"])
    step_s, timed = rank0["step_s"], rank0["timed"]
    on = [s for i, (s, t) in enumerate(zip(step_s, timed)) if t and i >= args.warmup and i != from_step]
    off = [s for i, (s, t) in enumerate(zip(step_s, timed)) if not t and i >= args.warmup and i != from_step]
    med_on, med_off = statistics.median(on), statistics.median(off)

    print(f"EP runtime, {args.ranks} ranks (gloo, CPU), {args.batch}x{args.seq_len} tokens/rank/step, "
          f"{rank0['steps']} steps in {wall_s:.0f} s (incl. start-up)")
    print(f"  layout switched live at step {from_step}: {switch['moves']} expert copies, "
          f"{switch['bytes_moved'] / 1e6:.1f} MB, {switch['seconds'] * 1000:.0f} ms on rank 0")
    print(f"  balancedness (first window, mean over layers): contiguous {eta_before:.3f} -> planned {eta_after:.3f}")
    print(f"  MoE layer time, slowest rank, mean: {before_layer * 1e3:.2f} ms -> {after_layer * 1e3:.2f} ms "
          f"(gain x{before_layer / after_layer:.3f})")
    print(f"  expert compute time, slowest rank, mean: {before_compute * 1e3:.2f} ms -> {after_compute * 1e3:.2f} ms "
          f"(gain x{before_compute / after_compute:.3f})")
    print(f"  predicted max-GPU-load gain: x{predicted_in:.3f} in sample, x{predicted_out:.3f} on the steps after")
    print(f"  measured / predicted gain: layer {(before_layer / after_layer) / predicted_out:.3f}, "
          f"compute {(before_compute / after_compute) / predicted_out:.3f}")
    for name, summary in (("before", timed_before), ("after", timed_after)):
        print(f"  all-to-all share of layer time {name}: dispatch {summary.dispatch_share:.1%}, combine "
              f"{summary.combine_share:.1%}; achieved overlap {summary.overlap:.2f}")
    print(f"  timing records overhead: step time median on {med_on * 1e3:.2f} ms / off {med_off * 1e3:.2f} ms = "
          f"x{med_on / med_off:.3f} ({len(on)} + {len(off)} interleaved steps)")
    return 0


if __name__ == "__main__":
    pin_malloc()
    sys.exit(main())
