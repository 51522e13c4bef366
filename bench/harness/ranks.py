"""The writers of bench.faults: simulated expert-parallel ranks that publish as real ranks do, each through a
collectors.publisher.Publisher (its queue, backoff and retry, health reports) over a RedisSink, fed DeepSeek-V3
shaped records drawn as the load generator draws them (bench.routing); one may record a trace file too.

Each group of ranks runs in an OS process of its own (RankGroup), so one rank can be SIGKILLed alone; all share
one Clock: step k of every rank is due at t0 + k / steps_per_s, so a restarted rank's step ids go on from it.
At the clock's stop step every rank flushes and its group reports what each rank published, dropped and failed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing as mp
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from bench import routing
from bench.harness.loadgen import FLUSH_INTERVAL_S
from moe_monitor import core

CLOSE_TIMEOUT_S = 60.0  # a publisher's close: its queue flushed (a Redis back from a stall drains a backlog)
START_MARGIN_STEPS = 1  # a restarted rank starts at the step after the one due when it is ready


class Clock:
    """The shared clock of one run: t0 (time.monotonic(), system-wide on Linux) and its wall-clock twin, the
    rate, and the stop step (no rank writes a step at or past it; inf until set)."""

    def __init__(self, ctx, steps_per_s: float):
        self.steps_per_s = float(steps_per_s)
        self.shared = ctx.Array("d", [0.0, 0.0, math.inf])

    def start(self, delay_s: float = 0.3) -> None:
        """Step 0 is due delay_s from now."""
        self.shared[0], self.shared[1] = time.monotonic() + delay_s, time.time() + delay_s
        # the stop step stays inf

    @property
    def started(self) -> bool:
        return self.shared[0] > 0

    def due(self, now: float | None = None) -> int:
        """The newest step whose time has come (-1 before step 0 is due)."""
        now = time.monotonic() if now is None else now
        return math.floor((now - self.shared[0]) * self.steps_per_s) if self.started else -1

    def time_of(self, step: int) -> float:
        """time.monotonic() at which `step` is due."""
        return self.shared[0] + step / self.steps_per_s

    def stop_at(self, step: int) -> None:
        self.shared[2] = float(step)

    @property
    def stop_step(self) -> float:
        return self.shared[2]


@dataclass(frozen=True)
class GroupConfig:
    """One process of ranks: where they write, the run's world and pace, their ranks, the first step (None: the
    step due once ready), a trace file per rank (trace_dir: <trace_dir>/rank<r>-<label>.jsonl; None: none),
    the publisher's Redis socket timeout and queue bound, the pool's size and seed (the load generator's)."""

    url: str
    run: str
    world: int
    ranks: tuple[int, ...]
    steps_per_s: float
    label: str
    first_step: int | None = 0
    tokens_per_rank: int = 64
    trace_dir: str | None = None
    redis_timeout_s: float = 1.0   # collectors' MonitorOptions.redis_timeout_s default
    queue_steps: int = 1024        # collectors' MonitorOptions.queue_steps default
    memory_budget_bytes: int = 256 << 20
    pool_steps: int = 4
    rank_spread: float = 0.25
    seed: int = 0

    def trace_path(self, rank: int) -> str | None:
        return None if self.trace_dir is None else f"{self.trace_dir}/rank{rank}-{self.label}.jsonl"


@dataclass
class RankReport:
    """One rank of a group at its end: its collector instance, first step id, the steps its Redis sink published
    (landed, in step order: first_step .. first_step + published - 1), dropped (queue full), failed writes and the
    last reason, the trace sink's published steps and failures (None without one)."""

    rank: int
    instance: str
    first_step: int
    published: int
    dropped: int
    failures: int
    last_failure: str
    trace_published: int | None = None
    trace_failures: int | None = None
    trace_last_failure: str = ""


@dataclass
class GroupReport:
    label: str
    ranks: list[RankReport] = field(default_factory=list)
    cpu_s: float = 0.0
    error: str = ""


def _group_main(config: GroupConfig, clock, results) -> None:
    """Process entry point: run the group, its report (or the exception's text) put on `results`."""
    try:
        results.put(("done", config.label, _run_group(config, clock, results)))
    except BaseException as exc:  # reported to the parent, never lost in a child's stderr
        results.put(("error", config.label, f"{type(exc).__name__}: {exc}"))


def _run_group(config: GroupConfig, shared, results) -> GroupReport:
    from moe_monitor.collectors.publisher import Publisher, StepJob
    from moe_monitor.collectors.sinks import RedisSink, Sink, TraceFileSink

    rate = config.steps_per_s
    base_LE = routing.popularity_LE(routing.LAYERS, routing.EXPERTS, seed=config.seed)
    pools = {r: routing.rank_pool(r, config.pool_steps, config.tokens_per_rank, base_LE, routing.TOP_K, 0,
                                  config.rank_spread, config.seed) for r in config.ranks}
    meta = routing.run_meta(config.run, config.world)
    maxlen = core.maxlen_for_budget(config.memory_budget_bytes, routing.LAYERS, routing.EXPERTS)
    instances = {r: f"{core.new_instance_id()}-r{r}" for r in config.ranks}
    publishers: dict[int, Any] = {}
    sinks_of: dict[int, list[Sink]] = {}
    for r in config.ranks:
        rank_meta = dataclasses.replace(meta, instance=instances[r])
        sinks: list[Sink] = [RedisSink(config.url, rank_meta, maxlen, config.redis_timeout_s,
                                       config.memory_budget_bytes)]
        path = config.trace_path(r)
        if path is not None:
            sinks.insert(0, TraceFileSink(path, rank_meta))
        sinks_of[r] = sinks

        def decode(jobs, rank=r, pool=pools[r], instance=instances[r]) -> list[core.StepRecord]:
            return [core.StepRecord(run=config.run, rank=rank, world_size=config.world, step=job.step,
                                    time_s=job.time_s, phase="decode", tokens=config.tokens_per_rank,
                                    counts_LE=pool.counts_SLE[job.step % len(pool.counts_SLE)], instance=instance)
                    for job in jobs]

        publishers[r] = Publisher(sinks, decode, lambda slot: None, r, config.queue_steps,
                                  flush_interval_s=FLUSH_INTERVAL_S)
    results.put(("loaded", config.label, None))
    while shared[0] <= 0:  # the parent starts the clock once every group has loaded
        time.sleep(0.01)
    t0, wall0 = shared[0], shared[1]
    first = config.first_step
    if first is None:
        first = max(0, math.floor((time.monotonic() - t0) * rate)) + START_MARGIN_STEPS
    results.put(("ready", config.label, first))
    next_step = dict.fromkeys(config.ranks, first)
    cpu0 = time.process_time()
    tick = math.ceil(max(0.0, time.monotonic() - t0) / FLUSH_INTERVAL_S)
    while True:
        pause = t0 + tick * FLUSH_INTERVAL_S - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        tick += 1
        stop = shared[2]
        upto = int(min(math.floor((time.monotonic() - t0) * rate) + 1, stop))  # steps below this are due
        for r in config.ranks:
            for k in range(next_step[r], upto):
                publishers[r].submit(StepJob(step=k, time_s=wall0 + k / rate, phase="decode",
                                             tokens=config.tokens_per_rank, slot=None,  # type: ignore[arg-type]
                                             facts=None))  # type: ignore[arg-type]
            next_step[r] = max(next_step[r], upto)
        if math.isfinite(stop) and all(step >= stop for step in next_step.values()):
            break
    report = GroupReport(config.label)
    for r in config.ranks:
        publishers[r].close(CLOSE_TIMEOUT_S)
        stats = publishers[r].sink_stats()
        redis_stats, trace_stats = stats["redis"], stats.get("trace")
        report.ranks.append(RankReport(
            rank=r, instance=instances[r], first_step=first, published=int(redis_stats["published_steps"]),
            dropped=int(redis_stats["dropped_steps"]), failures=int(redis_stats["failures"]),
            last_failure=str(redis_stats["last_failure"]),
            trace_published=None if trace_stats is None else int(trace_stats["published_steps"]),
            trace_failures=None if trace_stats is None else int(trace_stats["failures"]),
            trace_last_failure="" if trace_stats is None else str(trace_stats["last_failure"])))
    report.cpu_s = time.process_time() - cpu0
    return report


class RankGroup:
    """A GroupConfig's process: start() spawns it, wait_loaded() waits for its pools and publishers,
    wait_ready() returns its first step once the clock runs, kill() SIGKILLs it, report() waits for its report
    after the clock's stop step was set."""

    def __init__(self, ctx, config: GroupConfig, clock: Clock):
        self.config, self.clock = config, clock
        self.results = ctx.Queue()
        self.proc = ctx.Process(target=_group_main, args=(config, clock.shared, self.results), daemon=True,
                                name=f"faults-{config.label}")
        self.first_step: int | None = None
        self.killed = False

    def start(self) -> RankGroup:
        self.proc.start()
        return self

    @property
    def pid(self) -> int:
        return int(self.proc.pid or 0)

    def _next(self, timeout_s: float) -> tuple:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.results.get(timeout=0.25)
            except queue.Empty:
                if self.proc.exitcode is not None and self.results.empty():
                    raise RuntimeError(f"rank group {self.config.label} exited with code {self.proc.exitcode}") \
                        from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank group {self.config.label} did not answer in {timeout_s:.0f} s") \
                        from None

    def _expect(self, want: str, timeout_s: float):
        kind, _, payload = self._next(timeout_s)
        if kind == "error":
            raise RuntimeError(f"rank group {self.config.label} failed: {payload}")
        if kind != want:
            raise RuntimeError(f"rank group {self.config.label}: {kind!r} where {want!r} was due")
        return payload

    def wait_loaded(self, timeout_s: float = 300.0) -> None:
        """Until its pools are drawn and its publishers open (it then waits for the clock)."""
        self._expect("loaded", timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> int:
        """Its first step, once the clock runs and it writes."""
        self.first_step = int(self._expect("ready", timeout_s))
        return self.first_step

    def kill(self) -> None:
        """SIGKILL (what the OOM killer or a node loss does): nothing is flushed."""
        self.killed = True
        self.proc.kill()
        self.proc.join(10)

    def report(self, timeout_s: float = 180.0) -> GroupReport:
        kind, _, payload = self._next(timeout_s)
        self.proc.join(10)
        if kind == "error":
            return GroupReport(self.config.label, error=str(payload))
        return payload

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.join(5)


def context():
    """The multiprocessing context of the groups (spawn: no fork of a process holding threads and sockets)."""
    return mp.get_context("spawn")
