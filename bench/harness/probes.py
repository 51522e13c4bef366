"""What the benchmarks read while their load runs, each on a thread of its own. bench.scale: Redis sampled every
0.5 s (Sampler: used_memory, the steps stream's length, the aggregators' lag and pending, newest written and
aggregated steps), the steps stream tailed (StreamCounter), the dashboard's reader ticked and timed as the Overview
does it (DashboardProbe, dashboard_tick). bench.faults: the aggregate stream tailed from its first entry through
every outage (AggregateTail), the page's reader with its client settings (PageProbe, its notes summed by said())
and the exporter scraped (ExporterProbe). docs/scaling.md says what each figure means.
"""
from __future__ import annotations

import contextlib
import math
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.harness.target import node_client
from moe_monitor import core
from moe_monitor.demo.localredis import free_port

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


# ------------------------------------------------------------------ bench.faults
PAGE_TIMEOUT_S, PAGE_RETRIES = 0.5, 1  # the dashboard's own client (dashboard/views/session.py)
PAGE_EVERY_S = 1.0  # the live pages' refresh
WINDOW_STEPS = 600
SCRAPE_EVERY_S = 1.0
EXPORTER_INTERVAL_S = 2.0


def wait_for(condition: Callable[[], object], timeout_s: float, every_s: float = 0.1) -> float | None:
    """Seconds until condition() was truthy, None when it was not within timeout_s."""
    began = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            return None
        time.sleep(every_s)


# ------------------------------------------------------------------ aggregate
@dataclass(frozen=True)
class AggEntry:
    """One entry of the aggregate stream: its id, step, the ranks it carries (a bit mask), whether it folds late
    ranks into a step written before, the aggregator epoch, and when the tail read it (monotonic s)."""

    entry_id: bytes
    step: int
    ranks: int
    late: bool
    epoch: str
    seen_s: float


class AggregateTail:
    """Tails core.aggregate_key(run) from 0-0 on a thread until stop(). entries: every entry read, in order;
    newest_step: the newest step of an on-time entry; bad: entries that did not decode; errors: failed reads
    (an outage), last_error the latest."""

    def __init__(self, url: str, run: str):
        self.url, self.run, self.key = url, run, core.aggregate_key(run)
        self.entries: list[AggEntry] = []
        self.newest_step = -1
        self.bad = 0
        self.errors = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="faults-tail")
        self._thread.start()

    def _loop(self) -> None:
        client = core.connect(self.url, timeout_s=2.0)
        last: bytes = b"0-0"
        while not self._stop.is_set():
            try:
                reply = client.xread({self.key: last}, count=500, block=250)
            except Exception as exc:  # an outage: a fresh client, and read on after the last id seen
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    client.close()
                self._stop.wait(0.2)
                client = core.connect(self.url, timeout_s=2.0)
                continue
            now = time.monotonic()
            for _, found in reply or []:
                for entry_id, fields in found:
                    last = entry_id
                    try:
                        rec = core.decode_aggregate(fields)
                    except ValueError:
                        self.bad += 1
                        continue
                    mask = 0
                    for rank in rec.ranks_R.tolist():
                        mask |= 1 << rank
                    with self._lock:
                        self.entries.append(AggEntry(entry_id, int(rec.step), mask, rec.late, rec.instance, now))
                        if not rec.late:
                            self.newest_step = max(self.newest_step, int(rec.step))
        with contextlib.suppress(Exception):
            client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def snapshot(self) -> list[AggEntry]:
        with self._lock:
            return list(self.entries)

    def has_step_with(self, at_least: int, mask: int) -> bool:
        """Whether an entry of a step >= at_least carries every rank of mask."""
        with self._lock:
            return any(e.step >= at_least and e.ranks & mask == mask for e in reversed(self.entries[-2000:]))

    def vanished(self, url: str) -> list[AggEntry]:
        """Entries read that the stream no longer holds although it holds older ones (a failover took them
        back); entries trimmed from its head are not counted."""
        client = core.connect(url, timeout_s=10.0)
        try:
            held: set[bytes] = set()
            after: bytes | str = "-"
            while True:
                page = client.xrange(self.key, min=after, max="+", count=1000)
                if not page:
                    break
                held.update(entry_id for entry_id, _ in page)
                after = b"(" + page[-1][0]
        finally:
            client.close()
        if not held:
            return self.snapshot()
        oldest = min(held, key=_id)
        return [e for e in self.snapshot() if e.entry_id not in held and _id(e.entry_id) > _id(oldest)]


# ------------------------------------------------------------------ the page
@dataclass
class PageLook:
    """What the page showed at one tick (t: monotonic s)."""

    t: float
    ms: float
    feed: str
    newest: int | None
    ranks_at_newest: int
    reachable: bool
    error: str
    note: str
    stall_note: str
    held_note: str
    restart_note: str
    gap_note: str
    bad_records: int
    last_error: str
    missing: str
    steps_read: int
    collector_errors: dict[int, str] = field(default_factory=dict)
    feed_switches: int = 0
    skipped_overlap: int = 0
    short_steps: tuple[int, ...] = ()


class PageProbe:
    """The dashboard's reader of one run, ticked every PAGE_EVERY_S on a thread until stop() (the first ticks
    read the backlog at once, as the page's first loads do). looks: one PageLook per tick."""

    def __init__(self, url: str, run: str, window_steps: int = WINDOW_STEPS):
        self.url, self.run, self.window_steps = url, run, window_steps
        self.looks: list[PageLook] = []
        self.error = ""
        self.watched: Any = None  # the WatchedRun, once the thread made it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="faults-page")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    @property
    def latest(self) -> PageLook | None:
        return self.looks[-1] if self.looks else None

    def _loop(self) -> None:
        from moe_monitor.dashboard.live.watched import WatchedRun
        from moe_monitor.dashboard.sources.redis import RedisSource

        client = core.connect(self.url, timeout_s=PAGE_TIMEOUT_S, retries=PAGE_RETRIES)
        source = RedisSource(client, self.url, self.run, self.window_steps)
        watched = self.watched = WatchedRun(source, self.window_steps)
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    ms = dashboard_tick(watched)
                    while watched.last_tick is not None and watched.last_tick.more and not self._stop.is_set():
                        ms += dashboard_tick(watched)  # a backlog: the page reads on at once
                    self.looks.append(page_look(watched, ms))
                except Exception as exc:  # the page's analysis failing is a finding, not the end of the probe
                    self.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(max(0.0, PAGE_EVERY_S - (time.monotonic() - began)))
        finally:
            with contextlib.suppress(Exception):
                client.close()


def page_look(watched, ms: float) -> PageLook:
    window = watched.window
    newest = window.newest_step if window is not None else None
    ranks = 0
    missing = ""
    short: tuple[int, ...] = ()
    if window is not None and window.size:
        slots = window.ordered_slots()
        ranks = int(window.ranks_C[slots[window.step_C[slots].argmax()]])
        settled = slots[~window.pending(slots)]
        gone = window.missing_ranks(settled)
        short = tuple(int(x) for x in sorted(window.step_C[settled[window.ranks_C[settled] < window.world_C[settled]]]))
        if gone.rank_steps:
            listed = ", ".join(f"rank {rank} ({count} steps)" for rank, count in gone.by_rank[:3])
            missing = f"{gone.rank_steps} rank-steps missing in the window: {listed}"
    health = watched.source.health()
    errors = {rank: str(report.get("last_error") or "") for rank, report in health.collectors.items()
              if report.get("last_error")}
    return PageLook(time.monotonic(), ms, watched.feed, newest, ranks, health.reachable, health.error, health.note,
                    watched.source.stall_note, watched.held_note, watched.restart_note, watched.gap_note,
                    watched.bad_records, watched.last_error, missing, watched.steps_read, errors,
                    watched.feed_switches, watched.skipped_overlap, short if missing else ())


_NUMBER = re.compile(r"\d+(\.\d+)?")


def notes_of(x: PageLook) -> list[tuple[str, str]]:
    """(kind|the text with its numbers masked, the text) of every note one look shows."""
    found = [("health error", (x.error or "unreachable") if not x.reachable else ""), ("health note", x.note),
             ("stall_note", x.stall_note), ("held_note", x.held_note), ("restart_note", x.restart_note),
             ("gap_note", x.gap_note), ("missing", x.missing)]
    found += [(f"rank {rank} health last_error", text) for rank, text in sorted(x.collector_errors.items())]
    return [(f"{kind}|{_NUMBER.sub('#', text)}", text) for kind, text in found if text]


@dataclass
class Note:
    """One kind of note the page showed: its first text, when it first and last showed (seconds from the
    reference), and whether it showed already at the last tick before the span."""

    kind: str
    text: str
    first_s: float
    last_s: float
    already: bool


@dataclass
class PageSaid:
    """What the page showed over a span: its notes, the feeds it read in turn (with when each began, seconds from
    the reference) and the bad records it counted then (and the last reason)."""

    notes: list[Note] = field(default_factory=list)
    feeds: list[tuple[str, float]] = field(default_factory=list)
    bad: int = 0
    last_error: str = ""
    ticks: int = 0
    still_s: float = 0.0  # the longest the page's newest step stood still (seconds between ticks that moved it)

    def lines(self) -> list[str]:
        if not self.ticks:
            return ["(no tick of the page in this span)"]
        out = [f"{n.kind}: {n.text[:200]!r} ({n.first_s:+.1f} .. {n.last_s:+.1f} s"
               + (", showing before the fault)" if n.already else ")") for n in self.notes]
        out.append("feed: " + " -> ".join(f"{feed or '-'} ({t:+.1f} s)" for feed, t in self.feeds))
        out.append(f"the newest step shown stood still for up to {self.still_s:.1f} s")
        if self.bad:
            out.append(f"bad_records +{self.bad} (last error {self.last_error[:120]!r})")
        return out

    def short(self) -> str:
        """The new notes and the feeds in a few words (for a table cell)."""
        parts = [f"{n.kind}: {n.text[:90]}" for n in self.notes if not n.already]
        if self.still_s >= 3 * PAGE_EVERY_S:
            parts.append(f"newest step still for {self.still_s:.0f} s")
        if len(self.feeds) > 1:
            parts.append("feed " + " -> ".join(feed for feed, _ in self.feeds))
        if self.bad:
            parts.append(f"{self.bad} bad records")
        return "; ".join(parts) if parts else "nothing new"


def said(looks: list[PageLook], since: float, until: float, reference: float, began: float) -> PageSaid:
    """What the page showed between since and until (monotonic s): each kind of note once (its numbers aside),
    with its first text and when it showed (seconds from reference), and whether the last tick before `began`
    showed it already; the feeds; the bad records counted."""
    span = [x for x in looks if since <= x.t <= until]
    out = PageSaid(ticks=len(span))
    if not span:
        return out
    before = [x for x in looks if x.t < began][-1:]
    already = {key for x in before for key, _ in notes_of(x)}
    shown: dict[str, Note] = {}
    for x in span:
        for key, text in notes_of(x):
            if key in shown:
                shown[key].last_s = x.t - reference
            else:
                shown[key] = Note(key.split("|")[0], text, x.t - reference, x.t - reference, key in already)
    out.notes = list(shown.values())
    for x in span:
        if not out.feeds or out.feeds[-1][0] != x.feed:
            out.feeds.append((x.feed, x.t - reference))
    moved = span[0].t
    newest = span[0].newest
    for x in span[1:]:
        if x.newest is not None and (newest is None or x.newest > newest):
            newest, moved = x.newest, x.t
        out.still_s = max(out.still_s, x.t - moved)
    out.bad = span[-1].bad_records - (before[0].bad_records if before else 0)
    out.last_error = span[-1].last_error
    return out


# ------------------------------------------------------------------ exporter
@dataclass
class Scrape:
    t: float
    ok: bool
    error: str = ""
    steps_total: float | None = None
    collector_up: float | None = None
    redis_up: float | None = None


_SAMPLE = re.compile(r'^(moe_steps_total|moe_collector_up|moe_exporter_redis_up)(\{[^}]*\})?\s+(\S+)$')


class ExporterProbe:
    """`python -m moe_monitor export --redis URL --run RUN --port P` (stdout and stderr to log_path) and a
    thread scraping its /metrics every SCRAPE_EVERY_S until stop()."""

    def __init__(self, url: str, run: str, log_path: Path, window_steps: int = WINDOW_STEPS,
                 interval_s: float = EXPORTER_INTERVAL_S):
        self.port = free_port()
        self.run = run
        log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (the child's log, closed with it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moe_monitor", "export", "--redis", url, "--run", run, "--port", str(self.port),
             "--interval-s", str(interval_s), "--window-steps", str(window_steps)],
            stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
        log.close()
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="faults-exporter")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY_S):
            self.scrapes.append(self.scrape())

    def scrape(self) -> Scrape:
        now = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2.0) as reply:
                text = reply.read().decode()
        except Exception as exc:  # not serving yet, or stuck: a failed scrape, as Prometheus would see it
            return Scrape(now, False, f"{type(exc).__name__}: {exc}")
        values: dict[str, float] = {}
        for line in text.splitlines():
            found = _SAMPLE.match(line)
            if found and (found.group(2) is None or f'run="{self.run}"' in found.group(2)):
                values[found.group(1)] = float(found.group(3))
        return Scrape(now, True, "", values.get("moe_steps_total"), values.get("moe_collector_up"),
                      values.get("moe_exporter_redis_up"))

    @property
    def serving(self) -> bool:
        return any(s.ok and s.steps_total for s in self.scrapes)

    def moved_since(self, t: float) -> bool:
        """Whether a scrape after t (monotonic s) showed moe_steps_total above its last value up to t, with
        moe_collector_up 1: the exporter reads the run again."""
        scrapes = list(self.scrapes)
        base = [s.steps_total for s in scrapes if s.ok and s.t <= t and s.steps_total is not None][-1:]
        return any(s.ok and s.t > t and s.collector_up == 1 and s.steps_total is not None
                   and s.steps_total > (base[0] if base else 0.0) for s in scrapes)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def said(self, since: float, until: float, fault_end: float) -> str:
        """What the scrapes between since and until showed, and when moe_steps_total moved again after
        fault_end (seconds)."""
        span = [s for s in self.scrapes if since <= s.t <= until]
        if not span:
            return "exporter: no scrape"
        failed = sum(not s.ok for s in span)
        down = [s for s in span if s.ok and (s.collector_up == 0 or s.redis_up == 0)]
        at_end = [s.steps_total for s in span if s.ok and s.t <= fault_end and s.steps_total is not None]
        base = at_end[-1] if at_end else 0.0
        moved = next((s.t - fault_end for s in span if s.ok and s.t > fault_end and s.steps_total is not None
                      and s.steps_total > base and s.collector_up == 1), None)
        parts = [f"{len(span)} scrapes"]
        if failed:
            parts.append(f"{failed} failed")
        if down:
            parts.append(f"moe_collector_up/moe_exporter_redis_up 0 in {len(down)}")
        parts.append(f"moe_steps_total moving again {moved:+.1f} s after the fault" if moved is not None
                     else "moe_steps_total not moving again in this span")
        return "exporter: " + ", ".join(parts)
