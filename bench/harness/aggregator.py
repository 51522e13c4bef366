"""The aggregator as the benchmarks run it: `moe-monitor aggregate` started and stopped as its own process
(start_aggregator, stop_aggregator), its progress hash (progress, folded), whether and when it caught up with the
steps stream (caught_up, drain) and how far behind it read (Lag, report_aggregator). Used by bench.scale,
bench.faults and tests/bench/test_scale.py."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness.probes import Sample, groups
from moe_monitor import core

REPO = Path(__file__).resolve().parents[2]


def start_aggregator(url: str, run: str, log_path: Path, wait_s: float = 90.0,
                     options: Sequence[str] = (), all_runs: bool = False) -> subprocess.Popen:
    """Starts `moe-monitor aggregate --redis URL --run RUN [options]` (all_runs: `--all` instead of `--run RUN`;
    RUN must then be in moe:runs) (stdout and
    stderr to log_path) and waits up to wait_s until it has created its consumer group on the run's steps stream (XINFO
    GROUPS lists one) or has died. Returns the process; RuntimeError when it exits before its group appears."""
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (the child's log, closed with it)
    which = ["--all"] if all_runs else ["--run", run]
    proc = subprocess.Popen([sys.executable, "-m", "moe_monitor", "aggregate", "--redis", url, *which, *options],
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
