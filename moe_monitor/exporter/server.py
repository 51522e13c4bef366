"""The exporter's state: one WatchedRun per run, polled on a timer by one thread; every scrape gets the
metric families of the last poll (so the cost of a scrape does not grow with the number of scrapers).

Bounded: every run's window, rings and first-poll records reserve from one memory budget for the exporter
(core.membudget; --memory-budget, 1 GiB by default), so a run whose window does not fit gets fewer steps
(moe_exporter_window_steps says how many, the log why); a run that left moe:runs is forgotten at the next poll
(its window's bytes go back to the budget); per-GPU series are capped per run and phase (--max-gpus) and all
series together (--max-series), and moe_exporter_truncated / moe_exporter_series_dropped_total say so."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.core.costmodel import TimeModel
from moe_monitor.core.hardware import GpuProfile
from moe_monitor.core.steptails import StepTails
from moe_monitor.dashboard.analytics.timecost import time_model_for
from moe_monitor.dashboard.analytics.timing import TimingSummary, summarise
from moe_monitor.dashboard.live import sizing
from moe_monitor.dashboard.live.layout import ResolvedLayout, resolve_layout
from moe_monitor.dashboard.live.layout_changes import rebalances_of
from moe_monitor.dashboard.live.snapshot import Snapshot, analyse
from moe_monitor.dashboard.live.steptails import live_tails
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource, read_runs
from moe_monitor.dashboard.whatif.advice import advice_on_window
from moe_monitor.exporter.caps import DEFAULT_MAX_GPUS, DEFAULT_MAX_SERIES, MIN_MAX_SERIES, cap_series
from moe_monitor.exporter.metrics import PHASES, gpu_series_dropped, run_families
from moe_monitor.planner.advisor import DEFAULT_SUB_WINDOWS, DEFAULT_WINDOW, Advice

CATCH_UP_S = 1.0  # seconds a poll spends reading one run's backlog before it publishes
log = logging.getLogger("moe-exporter")
ADVISE_EVERY_S = 30.0  # seconds between rebalance-advisor decisions per run (each costs a repair)
MAX_TOP_EXPERTS = 64  # per run and phase: the cap that keeps --top-experts from becoming L x E series
ADVICE_BYTES_PER_CELL = 4 * 12  # the advisor's working memory per int32 count it is given (measured: 6-10x)
PLAN_BYTES_PER_CELL = 48  # per cell of the planner's tables (planner.loads.check_size: 2**25 cells ~ 1.5 GiB)


class RunExporter:
    """A prometheus_client collector over the runs of one Redis: `runs` (names) or every run of moe:runs
    (runs=None). poll() reads and analyses; collect() returns what the last poll computed."""

    def __init__(self, client: core.Client, url: str, runs: list[str] | None, window_steps: int = 600,
                 per_layer: bool = False, top_experts: int = 0, advise_every_s: float = ADVISE_EVERY_S,
                 max_gpus: int = DEFAULT_MAX_GPUS, max_series: int = DEFAULT_MAX_SERIES,
                 memory_budget: int | membudget.MemoryBudget = membudget.EXPORTER_DEFAULT_BYTES,
                 gpu_profile: GpuProfile | None = None):
        """memory_budget: bytes (or a MemoryBudget) every run's window and rings share; max_gpus: GPUs with
        series of their own per run and phase; max_series: series served at most, over every run; gpu_profile:
        the GPU every run's time gauges are predicted for (None: each run's own, as the Overview finds it)."""
        if top_experts < 0 or top_experts > MAX_TOP_EXPERTS:
            raise ValueError(f"--top-experts must be 0..{MAX_TOP_EXPERTS}, got {top_experts}")
        if not advise_every_s > 0:
            raise ValueError(f"--advise-every-s must be a positive number of seconds, got {advise_every_s}")
        if window_steps < 1:
            raise ValueError(f"--window-steps must be at least 1, got {window_steps}")
        if max_gpus < 1:
            raise ValueError(f"--max-gpus must be at least 1, got {max_gpus}")
        if max_series < MIN_MAX_SERIES:
            raise ValueError(f"--max-series must be at least {MIN_MAX_SERIES}, got {max_series}")
        self.advise_every_s = float(advise_every_s)
        self._advice: dict[str, tuple[float, dict[str, Advice | None]]] = {}  # run -> (monotonic time, decisions)
        self.client, self.url, self.runs, self.window_steps = client, url, runs, window_steps
        self.per_layer, self.top_experts = per_layer, top_experts
        self.gpu_profile = gpu_profile
        self.max_gpus, self.max_series = int(max_gpus), int(max_series)
        self.budget = memory_budget if isinstance(memory_budget, membudget.MemoryBudget) else membudget.MemoryBudget(
            memory_budget, label="the exporter's memory budget", shared_by="every exported run",
            setting="set --memory-budget")
        self._watched: dict[str, WatchedRun] = {}
        self.notes: dict[str, str] = {}  # run -> why its window holds fewer steps than --window-steps
        self._dropped_total: dict[str, int] = {}  # run -> series left out, summed over polls
        self._families: list[Metric] = []
        self._lock = threading.Lock()
        self.poll_ms = 0.0
        self.error = ""
        self.runs_beyond = 0  # runs of moe:runs beyond the newest MAX_RUNS at the last poll (not exported)

    def poll(self) -> None:
        """Read every run once and rebuild the metric families (never raises: a Redis error is exported)."""
        started = time.perf_counter()
        with membudget.using(self.budget):
            per_run, cut = self._poll_runs()
        own = self._own_families(per_run)
        capped, dropped = cap_series(per_run, max(0, self.max_series - _series(own) - 2 * len(per_run) - 1))
        truncated = GaugeMetricFamily("moe_exporter_truncated", "1 when some of the run's series were left out at "
                                      "the last poll (GPUs beyond --max-gpus, or --max-series reached)",
                                      labels=["run"])
        left_out = CounterMetricFamily("moe_exporter_series_dropped", "Series of the run left out by --max-gpus "
                                       "and --max-series, summed over polls", labels=["run"])
        for name, _ in per_run:
            now_dropped = dropped.get(name, 0) + cut.get(name, 0)
            self._dropped_total[name] = self._dropped_total.get(name, 0) + now_dropped
            truncated.add_metric([name], 1.0 if now_dropped else 0.0)
            left_out.add_metric([name], float(self._dropped_total[name]))
        merged = _merge(capped)
        self.poll_ms = (time.perf_counter() - started) * 1e3
        took = GaugeMetricFamily("moe_exporter_poll_seconds", "Seconds the last poll of every run took")
        took.add_metric([], self.poll_ms / 1e3)
        with self._lock:
            self._families = [*merged, *own, truncated, left_out, took]

    def _poll_runs(self) -> tuple[list[tuple[str, list[Metric]]], dict[str, int]]:
        """(run, its families) for every run read, newest first, and the per-GPU series each left out."""
        try:
            if self.runs is not None:
                names = self.runs
            else:
                listing = read_runs(self.client)
                names = [name for name, _ in listing.runs]
                if listing.beyond and listing.beyond != self.runs_beyond:
                    log.warning("moe:runs lists %d runs beyond the newest %d: they are not exported",
                                listing.beyond, len(names))
                self.runs_beyond = listing.beyond
            self.error = ""
        except core.REDIS_ERRORS as exc:
            names, self.error = list(self._watched), f"{type(exc).__name__}: {exc}"
        if self.runs is None and not self.error:
            self.forget(set(self._watched) - set(names))
        per_run: list[tuple[str, list[Metric]]] = []
        cut: dict[str, int] = {}
        for name in names:
            try:
                families, cut[name] = self._run_families(name)
                per_run.append((name, families))
            except Exception as exc:  # one bad run must not hide the others
                log.warning("run %s: %s", name, exc)
        return per_run, cut

    def _own_families(self, per_run: list[tuple[str, list[Metric]]]) -> list[Metric]:
        """The exporter's health and memory gauges (never capped)."""
        up = GaugeMetricFamily("moe_exporter_redis_up", "1 when the exporter could read the run list from Redis")
        up.add_metric([], 0.0 if self.error else 1.0)
        beyond = GaugeMetricFamily("moe_exporter_runs_left_out", "Runs of moe:runs beyond the newest ones the "
                                   "exporter watches (at most 100): not exported")
        beyond.add_metric([], float(self.runs_beyond))
        budget = GaugeMetricFamily("moe_exporter_memory_budget_bytes", "The exporter's memory budget (--memory-budget)")
        budget.add_metric([], float(self.budget.total_bytes))
        reserved = GaugeMetricFamily("moe_exporter_memory_reserved_bytes", "Bytes of the budget the runs' windows "
                                     "and rings hold")
        reserved.add_metric([], float(self.budget.reserved_bytes))
        steps = GaugeMetricFamily("moe_exporter_window_steps", "Steps the run's window holds (fewer than "
                                  "--window-steps when the memory budget could not hold them)", labels=["run"])
        for name, _ in per_run:
            window = self._watched[name].window if name in self._watched else None
            if window is not None:
                steps.add_metric([name], float(window.capacity))
        return [up, beyond, budget, reserved, steps]

    def forget(self, names: set[str]) -> None:
        """Drop the runs' WatchedRuns (their windows' and rings' bytes go back to the budget), advice and counts."""
        for name in names:
            watched = self._watched.pop(name, None)
            if watched is not None:
                _close(watched)
            self._advice.pop(name, None)
            self._dropped_total.pop(name, None)
            self.notes.pop(name, None)

    @property
    def watched_runs(self) -> list[str]:
        """The runs the exporter holds a window for."""
        return list(self._watched)

    def _open(self, name: str) -> tuple[WatchedRun, tuple[int, int, int, int] | None]:
        """A WatchedRun for the run, its window (and the source's first read) sized to the budget from the run's
        metadata when there is one: (watched, (steps, L, E, ranks) for sizing.first_poll, None without
        metadata)."""
        meta = _read_meta(self.client, name)
        steps, first = self.window_steps, None
        if meta is not None:
            layers, experts, ranks = len(meta.layer_names), meta.num_experts, max(1, meta.world_size)
            steps, note = sizing.budgeted_steps(self.window_steps, layers, experts, ranks, self.budget)
            if note:
                self.notes[name] = note
                log.warning("run %s: %s", name, note)
            first = (steps, layers, experts, ranks)
        watched = WatchedRun(RedisSource(self.client, self.url, name, steps), steps)
        if meta is not None:
            watched.max_entries_per_tick = sizing.entries_per_tick(len(meta.layer_names), meta.num_experts)
        return watched, first

    def _run_families(self, name: str) -> tuple[list[Metric], int]:
        """The run's families and the per-GPU series they leave out."""
        watched = self._watched.get(name)
        first = None
        if watched is None:
            watched, first = self._open(name)
            self._watched[name] = watched
        # a new run's first polls hand its backlog over at once: its decoded records are held from the budget
        with sizing.first_poll(*first, budget=self.budget) if first else contextlib.nullcontext():
            # catch up with what arrived since the last poll, CATCH_UP_S at most: after an outage the metrics
            # move again at once and the rest of the backlog is read by the next polls
            deadline = time.perf_counter() + CATCH_UP_S
            while watched.tick().more and time.perf_counter() < deadline:
                pass
        snapshots: dict[str, Snapshot | None] = dict.fromkeys(PHASES)
        tails: dict[str, StepTails | None] = {}
        window = watched.window
        if window is not None:
            if window.budget_note and self.notes.get(name) != window.budget_note:
                self.notes[name] = window.budget_note
                log.warning("run %s: %s", name, window.budget_note)
            watched.max_entries_per_tick = sizing.entries_per_tick(window.num_layers, window.num_experts)
            layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts,
                                    watched.world_size, changes=watched.layouts.changes, at_step=window.newest_step)
            model, note = self._time_model(watched, layout)
            snapshots = {phase: analyse(window, layout, phase, time_model=model, time_note=note) for phase in PHASES}
            self._advise(name, watched, layout, snapshots, model)
            tails = _tails(name, watched, layout, snapshots)
        held = self._advice.get(name)
        rebalance = rebalances_of(watched.source.meta(), watched.layouts.changes, time.time())
        families = run_families(name, snapshots, watched.steps_read, watched.dropped_steps, watched.bad_records,
                                watched.source.health(), per_layer=self.per_layer, top_experts=self.top_experts,
                                advice=None if held is None else held[1], timings=_timings(watched, snapshots),
                                max_gpus=self.max_gpus, tails=tails, rebalance=rebalance)
        return families, gpu_series_dropped(snapshots, self.max_gpus)

    def _time_model(self, watched: WatchedRun, layout: ResolvedLayout) -> tuple[TimeModel | None, str]:
        """(the run's cost model, "") as the Overview finds it (dashboard.analytics.timecost.time_model_for), on
        --gpu-profile when given; (None, what is missing) otherwise."""
        return time_model_for(watched.source.meta(), layout.gpus, layout.nodes, watched.gpus.names(),
                              self.gpu_profile)

    def _advise(self, name: str, watched: WatchedRun, layout: ResolvedLayout,
                snapshots: dict[str, Snapshot | None], model: TimeModel | None = None) -> None:
        """The rebalance advisor's decision per phase on the window (a repair each: at most every
        advise_every_s seconds per run; the gauges keep the last decision in between), priced in time under the
        run's model when it has one."""
        held = self._advice.get(name)
        now = time.monotonic()
        if held is not None and now - held[0] < self.advise_every_s or watched.window is None:
            return
        decisions: dict[str, Advice | None] = {}
        meta = watched.source.meta()
        window = watched.window
        step_bytes = ADVICE_BYTES_PER_CELL * window.num_layers * window.num_experts
        slots = int(layout.layout_LP.shape[1])
        tables = window.num_layers * (DEFAULT_SUB_WINDOWS * (slots // layout.gpus) * slots + layout.gpus *
                                      window.num_experts)
        plan_bytes = PLAN_BYTES_PER_CELL * tables
        for phase, snap in snapshots.items():
            if snap is None:
                continue
            # the advisor's working memory is held from the budget while it runs: fewer steps when less is left
            room = self.budget.available_bytes - plan_bytes
            steps = min(snap.view.num_steps, DEFAULT_WINDOW, max(0, room) // step_bytes)
            working = self.budget.try_reserve(plan_bytes + steps * step_bytes) if steps else None
            if working is None:
                log.warning("run %s phase %s: no rebalance advice: %s has no room left for it", name, phase,
                            self.budget.describe())
                decisions[phase] = None
                continue
            try:
                decisions[phase] = advice_on_window(window.counts_CLE[snap.view.slots_T[-steps:]], layout.layout_LP,
                                                    layout.gpus, meta, model)
            except ValueError as exc:  # a layout the advisor cannot read: no gauge for that phase
                log.warning("run %s phase %s: no rebalance advice: %s", name, phase, exc)
                decisions[phase] = None
            finally:
                working.release()
        self._advice[name] = (now, decisions)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._families


def _series(families: list[Metric]) -> int:
    return sum(len(family.samples) for family in families)


def _close(watched: WatchedRun) -> None:
    """Give a forgotten run's window and rings back to the budget now (not at the next garbage collection)."""
    for holder in (watched.window, watched.samples, watched.timings):
        close = getattr(holder, "close", None)
        if close is not None:
            close()


def _read_meta(client: core.Client, run: str) -> core.RunMeta | None:
    """The run's metadata, None when absent or unusable (the source reports that as a bad record itself)."""
    try:
        raw = client.getrange(core.meta_key(run), 0, core.MAX_META_BYTES)
        return core.decode_meta(raw) if raw else None
    except core.REDIS_ERRORS:
        return None
    except ValueError:
        return None


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


def _tails(name: str, watched: WatchedRun, layout: ResolvedLayout,
           snapshots: dict[str, Snapshot | None]) -> dict[str, StepTails | None]:
    """Per phase, the per-step figures of that phase's window under the run's dispatch policy (dashboard.live.
    steptails: each step solved once, shared by the phases; lp catches up on a backlog LP_ROWS_PER_CALL steps a
    poll, the newest first); None for a phase without steps or when the memory budget cannot hold them."""
    meta = watched.source.meta()
    policy = meta.dispatch if meta is not None else "even"
    out: dict[str, StepTails | None] = {}
    for phase, snap in snapshots.items():
        out[phase] = None
        if snap is None or watched.window is None:
            continue
        try:
            out[phase] = live_tails(watched.window, snap.view.slots_T, layout, policy).tails
        except ValueError as exc:
            log.warning("run %s phase %s: no per-step figures: %s", name, phase, exc)
    return out


def _timings(watched: WatchedRun, snapshots: dict[str, Snapshot | None]) -> dict[str, TimingSummary | None]:
    """Per phase, the layer timings of the steps of that phase's window (analytics.timing.summarise, as the Time
    page computes them); None for a phase without timed steps (no series then)."""
    out: dict[str, TimingSummary | None] = {}
    for phase, snap in snapshots.items():
        view = None if snap is None or not watched.timings.records else watched.timings.aligned(snap.view.step_T)
        out[phase] = None if view is None or not view.any else summarise(
            view.dispatch_TRL, view.compute_TRL, view.combine_TRL, view.layer_TRL)
    return out
