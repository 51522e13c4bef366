"""The deployment bench.faults runs its faults against: simulated ranks (ranks.py; the last one alone in its
process, recording a trace file too), the aggregator (`moe-monitor aggregate`), the tail of its stream, the
dashboard's reader and the exporter (probes.py), all on one Redis URL (a single redis-server or a cluster).
Deployment knows what was written (Segments: per rank and collector instance, the step ids its Redis sink
published) and counts what was read per span of step ids (Deployment.tally, a Tally).
"""
from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness.aggregator import progress, start_aggregator, stop_aggregator
from bench.harness.loadgen import split_ranks
from bench.harness.probes import AggEntry, AggregateTail, ExporterProbe, PageProbe, groups, wait_for
from bench.harness.ranks import Clock, GroupConfig, GroupReport, RankGroup, context
from moe_monitor import core
from moe_monitor.core.health import decode_health_report


@dataclass(frozen=True)
class Segment:
    """Steps first .. first + published - 1 of one rank, published by one collector instance (how: "report",
    its group's own count at its end; "health", its last health report in Redis, for an instance SIGKILLed)."""

    rank: int
    instance: str
    first: int
    published: int
    how: str = "report"

    def count_in(self, lo: int, hi: int) -> int:
        """Steps of this segment in [lo, hi)."""
        return max(0, min(hi, self.first + self.published) - max(lo, self.first))


@dataclass
class Tally:
    """Rank-steps of the step ids [lo, hi): written (the writers' count), read (in the aggregate stream and still
    there), lost (written, never read), extra (read, not counted written), twice (a rank-step in two entries)."""

    lo: int
    hi: int
    written: int
    read: int
    lost: int
    extra: int
    twice: int
    lost_sample: tuple[tuple[int, int], ...] = ()  # the first (step, rank) written and never read


class Deployment:
    """A run of `ranks` simulated ranks at steps_per_s into url; start() brings everything up and starts the clock,
    stop() lets every rank write up to a common last step and drains the aggregator."""

    def __init__(self, url: str, run: str, ranks: int, steps_per_s: float, tmp: Path, processes: int = 2,
                 tokens_per_rank: int = 64, lease_s: float = 5.0, exporter: bool = True,
                 aggregate_all: bool = False, memory_budget: str | None = None):
        """aggregate_all: the aggregator serves every run of the Redis (`--all`), memory_budget its
        --memory-budget."""
        if ranks < 2:
            raise ValueError(f"need at least 2 ranks (one of them alone in its process), got {ranks}")
        self.url, self.run, self.ranks, self.steps_per_s = url, core.check_run_name(run), ranks, steps_per_s
        self.tmp, self.processes, self.tokens, self.lease_s = tmp, processes, tokens_per_rank, lease_s
        self.with_exporter = exporter
        self.aggregate_all, self.memory_budget = aggregate_all, memory_budget
        self.solo_rank = ranks - 1
        self.ctx = context()
        self.clock = Clock(self.ctx, steps_per_s)
        self.groups: list[RankGroup] = []
        self.solo: RankGroup | None = None
        self.segments: list[Segment] = []
        self.reports: list[GroupReport] = []
        self.aggregator: subprocess.Popen | None = None
        self.aggregators = 0
        self.tail: AggregateTail | None = None
        self.page: PageProbe | None = None
        self.exporter: ExporterProbe | None = None
        self.client = core.connect(url, timeout_s=5.0)
        self.stop_step: int | None = None
        self.stranded = 0

    # ------------------------------------------------------------------ bringing up
    def _config(self, ranks: tuple[int, ...], label: str, first_step: int | None = 0,
                trace: bool = False) -> GroupConfig:
        return GroupConfig(self.url, self.run, self.ranks, tuple(ranks), self.steps_per_s, label, first_step,
                           self.tokens, trace_dir=str(self.tmp) if trace else None)

    def start(self) -> None:
        self.start_aggregator()
        others = split_ranks(self.ranks - 1, self.processes)
        self.groups = [RankGroup(self.ctx, self._config(tuple(share), f"ranks{i}"), self.clock).start()
                       for i, share in enumerate(others)]
        self.solo = RankGroup(self.ctx, self._config((self.solo_rank,), "solo0", trace=True), self.clock).start()
        self.groups.append(self.solo)
        self.tail = AggregateTail(self.url, self.run)
        if self.with_exporter:
            self.exporter = ExporterProbe(self.url, self.run, self.tmp / "exporter.log")
        for group in self.groups:
            group.wait_loaded()
        self.clock.start()
        for group in self.groups:
            group.wait_ready()
        # the page opens on a run the aggregator already holds (its first check then reads the aggregate)
        tail = self.tail
        wait_for(lambda: tail.newest_step >= 0 and self.client.get(core.aggregator_key(self.run)) is not None,
                 120.0)
        self.page = PageProbe(self.url, self.run)

    def start_aggregator(self) -> None:
        self.aggregators += 1
        options = ["--lease-s", f"{self.lease_s:g}"]
        if self.memory_budget:
            options += ["--memory-budget", self.memory_budget]
        if self.aggregate_all:  # every run of moe:runs, this one listed first so that it is found at once
            self.client.zadd(core.RUNS_KEY, {self.run: time.time()})
            options += ["--discover-s", "1"]
        self.aggregator = start_aggregator(self.url, self.run, self.tmp / f"aggregator-{self.aggregators}.log",
                                           options=options, all_runs=self.aggregate_all)

    def kill_aggregator(self) -> None:
        """SIGKILL the aggregator (nothing committed, nothing released)."""
        if self.aggregator is not None:
            self.aggregator.kill()
            self.aggregator.wait(10)

    # ------------------------------------------------------------------ the solo rank
    @property
    def trace_path(self) -> str | None:
        return None if self.solo is None else self.solo.config.trace_path(self.solo_rank)

    def kill_solo(self) -> Segment:
        """SIGKILL the solo rank's process; its published steps from the health report it last wrote (it is in
        the same pipelined round trip as the steps it counts)."""
        assert self.solo is not None
        self.solo.kill()
        raw = self.client.hget(core.health_key(self.run), str(self.solo_rank))
        report = decode_health_report(raw) if raw else {}
        first = self.solo.first_step or 0
        segment = Segment(self.solo_rank, f"{self.solo.config.label} (SIGKILLed)", first,
                          int(report.get("published_steps", 0)), "health")
        self.segments.append(segment)
        self.groups.remove(self.solo)
        return segment

    def restart_solo(self) -> int:
        """A new process (a new collector instance) for the solo rank; its first step is the step due once it is
        ready to write. Returns that step."""
        label = f"solo{sum(1 for s in self.segments if s.rank == self.solo_rank)}"
        self.solo = RankGroup(self.ctx, self._config((self.solo_rank,), label, None, trace=True), self.clock).start()
        self.groups.append(self.solo)
        self.solo.wait_loaded()
        return self.solo.wait_ready()

    # ------------------------------------------------------------------ other groups of ranks
    def restart_group(self, index: int) -> tuple[tuple[int, ...], int]:
        """SIGKILL the index-th group of ranks (not the solo rank) and start its ranks again as new collector
        instances (step ids going on from the clock); returns (its ranks, its first step)."""
        group = [g for g in self.groups if g is not self.solo][index]
        group.kill()
        ranks = group.config.ranks
        health = self.client.hgetall(core.health_key(self.run))
        first = group.first_step or 0
        for rank in ranks:
            raw = health.get(str(rank).encode())
            report = decode_health_report(raw) if raw else {}
            self.segments.append(Segment(rank, f"{group.config.label} (SIGKILLed)", first,
                                         int(report.get("published_steps", 0)), "health"))
        self.groups.remove(group)
        label = f"{group.config.label}r"
        fresh = RankGroup(self.ctx, self._config(ranks, label, None), self.clock).start()
        self.groups.insert(index, fresh)
        fresh.wait_loaded()
        return ranks, fresh.wait_ready()

    # ------------------------------------------------------------------ the clock and what was read
    def due(self) -> int:
        return self.clock.due()

    def aggregate_current(self, step: int) -> bool:
        return self.tail is not None and self.tail.newest_step >= step

    def page_current(self, step: int, feed: str | None = "aggregate", full: bool = False) -> bool:
        """The page's latest tick reached `step`, Redis reachable, reading `feed` (None: either), and with
        full the newest step had every rank."""
        latest = self.page.latest if self.page is not None else None
        return latest is not None and latest.reachable and latest.newest is not None and latest.newest >= step \
            and (feed is None or latest.feed == feed) and (not full or latest.ranks_at_newest >= self.ranks)

    def writer_failures(self) -> tuple[int, int]:
        """(failed writes, dropped steps) summed over the ranks' health reports in Redis ((0, 0) unreadable)."""
        failed = dropped = 0
        with contextlib.suppress(Exception):
            for value in self.client.hgetall(core.health_key(self.run)).values():
                report = decode_health_report(value)
                failed += int(report.get("sink_failures") or 0)
                dropped += int(report.get("dropped_steps") or 0)
        return failed, dropped

    def stranded_entries(self, idle_ms: int = 5000) -> int:
        """Entries of the steps stream delivered to a consumer of the aggregators' group and not acknowledged for
        idle_ms (at the end of a run, once the aggregator has caught up, nothing should be)."""
        from moe_monitor.aggregator.options import GROUP

        with contextlib.suppress(Exception):
            return len(self.client.xpending_range(core.steps_key(self.run), GROUP, min="-", max="+", count=10_000,
                                                  idle=idle_ms))
        return 0

    def pending_entries(self) -> int:
        """Entries delivered to the aggregators' consumer group and not acknowledged (XPENDING)."""
        from moe_monitor.aggregator.options import GROUP

        with contextlib.suppress(Exception):
            return int(self.client.xpending(core.steps_key(self.run), GROUP)["pending"])
        return -1

    # ------------------------------------------------------------------ stopping
    def stop(self, drain_s: float = 120.0) -> None:
        """Every rank writes up to a common last step (a few steps ahead) and flushes; then wait until the tail
        holds every rank-step written (or the aggregator has caught up and settled), and stop the readers."""
        self.stop_step = self.due() + 3
        self.clock.stop_at(self.stop_step)
        for group in list(self.groups):
            report = group.report()
            self.reports.append(report)
            for rank in report.ranks:
                self.segments.append(Segment(rank.rank, f"{report.label} ({rank.instance})", rank.first_step,
                                             rank.published))
        self.groups = []
        self.drain(drain_s)
        for probe in (self.page, self.exporter, self.tail):
            if probe is not None:
                probe.stop()

    def drain(self, timeout_s: float, settled_s: float = 10.0) -> None:
        """Until the tail holds every rank-step written, or the aggregator has caught up with the steps stream
        and what is missing has not changed for settled_s (a loss: nothing more will come)."""
        assert self.stop_step is not None
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            lost = self.tally(0, self.stop_step).lost
            if lost == 0:
                return
            if lost != last:
                last, since = lost, time.monotonic()
            elif time.monotonic() - since > settled_s and self.delivered_all():
                return
            time.sleep(0.5)

    def delivered_all(self) -> bool:
        """Whether the aggregators' group has been delivered the steps stream's newest entry (acknowledged or not:
        an entry stranded unacknowledged must not hold a drain up)."""
        found = groups(self.client, self.run)
        try:
            newest = self.client.xinfo_stream(core.steps_key(self.run))["last-generated-id"]
        except Exception:
            return False
        return bool(found) and all(g.get("last-delivered-id") == newest for g in found)

    def close(self) -> None:
        for group in self.groups:
            group.stop()
        for probe in (self.page, self.exporter, self.tail):
            with contextlib.suppress(Exception):
                if probe is not None:
                    probe.stop()
        stop_aggregator(self.aggregator)
        with contextlib.suppress(Exception):
            self.client.close()

    def progress(self) -> dict[str, str]:
        return progress(self.client, self.run)

    # ------------------------------------------------------------------ counting
    def tally(self, lo: int, hi: int, vanished: list[AggEntry] | None = None,
              ranks: tuple[int, ...] | None = None) -> Tally:
        """What was written and read of the step ids [lo, hi) (of `ranks` only, when given): entries in
        `vanished` (read, then gone from the stream) do not count as read."""
        keep = (1 << self.ranks) - 1 if ranks is None else sum(1 << r for r in ranks)
        assert self.tail is not None
        gone = {e.entry_id for e in vanished or []}
        read_by_step: dict[int, int] = {}
        twice = 0
        for entry in self.tail.snapshot():
            if entry.entry_id in gone or not lo <= entry.step < hi:
                continue
            have = read_by_step.get(entry.step, 0)
            twice += bin(have & entry.ranks & keep).count("1")
            read_by_step[entry.step] = have | (entry.ranks & keep)
        written_by_step: dict[int, int] = {}
        for seg in self.segments:
            if not keep >> seg.rank & 1:
                continue
            for step in range(max(lo, seg.first), min(hi, seg.first + seg.published)):
                written_by_step[step] = written_by_step.get(step, 0) | (1 << seg.rank)
        written = sum(bin(mask).count("1") for mask in written_by_step.values())
        read = sum(bin(mask).count("1") for mask in read_by_step.values())
        both = sum(bin(mask & read_by_step.get(step, 0)).count("1") for step, mask in written_by_step.items())
        sample = []
        for step in sorted(written_by_step):
            unread = written_by_step[step] & ~read_by_step.get(step, 0)
            sample += [(step, rank) for rank in range(self.ranks) if unread >> rank & 1]
            if len(sample) >= 20:
                break
        return Tally(lo, hi, written, read, written - both, read - both, twice, tuple(sample[:20]))
