"""The exporter's state: one WatchedRun per run, polled on a timer by one thread; every scrape gets the
metric families of the last poll (so the cost of a scrape does not grow with the number of scrapers)."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from moe_monitor import core
from moe_monitor.dashboard.analytics.timing import TimingSummary, summarise
from moe_monitor.dashboard.live.layout import ResolvedLayout, resolve_layout
from moe_monitor.dashboard.live.snapshot import Snapshot, analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource, read_runs
from moe_monitor.dashboard.whatif.advice import advice_on_window
from moe_monitor.exporter.metrics import PHASES, run_families
from moe_monitor.planner.advisor import Advice

log = logging.getLogger("moe-exporter")
ADVISE_EVERY_S = 30.0  # seconds between rebalance-advisor decisions per run (each costs a repair)
MAX_TOP_EXPERTS = 64  # per run and phase: the cap that keeps --top-experts from becoming L x E series


class RunExporter:
    """A prometheus_client collector over the runs of one Redis: `runs` (names) or every run of moe:runs
    (runs=None). poll() reads and analyses; collect() returns what the last poll computed."""

    def __init__(self, client: core.Client, url: str, runs: list[str] | None, window_steps: int = 600,
                 per_layer: bool = False, top_experts: int = 0, advise_every_s: float = ADVISE_EVERY_S):
        if top_experts < 0 or top_experts > MAX_TOP_EXPERTS:
            raise ValueError(f"--top-experts must be 0..{MAX_TOP_EXPERTS}, got {top_experts}")
        if not advise_every_s > 0:
            raise ValueError(f"--advise-every-s must be a positive number of seconds, got {advise_every_s}")
        self.advise_every_s = float(advise_every_s)
        self._advice: dict[str, tuple[float, dict[str, Advice | None]]] = {}  # run -> (monotonic time, decisions)
        self.client, self.url, self.runs, self.window_steps = client, url, runs, window_steps
        self.per_layer, self.top_experts = per_layer, top_experts
        self._watched: dict[str, WatchedRun] = {}
        self._families: list[Metric] = []
        self._lock = threading.Lock()
        self.poll_ms = 0.0
        self.error = ""

    def poll(self) -> None:
        """Read every run once and rebuild the metric families (never raises: a Redis error is exported)."""
        started = time.perf_counter()
        families: list[Metric] = []
        try:
            names = self.runs if self.runs is not None else [name for name, _ in read_runs(self.client).runs]
            self.error = ""
        except core.REDIS_ERRORS as exc:
            names, self.error = list(self._watched), f"{type(exc).__name__}: {exc}"
        for name in names:
            try:
                families += self._run_families(name)
            except Exception as exc:  # one bad run must not hide the others
                log.warning("run %s: %s", name, exc)
        merged = _merge(families)
        up = GaugeMetricFamily("moe_exporter_redis_up", "1 when the exporter could read the run list from Redis")
        up.add_metric([], 0.0 if self.error else 1.0)
        self.poll_ms = (time.perf_counter() - started) * 1e3
        took = GaugeMetricFamily("moe_exporter_poll_seconds", "Seconds the last poll of every run took")
        took.add_metric([], self.poll_ms / 1e3)
        with self._lock:
            self._families = [*merged, up, took]

    def _run_families(self, name: str) -> list[Metric]:
        watched = self._watched.get(name)
        if watched is None:
            watched = self._watched[name] = WatchedRun(RedisSource(self.client, self.url, name, self.window_steps),
                                                       self.window_steps)
        while watched.tick().more:  # catch up with everything that arrived since the last poll
            pass
        snapshots: dict[str, Snapshot | None] = dict.fromkeys(PHASES)
        window = watched.window
        if window is not None:
            layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts,
                                    watched.world_size, changes=watched.layouts.changes, at_step=window.newest_step)
            snapshots = {phase: analyse(window, layout, phase) for phase in PHASES}
            self._advise(name, watched, layout, snapshots)
        held = self._advice.get(name)
        return run_families(name, snapshots, watched.steps_read, watched.dropped_steps, watched.bad_records,
                            watched.source.health(), per_layer=self.per_layer, top_experts=self.top_experts,
                            advice=None if held is None else held[1], timings=_timings(watched, snapshots))

    def _advise(self, name: str, watched: WatchedRun, layout: ResolvedLayout,
                snapshots: dict[str, Snapshot | None]) -> None:
        """The rebalance advisor's decision per phase on the window (a repair each: at most every
        advise_every_s seconds per run; the gauges keep the last decision in between)."""
        held = self._advice.get(name)
        now = time.monotonic()
        if held is not None and now - held[0] < self.advise_every_s or watched.window is None:
            return
        decisions: dict[str, Advice | None] = {}
        meta = watched.source.meta()
        for phase, snap in snapshots.items():
            if snap is None:
                continue
            try:
                decisions[phase] = advice_on_window(watched.window.counts_CLE[snap.view.slots_T], layout.p2l_LP,
                                                    layout.gpus, meta)
            except ValueError as exc:  # a layout the advisor cannot read: no gauge for that phase
                log.warning("run %s phase %s: no rebalance advice: %s", name, phase, exc)
                decisions[phase] = None
        self._advice[name] = (now, decisions)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._families


def _merge(families: list[Metric]) -> list[Metric]:
    """Families of several runs with the same name as one family each (Prometheus wants one per name)."""
    by_name: dict[str, Metric] = {}
    for family in families:
        held = by_name.get(family.name)
        if held is None:
            by_name[family.name] = family
        else:
            held.samples.extend(family.samples)
    return list(by_name.values())


def poll_forever(exporter: RunExporter, interval_s: float, stop: threading.Event) -> None:
    """Poll every interval_s on a monotonic clock until stop is set."""
    next_at = time.monotonic()
    while not stop.is_set():
        exporter.poll()
        next_at += interval_s
        stop.wait(max(0.0, next_at - time.monotonic()))


def connect(url: str) -> core.AutoClient:
    """The exporter's Redis client: explicit timeouts (core.connect)."""
    return core.connect(url, timeout_s=2.0)


def _timings(watched: WatchedRun, snapshots: dict[str, Snapshot | None]) -> dict[str, TimingSummary | None]:
    """Per phase, the layer timings of the steps of that phase's window (analytics.timing.summarise, as the Time
    page computes them); None for a phase without timed steps (no series then)."""
    out: dict[str, TimingSummary | None] = {}
    for phase, snap in snapshots.items():
        view = None if snap is None or not watched.timings.records else watched.timings.aligned(snap.view.step_T)
        out[phase] = None if view is None or not view.any else summarise(
            view.dispatch_TRL, view.compute_TRL, view.combine_TRL, view.layer_TRL)
    return out
