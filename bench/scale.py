"""Scale test: 256 expert-parallel ranks at 20 steps/s for 60 s into one private Redis (DeepSeek-V3 shaped records
through collectors.sinks.RedisSink from several processes), the aggregator summing them and the dashboard reading
its stream; then the same through a private 3-master Redis Cluster and the scaling from 1 to 3 masters. Ends with
a table of the figures beside the goals (docs/scaling.md: what each figure is, and those measured).

    python -m bench.scale [--ranks 256] [--steps-per-s 20] [--seconds 60] [--cluster | --no-cluster] ...

About 4.5 minutes on 2 cores. A short version: `python -m bench.scale --ranks 32 --seconds 10 --ramp ""
--backlog-s 0 --cluster-seconds 10`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from bench.harness.scale import (
    BLAS_THREADS,
    Load,
    Result,
    Split,
    blas_threads,
    measure,
    print_summary,
    report_scaling,
    split_load,
)
from bench.harness.target import Target
from bench.malloc_env import STEADY, pin_malloc


def main(argv: list[str] | None = None) -> int:
    loads_before = os.getloadavg()
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps-per-s", type=float, default=20.0, help="steps per second per rank")
    parser.add_argument("--seconds", type=float, default=60.0, help="the single Redis's main load")
    parser.add_argument("--processes", type=int, default=4, help="load generator processes")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per rank per step (decode)")
    parser.add_argument("--window", type=int, default=600, help="the dashboard's window, steps")
    parser.add_argument("--maxmemory-mb", type=int, default=1024)
    parser.add_argument("--policy", default="noeviction", help="maxmemory-policy")
    parser.add_argument("--memory-budget-mb", type=int, default=256, help="the collectors' stream budget")
    parser.add_argument("--ramp", default="20,40,80,160", help="steps/s per rank of the ceiling ramp ('' = none)")
    parser.add_argument("--ramp-seconds", type=float, default=15.0)
    parser.add_argument("--backlog-s", type=float, default=10.0,
                        help="seconds of steps (at --steps-per-s) in the aggregator's backlog throughput test (0: none)")
    parser.add_argument("--no-aggregator", action="store_true")
    parser.add_argument("--count-stream", action="store_true", help="tail the stream and count every rank's steps")
    parser.add_argument("--run", default="scale")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--cluster", action="store_true", help="the cluster only")
    which.add_argument("--no-cluster", action="store_true", help="the single Redis only")
    parser.add_argument("--cluster-seconds", type=float, default=40.0, help="the cluster's loads (0: no cluster)")
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=0, help="replicas per master (0 on a 2-core machine)")
    parser.add_argument("--cluster-ramp", default="", help="the ceiling ramp through the cluster ('' = none)")
    parser.add_argument("--cluster-backlog-s", type=float, default=0.0,
                        help="the aggregator's backlog test through the cluster (0: none)")
    parser.add_argument("--no-split", action="store_true", help="no 1 -> 3 masters scaling")
    parser.add_argument("--blas-threads", type=int, default=1,
                        help="OPENBLAS/OMP/MKL_NUM_THREADS of this process, where the dashboard's analysis runs (0: "
                             "the library's default pool, whose threads stall on a machine the load keeps busy)")
    args = parser.parse_args(argv)
    pin_malloc({**STEADY, **({name: str(args.blas_threads) for name in BLAS_THREADS} if args.blas_threads > 0
                             else {})})
    with contextlib.suppress(Exception):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    print(f"load average before this benchmark (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in loads_before)} on "
          f"{os.cpu_count()} CPUs (anything else running shares them with the figures below); the dashboard's "
          f"analysis runs with {blas_threads()}")
    load = Load(args.ranks, args.steps_per_s, args.processes, args.tokens, args.memory_budget_mb,
                instance=f"scale-{os.getpid():x}")
    options = dict(ramp_seconds=args.ramp_seconds, backlog_s=args.backlog_s, window=args.window,
                   aggregate=not args.no_aggregator, count_stream=args.count_stream)
    cores = os.cpu_count() or 1
    results: list[Result] = []
    split: Split | None = None
    one: Result | None = None
    ok = True
    if not args.cluster:
        tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
        target = Target("single", str(tmp), args.maxmemory_mb << 20, args.policy)
        try:
            print(f"== single Redis: private redis-server {target.version()}, maxmemory {args.maxmemory_mb} MiB, "
                  f"maxmemory-policy {args.policy}; {cores} CPUs here")
            rates = [float(r) for r in args.ramp.split(",") if r.strip()]
            results.append(measure(target, load, args.run, args.seconds, tmp, "single Redis", rates, **options))
            ok = ok and results[-1].report.ok
        finally:
            target.stop()
    if not args.no_cluster and args.cluster_seconds > 0:
        tmp = Path(tempfile.mkdtemp(prefix="bench-scale-cluster-"))
        target = Target("cluster", str(tmp), args.maxmemory_mb << 20, args.policy, args.masters, args.replicas)
        try:
            print(f"\n== Redis Cluster: {args.masters} masters x {args.replicas} replicas (private redis-server "
                  f"{target.version()} nodes on loopback, maxmemory {args.maxmemory_mb} MiB each), "
                  f"{args.cluster_seconds:g} s; {cores} CPUs here")
            rates = [float(r) for r in args.cluster_ramp.split(",") if r.strip()]
            label = f"{args.masters}-master cluster"
            one = measure(target, load, args.run, args.cluster_seconds, tmp, label, rates,
                          **{**options, "backlog_s": args.cluster_backlog_s})
            results.append(one)
            ok = ok and one.report.ok
            if not args.no_split and one.aggregator and len(target.masters) > 1:
                target.flush()
                print(f"\n{args.ranks} ranks split into {len(target.masters)} runs on {len(target.masters)} "
                      f"masters, each with its own aggregator, {args.cluster_seconds:g} s:")
                split = split_load(target, load, args.cluster_seconds, tmp, f"{args.run}-split")
                for (run, port), share, report in zip(split.runs, split.shares, split.reports):
                    print(f"  {run} (master :{port}, {share} ranks in {len(report.processes)} processes): "
                          f"{report.written:,} of {report.expected:,} written, {report.failed} failed, "
                          f"{report.rate:,.0f} records/s, lateness p99 {report.lateness_s[1]:.2f} s, write median "
                          f"{report.write_s[0] * 1e3:.2f} ms, client CPU {report.cpu_s:.1f} s")
                report_scaling(one, split, target, cores)
                ok = ok and split.lost == 0
        finally:
            target.stop()
    print_summary(results, split, one)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
