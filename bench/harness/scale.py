"""bench.scale's measurements: a load (Load) into a private redis-server or cluster (target.py) with the aggregator
and the dashboard's reader beside it (measure), the aggregator's ceiling by a ramp of rates and alone on a backlog
(ramp, aggregator_throughput), the same ranks split over the cluster's masters (split_load, report_scaling), and
the summary beside the goals (print_summary). Used by bench/scale.py's main; docs/scaling.md gives the figures.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import routing
from bench.harness import loadgen
from bench.harness.aggregator import (
    Lag,
    caught_up,
    drain,
    folded,
    progress,
    report_aggregator,
    start_aggregator,
    stop_aggregator,
)
from bench.harness.probes import DashboardFigures, DashboardProbe, Sampler, StreamCounter, groups
from bench.harness.target import Target, benchmark_xadd, entry_size, mib
from moe_monitor import core

GOAL_TICK_MS = 100.0
GOAL_MEMORY_BYTES = 512 << 20
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class Load:
    """The load bench.scale puts on a target: `ranks` simulated ranks at `steps_per_s` steps a second each from
    `processes` load generator processes, `tokens` decode tokens a rank and step, the collectors' stream budget
    (MiB), and the prefix of the ranks' collector instances (every load of one run keeps the same instances)."""

    ranks: int
    steps_per_s: float
    processes: int
    tokens: int
    memory_budget_mb: int
    instance: str

    def run(self, url: str, run: str, seconds: float, **overrides) -> loadgen.LoadReport:
        """loadgen.run_load of this load into `run` for `seconds`; overrides: run_load's arguments by name
        (steps_per_s, ranks, processes, first_step, memory_budget_bytes, instance_prefix, max_batch, ...)."""
        options: dict[str, Any] = dict(ranks=self.ranks, steps_per_s=self.steps_per_s, processes=self.processes,
                                       tokens_per_rank=self.tokens, memory_budget_bytes=self.memory_budget_mb << 20,
                                       instance_prefix=self.instance)
        options.update(overrides)
        return loadgen.run_load(url, run, seconds=seconds, **options)


@dataclass
class Result:
    """The figures of one target's main load (the summary's rows)."""

    label: str
    ranks: int
    steps_per_s: float
    seconds: float
    report: loadgen.LoadReport
    run_port: int
    memory_peak: float  # INFO used_memory_peak of the master holding the run, right after the load
    node_cpu_s: dict[int, float]  # redis-server CPU seconds during the load, by port (replicas too)
    node_peak: dict[int, int]  # used_memory sampled max during the load, by port (masters)
    aggregator: bool = False
    lag: Lag = field(default_factory=Lag)
    caught_up_s: float | None = None
    progress: dict[str, str] = field(default_factory=dict)
    dashboard: DashboardFigures | None = None
    entry_bytes: int = 0
    xadd_rate: float | None = None
    ceiling: Ceiling | None = None
    backlog_rate: float | None = None

    @property
    def lost(self) -> int:
        return self.report.expected - self.report.written

    @property
    def missing(self) -> int | None:
        value = self.progress.get("rank_steps_missing")
        return int(value) if value is not None else None

    @property
    def keeps_up(self) -> bool:
        """Caught up within 2 s of the last write, every step written with all its ranks."""
        return self.caught_up_s is not None and self.caught_up_s <= 2.0 and self.missing == 0 \
            and int(self.progress.get("steps_written", -1)) == self.report.config.steps


# ------------------------------------------------------------------ the main load
def report_load(report: loadgen.LoadReport, redis_cpu_s: float) -> None:
    print(report.summary())
    print(f"  redis-server CPU: {redis_cpu_s:.1f} s = {redis_cpu_s / max(report.duration_s, 1e-9):.2f} cores "
          f"({redis_cpu_s / max(report.written, 1) * 1e6:.0f} us per record)")


def measure(target: Target, load: Load, run: str, seconds: float, tmp: Path, label: str, rates: Sequence[float] = (),
            ramp_seconds: float = 15.0, backlog_s: float = 0.0, window: int = 600, aggregate: bool = True,
            count_stream: bool = False) -> Result:
    """The main load into target with the aggregator (aggregate) and the dashboard (a `window`-step window), then
    redis-benchmark, the ceiling ramp (rates, each for ramp_seconds) and the aggregator on a backlog (backlog_s
    seconds of steps); prints as it goes and returns the figures. count_stream: also tail the steps stream."""
    aggregator = None
    if not aggregate:
        print("aggregator: not started (--no-aggregator)")
    else:
        aggregator = start_aggregator(target.url, run, tmp / f"aggregator-{run}.log")
        print(f"aggregator: started (pid {aggregator.pid}; log {tmp}/aggregator-{run}.log)")
    try:
        run_port = target.master_of(core.steps_key(run))
        masters = {port: target.node_urls[port] for port in target.masters}
        sampler = Sampler(target.url, run, masters, run_port)
        counter = StreamCounter(target.url, run) if count_stream else None
        steps = round(load.steps_per_s * seconds)
        probe = DashboardProbe(target.url, run, window, min(window, max(1, steps // 2))) \
            if aggregator is not None else None
        client = core.connect(target.url, timeout_s=10.0)
        before = target.figures()
        began = time.monotonic()
        report = load.run(target.url, run, seconds)
        after = target.figures()
        dashboard = probe.stop() if probe is not None else None
        node_cpu = {port: after[port]["cpu_s"] - before[port]["cpu_s"] for port in after}
        node_peak = {port: sampler.peak(port, began) for port in masters}
        print()
        report_load(report, node_cpu[run_port])
        samples = sampler.window(began)
        length = client.xlen(core.steps_key(run))
        usage = client.memory_usage(core.steps_key(run), samples=0) or 0
        trimmed = "; the aggregator trims it to 5 s behind what it read" if aggregator else ""
        print(f"  Redis memory{f' (master :{run_port}, holding the run)' if target.cluster else ''}: used_memory "
              f"peak {mib(after[run_port]['used_memory_peak'])} (sampled max {mib(node_peak[run_port])}), at the "
              f"end {mib(after[run_port]['used_memory'])}; steps stream {length:,} entries = "
              f"{length / (load.ranks * load.steps_per_s):.1f} s of steps (the collectors' MAXLEN ~ follows their "
              f"{load.memory_budget_mb} MiB budget at the entries' real size{trimmed}), {mib(usage)} = "
              f"{usage / max(length, 1):,.0f} B per entry")
        result = Result(label, load.ranks, load.steps_per_s, seconds, report, run_port,
                        after[run_port]["used_memory_peak"], node_cpu, node_peak, aggregator is not None,
                        dashboard=dashboard)
        print(f"  steps lost: {result.lost} of {report.expected} by the writers' count ({report.failed} failed "
              "writes)")
        if counter is not None:
            counter.stop()
            missing = counter.missing(load.ranks, report.config.steps)
            print(f"  stream tail: {missing} of {report.expected} rank-steps never seen in the stream"
                  + (f" ({counter.unread} entries were trimmed before the tail read them)" if counter.unread else
                     " (the tail read every entry the stream took)"))
        if aggregator is not None:
            result.lag = report_aggregator(samples)
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
            print(f"  dashboard ({window}-step window, RedisSource + WatchedRun, tick + layout + analyse, "
                  f"{blas_threads()}): " + dashboard.line())
        result.entry_bytes = entry_size(load.tokens)
        result.xadd_rate = benchmark_xadd(target, result.entry_bytes, report.config.maxlen)
        if result.xadd_rate is not None:
            print(f"  redis-benchmark XADD of a {result.entry_bytes:,} B entry (-P 16, 50 clients"
                  f"{', into the master of its key' if target.cluster else ''}): {result.xadd_rate:,.0f} /s "
                  f"= {result.xadd_rate / load.ranks:,.1f} steps/s at {load.ranks} ranks")
        if aggregator is not None and rates:
            result.ceiling = ramp(target.url, run, load, list(rates), ramp_seconds, report.config.steps, sampler)
        if aggregator is not None and backlog_s > 0:
            stop_aggregator(aggregator)
            aggregator = None
            print(f"\naggregator alone on a backlog of {backlog_s:g} s x {load.steps_per_s:g} steps/s x "
                  f"{load.ranks} ranks (written first, the aggregator stopped):")
            got = aggregator_throughput(target.url, f"{run}-backlog", load, backlog_s, tmp / f"aggregator-{run}-2.log")
            if got is None:
                print("  it stopped moving before it had read the backlog")
            else:
                per_s, records, state = got
                result.backlog_rate = per_s
                print(f"  {per_s:,.0f} records/s consumed = {per_s / load.ranks:,.1f} steps/s at {load.ranks} "
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


# ------------------------------------------------------------------ the aggregator's ceiling
@dataclass
class Ceiling:
    """The ramp's outcome: the highest rate (steps/s per rank, as achieved) after which the aggregator kept up
    (None: not even the first), whether that is only a lower bound (the load generator could go no faster, or
    the last rate was reached), and the rate it fell behind at (None: it never did)."""

    steps_per_s: float | None
    at_least: bool
    fell_behind_at: float | None


def ramp(url: str, run: str, load: Load, rates: list[float], seconds: float, first_step: int,
         sampler: Sampler) -> Ceiling:
    """Runs the load at each rate in turn for `seconds` (steps continuing from first_step, the same instances)
    and prints the aggregator's standing after each. It kept up with a rate when it caught up (caught_up) within
    2 s of the phase's last write and wrote no step short of a rank during the phase; the ceiling is the highest
    such rate, or "at least" the rate the load generator reached when it could not go faster."""
    print(f"\nceiling ramp: {load.ranks} ranks, {seconds:g} s per rate, rates {rates} steps/s per rank")
    ceiling, limited, fell_at = None, False, None
    client = core.connect(url, timeout_s=5.0)
    for rate in rates:
        missing_before = int(progress(client, run).get("rank_steps_missing", 0))
        began = time.monotonic()
        report = load.run(url, run, seconds, steps_per_s=rate, first_step=first_step)
        first_step += report.config.steps
        took = drain(url, run, 2.0)
        time.sleep(2.5)  # past the aggregator's deadline: a step short of a rank is written and counted by now
        missing = int(progress(client, run).get("rank_steps_missing", 0)) - missing_before
        loadgen_kept_up = report.rate >= 0.95 * load.ranks * rate
        kept_up = took is not None and missing == 0
        print(f"  {rate:g} steps/s: loadgen {report.rate:,.0f} records/s of {load.ranks * rate:,.0f} asked"
              f"{'' if loadgen_kept_up else ' (the load generator could not keep up on this machine)'}; aggregator "
              + (f"caught up {took:.1f} s after the last write" if took is not None else "not caught up 2 s after it")
              + f", {missing:,} rank-steps missing from its steps")
        report_aggregator(sampler.window(began))
        if not kept_up:
            print(f"  the aggregator fell behind at {rate:g} steps/s per rank")
            fell_at = rate
            break
        ceiling = report.rate / load.ranks
        if not loadgen_kept_up:
            print("  ramp stopped: the load generator, not the aggregator, is the limit here")
            limited = True
            break
    client.close()
    at_least = ceiling is not None and (limited or (fell_at is None and ceiling >= rates[-1] * 0.95))
    if ceiling is None:
        print(f"  ceiling: below {rates[0]:g} steps/s per rank")
    else:
        print(f"  ceiling: {'at least ' if at_least else ''}{ceiling:,.1f} steps/s per rank "
              f"({ceiling * load.ranks:,.0f} records/s)")
    return Ceiling(ceiling, at_least, fell_at)


def entries_read(client, run: str) -> int | None:
    """XINFO GROUPS entries-read of the run's steps stream (the most advanced group; None without one)."""
    found = [g.get("entries-read") for g in groups(client, run)]
    values = [int(v) for v in found if v is not None]
    return max(values) if values else None


def aggregator_throughput(url: str, run: str, load: Load, backlog_s: float, log_path: Path
                          ) -> tuple[float, int, dict[str, str]] | None:
    """The aggregator alone on a backlog, in a run of its own (`run`, a fresh stream): the load generator writes
    backlog_s seconds of steps of every rank as fast as it can (at most 4 steps per write, so the stream is in step
    order give or take a round over the ranks), with MAXLEN raised to hold them all, then the aggregator starts;
    the entries it read after the first look that saw it reading (the group's entries-read), over the time from
    that look until it has caught up (caught_up). Returns (records per second it consumed, records in the
    backlog, its progress hash), None when it stopped moving for 30 s before catching up."""
    steps = max(1, round(backlog_s * load.steps_per_s))
    entries = steps * load.ranks
    budget = (entries + load.ranks * 8) * (routing.LAYERS * routing.EXPERTS * 4 + 200)  # maxlen_for_budget's bound
    # all due at once, at most 4 steps per write: the backlog is in step order give or take a round over the ranks
    report = load.run(url, run, steps / 1e6, steps_per_s=1e6, memory_budget_bytes=budget, max_batch=4)
    client = core.connect(url, timeout_s=5.0)
    proc = start_aggregator(url, run, log_path)
    try:
        first: tuple[float, int] | None = None  # (when, entries read) at the first look that saw it reading
        last_read, moved_at = 0, time.monotonic()
        while time.monotonic() - moved_at < 30:
            read = entries_read(client, run) or 0
            now = time.monotonic()
            if read > last_read:
                first = (now, read) if first is None else first
                last_read, moved_at = read, now
            if first is not None and caught_up(client, run):
                if report.written - first[1] < report.written // 2:
                    print("  (it read over half the backlog before the first look: the rate is a rough one)")
                return ((report.written - first[1]) / max(now - first[0], 1e-9), report.written,
                        progress(client, run))
            time.sleep(0.02)
        return None
    finally:
        client.close()
        stop_aggregator(proc)
        with contextlib.suppress(Exception):  # the backlog run's keys: its memory is not the next phase's
            cleanup = core.connect(url, timeout_s=10.0)
            for key in (core.steps_key(run), core.aggregate_key(run)):
                cleanup.delete(key)
            cleanup.close()


# ------------------------------------------------------------------ one run against runs on every master
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


def split_load(target: Target, load: Load, seconds: float, tmp: Path, base: str) -> Split:
    """The load's ranks split into len(masters) runs, one on each master, each with its own aggregator process, the
    loads side by side (one run_load each, the load's processes spread over them)."""
    masters = target.masters
    runs = runs_on_masters(target.master_of, base, len(masters))
    shares = [load.ranks // len(runs) + (1 if i < load.ranks % len(runs) else 0) for i in range(len(runs))]
    # as many load generator processes per run (the OS shares the CPU per process: a run with fewer would fall
    # behind the others), at least --processes in all
    processes = [max(1, -(-load.processes // len(runs)))] * len(runs)
    aggregators = [start_aggregator(target.url, run, tmp / f"aggregator-{run}.log") for run, _ in runs]
    samplers = [Sampler(target.url, run, {port: target.node_urls[port]}, port) for run, port in runs]
    try:
        before = target.figures()
        began = time.monotonic()
        with ThreadPoolExecutor(len(runs)) as pool:
            futures = [pool.submit(load.run, target.url, run, seconds, ranks=share, processes=procs,
                                   instance_prefix=f"{load.instance}-{run}")
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


# ------------------------------------------------------------------ the summary
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
