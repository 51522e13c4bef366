"""bench.scale's scaling from 1 to 3 masters: the same ranks split into runs whose keys live on different masters
of the cluster (runs_on_masters), each with its own aggregator, loaded side by side (Split, split_load), and the
per-master table of one run beside the split (report_scaling)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench import loadgen
from bench.scale_aggregator import drain, progress, start_aggregator, stop_aggregator
from bench.scale_probe import Sampler
from bench.scale_target import Target, mib
from moe_monitor import core

if TYPE_CHECKING:
    from bench.scale_result import Result


def runs_on_masters(master_of: Callable[[str], int], base: str, count: int) -> list[tuple[str, int]]:
    """`count` run names base-0, base-1, ... whose keys (one hash slot per run) live on `count` different masters
    (master_of: key -> port of its master, e.g. LocalCluster.master_of), with the port of each one's master, in
    port order. RuntimeError when the cluster has fewer masters."""
    chosen: dict[int, str] = {}
    for i in range(10_000):
        name = f"{base}-{i}"
        chosen.setdefault(master_of(core.steps_key(name)), name)
        if len(chosen) == count:
            return [(chosen[port], port) for port in sorted(chosen)]
    raise RuntimeError(f"no {count} runs on {count} different masters (the cluster has {len(chosen)})")


@dataclass
class Split:
    """The same ranks split into runs on different masters: each run's name, master, ranks and load report, the
    aggregators' catch-up and progress, redis-server CPU seconds by port and used_memory sampled max by master."""

    runs: list[tuple[str, int]]
    shares: list[int]
    reports: list[loadgen.LoadReport]
    caught_up_s: list[float | None]
    progress: list[dict[str, str]]
    node_cpu_s: dict[int, float]
    node_peak: dict[int, int]

    @property
    def lost(self) -> int:
        return sum(r.expected - r.written for r in self.reports)

    @property
    def rate(self) -> float:
        """Records per second of all runs together (each run's own rate, summed: they ran side by side)."""
        return sum(r.rate for r in self.reports)


def split_load(target: Target, args: argparse.Namespace, seconds: float, tmp: Path, base: str) -> Split:
    """--ranks ranks split into len(masters) runs, one on each master, each with its own aggregator process, the
    loads side by side (one run_load each, --processes spread over them)."""
    masters = target.masters
    runs = runs_on_masters(target.master_of, base, len(masters))
    shares = [args.ranks // len(runs) + (1 if i < args.ranks % len(runs) else 0) for i in range(len(runs))]
    # as many load generator processes per run (the OS shares the CPU per process: a run with fewer would fall
    # behind the others), at least --processes in all
    processes = [max(1, -(-args.processes // len(runs)))] * len(runs)
    aggregators = [start_aggregator(target.url, run, tmp / f"aggregator-{run}.log") for run, _ in runs]
    samplers = [Sampler(target.url, run, {port: target.node_urls[port]}, port) for run, port in runs]
    try:
        before = target.figures()
        began = time.monotonic()
        with ThreadPoolExecutor(len(runs)) as pool:
            futures = [pool.submit(loadgen.run_load, target.url, run, share, args.steps_per_s, seconds, procs,
                                   args.tokens, memory_budget_bytes=args.memory_budget_mb << 20,
                                   instance_prefix=f"{args.instance}-{run}")
                       for (run, _), share, procs in zip(runs, shares, processes)]
            reports = [f.result() for f in futures]
        after = target.figures()
        caught = [drain(target.url, run, 60.0) if agg is not None else None for (run, _), agg in zip(runs, aggregators)]
        time.sleep(3.0)
        client = core.connect(target.url, timeout_s=10.0)
        states = [progress(client, run) for run, _ in runs]
        client.close()
        return Split(runs, shares, reports, caught, states,
                     {port: after[port]["cpu_s"] - before[port]["cpu_s"] for port in after},
                     {port: sampler.peak(port, began) for (_, port), sampler in zip(runs, samplers)})
    finally:
        for sampler in samplers:
            sampler.stop()
        for proc in aggregators:
            stop_aggregator(proc)


def report_scaling(one: Result, split: Split, target: Target, cores: int) -> None:
    """The per-master table of (i) one run and (ii) the split, and what it does and does not show."""
    written_one = max(one.report.written, 1)
    written_split = max(sum(r.written for r in split.reports), 1)
    runs_of = {port: run for run, port in split.runs}
    print(f"\nscaling from 1 to {len(split.runs)} masters, redis-server CPU seconds and used_memory (sampled max) per "
          f"master over the same {one.seconds:g} s of load:")
    print(f"  {'master':>8s} | {'(i) 1 run of ' + str(one.ranks) + ' ranks':>40s} | "
          f"{'(ii) ' + str(len(split.runs)) + ' runs of ' + '/'.join(map(str, split.shares)) + ' ranks':>46s}")
    index_port = target.master_of(core.RUNS_KEY)
    cpu_one = sum(one.node_cpu_s.get(p, 0.0) for p in target.masters)
    cpu_split = sum(split.node_cpu_s.get(p, 0.0) for p in target.masters)
    for port in target.masters:
        a, b = one.node_cpu_s.get(port, 0.0), split.node_cpu_s.get(port, 0.0)
        holds = "holds the run" if port == one.run_port else "moe:runs" if port == index_port else "idle"
        print(f"  {':' + str(port):>8s} | {a:6.1f} s CPU ({a / max(cpu_one, 1e-9):4.0%}), "
              f"{mib(one.node_peak.get(port, 0)):>11s} {holds:>13s} | {b:6.1f} s CPU ({b / max(cpu_split, 1e-9):4.0%}), "
              f"{mib(split.node_peak.get(port, 0)):>11s} {runs_of.get(port, '-'):>14s}"
              + (" + moe:runs" if port == index_port else ""))
    for port in target.replicas:
        print(f"  {':' + str(port):>8s} | replica: {one.node_cpu_s.get(port, 0.0):6.1f} s CPU | replica: "
              f"{split.node_cpu_s.get(port, 0.0):6.1f} s CPU")
    steps_one = int(one.progress.get("steps_written", 0))
    steps_split = [int(p.get("steps_written", 0)) for p in split.progress]
    print(f"  throughput: (i) {one.report.rate:,.0f} records/s written, {steps_one:,} steps aggregated "
          f"({one.report.written:,} records, {cpu_one / written_one * 1e6:.0f} us of redis-server CPU each); "
          f"(ii) {split.rate:,.0f} records/s written by the {len(split.runs)} runs together, "
          f"{sum(steps_split):,} steps aggregated ({'/'.join(map(str, steps_split))}; {written_split:,} records, "
          f"{cpu_split / written_split * 1e6:.0f} us of redis-server CPU each); steps lost {split.lost}; aggregators "
          "caught up " + ", ".join(f"{c:.1f} s" if c is not None else "not within 60 s" for c in split.caught_up_s)
          + " after the last write; rank-steps missing "
          + "/".join(p.get("rank_steps_missing", "?") for p in split.progress))
    busiest_one = max((one.node_cpu_s.get(p, 0.0) for p in target.masters), default=0.0) / max(cpu_one, 1e-9)
    busiest_split = max((split.node_cpu_s.get(p, 0.0) for p in target.masters), default=0.0) / max(cpu_split, 1e-9)
    print(f"  what this shows: a run lives on one master (its keys share a hash slot), so one run's load cannot be "
          f"spread; runs on different masters split it: the busiest master carries {busiest_one:.0%} of the "
          f"redis-server CPU with one run, {busiest_split:.0%} with {len(split.runs)} (memory likewise). The run "
          f"index {core.RUNS_KEY} is one key for all runs, on master :{index_port}: every write of every run also "
          "ZADDs it there (a second node per write round trip for the runs elsewhere). What it "
          f"does not show: a speed-up. Here {len(target.node_urls)} redis-servers, the load generator and "
          f"{len(split.runs)} aggregators share {cores} cores, so the throughput is the machine's, not the "
          f"cluster's; on {len(split.runs)} machines each master would need about a third of one master's CPU, and "
          "the ceiling of each run stays that of its own aggregator (one process per run).")
