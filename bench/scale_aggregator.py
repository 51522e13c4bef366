"""The aggregator in bench.scale: starting and stopping `moe-monitor aggregate` (start_aggregator,
stop_aggregator), its progress hash (progress, folded), whether and when it caught up (caught_up,
drain), how far behind it read (Lag, report_aggregator), its ceiling by a ramp of rates (Ceiling, ramp) and its
throughput alone on a backlog (entries_read, aggregator_throughput)."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import loadgen, routing
from bench.scale_probe import Sample, Sampler, groups
from moe_monitor import core

REPO = Path(__file__).resolve().parents[1]

def start_aggregator(url: str, run: str, log_path: Path, wait_s: float = 90.0,
                     options: Sequence[str] = ()) -> subprocess.Popen:
    """Starts `moe-monitor aggregate --redis URL --run RUN [options]` (stdout and
    stderr to log_path) and waits up to wait_s until it has created its consumer group on the run's steps stream (XINFO
    GROUPS lists one) or has died. Returns the process; RuntimeError when it exits before its group appears."""
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (the child's log, closed with it)
    proc = subprocess.Popen([sys.executable, "-m", "moe_monitor", "aggregate", "--redis", url, "--run", run, *options],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    log.close()
    client = core.connect(url, timeout_s=5.0)
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the aggregator exited with code {proc.returncode}: "
                                   f"{log_path.read_text()[-2000:]}")
            if groups(client, run):
                return proc
            time.sleep(0.25)
    finally:
        client.close()
    print(f"  (the aggregator made no consumer group within {wait_s:.0f} s; going on)")
    return proc


def stop_aggregator(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Lag:
    """How far behind the aggregator read over a load: seconds of the stream not yet delivered (median, max),
    the newest aggregated step behind the newest written (max), XINFO GROUPS lag (max entries)."""

    behind_median_s: float | None = None
    behind_max_s: float | None = None
    gap_max: int | None = None
    lag_max: int | None = None


def report_aggregator(samples: list[Sample]) -> Lag:
    """Prints how far behind the aggregator read over the samples; returns it."""
    with_group = [s for s in samples if s.pending is not None]
    if not with_group:
        print("  aggregator: no consumer group seen on the steps stream")
        return Lag()
    behind_s = [s.behind_s for s in with_group if s.behind_s is not None]
    lags = [s.lag for s in with_group if s.lag is not None]
    gaps = [s.written_step - s.aggregated_step for s in with_group
            if s.written_step is not None and s.aggregated_step is not None]
    end = with_group[-1]

    def spread(values: list, unit: str = "") -> str:
        return f"median {statistics.median(values):,.2f}{unit}, max {max(values):,.2f}{unit}" if values else "-"

    print(f"  aggregator reading behind the newest entry: {spread(behind_s, ' s')} (at the end {end.behind_s} s); "
          f"XINFO GROUPS lag {spread(lags)} entries, pending max {max(s.pending or 0 for s in with_group):,}; newest "
          f"aggregated step behind the newest written: {spread(gaps)} steps")
    return Lag(statistics.median(behind_s) if behind_s else None, max(behind_s) if behind_s else None,
               max(gaps) if gaps else None, max(lags) if lags else None)


PROGRESS_FIELDS = ("steps_written", "rank_steps_missing", "late_records", "late_ranks", "duplicates", "bad_records",
                   "stale_records", "too_old", "last_step", "pending_steps", "lag_entries", "entries_per_s")


def progress(client, run: str) -> dict[str, str]:
    """The aggregator's progress hash (core.aggregator_key(run) + ":state"), the fields in PROGRESS_FIELDS that
    are there, as text ({} when there is none)."""
    try:
        raw = client.hgetall(core.aggregator_key(run) + ":state")
    except Exception:
        return {}
    text = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
            for k, v in raw.items()}
    return {name: text[name] for name in PROGRESS_FIELDS if name in text}


def folded(state: dict[str, str]) -> str:
    """What became of the rank-steps a step was written without (progress hash): folded in by a late entry, or
    never read (no duplicate, stale or too old record either: trimmed from the steps stream first)."""
    try:
        missing, late = int(state["rank_steps_missing"]), int(state["late_ranks"])
    except (KeyError, ValueError):
        return "late ranks unknown"
    never = missing - late
    return f"{late} folded in late" + (f", {never} never read: trimmed from the steps stream first" if never else "")


def caught_up(client, run: str) -> bool:
    """Whether every consumer group of the run's steps stream has been delivered the stream's newest entry and
    acknowledged everything (XINFO GROUPS last-delivered-id = XINFO STREAM last-generated-id, pending 0). Redis's
    `lag` cannot say this once entries were trimmed before the group read them (it then stays at the number
    never read, or is null)."""
    found = groups(client, run)
    try:
        newest = client.xinfo_stream(core.steps_key(run))["last-generated-id"]
    except Exception:
        return False
    return bool(found) and all(g.get("last-delivered-id") == newest and int(g.get("pending") or 0) == 0
                               for g in found)


def drain(url: str, run: str, timeout_s: float) -> float | None:
    """Seconds until the aggregator has caught up (caught_up) with the steps stream; None when it has not within
    timeout_s."""
    client = core.connect(url, timeout_s=5.0)
    began = time.monotonic()
    try:
        while time.monotonic() - began < timeout_s:
            if caught_up(client, run):
                return time.monotonic() - began
            time.sleep(0.1)
        return None
    finally:
        client.close()


@dataclass
class Ceiling:
    """The ramp's outcome: the highest rate (steps/s per rank, as achieved) after which the aggregator kept up
    (None: not even the first), whether that is only a lower bound (the load generator could go no faster, or
    the last rate was reached), and the rate it fell behind at (None: it never did)."""

    steps_per_s: float | None
    at_least: bool
    fell_behind_at: float | None


def ramp(url: str, run: str, args: argparse.Namespace, rates: list[float], first_step: int,
         sampler: Sampler) -> Ceiling:
    """Runs the load at each rate in turn (steps continuing from first_step, the same instances) and prints the
    aggregator's standing after each. It kept up with a rate when it caught up (caught_up) within 2 s of the
    phase's last write and wrote no step short of a rank during the phase; the ceiling is the highest such rate,
    or "at least" the rate the load generator reached when it could not go faster."""
    print(f"\nceiling ramp: {args.ranks} ranks, {args.ramp_seconds:g} s per rate, rates {rates} steps/s per rank")
    ceiling, limited, fell_at = None, False, None
    client = core.connect(url, timeout_s=5.0)
    for rate in rates:
        missing_before = int(progress(client, run).get("rank_steps_missing", 0))
        began = time.monotonic()
        report = loadgen.run_load(url, run, args.ranks, rate, args.ramp_seconds, args.processes, args.tokens,
                                  first_step=first_step, instance_prefix=args.instance,
                                  memory_budget_bytes=args.memory_budget_mb << 20)
        first_step += report.config.steps
        took = drain(url, run, 2.0)
        time.sleep(2.5)  # past the aggregator's deadline: a step short of a rank is written and counted by now
        missing = int(progress(client, run).get("rank_steps_missing", 0)) - missing_before
        loadgen_kept_up = report.rate >= 0.95 * args.ranks * rate
        kept_up = took is not None and missing == 0
        print(f"  {rate:g} steps/s: loadgen {report.rate:,.0f} records/s of {args.ranks * rate:,.0f} asked"
              f"{'' if loadgen_kept_up else ' (the load generator could not keep up on this machine)'}; aggregator "
              + (f"caught up {took:.1f} s after the last write" if took is not None else "not caught up 2 s after it")
              + f", {missing:,} rank-steps missing from its steps")
        report_aggregator(sampler.window(began))
        if not kept_up:
            print(f"  the aggregator fell behind at {rate:g} steps/s per rank")
            fell_at = rate
            break
        ceiling = report.rate / args.ranks
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
              f"({ceiling * args.ranks:,.0f} records/s)")
    return Ceiling(ceiling, at_least, fell_at)


def entries_read(client, run: str) -> int | None:
    """XINFO GROUPS entries-read of the run's steps stream (the most advanced group; None without one)."""
    found = [g.get("entries-read") for g in groups(client, run)]
    values = [int(v) for v in found if v is not None]
    return max(values) if values else None


def aggregator_throughput(url: str, run: str, args: argparse.Namespace, backlog_s: float, log_path: Path
                          ) -> tuple[float, int, dict[str, str]] | None:
    """The aggregator alone on a backlog, in a run of its own (`run`, a fresh stream): the load generator writes
    backlog_s seconds of steps of every rank as fast as it can (at most 4 steps per write, so the stream is in step
    order give or take a round over the ranks), with MAXLEN raised to hold them all, then the aggregator starts;
    the entries it read after the first look that saw it reading (the group's entries-read), over the time from
    that look until it has caught up (caught_up). Returns (records per second it consumed, records in the
    backlog, its progress hash), None when it stopped moving for 30 s before catching up."""
    steps = max(1, round(backlog_s * args.steps_per_s))
    entries = steps * args.ranks
    budget = (entries + args.ranks * 8) * (routing.LAYERS * routing.EXPERTS * 4 + 200)  # maxlen_for_budget's bound
    # all due at once, at most 4 steps per write: the backlog is in step order give or take a round over the ranks
    report = loadgen.run_load(url, run, args.ranks, 1e6, steps / 1e6, args.processes, args.tokens,
                              instance_prefix=args.instance, memory_budget_bytes=budget, max_batch=4)
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
