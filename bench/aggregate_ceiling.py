"""python -m bench.aggregate_ceiling --redis URL: how many step entries a second one aggregator sustains,
its CPU, and what the rollups cost in Redis memory, at DeepSeek-V3's shape (58 MoE layers x 256 experts, top-8).

Point it at a scratch Redis: it writes a throwaway run (selfbench-<random>) and deletes its keys at the end.

1. backlog: --ranks x --steps records (64 decode tokens a rank) are written first, then one Aggregator
   (in-process) drains them: entries/s and its CPU seconds per 1,000 entries, Redis's CPU beside it.
2. live (--live-s > 0): a writer process XADDs --rate entries/s (in batches, like the collectors) while the
   aggregator runs; prints whether it kept up (lag at the end), its CPU share and Redis's.
3. memory: 1 s and 60 s rollup buckets of that traffic (--ranks x 64 tokens x top-8 x --steps-per-s, counts
   from --popularity: an SGLang logical_count JSON [layers][experts], else Zipf) XADDed with their ids into
   real streams, MEMORY USAGE of each: 1 h of 1 s buckets and 24 h of 60 s buckets (scaled from --buckets
   written when fewer), and the aggregate stream at its MAXLEN.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import sys
import time

import numpy as np

from moe_monitor import core
from moe_monitor.aggregator.layoutbook import LayoutBook
from moe_monitor.aggregator.options import AggregateOptions
from moe_monitor.aggregator.rollup import StepEntry, bucket_rollup
from moe_monitor.aggregator.worker import Aggregator

LAYERS, EXPERTS, TOP_K, TOKENS = 58, 256, 8, 64
POOL = 64  # distinct rank-step count arrays the records cycle through


def popularity(path: str | None, rng: np.random.Generator) -> np.ndarray:
    """float [L, E] routing probabilities: the MoE layers of an SGLang logical_count file, else Zipf(1) per
    layer with its own order of experts."""
    if path:
        with open(path, "rb") as handle:
            rows = np.asarray(core.parse_json(handle.read(), path)["logical_count"], dtype=np.float64)
        rows = rows[rows.sum(axis=1) > 0][-LAYERS:]
        return rows / rows.sum(axis=1, keepdims=True)
    weights = 1.0 / np.arange(1, EXPERTS + 1)
    rows = np.stack([rng.permutation(weights) for _ in range(LAYERS)])
    return rows / rows.sum(axis=1, keepdims=True)


def rank_counts(p_LE: np.ndarray, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """int32 [L, E]: `tokens` x top-k routed by p_LE (multinomial per layer)."""
    return np.stack([rng.multinomial(tokens * TOP_K, row) for row in p_LE]).astype(np.int32)


def encoded_pool(run: str, ranks: int, pool: list[np.ndarray], instance: str) -> list[dict]:
    """Encoded step records of the pool's counts (a writer then only changes step, rank and time)."""
    return [core.encode_step(core.StepRecord(run=run, rank=0, world_size=ranks, step=0, time_s=time.time(),
                                             phase="decode", tokens=TOKENS, counts_LE=counts, instance=instance))
            for counts in pool]


def write_steps(url: str, run: str, ranks: int, steps: range, pool: list[np.ndarray], instance: str,
                rate: float | None = None) -> None:
    """XADD the records of `steps` (all ranks of a step in one pipeline), paced at `rate` entries/s if given.
    The counts are encoded once per pool entry (the collectors encode on their own hosts)."""
    client = core.connect(url, timeout_s=10.0)
    encoded = encoded_pool(run, ranks, pool, instance)
    started, sent = time.monotonic(), 0
    key = core.steps_key(run)
    for step in steps:
        pipe = client.pipeline(transaction=False)
        now = repr(time.time())
        for rank in range(ranks):
            pipe.xadd(key, {**encoded[(step * 7 + rank) % len(encoded)], "step": step, "rank": rank, "t": now})
        pipe.execute()
        sent += ranks
        if rate:
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    client.close()


def _redis_cpu_s(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(url: str, run: str, options: AggregateOptions, want_steps: int, limit_s: float = 600.0) -> Aggregator:
    aggregator = Aggregator(url, run, options, log=lambda line: None)
    end = time.monotonic() + limit_s
    while aggregator.counters.steps_written < want_steps and time.monotonic() < end:
        aggregator.step()
    return aggregator


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.aggregate_ceiling", description=__doc__.split("\n\n")[0])
    p.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--steps", type=int, default=40, help="steps of the backlog")
    p.add_argument("--live-s", type=float, default=10.0, help="seconds of the live phase (0: none)")
    p.add_argument("--rate", type=float, default=5120.0, help="entries/s the live writer sends")
    p.add_argument("--steps-per-s", type=float, default=20.0, help="step rate the rollup memory is sized for")
    p.add_argument("--popularity", default=None, help="SGLang logical_count JSON for the expert popularity")
    p.add_argument("--buckets", type=int, default=3600, help="1 s buckets written for the memory figure")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    p_LE = popularity(args.popularity, rng)
    pool = [rank_counts(p_LE, TOKENS, rng) for _ in range(POOL)]
    run = f"selfbench-{secrets.token_hex(4)}"
    client = core.connect(args.redis, timeout_s=10.0)
    options = AggregateOptions(deadline_s=2.0, log_every_s=3600.0)
    try:
        write_steps(args.redis, run, args.ranks, range(args.steps), pool, "selfbench")
        entries = args.ranks * args.steps
        cpu0, redis0, wall0 = time.process_time(), _redis_cpu_s(client), time.perf_counter()
        aggregator = drain(args.redis, run, options, args.steps)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        redis_cpu = _redis_cpu_s(client) - redis0
        print(f"backlog: {entries} entries ({args.ranks} ranks x {args.steps} steps, {LAYERS}x{EXPERTS}) in "
              f"{wall:.2f} s: {entries / wall:,.0f} entries/s; aggregator CPU {cpu:.2f} s "
              f"({1000 * cpu / entries:.3f} s per 1,000 entries), redis-server CPU {redis_cpu:.2f} s; "
              f"{aggregator.counters.steps_written} steps written")
        if args.live_s > 0:
            live(args, run, pool, aggregator, client)
        aggregator.close()
        memory(args, client, run, p_LE, rng)
    finally:
        keys = [core.steps_key(run), core.aggregate_key(run), core.rollup_key(run, 1), core.rollup_key(run, 60),
                core.aggregator_key(run), core.aggregator_key(run) + ":state", run_key_tmp(run, 1),
                run_key_tmp(run, 60)]
        client.delete(*keys)
        client.close()
    return 0


def live(args, run: str, pool: list[np.ndarray], aggregator: Aggregator, client) -> None:
    """A writer process at args.rate entries/s for args.live_s seconds, the aggregator draining beside it."""
    steps = int(args.live_s * args.rate / args.ranks)
    first = aggregator.counters.steps_written
    writer = multiprocessing.get_context("fork").Process(
        target=write_steps, args=(args.redis, run, args.ranks, range(10_000, 10_000 + steps), pool, "selfbench",
                                  args.rate))
    cpu0, redis0, wall0 = time.process_time(), _redis_cpu_s(client), time.perf_counter()
    writer.start()
    writer_s, behind = 0.0, 0
    while writer.is_alive() or aggregator.assembler.pending_steps or \
            aggregator.counters.steps_written - first < steps and time.perf_counter() - wall0 < args.live_s * 3:
        if not aggregator.step():
            time.sleep(aggregator.idle_wait_s())
        if not writer_s and not writer.is_alive():
            writer_s = time.perf_counter() - wall0
            behind = steps - (aggregator.counters.steps_written - first)
    writer.join()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    redis_cpu = _redis_cpu_s(client) - redis0
    done = aggregator.counters.steps_written - first
    print(f"live: writer at {args.rate:,.0f} entries/s for {args.live_s:g} s ({steps} steps x {args.ranks} ranks); "
          f"the aggregator wrote {done} steps in {wall:.1f} s (writer done at {writer_s:.1f} s with {behind} steps "
          f"still to write), its CPU "
          f"{100 * cpu / wall:.0f}% of a core, redis-server {100 * redis_cpu / wall:.0f}%, "
          f"{aggregator.counters.rank_steps_missing} rank-steps written short")


def run_key_tmp(run: str, resolution_s: int) -> str:
    return core.run_key(run, f"membench:{resolution_s}s")


def memory(args, client, run: str, p_LE: np.ndarray, rng: np.random.Generator) -> None:
    """MEMORY USAGE of real rollup streams of this traffic (see the module docstring)."""
    book = LayoutBook()
    per_step = args.ranks * TOKENS
    start = int(time.time()) // 60 * 60 - 86_400
    for resolution, keep_s, count in ((1, 3600, args.buckets), (60, 86_400, max(1, args.buckets * 1440 // 3600))):
        steps_per_bucket = max(1, int(args.steps_per_s * resolution))
        fields = []
        for _ in range(min(count, 24)):  # distinct buckets; the stream cycles through them
            step_counts = [np.stack([rng.multinomial(per_step * TOP_K, row) for row in p_LE]).astype(np.int64)
                           for _ in range(min(steps_per_bucket, 4))]  # per-step statistics from a few steps
            total = np.stack([rng.multinomial(per_step * TOP_K * steps_per_bucket, row) for row in p_LE])
            entries = [StepEntry(epoch="", step=s, phase="decode", world=args.ranks, counts_LE=c,
                                 tokens=per_step, missing_ranks=0) for s, c in enumerate(step_counts)]
            rec = bucket_rollup(run, resolution, start, entries, book)
            rec = core.RollupRecord(**{**rec.__dict__, "counts_LE": total.astype(np.int64),
                                       "steps": steps_per_bucket,
                                       "steps_by_phase": np.array([0, steps_per_bucket, 0, 0, 0], dtype=np.int64)})
            fields.append(core.encode_rollup(rec))
        key = run_key_tmp(run, resolution)
        pipe = client.pipeline(transaction=False)
        for i in range(count):
            pipe.xadd(key, fields[i % len(fields)], id=f"{(start + i * resolution) * 1000}-0")
            if len(pipe) >= 200:
                pipe.execute()
        pipe.execute()
        used = int(client.memory_usage(key, samples=0))
        full = keep_s // resolution
        print(f"rollups {resolution} s: {count} buckets take {used / 2**20:.1f} MiB ({used / count / 1000:.1f} kB "
              f"each); {full} buckets ({keep_s // 3600} h) ~ {used / count * full / 2**20:.1f} MiB")
    agg_key = core.aggregate_key(run)
    length = int(client.xlen(agg_key))
    if length:
        used = int(client.memory_usage(agg_key, samples=0))
        maxlen = AggregateOptions().agg_maxlen
        print(f"aggregate stream: {length} entries take {used / 2**20:.1f} MiB ({used / length / 1000:.1f} kB each); "
              f"at MAXLEN {maxlen}: ~{used / length * maxlen / 2**20:.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
