"""Load generator: simulated expert-parallel ranks writing DeepSeek-V3-shaped step records (bench/routing.py: 58
MoE layers x 256 experts, top-8, each rank its own mix) through the real writer, collectors.sinks.RedisSink.write,
paced like real ranks: step k of every rank is due at t0 + k / steps_per_s, handed over every 0.1 s (at most 256
steps a write) from `processes` spawned processes. A failed write is counted, never retried: LoadReport says what
landed, how late, each write's wall time and the CPU. Used by bench.scale, bench.wire and tests/bench.

    python -m bench.harness.loadgen [--redis URL] [--run NAME] [--ranks 32] [--steps-per-s 20] [--seconds 10]
                                    [--processes 2] [--tokens 64]

Without --redis it starts a private redis-server (demo.localredis) and prints its memory and CPU too.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import multiprocessing as mp
import os
import queue
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from bench.routing import (
    EXPERTS,
    LAYERS,
    TOP_K,
    popularity_LE,
    rank_pool,
    run_meta,
)
from moe_monitor import core
from moe_monitor.core.health import HealthReport

FLUSH_INTERVAL_S = 0.1                        # the publisher's flush interval (collectors/publisher.py)
BATCH = 256                                   # at most this many steps per write (the publisher's batch)


@dataclass(frozen=True)
class LoadConfig:
    """What every process of one run needs: where to write, the run's shape and its pace."""

    url: str
    run: str
    ranks: int
    steps_per_s: float
    seconds: float
    tokens_per_rank: int = 64
    phase: str = "decode"
    num_layers: int = LAYERS
    num_experts: int = EXPERTS
    top_k: int = TOP_K
    sample_tokens: int = 0        # sampled routing rows per layer, on one step in SAMPLE_EVERY (0: none)
    pool_steps: int = 4           # pre-drawn steps per rank
    first_step: int = 0
    memory_budget_bytes: int = 256 << 20
    redis_timeout_s: float = 1.0
    rank_spread: float = 0.25
    seed: int = 0
    max_batch: int = BATCH        # steps per write at most (the publisher's 256; less keeps a backlog in step order)
    instance_prefix: str = ""     # rank r's collector instance is f"{prefix}-r{r}" (a run continued over
                                  # several run_load calls keeps its instances); "": a new instance id per rank
    stop_after_seconds: bool = False  # True: stop writing at start + seconds, steps not written by then left out
                                      # (for a saturating rate); False: write every scheduled step, late or not

    @property
    def steps(self) -> int:
        """Steps per rank in the run."""
        return max(0, round(self.steps_per_s * self.seconds))

    @property
    def maxlen(self) -> int:
        """The steps stream's MAXLEN, as a collector sets it (collectors/monitor.py)."""
        sample_bytes = self.num_layers * self.sample_tokens * self.top_k * 2
        return core.maxlen_for_budget(self.memory_budget_bytes, self.num_layers, self.num_experts, sample_bytes)


SAMPLE_EVERY = 4  # a step in four carries sampled rows (the collectors' default sample_every)


@dataclass
class ProcessReport:
    """One process's run. Times in seconds; lateness_s: float32 [records written], each record's landing time
    (its write returned) minus its scheduled time; write_s: float32 [writes], the wall time of each
    RedisSink.write call."""

    index: int
    ranks: list[int]
    expected: int = 0
    written: int = 0
    failed: int = 0
    unwritten: int = 0            # scheduled but never offered (stop_after_seconds cut the run short)
    writes: int = 0
    duration_s: float = 0.0       # from the common start to this process's last write's return
    behind_s: float = 0.0         # duration_s minus the scheduled time of the last step
    cpu_s: float = 0.0            # this process's CPU time (user + system) during the run
    pool_s: float = 0.0           # wall time spent drawing the pool before the start
    last_error: str = ""
    lateness_s: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    write_s: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def rate(self) -> float:
        """Records written per second of the run."""
        return self.written / self.duration_s if self.duration_s > 0 else 0.0


def _quantiles(values: np.ndarray) -> tuple[float, float, float]:
    """(median, 99th percentile, max) of values, NaN when empty."""
    if values.size == 0:
        return math.nan, math.nan, math.nan
    p50, p99 = np.percentile(values, [50, 99])
    return float(p50), float(p99), float(values.max())


@dataclass
class LoadReport:
    """A whole run: per-process reports and their sums. rate: records written per second of the run (the
    slowest process's duration); lateness and write-time quantiles (median, p99, max) in seconds over every
    record / write of every process; cpu_s: CPU seconds of all processes together during the run."""

    config: LoadConfig
    processes: list[ProcessReport]

    @property
    def expected(self) -> int:
        return self.config.ranks * self.config.steps

    @property
    def written(self) -> int:
        return sum(p.written for p in self.processes)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.processes)

    @property
    def unwritten(self) -> int:
        return sum(p.unwritten for p in self.processes)

    @property
    def writes(self) -> int:
        return sum(p.writes for p in self.processes)

    @property
    def duration_s(self) -> float:
        return max((p.duration_s for p in self.processes), default=0.0)

    @property
    def rate(self) -> float:
        return self.written / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def behind_s(self) -> float:
        return max((p.behind_s for p in self.processes), default=0.0)

    @property
    def cpu_s(self) -> float:
        return sum(p.cpu_s for p in self.processes)

    @property
    def lateness_s(self) -> tuple[float, float, float]:
        return _quantiles(np.concatenate([p.lateness_s for p in self.processes] or [np.zeros(0, np.float32)]))

    @property
    def write_s(self) -> tuple[float, float, float]:
        return _quantiles(np.concatenate([p.write_s for p in self.processes] or [np.zeros(0, np.float32)]))

    @property
    def ok(self) -> bool:
        """Every scheduled record landed."""
        return self.written == self.expected and self.failed == 0

    def errors(self) -> list[str]:
        return [f"process {p.index}: {p.last_error}" for p in self.processes if p.last_error]

    def summary(self) -> str:
        c = self.config
        late, write = self.lateness_s, self.write_s
        lines = [
            f"{c.ranks} ranks x {c.steps_per_s:g} steps/s x {c.seconds:g} s in {len(self.processes)} processes "
            f"({c.phase}, {c.tokens_per_rank} tokens/rank, {c.num_layers}x{c.num_experts} top-{c.top_k})",
            f"  records: {self.written} written of {self.expected} scheduled, {self.failed} failed"
            + (f", {self.unwritten} not offered (stopped at {c.seconds:g} s)" if self.unwritten else "") + "; "
            f"{self.rate:,.0f} records/s (asked {c.ranks * c.steps_per_s:,.0f}); last write "
            f"{self.behind_s * 1e3:.0f} ms after the last scheduled step",
            f"  lateness (landed - scheduled): median {late[0] * 1e3:.1f} ms, p99 {late[1] * 1e3:.1f} ms, "
            f"max {late[2] * 1e3:.1f} ms",
            f"  write (one RedisSink.write): median {write[0] * 1e3:.2f} ms, p99 {write[1] * 1e3:.2f} ms, "
            f"max {write[2] * 1e3:.2f} ms over {self.writes} writes "
            f"({self.written / max(self.writes, 1):.1f} records each)",
            f"  client CPU: {self.cpu_s:.1f} s = {self.cpu_s / max(self.duration_s, 1e-9):.2f} cores "
            f"({self.cpu_s / max(self.written, 1) * 1e6:.0f} us per record)",
        ]
        for p in self.processes:
            lines.append(f"    process {p.index}: {len(p.ranks)} ranks, {p.written} written, {p.failed} failed, "
                         f"{p.rate:,.0f} records/s, last write {p.behind_s * 1e3:.0f} ms after its last step's "
                         f"time, CPU {p.cpu_s:.1f} s, pool drawn in {p.pool_s:.1f} s")
        lines += [f"  {line}" for line in self.errors()]
        return "\n".join(lines)


def split_ranks(ranks: int, processes: int) -> list[list[int]]:
    """Ranks 0..ranks-1 dealt round-robin over min(processes, ranks) processes."""
    processes = max(1, min(processes, ranks))
    return [list(range(i, ranks, processes)) for i in range(processes)]


def _health(rank: int, published: int, failures: int, last_failure: str) -> HealthReport:
    """The publisher's health report (collectors/publisher.py) of one simulated rank."""
    return HealthReport(rank=rank, published_steps=published, sink_failures=failures, last_failure=last_failure,
                        extra={"published_layouts": 0, "dropped_layouts": 0})


def _drive(config: LoadConfig, index: int, ranks: list[int], processes: int, ready, go, start) -> ProcessReport:
    """One process: draw the pools, open one RedisSink per rank, report ready, wait for the common start
    (start[0]: time.monotonic(), start[1]: time.time(); CLOCK_MONOTONIC is system-wide), then write every
    rank's due steps each tick."""
    from moe_monitor.collectors.sinks import (  # the real writer (collectors/__init__ loads no torch)
        PartialWrite,
        RedisSink,
    )

    report = ProcessReport(index=index, ranks=list(ranks))
    began = time.monotonic()
    base_LE = popularity_LE(config.num_layers, config.num_experts, seed=config.seed)
    pools = {r: rank_pool(r, config.pool_steps, config.tokens_per_rank, base_LE, config.top_k,
                          config.sample_tokens, config.rank_spread, config.seed) for r in ranks}
    report.pool_s = time.monotonic() - began
    meta = run_meta(config.run, config.ranks, config.num_layers, config.num_experts, config.top_k,
                    config.sample_tokens)
    instances = {r: f"{config.instance_prefix or core.new_instance_id()}-r{r}" for r in ranks}
    sinks = {r: RedisSink(config.url, dataclasses.replace(meta, instance=instances[r]), config.maxlen,
                          config.redis_timeout_s, config.memory_budget_bytes) for r in ranks}
    published = dict.fromkeys(ranks, 0)
    failures = dict.fromkeys(ranks, 0)
    next_step = dict.fromkeys(ranks, 0)
    total, rate = config.steps, config.steps_per_s
    report.expected = total * len(ranks)
    # as a publisher does while its engine loads (health once a second while idle): the metadata and health land,
    # and each sink's client has decided single or cluster, before the first step (a failure: the first step's
    # write sends the metadata again)
    for r in ranks:
        with contextlib.suppress(Exception):
            sinks[r].write([], [], _health(r, 0, 0, ""))
    ready.put(("ready", index))
    if not go.wait(600):
        raise RuntimeError("no start signal within 600 s")
    t0, wall0 = start[0], start[1]
    phase_s = FLUSH_INTERVAL_S * index / processes
    lateness: list[np.ndarray] = []
    write_s: list[float] = []
    cpu0 = time.process_time()
    tick = 0
    while True:
        wake = t0 + phase_s + tick * FLUSH_INTERVAL_S
        pause = wake - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        tick += 1
        now = time.monotonic()
        due = min(total, math.floor((now - t0) * rate) + 1) if now >= t0 else 0
        for r in ranks:
            first = next_step[r]
            last = min(due, first + config.max_batch)
            if last <= first:
                continue
            pool = pools[r]
            records = []
            for k in range(first, last):
                sample = None
                if pool.sample_SLNK is not None and k % SAMPLE_EVERY == 0:
                    sample = pool.sample_SLNK[k % len(pool.sample_SLNK)]
                records.append(core.StepRecord(
                    run=config.run, rank=r, world_size=config.ranks, step=config.first_step + k,
                    time_s=wall0 + k / rate, phase=config.phase, tokens=config.tokens_per_rank,
                    counts_LE=pool.counts_SLE[k % len(pool.counts_SLE)], sample_ids_LNK=sample,
                    instance=instances[r]))
            landed = len(records)
            called = time.monotonic()
            try:
                sinks[r].write(records, [], _health(r, published[r] + landed, failures[r], report.last_error))
            except PartialWrite as exc:
                landed = len(exc.landed)
                failures[r] += 1
                report.last_error = f"rank {r}: {exc}"
            except Exception as exc:  # counted, never raised: the load goes on
                landed = 0
                failures[r] += 1
                report.last_error = f"rank {r}: {type(exc).__name__}: {exc}"
            returned = time.monotonic()
            write_s.append(returned - called)
            report.writes += 1
            report.written += landed
            report.failed += len(records) - landed
            published[r] += landed
            next_step[r] = last
            sched = t0 + np.arange(first, last) / rate
            lateness.append((returned - sched).astype(np.float32))
        if all(step >= total for step in next_step.values()):
            break
        if config.stop_after_seconds and time.monotonic() >= t0 + config.seconds:
            report.unwritten = sum(total - step for step in next_step.values())
            break
    report.cpu_s = time.process_time() - cpu0
    report.duration_s = time.monotonic() - t0
    report.behind_s = report.duration_s - (max(next_step.values()) - 1) / rate if total else 0.0
    report.lateness_s = np.concatenate(lateness) if lateness else np.zeros(0, np.float32)
    report.write_s = np.asarray(write_s, dtype=np.float32)
    for sink in sinks.values():
        sink.close()
    return report


def _worker(config: LoadConfig, index: int, ranks: list[int], processes: int, ready, go, start) -> None:
    """Process entry point: _drive, its report (or the exception's text) put on `ready`."""
    try:
        ready.put(("done", index, _drive(config, index, ranks, processes, ready, go, start)))
    except BaseException as exc:
        ready.put(("error", index, f"{type(exc).__name__}: {exc}"))


def run_load(url: str, run: str, ranks: int, steps_per_s: float, seconds: float, processes: int = 2,
             tokens_per_rank: int = 64, **options) -> LoadReport:
    """Write ranks x round(steps_per_s x seconds) step records into `url` under run `run` from `processes` spawned
    processes (ranks dealt round-robin), paced at steps_per_s per rank from a common start once every process has
    drawn its pool; returns when every process has written its last step. options: the other LoadConfig fields
    (phase, sample_tokens, pool_steps, first_step, memory_budget_bytes, redis_timeout_s, num_layers, num_experts,
    top_k, rank_spread, seed, max_batch, instance_prefix, stop_after_seconds). Raises RuntimeError when a process fails to start or dies; failed writes are only
    counted (LoadReport.failed)."""
    if ranks < 1 or steps_per_s <= 0 or seconds < 0:
        raise ValueError(f"need ranks >= 1, steps_per_s > 0, seconds >= 0 (got {ranks}, {steps_per_s}, {seconds})")
    config = LoadConfig(url=url, run=core.check_run_name(run), ranks=ranks, steps_per_s=steps_per_s,
                        seconds=seconds, tokens_per_rank=tokens_per_rank, **options)
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    go = ctx.Event()
    start = ctx.Array("d", 2)
    shares = split_ranks(ranks, processes)
    procs = [ctx.Process(target=_worker, args=(config, i, share, len(shares), ready, go, start), daemon=True,
                         name=f"loadgen-{i}") for i, share in enumerate(shares)]
    for proc in procs:
        proc.start()
    reports: dict[int, ProcessReport] = {}
    try:
        waiting = set(range(len(procs)))
        limit = time.monotonic() + 300 + config.pool_steps * ranks * tokens_per_rank * 1e-5
        while waiting:
            kind, index, *rest = _next(ready, procs, limit)
            if kind == "error":
                raise RuntimeError(f"load process {index} failed: {rest[0]}")
            waiting.discard(index)
        start[0], start[1] = time.monotonic() + 0.2, time.time() + 0.2
        go.set()
        waiting = set(range(len(procs)))
        limit = time.monotonic() + 120 + 3 * seconds
        while waiting:
            kind, index, payload = _next(ready, procs, limit)
            if kind == "error":
                raise RuntimeError(f"load process {index} failed: {payload}")
            reports[index] = payload
            waiting.discard(index)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    return LoadReport(config, [reports[i] for i in sorted(reports)])


def _next(ready, procs, limit: float) -> tuple:
    """The next message on `ready`; RuntimeError when a process died without one or `limit` (monotonic) passed."""
    while True:
        try:
            return ready.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"load process {dead[0].name} exited with code {dead[0].exitcode}") from None
            if time.monotonic() > limit:
                raise RuntimeError("load processes did not answer in time") from None


# ---------------------------------------------------------------------------------------------------- CLI
def redis_figures(client) -> dict[str, float]:
    """used_memory and used_memory_peak (bytes) and the server's CPU seconds (user + system) from INFO."""
    memory, cpu = client.info("memory"), client.info("cpu")
    return {"used_memory": float(memory["used_memory"]), "used_memory_peak": float(memory["used_memory_peak"]),
            "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])}


def main(argv: list[str] | None = None) -> int:
    from bench.malloc_env import pin_malloc

    pin_malloc()
    parser = argparse.ArgumentParser(prog="python -m bench.harness.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=None, help="Redis URL (default: a private redis-server)")
    parser.add_argument("--run", default="loadgen")
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--steps-per-s", type=float, default=20.0, help="steps per second per rank")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--tokens", type=int, default=64, help="tokens per rank per step")
    parser.add_argument("--phase", default="decode", choices=core.PHASES)
    parser.add_argument("--sample-tokens", type=int, default=0, help="sampled rows per layer, one step in 4")
    args = parser.parse_args(argv)
    server = None
    url = args.redis
    if url is None:
        import tempfile

        from moe_monitor.demo.localredis import RedisServer

        server = RedisServer(tempfile.mkdtemp(prefix="loadgen-redis-"))
        url = server.url
    try:
        client = core.connect(url, timeout_s=5.0)
        before = redis_figures(client)
        report = run_load(url, args.run, args.ranks, args.steps_per_s, args.seconds, args.processes, args.tokens,
                          phase=args.phase, sample_tokens=args.sample_tokens)
        print(report.summary())
        if server is not None:
            after = redis_figures(client)
            print(f"  redis-server: CPU {(after['cpu_s'] - before['cpu_s']) / report.duration_s:.2f} cores, "
                  f"used_memory {after['used_memory'] / 2**20:.1f} MiB (peak "
                  f"{after['used_memory_peak'] / 2**20:.1f} MiB), steps stream "
                  f"{client.xlen(core.steps_key(args.run))} entries (MAXLEN ~{report.config.maxlen})")
        client.close()
    finally:
        if server is not None:
            server.stop()
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
