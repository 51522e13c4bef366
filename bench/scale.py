"""Scale test: 256 expert-parallel ranks at 20 steps/s for 60 s into one private Redis (bench.loadgen: DeepSeek-V3
shaped compact records through collectors.sinks.RedisSink), and, when collectors/aggregate exists, the aggregator
reading them: its lag and the step rate at which it falls behind.

Redis: a private redis-server (demo.localredis) with `maxmemory` (--maxmemory-mb, default 1024) and
`maxmemory-policy noeviction` (--policy): under noeviction a full Redis refuses the write (the collector counts it
and retries) instead of evicting a run's keys behind everyone's back. While the load runs, a sampler reads every
0.5 s: INFO memory used_memory, the steps stream's length and, with the aggregator, XINFO GROUPS on the steps
stream (`lag`: entries not yet delivered to the group; `pending`: delivered, not acknowledged) and the newest
aggregated step (wire.aggregate_key) against the newest written step. Printed: records written / failed (what the
writers report: the stream is trimmed at MAXLEN ~, so counting it afterwards cannot prove that no step was lost;
--count-stream also tails the stream and counts each rank's distinct steps as they arrive), the achieved rate, how
late records landed, write latency, client and redis-server CPU, used_memory peak and at the end, the stream's
length and memory per entry.

Aggregator (`python -m collectors.aggregate --redis URL --run NAME`, a consumer group on the steps stream): started
as a subprocess before the load when collectors/aggregate/__main__.py exists (start_aggregator); after the main run,
a ramp (--ramp, steps/s per rank, each for --ramp-seconds) finds the ceiling: the highest rate after which the
aggregator was still within one second of the newest written step (the ramp stops where the load generator itself
cannot go faster: the ceiling is then at least that). Then the aggregator alone on a backlog (--backlog-s seconds
of steps written while it is stopped, then a fresh aggregator started): the records per second it consumes with the
CPU to itself, its ceiling in steps/s at --ranks ranks. Without the aggregator neither runs.

    python -m bench.scale [--ranks 256] [--steps-per-s 20] [--seconds 60] [--processes 4] [--tokens 64]
                          [--maxmemory-mb 1024] [--policy noeviction] [--ramp 20,40,80,160] [--ramp-seconds 15]
                          [--no-aggregator] [--count-stream]

A short version for a test: `python -m bench.scale --ranks 32 --seconds 10 --ramp "" --backlog-s 0`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import wire
from bench import loadgen
from bench.malloc_env import pin_malloc

REPO = Path(__file__).resolve().parents[1]
AGGREGATOR_MAIN = REPO / "collectors" / "aggregate" / "__main__.py"


# ---------------------------------------------------------------------------------------------------- the aggregator
def aggregator_available() -> bool:
    """Whether collectors/aggregate/__main__.py is there (`python -m collectors.aggregate`)."""
    return AGGREGATOR_MAIN.is_file()


def start_aggregator(url: str, run: str, log_path: Path, wait_s: float = 90.0) -> subprocess.Popen | None:
    """THE AGGREGATOR HOOK. Starts `python -m collectors.aggregate --redis URL --run RUN` (stdout and stderr to
    log_path) and waits up to wait_s until it has created its consumer group on the run's steps stream (XINFO
    GROUPS lists one) or has died. Returns the process (None when collectors/aggregate/__main__.py is missing);
    RuntimeError when it exits before its group appears."""
    if not aggregator_available():
        return None
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (the child's log, closed with it)
    proc = subprocess.Popen([sys.executable, "-m", "collectors.aggregate", "--redis", url, "--run", run],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    log.close()
    client = wire.connect(url, timeout_s=5.0)
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


def groups(client, run: str) -> list[dict]:
    """XINFO GROUPS of the run's steps stream ([] when the stream or its groups do not exist yet)."""
    try:
        return list(client.xinfo_groups(wire.steps_key(run)))
    except Exception:
        return []


def newest_step(client, key: str) -> int | None:
    """The `step` field of the newest entry of stream `key` (None when empty, missing, or without one)."""
    try:
        entries = client.xrevrange(key, count=1)
    except Exception:
        return None
    if not entries:
        return None
    value = entries[0][1].get(b"step")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------------- sampling
@dataclass
class Sample:
    """One look at Redis: time (monotonic s), used_memory (bytes), the steps stream's length, the consumer
    group's lag and pending entries (None without a group; lag None also when Redis cannot tell), behind_s: the
    newest entry's id time minus the group's last delivered id time (seconds of the stream not yet read; entry
    ids are their XADD time in ms), the newest written and aggregated step ids."""

    t: float
    used_memory: int
    stream_len: int
    lag: int | None = None
    pending: int | None = None
    behind_s: float | None = None
    written_step: int | None = None
    aggregated_step: int | None = None


@dataclass
class Sampler:
    """Samples Redis every interval_s on a thread of its own until stop()."""

    url: str
    run: str
    interval_s: float = 0.5
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scale-sampler")
        self._thread.start()

    def _loop(self) -> None:
        client = wire.connect(self.url, timeout_s=5.0)
        steps_key = wire.steps_key(self.run)
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):
                self.samples.append(look(client, self.run, steps_key))
        client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def window(self, since: float) -> list[Sample]:
        return [s for s in self.samples if s.t >= since]


def look(client, run: str, steps_key: str | None = None) -> Sample:
    """One Sample of the run's Redis now (the lag and pending of the most lagging group when there are several)."""
    steps_key = steps_key or wire.steps_key(run)
    memory = client.info("memory")
    found = groups(client, run)
    lag: int | None = None
    pending: int | None = None
    behind_s: float | None = None
    if found:
        lags = [int(g["lag"]) for g in found if g.get("lag") is not None]
        lag = max(lags) if len(lags) == len(found) else None
        pending = max(int(g.get("pending") or 0) for g in found)
        with contextlib.suppress(Exception):
            newest = _id(client.xinfo_stream(steps_key)["last-generated-id"])[0]
            behind_s = max(newest - min(_id(g["last-delivered-id"])[0] for g in found), 0) / 1e3
    return Sample(time.monotonic(), int(memory["used_memory"]), int(client.xlen(steps_key)), lag, pending, behind_s,
                  newest_step(client, steps_key), newest_step(client, wire.aggregate_key(run)) if found else None)


def _id(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id (ms-seq) as (ms, seq)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class StreamCounter:
    """Tails the steps stream (XREAD from the start) on a thread and counts each rank's distinct steps: proof that
    every step reached the stream as long as the tail keeps ahead of MAXLEN ~ trimming (`unread` after stop():
    entries the stream took, by XINFO STREAM entries-added, that the tail never read because they were trimmed
    first)."""

    def __init__(self, url: str, run: str):
        self.url, self.key = url, wire.steps_key(run)
        self.steps: dict[int, set[int]] = {}
        self.read = 0
        self.unread = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scale-counter")
        self._thread.start()

    def _loop(self) -> None:
        client = wire.connect(self.url, timeout_s=5.0)
        last: bytes | str = "0-0"
        while not self._stop.is_set():
            try:
                reply = client.xread({self.key: last}, count=2000, block=200)
            except Exception:
                time.sleep(0.1)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    self.steps.setdefault(int(fields[b"rank"]), set()).add(int(fields[b"step"]))
                    last = entry_id
                self.read += len(entries)
        with contextlib.suppress(Exception):
            self.unread = int(client.xinfo_stream(self.key)["entries-added"]) - self.read
        client.close()

    def stop(self, settle_s: float = 2.0) -> None:
        time.sleep(settle_s)
        self._stop.set()
        self._thread.join(10)

    def missing(self, ranks: int, steps: int, first_step: int = 0) -> int:
        """Steps first_step..first_step+steps-1 of ranks 0..ranks-1 never seen."""
        want = set(range(first_step, first_step + steps))
        return sum(len(want - self.steps.get(rank, set())) for rank in range(ranks))


# ---------------------------------------------------------------------------------------------------- the run
def start_redis(tmp: str, maxmemory_bytes: int, policy: str):
    """A private redis-server with maxmemory and maxmemory-policy set."""
    from demo.localredis import RedisServer

    server = RedisServer(tmp)
    client = server.client()
    client.config_set("maxmemory", str(maxmemory_bytes))
    client.config_set("maxmemory-policy", policy)
    client.close()
    return server


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def report_load(report: loadgen.LoadReport, redis_cpu_s: float) -> None:
    print(report.summary())
    print(f"  redis-server CPU: {redis_cpu_s:.1f} s = {redis_cpu_s / max(report.duration_s, 1e-9):.2f} cores "
          f"({redis_cpu_s / max(report.written, 1) * 1e6:.0f} us per record)")


def report_aggregator(samples: list[Sample]) -> None:
    """Prints how far behind the aggregator read over the samples."""
    with_group = [s for s in samples if s.pending is not None]
    if not with_group:
        print("  aggregator: no consumer group seen on the steps stream")
        return
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


PROGRESS_FIELDS = ("steps_written", "rank_steps_missing", "late_records", "late_ranks", "duplicates", "bad_records",
                   "stale_records", "too_old", "last_step", "pending_steps", "lag_entries", "entries_per_s")


def progress(client, run: str) -> dict[str, str]:
    """The aggregator's progress hash (wire.aggregator_key(run) + ":state"), the fields in PROGRESS_FIELDS that
    are there, as text ({} when there is none)."""
    try:
        raw = client.hgetall(wire.aggregator_key(run) + ":state")
    except Exception:
        return {}
    text = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
            for k, v in raw.items()}
    return {name: text[name] for name in PROGRESS_FIELDS if name in text}


def caught_up(client, run: str) -> bool:
    """Whether every consumer group of the run's steps stream has been delivered the stream's newest entry and
    acknowledged everything (XINFO GROUPS last-delivered-id = XINFO STREAM last-generated-id, pending 0). Redis's
    `lag` cannot say this once entries were trimmed before the group read them (it then stays at the number
    never read, or is null)."""
    found = groups(client, run)
    try:
        newest = client.xinfo_stream(wire.steps_key(run))["last-generated-id"]
    except Exception:
        return False
    return bool(found) and all(g.get("last-delivered-id") == newest and int(g.get("pending") or 0) == 0
                               for g in found)


def drain(url: str, run: str, timeout_s: float) -> float | None:
    """Seconds until the aggregator has caught up (caught_up) with the steps stream; None when it has not within
    timeout_s."""
    client = wire.connect(url, timeout_s=5.0)
    began = time.monotonic()
    try:
        while time.monotonic() - began < timeout_s:
            if caught_up(client, run):
                return time.monotonic() - began
            time.sleep(0.1)
        return None
    finally:
        client.close()


def ramp(url: str, run: str, args: argparse.Namespace, rates: list[float], first_step: int,
         sampler: Sampler) -> None:
    """Runs the load at each rate in turn (steps continuing from first_step, the same instances) and prints the
    aggregator's standing after each. It kept up with a rate when it caught up (caught_up) within 2 s of the
    phase's last write and wrote no step short of a rank during the phase; the ceiling is the highest such rate,
    or "at least" the rate the load generator reached when it could not go faster."""
    print(f"\nceiling ramp: {args.ranks} ranks, {args.ramp_seconds:g} s per rate, rates {rates} steps/s per rank")
    ceiling, limited = None, False
    client = wire.connect(url, timeout_s=5.0)
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
            break
        ceiling = report.rate / args.ranks
        if not loadgen_kept_up:
            print("  ramp stopped: the load generator, not the aggregator, is the limit here")
            limited = True
            break
    client.close()
    if ceiling is None:
        print(f"  ceiling: below {rates[0]:g} steps/s per rank")
    else:
        print(f"  ceiling: {'at least ' if limited or ceiling >= rates[-1] * 0.95 else ''}{ceiling:,.1f} steps/s per "
              f"rank ({ceiling * args.ranks:,.0f} records/s)")


def entries_read(client, run: str) -> int | None:
    """XINFO GROUPS entries-read of the run's steps stream (the most advanced group; None without one)."""
    found = [g.get("entries-read") for g in groups(client, run)]
    values = [int(v) for v in found if v is not None]
    return max(values) if values else None


def aggregator_throughput(url: str, run: str, args: argparse.Namespace, log_path: Path
                          ) -> tuple[float, int, dict[str, str]] | None:
    """The aggregator alone on a backlog, in a run of its own (`run`, a fresh stream): the load generator writes
    --backlog-s seconds of steps of every rank as fast as it can (at most 4 steps per write, so the stream is in step
    order give or take a round over the ranks), with MAXLEN raised to hold them all, then the
    aggregator starts; the entries it read after the first look that saw it reading (the group's entries-read),
    over the time from that look until it has caught up (caught_up). Returns (records per second it consumed, records in the backlog, its progress hash), None when
    it stopped moving for 30 s before catching up."""
    steps = max(1, round(args.backlog_s * args.steps_per_s))
    entries = steps * args.ranks
    budget = (entries + args.ranks * 8) * (loadgen.LAYERS * loadgen.EXPERTS * 4 + 200)  # maxlen_for_budget's bound
    # all due at once, at most 4 steps per write: the backlog is in step order give or take a round over the ranks
    report = loadgen.run_load(url, run, args.ranks, 1e6, steps / 1e6, args.processes, args.tokens,
                              instance_prefix=args.instance, memory_budget_bytes=budget, max_batch=4)
    client = wire.connect(url, timeout_s=5.0)
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


def main(argv: list[str] | None = None) -> int:
    pin_malloc()
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps-per-s", type=float, default=20.0, help="steps per second per rank")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=4, help="load generator processes")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per rank per step (decode)")
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
    args = parser.parse_args(argv)
    args.instance = f"scale-{os.getpid():x}"
    tmp = tempfile.mkdtemp(prefix="bench-scale-")
    server = start_redis(tmp, args.maxmemory_mb << 20, args.policy)
    aggregator = None
    try:
        client = server.client()
        print(f"scale: private redis-server {client.info('server')['redis_version']}, maxmemory "
              f"{args.maxmemory_mb} MiB, maxmemory-policy {args.policy}; {os.cpu_count()} CPUs here")
        if args.no_aggregator:
            print("aggregator: not started (--no-aggregator)")
        elif not aggregator_available():
            print("aggregator: collectors/aggregate/__main__.py does not exist yet: lag and ceiling not measured "
                  "(start_aggregator() in bench/scale.py starts it once it does)")
        else:
            aggregator = start_aggregator(server.url, args.run, Path(tmp) / "aggregator.log")
            print(f"aggregator: started (pid {aggregator.pid if aggregator else '-'}; log {tmp}/aggregator.log)")
        sampler = Sampler(server.url, args.run)
        counter = StreamCounter(server.url, args.run) if args.count_stream else None
        cpu_before = loadgen.redis_figures(client)["cpu_s"]
        began = time.monotonic()
        report = loadgen.run_load(server.url, args.run, args.ranks, args.steps_per_s, args.seconds, args.processes,
                                  args.tokens, memory_budget_bytes=args.memory_budget_mb << 20,
                                  instance_prefix=args.instance)
        figures = loadgen.redis_figures(client)
        print()
        report_load(report, figures["cpu_s"] - cpu_before)
        window = sampler.window(began)
        length = client.xlen(wire.steps_key(args.run))
        usage = client.memory_usage(wire.steps_key(args.run), samples=0) or 0
        print(f"  Redis memory: used_memory peak {mib(figures['used_memory_peak'])} (sampled max "
              f"{mib(max((s.used_memory for s in window), default=0))}), at the end {mib(figures['used_memory'])}; "
              f"steps stream {length:,} entries (MAXLEN ~{report.config.maxlen:,}: "
              f"{report.config.maxlen / args.ranks:.1f} steps of {args.ranks} ranks = "
              f"{report.config.maxlen / args.ranks / args.steps_per_s:.2f} s), {mib(usage)} = "
              f"{usage / max(length, 1):,.0f} B per entry")
        lost = report.expected - report.written
        print(f"  steps lost: {lost} of {report.expected} by the writers' count ({report.failed} failed writes)")
        if counter is not None:
            counter.stop()
            missing = counter.missing(args.ranks, report.config.steps)
            print(f"  stream tail: {missing} of {report.expected} rank-steps never seen in the stream"
                  + (f" ({counter.unread} entries were trimmed before the tail read them)" if counter.unread else
                     " (the tail read every entry the stream took)"))
        if aggregator is not None:
            report_aggregator(window)
            took = drain(server.url, args.run, 60.0)
            print("  aggregator caught up " + (f"{took:.1f} s" if took is not None else "not within 60 s")
                  + " after the last write")
            time.sleep(3.0)  # past its 2 s deadline: the last steps are written and counted
            state = progress(client, args.run)
            print("  aggregator progress: " + ", ".join(f"{k} {v}" for k, v in state.items()))
            print(f"  rank-steps the aggregator wrote its steps without: {state.get('rank_steps_missing', '?')} of "
                  f"{report.expected} (trimmed by MAXLEN ~ before it read them, or later than its deadline)")
            rates = [float(r) for r in args.ramp.split(",") if r.strip()]
            if rates:
                ramp(server.url, args.run, args, rates, report.config.steps, sampler)
            if args.backlog_s > 0:
                stop_aggregator(aggregator)
                aggregator = None
                print(f"\naggregator alone on a backlog of {args.backlog_s:g} s x {args.steps_per_s:g} steps/s x "
                      f"{args.ranks} ranks (written first, the aggregator stopped):")
                got = aggregator_throughput(server.url, f"{args.run}-backlog", args, Path(tmp) / "aggregator2.log")
                if got is None:
                    print("  it stopped moving before it had read the backlog")
                else:
                    per_s, records, state = got
                    print(f"  {per_s:,.0f} records/s consumed = {per_s / args.ranks:,.1f} steps/s at {args.ranks} "
                          f"ranks ({records:,} records in the backlog): the aggregator's ceiling on this machine "
                          f"with the CPU to itself")
                    print("  aggregator progress: " + ", ".join(f"{k} {v}" for k, v in state.items()))
        sampler.stop()
        client.close()
        ok = report.ok
    finally:
        stop_aggregator(aggregator)
        server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
