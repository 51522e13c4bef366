"""What bench.scale reads while its load runs: Redis sampled on a thread (Sample, Sampler, look: used_memory, the
steps stream's length, the aggregator's consumer group lag and pending, newest written and aggregated steps), the
stream tailed to count every rank's steps (StreamCounter), and the dashboard's reader (a WatchedRun over a
RedisSource) ticking on a thread and timed as the Overview does it (DashboardProbe, DashboardFigures,
dashboard_tick)."""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from dataclasses import dataclass, field

import redis

from bench.scale_target import node_client
from moe_monitor import core

DASHBOARD_EVERY_S = 1.0  # the live pages' refresh (dashboard/views/session.py REFRESH_S)
MAX_COLD_TICKS = 50

def groups(client, run: str) -> list[dict]:
    """XINFO GROUPS of the run's steps stream ([] when the stream or its groups do not exist yet)."""
    try:
        return list(client.xinfo_groups(core.steps_key(run)))
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
        client = core.connect(self.url, timeout_s=5.0)
        nodes = {port: node_client(url) for port, url in self.node_urls.items()}
        steps_key = core.steps_key(self.run)
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
    steps_key = steps_key or core.steps_key(run)
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
                  newest_step(client, core.aggregate_key(run)) if found else None, node_memory)


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
        self.url, self.key = url, core.steps_key(run)
        self.steps: dict[int, set[int]] = {}
        self.read = 0
        self.unread = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scale-counter")
        self._thread.start()

    def _loop(self) -> None:
        client = core.connect(self.url, timeout_s=5.0)
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
    entries, a WatchedRun(RedisSource(core.connect(url), url, run, window), window) ticks until the window's
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
        from moe_monitor.dashboard.live.watched import WatchedRun
        from moe_monitor.dashboard.sources.redis import RedisSource

        client = core.connect(self.url, timeout_s=5.0)
        try:
            key = core.aggregate_key(self.run)
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
    from moe_monitor.dashboard.live.layout import resolve_layout
    from moe_monitor.dashboard.live.snapshot import analyse

    started = time.perf_counter()
    watched.tick()
    window = watched.window
    if window is not None and window.size:
        layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size,
                                changes=watched.layouts.changes, at_step=window.newest_step)
        analyse(window, layout, "both", None)
    return (time.perf_counter() - started) * 1e3
