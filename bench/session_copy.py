"""A new session's first tick of a live run: reading and decoding the window afresh, against starting from another
session's copy (dashboard.live.seeds) and polling on. No timed assertion anywhere.

Starts its own redis-server on a free loopback port and fills --steps steps; per repeat, a session reads the run
afresh (its first tick, then the window's view), offers its copy, 5 new steps are written (untimed), and a new
session takes the copy, ticks over the 5 steps and views the window. Prints the medians and their ratio.

    python -m bench.session_copy [--layers 4] [--experts 256] [--steps 600] [--gpus 32] [--ranks 4] [--repeats 7]
"""
from __future__ import annotations

from bench.malloc_env import pin_malloc

pin_malloc()

import argparse
import statistics
import tempfile
import time

from moe_monitor import core
from moe_monitor.dashboard.live.seeds import Seeds
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.demo.localredis import RedisServer
from tests.support import synthfill

RUN = "bench-copy"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    shape = dict(num_layers=args.layers, num_experts=args.experts, gpus=args.gpus, world_size=args.ranks)
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(tmp)
        try:
            client = core.connect(server.url, timeout_s=5.0)
            synthfill.fill(client, RUN, steps=args.steps, **shape)

            def session() -> WatchedRun:
                source = RedisSource(core.connect(server.url, timeout_s=5.0), server.url, RUN, args.steps)
                return WatchedRun(source, args.steps)

            def first_tick(watched: WatchedRun) -> float:
                began = time.perf_counter()
                watched.tick()
                meta = watched.source.meta()
                watched.window.view("both", meta.layout.physical_to_logical_map, meta.layout.gpus)
                return time.perf_counter() - began

            fresh_s, copy_s, next_step = [], [], args.steps
            for i in range(args.repeats):
                owner = session()
                fresh_s.append(first_tick(owner))
                seeds = Seeds()
                seeds.offer((RUN,), owner)
                synthfill.fill(client, RUN, steps=5, first_step=next_step, meta=False, seed=i + 1, **shape)
                next_step += 5
                began = time.perf_counter()
                given = seeds.take((RUN,))
                if given is None:
                    print("  no copy was given out: the budget or the run refused it")
                    return 1
                copy_s.append(time.perf_counter() - began + first_tick(given))
                seeds.clear()
        finally:
            server.stop()
    fresh, copy = statistics.median(fresh_s), statistics.median(copy_s)
    print(f"a new session's first tick and view, {args.steps} steps of {args.layers} x {args.experts} at {args.ranks} "
          f"ranks, {args.gpus} GPUs, median of {args.repeats}:")
    print(f"  read afresh {fresh * 1e3:7.1f} ms · from a copy, 5 new steps polled on {copy * 1e3:7.1f} ms  "
          f"ratio {copy / fresh:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
