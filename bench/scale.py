"""Scale test: 256 expert-parallel ranks at 20 steps/s for 60 s into one private Redis (bench.loadgen: DeepSeek-V3
shaped compact records, 64 decode tokens per rank and step, through collectors.sinks.RedisSink from several
processes), the aggregator (moe-monitor aggregate) summing them and a dashboard reading its stream; then the same
through a private 3-master Redis Cluster (demo.localcluster) and the scaling from 1 to 3 masters. Ends with a
table of the figures beside the goals.

Redis: private redis-servers with `maxmemory` (--maxmemory-mb, default 1024) and `maxmemory-policy noeviction`
(--policy): under noeviction a full Redis refuses the write (the collector counts it) instead of evicting a run's
keys behind everyone's back. While the load runs, a sampler reads every 0.5 s: INFO memory used_memory of every
master, the steps stream's length, XINFO GROUPS on the steps stream (`lag`: entries not yet delivered to the
aggregator's group; `pending`: delivered, not acknowledged) and the newest aggregated step (core.aggregate_key)
against the newest written step. Printed per target (the single Redis, then the cluster):

- records written / failed (what the writers report; the stream is trimmed at MAXLEN ~ and by the aggregator, so
  counting it afterwards cannot prove that no step was lost; --count-stream also tails the stream and counts each
  rank's distinct steps as they arrive), the achieved rate, how late records landed, write latency, client and
  redis-server CPU, used_memory peak (INFO, right after the main load) and the stream's memory per entry;
- the aggregator (`moe-monitor aggregate --redis URL --run NAME`, a subprocess started before the load):
  how far behind it read, how long after the last write it had caught up, its progress hash
  (core.aggregator_key(run) + ":state": steps written, rank-steps it wrote a step without);
- the dashboard: a WatchedRun over a RedisSource (the dashboard's own reader, window --window 600 steps) on a thread
  of this process, started once the aggregate stream holds the window (or half the run when the run is shorter):
  the cold first tick(s) reading the window's backlog, then one tick a second (the pages' refresh) while steps
  arrive, each timed as bench.aggregate_tick does: tick() + resolve_layout + dashboard.live.snapshot.analyse;
  the feed it read ("aggregate": the aggregator's stream, not the per-rank records). This process runs with one
  BLAS thread (--blas-threads 1; 0: the library's default pool): on a machine the load keeps busy, OpenBLAS's
  pool of 2 threads stalls (the GPU loads of 20 new rows, core.loadmodel.weighted_loads, ~3 ms on one thread, took
  15-40 ms median and 200-900 ms p90 with the default pool next to two busy processes on 2 cores);
- redis-benchmark's XADD rate (bench.wire.redis_benchmark_rate: -P 16, 50 clients) for an entry of the size the
  load generator writes, into the same Redis (for the cluster: the master of the benchmark's key), after the load;
- the ceiling: a ramp (--ramp, steps/s per rank, each for --ramp-seconds; the cluster: --cluster-ramp) finds the
  highest rate after which the aggregator caught up within 2 s of the last write with no rank-step missing (the
  ramp stops where the load generator itself cannot go faster: the ceiling is then at least that); then the
  aggregator alone on a backlog (--backlog-s seconds of steps written while it is stopped, then a fresh aggregator):
  the records per second it consumes with the CPU to itself, its ceiling in steps/s at --ranks ranks.

Cluster (--cluster-seconds, default 40; --masters 3, --replicas 0: on a 2-core machine replicas only take CPU from
the figures, --replicas 1 adds them): the same load, aggregator and dashboard through the cluster URL (core.connect
speaks cluster). A run's keys share one hash slot (core.run_key's hash tag), so one run lives on one master. The
scaling from 1 to 3 masters: (i) the one run of --ranks ranks above and (ii) the same ranks split into 3 runs
whose names hash to 3 different masters (LocalCluster.master_of on core.steps_key), each with its own aggregator
process, for the same time: redis-server CPU seconds and used_memory per master, and the throughput of all runs
together. On a machine with fewer cores than masters + writers + aggregators, the masters share the same cores:
the figures show how the load splits, not a speed-up.

    python -m bench.scale [--ranks 256] [--steps-per-s 20] [--seconds 60] [--processes 4] [--tokens 64]
                          [--window 600] [--maxmemory-mb 1024] [--policy noeviction] [--ramp 20,40,80,160]
                          [--ramp-seconds 15] [--backlog-s 10] [--no-aggregator] [--count-stream]
                          [--cluster | --no-cluster] [--cluster-seconds 40] [--masters 3] [--replicas 0]
                          [--cluster-ramp ""] [--cluster-backlog-s 0] [--no-split] [--blas-threads 1]

Default: the full single-Redis run, then the cluster (--cluster: the cluster only; --no-cluster: the single Redis
only), about 4.5 minutes on 2 cores. The load average before the start is printed: anything else running shares
the CPUs with the figures. A short version: `python -m bench.scale --ranks 32 --seconds 10 --ramp "" --backlog-s 0
--cluster-seconds 10`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import loadgen
from bench.malloc_env import STEADY, pin_malloc
from bench.scale_aggregator import (
    aggregator_throughput,
    drain,
    folded,
    progress,
    ramp,
    report_aggregator,
    start_aggregator,
    stop_aggregator,
)
from bench.scale_probe import DashboardProbe, Sampler, StreamCounter
from bench.scale_result import Result
from bench.scale_split import Split, report_scaling, split_load
from bench.scale_target import Target, benchmark_xadd, entry_size, mib
from moe_monitor import core

GOAL_TICK_MS = 100.0
GOAL_MEMORY_BYTES = 512 << 20
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def report_load(report: loadgen.LoadReport, redis_cpu_s: float) -> None:
    print(report.summary())
    print(f"  redis-server CPU: {redis_cpu_s:.1f} s = {redis_cpu_s / max(report.duration_s, 1e-9):.2f} cores "
          f"({redis_cpu_s / max(report.written, 1) * 1e6:.0f} us per record)")


def measure(target: Target, args: argparse.Namespace, run: str, seconds: float, rates: list[float],
            backlog_s: float, tmp: Path, label: str) -> Result:
    """The main load into target with the aggregator and the dashboard, then redis-benchmark, the ceiling ramp and
    the aggregator on a backlog; prints as it goes and returns the figures."""
    aggregator = None
    if args.no_aggregator:
        print("aggregator: not started (--no-aggregator)")
    else:
        aggregator = start_aggregator(target.url, run, tmp / f"aggregator-{run}.log")
        print(f"aggregator: started (pid {aggregator.pid}; log {tmp}/aggregator-{run}.log)")
    try:
        run_port = target.master_of(core.steps_key(run))
        masters = {port: target.node_urls[port] for port in target.masters}
        sampler = Sampler(target.url, run, masters, run_port)
        counter = StreamCounter(target.url, run) if args.count_stream else None
        steps = round(args.steps_per_s * seconds)
        probe = DashboardProbe(target.url, run, args.window, min(args.window, max(1, steps // 2))) \
            if aggregator is not None else None
        client = core.connect(target.url, timeout_s=10.0)
        before = target.figures()
        began = time.monotonic()
        report = loadgen.run_load(target.url, run, args.ranks, args.steps_per_s, seconds, args.processes,
                                  args.tokens, memory_budget_bytes=args.memory_budget_mb << 20,
                                  instance_prefix=args.instance)
        after = target.figures()
        dashboard = probe.stop() if probe is not None else None
        node_cpu = {port: after[port]["cpu_s"] - before[port]["cpu_s"] for port in after}
        node_peak = {port: sampler.peak(port, began) for port in masters}
        print()
        report_load(report, node_cpu[run_port])
        window = sampler.window(began)
        length = client.xlen(core.steps_key(run))
        usage = client.memory_usage(core.steps_key(run), samples=0) or 0
        trimmed = "; the aggregator trims it to 5 s behind what it read" if aggregator else ""
        print(f"  Redis memory{f' (master :{run_port}, holding the run)' if target.cluster else ''}: used_memory "
              f"peak {mib(after[run_port]['used_memory_peak'])} (sampled max {mib(node_peak[run_port])}), at the "
              f"end {mib(after[run_port]['used_memory'])}; steps stream {length:,} entries = "
              f"{length / (args.ranks * args.steps_per_s):.1f} s of steps (the collectors' MAXLEN ~ follows their "
              f"{args.memory_budget_mb} MiB budget at the entries' real size{trimmed}), {mib(usage)} = "
              f"{usage / max(length, 1):,.0f} B per entry")
        result = Result(label, args.ranks, args.steps_per_s, seconds, report, run_port,
                        after[run_port]["used_memory_peak"], node_cpu, node_peak, aggregator is not None,
                        dashboard=dashboard)
        print(f"  steps lost: {result.lost} of {report.expected} by the writers' count ({report.failed} failed "
              "writes)")
        if counter is not None:
            counter.stop()
            missing = counter.missing(args.ranks, report.config.steps)
            print(f"  stream tail: {missing} of {report.expected} rank-steps never seen in the stream"
                  + (f" ({counter.unread} entries were trimmed before the tail read them)" if counter.unread else
                     " (the tail read every entry the stream took)"))
        if aggregator is not None:
            result.lag = report_aggregator(window)
            result.caught_up_s = drain(target.url, run, 60.0)
            print("  aggregator caught up " + (f"{result.caught_up_s:.1f} s" if result.caught_up_s is not None
                                               else "not within 60 s") + " after the last write")
            time.sleep(3.0)  # past its 2 s deadline: the last steps are written and counted
            result.progress = progress(client, run)
            print("  aggregator progress: " + ", ".join(f"{k} {v}" for k, v in result.progress.items()))
            print(f"  rank-steps the aggregator wrote their steps without (later than its 2 s deadline, or trimmed "
                  f"by the writers' MAXLEN ~ before it read them): {result.progress.get('rank_steps_missing', '?')} "
                  f"of {report.expected}: {folded(result.progress)}")
        if dashboard is not None:
            print(f"  dashboard ({args.window}-step window, RedisSource + WatchedRun, tick + layout + analyse, "
                  f"{blas_threads()}): " + dashboard.line())
        result.entry_bytes = entry_size(args.tokens)
        result.xadd_rate = benchmark_xadd(target, result.entry_bytes, report.config.maxlen)
        if result.xadd_rate is not None:
            print(f"  redis-benchmark XADD of a {result.entry_bytes:,} B entry (-P 16, 50 clients"
                  f"{', into the master of its key' if target.cluster else ''}): {result.xadd_rate:,.0f} /s "
                  f"= {result.xadd_rate / args.ranks:,.1f} steps/s at {args.ranks} ranks")
        if aggregator is not None and rates:
            result.ceiling = ramp(target.url, run, args, rates, report.config.steps, sampler)
        if aggregator is not None and backlog_s > 0:
            stop_aggregator(aggregator)
            aggregator = None
            print(f"\naggregator alone on a backlog of {backlog_s:g} s x {args.steps_per_s:g} steps/s x "
                  f"{args.ranks} ranks (written first, the aggregator stopped):")
            got = aggregator_throughput(target.url, f"{run}-backlog", args, backlog_s, tmp / f"aggregator-{run}-2.log")
            if got is None:
                print("  it stopped moving before it had read the backlog")
            else:
                per_s, records, state = got
                result.backlog_rate = per_s
                print(f"  {per_s:,.0f} records/s consumed = {per_s / args.ranks:,.1f} steps/s at {args.ranks} "
                      f"ranks ({records:,} records in the backlog): the aggregator's ceiling on this machine "
                      f"with the CPU to itself")
                print("  aggregator progress: " + ", ".join(f"{k} {v}" for k, v in state.items()))
        if result.ceiling is not None or result.backlog_rate is not None or result.xadd_rate is not None:
            print("  " + ceiling_line(result))
        sampler.stop()
        client.close()
        return result
    finally:
        stop_aggregator(aggregator)


def ceiling_line(result: Result) -> str:
    """The ceiling beside redis-benchmark's rate, in records/s."""
    parts = []
    c = result.ceiling
    if c is not None and c.steps_per_s is not None:
        parts.append(f"aggregator ceiling {'>= ' if c.at_least else ''}{c.steps_per_s:,.1f} steps/s per rank = "
                     f"{c.steps_per_s * result.ranks:,.0f} records/s"
                     + (f" (fell behind at {c.fell_behind_at:g})" if c.fell_behind_at is not None else
                        " (the load generator was the limit)" if c.at_least else ""))
    elif c is not None:
        parts.append(f"aggregator fell behind at {c.fell_behind_at:g} steps/s per rank")
    if result.backlog_rate is not None:
        parts.append(f"alone on a backlog {result.backlog_rate:,.0f} records/s = "
                     f"{result.backlog_rate / result.ranks:,.1f} steps/s per rank")
    if result.xadd_rate is not None:
        parts.append(f"redis-benchmark XADD {result.xadd_rate:,.0f} /s ({result.entry_bytes:,} B entries) = "
                     f"{result.xadd_rate / result.ranks:,.1f} steps/s per rank")
    return "ceiling: " + "; ".join(parts) if parts else "ceiling: not measured"


def summary_rows(result: Result) -> list[tuple[str, str, str, str]]:
    """(what, goal, figure, verdict) rows of one target."""
    rows = []
    r = result.report
    rows.append(("steps lost (writers' count)", "0", f"{result.lost} of {r.expected:,} ({r.failed} failed writes, "
                 f"{r.rate:,.0f} records/s of {result.ranks * result.steps_per_s:,.0f})",
                 "ok" if result.lost == 0 and r.failed == 0 else "MISSED"))
    rows.append((f"writers ({result.ranks} simulated ranks here)", "-",
                 f"write median {r.write_s[0] * 1e3:.1f} ms ({r.written / max(r.writes, 1):.1f} records each), "
                 f"lateness p99 {r.lateness_s[1]:.1f} s, client CPU {r.cpu_s / max(r.duration_s, 1e-9):.2f} cores "
                 f"({r.cpu_s / max(r.written, 1) * 1e6:.0f} us per record)", "-"))
    if result.aggregator:
        caught = f"{result.caught_up_s:.1f} s" if result.caught_up_s is not None else "not within 60 s"
        behind = f"{result.lag.behind_max_s:.1f} s" if result.lag.behind_max_s is not None else "-"
        rows.append(("aggregator lag", "keeps up",
                     f"caught up {caught} after the last write; read behind max {behind}, newest aggregated step "
                     f"max {result.lag.gap_max} behind; {result.progress.get('steps_written', '?')} steps written, "
                     f"{result.progress.get('rank_steps_missing', '?')} rank-steps missing at the 2 s deadline "
                     f"({folded(result.progress)}; writers' lateness p99 {r.lateness_s[1]:.1f} s)",
                     "ok" if result.keeps_up else "MISSED"))
    d = result.dashboard
    if d is not None:
        if d.median_ms is not None and d.p90_ms is not None:
            figure = (f"median {d.median_ms:.0f} ms, p90 {d.p90_ms:.0f} ms ({len(d.warm_ms)} ticks, window "
                      f"{d.window_steps} steps, feed {d.feed!r}; cold {d.cold_ms or 0:.0f} ms)")
            verdict = "ok" if d.median_ms <= GOAL_TICK_MS and d.feed == "aggregate" else "MISSED"
        else:
            figure, verdict = d.line(), "-"
        rows.append((f"dashboard tick, {d.window_steps}-step window", f"<= {GOAL_TICK_MS:.0f} ms", figure, verdict))
    rows.append(("Redis used_memory peak", f"<= {GOAL_MEMORY_BYTES >> 20} MiB", mib(result.memory_peak),
                 "ok" if result.memory_peak <= GOAL_MEMORY_BYTES else "MISSED"))
    if result.ceiling is not None or result.backlog_rate is not None or result.xadd_rate is not None:
        rows.append(("ceiling vs redis-benchmark", "-", ceiling_line(result).removeprefix("ceiling: "), "-"))
    return rows


def print_summary(results: list[Result], split: Split | None, one: Result | None) -> None:
    print("\n" + "=" * 30 + " summary " + "=" * 30)
    for result in results:
        print(f"{result.label}: {result.ranks} ranks x {result.steps_per_s:g} steps/s x {result.seconds:g} s, "
              f"decode {result.report.config.tokens_per_rank} tokens per rank, DeepSeek-V3 58 x 256 top-8")
        rows = summary_rows(result)
        width = max(len(row[0]) for row in rows)
        goal_width = max(len(row[1]) for row in rows)
        for what, goal, figure, verdict in rows:
            print(f"  {what:<{width}s}  {goal:<{goal_width}s}  {verdict:<6s}  {figure}")
    if split is not None and one is not None:
        cpu_one = {p: one.node_cpu_s.get(p, 0.0) for p in one.node_peak}
        cpu_split = {p: split.node_cpu_s.get(p, 0.0) for p in split.node_peak}
        share = lambda cpu: "/".join(f"{v / max(sum(cpu.values()), 1e-9):.0%}" for _, v in sorted(cpu.items()))
        print(f"scaling 1 -> {len(split.runs)} masters (redis-server CPU share per master; records/s written):")
        print(f"  1 run : CPU {share(cpu_one)}, memory max {mib(max(one.node_peak.values(), default=0))}, "
              f"{one.report.rate:,.0f} records/s")
        print(f"  {len(split.runs)} runs: CPU {share(cpu_split)}, memory max "
              f"{mib(max(split.node_peak.values(), default=0))}, {split.rate:,.0f} records/s, "
              f"{split.lost} steps lost, rank-steps missing at the 2 s deadline "
              + "/".join(p.get("rank_steps_missing", "?") for p in split.progress)
              + f" (writers' lateness p99 {'/'.join(f'{r.lateness_s[1]:.1f}' for r in split.reports)} s; the "
              f"masters, writers and aggregators share this machine's {os.cpu_count()} cores: a split, not a "
              "speed-up)")


def blas_threads() -> str:
    """The BLAS thread setting this process started with (what the dashboard's analysis runs under)."""
    value = os.environ.get("OPENBLAS_NUM_THREADS")
    return f"BLAS threads {value}" if value else "BLAS threads: the library's default"


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
    args.instance = f"scale-{os.getpid():x}"
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
            results.append(measure(target, args, args.run, args.seconds, rates, args.backlog_s, tmp, "single Redis"))
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
            one = measure(target, args, args.run, args.cluster_seconds, rates, args.cluster_backlog_s, tmp, label)
            results.append(one)
            ok = ok and one.report.ok
            if not args.no_split and one.aggregator and len(target.masters) > 1:
                target.flush()
                print(f"\n{args.ranks} ranks split into {len(target.masters)} runs on {len(target.masters)} "
                      f"masters, each with its own aggregator, {args.cluster_seconds:g} s:")
                split = split_load(target, args, args.cluster_seconds, tmp, f"{args.run}-split")
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
