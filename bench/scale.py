"""Scale test: 256 expert-parallel ranks at 20 steps/s for 60 s into one private Redis (bench.loadgen: DeepSeek-V3
shaped compact records, 64 decode tokens per rank and step, through collectors.sinks.RedisSink from several
processes), the aggregator (collectors.aggregate) summing them and a dashboard reading its stream; then the same
through a private 3-master Redis Cluster (demo.localcluster) and the scaling from 1 to 3 masters. Ends with a
table of the figures beside the goals.

Redis: private redis-servers with `maxmemory` (--maxmemory-mb, default 1024) and `maxmemory-policy noeviction`
(--policy): under noeviction a full Redis refuses the write (the collector counts it) instead of evicting a run's
keys behind everyone's back. While the load runs, a sampler reads every 0.5 s: INFO memory used_memory of every
master, the steps stream's length, XINFO GROUPS on the steps stream (`lag`: entries not yet delivered to the
aggregator's group; `pending`: delivered, not acknowledged) and the newest aggregated step (wire.aggregate_key)
against the newest written step. Printed per target (the single Redis, then the cluster):

- records written / failed (what the writers report; the stream is trimmed at MAXLEN ~ and by the aggregator, so
  counting it afterwards cannot prove that no step was lost; --count-stream also tails the stream and counts each
  rank's distinct steps as they arrive), the achieved rate, how late records landed, write latency, client and
  redis-server CPU, used_memory peak (INFO, right after the main load) and the stream's memory per entry;
- the aggregator (`python -m collectors.aggregate --redis URL --run NAME`, a subprocess started before the load):
  how far behind it read, how long after the last write it had caught up, its progress hash
  (wire.aggregator_key(run) + ":state": steps written, rank-steps it wrote a step without);
- the dashboard: a WatchedRun over a RedisSource (the dashboard's own reader, window --window 600 steps) on a thread
  of this process, started once the aggregate stream holds the window (or half the run when the run is shorter):
  the cold first tick(s) reading the window's backlog, then one tick a second (the pages' refresh) while steps
  arrive, each timed as bench.aggregate_tick does: tick() + resolve_layout + dashboard.live.snapshot.analyse;
  the feed it read ("aggregate": the aggregator's stream, not the per-rank records). This process runs with one
  BLAS thread (--blas-threads 1; 0: the library's default pool): on a machine the load keeps busy, OpenBLAS's
  pool of 2 threads stalls (the GPU loads of 20 new rows, planner.loads.weighted_loads, ~3 ms on one thread, took
  15-40 ms median and 200-900 ms p90 with the default pool next to two busy processes on 2 cores);
- redis-benchmark's XADD rate (bench.wire.redis_benchmark_rate: -P 16, 50 clients) for an entry of the size the
  load generator writes, into the same Redis (for the cluster: the master of the benchmark's key), after the load;
- the ceiling: a ramp (--ramp, steps/s per rank, each for --ramp-seconds; the cluster: --cluster-ramp) finds the
  highest rate after which the aggregator caught up within 2 s of the last write with no rank-step missing (the
  ramp stops where the load generator itself cannot go faster: the ceiling is then at least that); then the
  aggregator alone on a backlog (--backlog-s seconds of steps written while it is stopped, then a fresh aggregator):
  the records per second it consumes with the CPU to itself, its ceiling in steps/s at --ranks ranks.

Cluster (--cluster-seconds, default 40; --masters 3, --replicas 0: on a 2-core machine replicas only take CPU from
the figures, --replicas 1 adds them): the same load, aggregator and dashboard through the cluster URL (wire.connect
speaks cluster). A run's keys share one hash slot (wire.run_key's hash tag), so one run lives on one master. The
scaling from 1 to 3 masters: (i) the one run of --ranks ranks above and (ii) the same ranks split into 3 runs
whose names hash to 3 different masters (LocalCluster.master_of on wire.steps_key), each with its own aggregator
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
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import redis

import wire
from bench import loadgen
from bench.malloc_env import STEADY, pin_malloc

REPO = Path(__file__).resolve().parents[1]
AGGREGATOR_MAIN = REPO / "collectors" / "aggregate" / "__main__.py"
GOAL_TICK_MS = 100.0
GOAL_MEMORY_BYTES = 512 << 20
DASHBOARD_EVERY_S = 1.0  # the live pages' refresh (dashboard/views/session.py REFRESH_S)
MAX_COLD_TICKS = 50
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


# ---------------------------------------------------------------------------------------------------- the aggregator
def aggregator_available() -> bool:
    """Whether collectors/aggregate/__main__.py is there (`python -m collectors.aggregate`)."""
    return AGGREGATOR_MAIN.is_file()


def start_aggregator(url: str, run: str, log_path: Path, wait_s: float = 90.0,
                     options: Sequence[str] = ()) -> subprocess.Popen | None:
    """THE AGGREGATOR HOOK. Starts `python -m collectors.aggregate --redis URL --run RUN [options]` (stdout and
    stderr to log_path) and waits up to wait_s until it has created its consumer group on the run's steps stream (XINFO
    GROUPS lists one) or has died. Returns the process (None when collectors/aggregate/__main__.py is missing);
    RuntimeError when it exits before its group appears."""
    if not aggregator_available():
        return None
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (the child's log, closed with it)
    proc = subprocess.Popen([sys.executable, "-m", "collectors.aggregate", "--redis", url, "--run", run, *options],
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


# ---------------------------------------------------------------------------------------------------- where it goes
def start_redis(tmp: str, maxmemory_bytes: int, policy: str):
    """A private redis-server with maxmemory and maxmemory-policy set."""
    from demo.localredis import RedisServer

    server = RedisServer(tmp)
    client = server.client()
    client.config_set("maxmemory", str(maxmemory_bytes))
    client.config_set("maxmemory-policy", policy)
    client.close()
    return server


def node_client(url: str) -> redis.Redis:
    """A plain client of one redis-server (a cluster node answers INFO, CPU and memory of its own)."""
    return redis.Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=5.0)


class Target:
    """Where the load goes: a private redis-server (kind "single") or a private LocalCluster of `masters` masters
    with `replicas` replicas each ("cluster"), every node with maxmemory and maxmemory-policy set. url: what the
    writers, the aggregators and the dashboard are given; node_urls: client port -> redis:// URL of every node."""

    def __init__(self, kind: str, tmp: str, maxmemory_bytes: int, policy: str, masters: int = 3,
                 replicas: int = 0):
        self.kind, self.server, self.cluster = kind, None, None
        if kind == "single":
            self.server = start_redis(tmp, maxmemory_bytes, policy)
            self.url = self.server.url
            self.node_urls = {self.server.port: self.server.url}
        else:
            from demo.localcluster import LocalCluster

            self.cluster = LocalCluster(tmp, masters=masters, replicas=replicas)
            self.url = self.cluster.url
            self.node_urls = {port: self.cluster.url_of(port) for port in self.cluster.ports}
            for url in self.node_urls.values():
                node = node_client(url)
                node.config_set("maxmemory", str(maxmemory_bytes))
                node.config_set("maxmemory-policy", policy)
                node.close()

    @property
    def masters(self) -> list[int]:
        return self.cluster.masters() if self.cluster is not None else list(self.node_urls)

    @property
    def replicas(self) -> list[int]:
        return self.cluster.replicas() if self.cluster is not None else []

    def master_of(self, key: str) -> int:
        """Port of the master serving key (the single server's own port)."""
        return self.cluster.master_of(key) if self.cluster is not None else next(iter(self.node_urls))

    def version(self) -> str:
        node = node_client(next(iter(self.node_urls.values())))
        try:
            return str(node.info("server")["redis_version"])
        finally:
            node.close()

    def figures(self) -> dict[int, dict[str, float]]:
        """loadgen.redis_figures (used_memory, used_memory_peak, CPU seconds) of every node, by port."""
        out = {}
        for port, url in self.node_urls.items():
            node = node_client(url)
            try:
                out[port] = loadgen.redis_figures(node)
            finally:
                node.close()
        return out

    def flush(self) -> None:
        """FLUSHALL every master (a cluster's replicas follow)."""
        for port in self.masters:
            node = node_client(self.node_urls[port])
            node.flushall()
            node.close()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.cluster is not None:
            self.cluster.stop()


# ---------------------------------------------------------------------------------------------------- sampling
@dataclass
class Sample:
    """One look at Redis: time (monotonic s), used_memory (bytes) of the master holding the run and of every
    master sampled (by port), the steps stream's length, the consumer group's lag and pending entries (None
    without a group; lag None also when Redis cannot tell), behind_s: the newest entry's id time minus the group's
    last delivered id time (seconds of the stream not yet read; entry ids are their XADD time in ms), the newest
    written and aggregated step ids."""

    t: float
    used_memory: int
    stream_len: int
    lag: int | None = None
    pending: int | None = None
    behind_s: float | None = None
    written_step: int | None = None
    aggregated_step: int | None = None
    node_memory: dict[int, int] = field(default_factory=dict)


@dataclass
class Sampler:
    """Samples Redis every interval_s on a thread of its own until stop(): the run through url, used_memory of
    the nodes of node_urls (port -> URL), run_port the one holding the run."""

    url: str
    run: str
    node_urls: dict[int, str]
    run_port: int
    interval_s: float = 0.5
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scale-sampler")
        self._thread.start()

    def _loop(self) -> None:
        client = wire.connect(self.url, timeout_s=5.0)
        nodes = {port: node_client(url) for port, url in self.node_urls.items()}
        steps_key = wire.steps_key(self.run)
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):
                self.samples.append(look(client, self.run, nodes, self.run_port, steps_key))
        client.close()
        for node in nodes.values():
            node.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def window(self, since: float) -> list[Sample]:
        return [s for s in self.samples if s.t >= since]

    def peak(self, port: int, since: float = float("-inf")) -> int:
        """The highest used_memory sampled on node `port` since `since` (0 when none)."""
        return max((s.node_memory.get(port, 0) for s in self.window(since)), default=0)


def look(client, run: str, nodes: dict[int, redis.Redis], run_port: int, steps_key: str | None = None) -> Sample:
    """One Sample of the run now (the lag and pending of the most lagging group when there are several)."""
    steps_key = steps_key or wire.steps_key(run)
    node_memory = {port: int(node.info("memory")["used_memory"]) for port, node in nodes.items()}
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
    return Sample(time.monotonic(), node_memory.get(run_port, 0), int(client.xlen(steps_key)), lag, pending,
                  behind_s, newest_step(client, steps_key),
                  newest_step(client, wire.aggregate_key(run)) if found else None, node_memory)


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


# ---------------------------------------------------------------------------------------------------- the dashboard
@dataclass
class DashboardFigures:
    """What the dashboard's reader did: the feed it read last ("aggregate" or "steps"), the window's steps at the
    end and its newest step, the cold start (ms summed over the ticks that read the backlog, and how many), each
    warm tick's ms (tick + layout + analyse) and the aggregated steps it took, bad records, an error if it
    failed."""

    feed: str = ""
    window_steps: int = 0
    newest_step: int | None = None
    cold_ms: float | None = None
    cold_ticks: int = 0
    warm_ms: list[float] = field(default_factory=list)
    warm_new: list[int] = field(default_factory=list)
    bad_records: int = 0
    error: str = ""

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.warm_ms) if self.warm_ms else None

    @property
    def p90_ms(self) -> float | None:
        return sorted(self.warm_ms)[max(0, math.ceil(0.9 * len(self.warm_ms)) - 1)] if self.warm_ms else None

    def line(self) -> str:
        if self.error:
            return f"the dashboard's reader failed: {self.error}"
        if self.cold_ms is None:
            return "the dashboard did not start (the aggregate stream never held the steps it waits for)"
        warm = (f"warm ticks (one a second while steps arrived, {statistics.median(self.warm_new or [0]):.0f} new "
                f"steps each): median {self.median_ms:.1f} ms, p90 {self.p90_ms:.1f} ms over {len(self.warm_ms)}"
                if self.warm_ms else "no warm tick (the load ended first)")
        return (f"feed {self.feed or '-'!r}, window {self.window_steps} steps (newest {self.newest_step}); cold "
                f"start {self.cold_ms:.0f} ms over {self.cold_ticks} tick(s); {warm}; {self.bad_records} bad records")


class DashboardProbe:
    """The dashboard's reader on a thread of this process: once the run's aggregate stream holds `start_at`
    entries, a WatchedRun(RedisSource(wire.connect(url), url, run, window), window) ticks until the window's
    backlog is read (the cold start), then once every `every_s` until stop(); each tick timed as the Overview
    does it: tick() + resolve_layout + analyse (bench.aggregate_tick)."""

    def __init__(self, url: str, run: str, window_steps: int = 600, start_at: int = 600,
                 every_s: float = DASHBOARD_EVERY_S):
        self.url, self.run, self.window_steps = url, run, window_steps
        self.start_at, self.every_s = max(1, start_at), every_s
        self.figures = DashboardFigures()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scale-dashboard")
        self._thread.start()

    def stop(self) -> DashboardFigures:
        self._stop.set()
        self._thread.join(60)
        return self.figures

    def _loop(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # reported in the figures, never raised into the benchmark
            self.figures.error = f"{type(exc).__name__}: {exc}"

    def _watch(self) -> None:
        from dashboard.live.watched import WatchedRun
        from dashboard.sources.redis import RedisSource

        client = wire.connect(self.url, timeout_s=5.0)
        try:
            key = wire.aggregate_key(self.run)
            while True:  # a stop() while waiting still reads the stream once it holds start_at entries
                with contextlib.suppress(redis.RedisError):
                    if client.xlen(key) >= self.start_at:
                        break
                if self._stop.is_set():
                    return
                self._stop.wait(0.2)
            watched = WatchedRun(RedisSource(client, self.url, self.run, self.window_steps), self.window_steps)
            cold = 0.0
            for _ in range(MAX_COLD_TICKS):
                cold += dashboard_tick(watched)
                self.figures.cold_ticks += 1
                if watched.last_tick is not None and not watched.last_tick.more and watched.window is not None:
                    break
            self.figures.cold_ms = cold
            self._note(watched)
            while not self._stop.wait(self.every_s):
                self.figures.warm_ms.append(dashboard_tick(watched))
                self.figures.warm_new.append(watched.last_tick.aggregates_in if watched.last_tick else 0)
                self._note(watched)
        finally:
            client.close()

    def _note(self, watched) -> None:
        window = watched.window
        self.figures.feed = watched.feed
        self.figures.window_steps = window.size if window is not None else 0
        self.figures.newest_step = window.newest_step if window is not None else None
        self.figures.bad_records = watched.bad_records


def dashboard_tick(watched) -> float:
    """One Overview tick of a WatchedRun: poll + ingest, resolve the layout, analyse; milliseconds."""
    from dashboard.live.layout import resolve_layout
    from dashboard.live.snapshot import analyse

    started = time.perf_counter()
    watched.tick()
    window = watched.window
    if window is not None and window.size:
        layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size,
                                changes=watched.layouts.changes, at_step=window.newest_step)
        analyse(window, layout, "both", None)
    return (time.perf_counter() - started) * 1e3


# ---------------------------------------------------------------------------------------------------- reports
def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def report_load(report: loadgen.LoadReport, redis_cpu_s: float) -> None:
    print(report.summary())
    print(f"  redis-server CPU: {redis_cpu_s:.1f} s = {redis_cpu_s / max(report.duration_s, 1e-9):.2f} cores "
          f"({redis_cpu_s / max(report.written, 1) * 1e6:.0f} us per record)")


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
    """The aggregator's progress hash (wire.aggregator_key(run) + ":state"), the fields in PROGRESS_FIELDS that
    are there, as text ({} when there is none)."""
    try:
        raw = client.hgetall(wire.aggregator_key(run) + ":state")
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
        with contextlib.suppress(Exception):  # the backlog run's keys: its memory is not the next phase's
            cleanup = wire.connect(url, timeout_s=10.0)
            for key in (wire.steps_key(run), wire.aggregate_key(run)):
                cleanup.delete(key)
            cleanup.close()


def entry_size(tokens: int) -> int:
    """Bytes of one step entry as the load generator writes it (every field, compact counts; the median over 16
    ranks of real-shaped decode records of `tokens` tokens)."""
    from bench.wire import entry_bytes, records_for

    return int(statistics.median(entry_bytes(wire.encode_step(rec)) for rec in records_for("decode", tokens, 16)))


def benchmark_xadd(target: Target, payload_bytes: int, maxlen: int) -> float | None:
    """redis-benchmark's XADD rate (bench.wire.redis_benchmark_rate) for one field of payload_bytes into the
    master of its key (bench:s), the key deleted afterwards; None (said why) when it cannot run."""
    from bench.wire import redis_benchmark_rate

    port = target.master_of("bench:s")
    try:
        return redis_benchmark_rate(port, payload_bytes, maxlen)
    except Exception as exc:  # no redis-benchmark here, or it failed: the rest of the figures stand
        print(f"  redis-benchmark: not measured ({type(exc).__name__}: {exc})")
        return None
    finally:
        with contextlib.suppress(Exception):
            node = node_client(target.node_urls[port])
            node.delete("bench:s")
            node.close()


# ---------------------------------------------------------------------------------------------------- one target
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


def measure(target: Target, args: argparse.Namespace, run: str, seconds: float, rates: list[float],
            backlog_s: float, tmp: Path, label: str) -> Result:
    """The main load into target with the aggregator and the dashboard, then redis-benchmark, the ceiling ramp and
    the aggregator on a backlog; prints as it goes and returns the figures."""
    aggregator = None
    if args.no_aggregator:
        print("aggregator: not started (--no-aggregator)")
    elif not aggregator_available():
        print("aggregator: collectors/aggregate/__main__.py does not exist: lag and ceiling not measured")
    else:
        aggregator = start_aggregator(target.url, run, tmp / f"aggregator-{run}.log")
        print(f"aggregator: started (pid {aggregator.pid if aggregator else '-'}; log {tmp}/aggregator-{run}.log)")
    try:
        run_port = target.master_of(wire.steps_key(run))
        masters = {port: target.node_urls[port] for port in target.masters}
        sampler = Sampler(target.url, run, masters, run_port)
        counter = StreamCounter(target.url, run) if args.count_stream else None
        steps = round(args.steps_per_s * seconds)
        probe = DashboardProbe(target.url, run, args.window, min(args.window, max(1, steps // 2))) \
            if aggregator is not None else None
        client = wire.connect(target.url, timeout_s=10.0)
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
        length = client.xlen(wire.steps_key(run))
        usage = client.memory_usage(wire.steps_key(run), samples=0) or 0
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


# ---------------------------------------------------------------------------------------------------- 1 -> 3 masters
def runs_on_masters(master_of: Callable[[str], int], base: str, count: int) -> list[tuple[str, int]]:
    """`count` run names base-0, base-1, ... whose keys (one hash slot per run) live on `count` different masters
    (master_of: key -> port of its master, e.g. LocalCluster.master_of), with the port of each one's master, in
    port order. RuntimeError when the cluster has fewer masters."""
    chosen: dict[int, str] = {}
    for i in range(10_000):
        name = f"{base}-{i}"
        chosen.setdefault(master_of(wire.steps_key(name)), name)
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
        client = wire.connect(target.url, timeout_s=10.0)
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
    index_port = target.master_of(wire.RUNS_KEY)
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
          f"index {wire.RUNS_KEY} is one key for all runs, on master :{index_port}: every write of every run also "
          "ZADDs it there (a second node per write round trip for the runs elsewhere). What it "
          f"does not show: a speed-up. Here {len(target.node_urls)} redis-servers, the load generator and "
          f"{len(split.runs)} aggregators share {cores} cores, so the throughput is the machine's, not the "
          f"cluster's; on {len(split.runs)} machines each master would need about a third of one master's CPU, and "
          "the ceiling of each run stays that of its own aggregator (one process per run).")


# ---------------------------------------------------------------------------------------------------- summary
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


# ---------------------------------------------------------------------------------------------------- main
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
