"""What publishing a step costs beside the model: CPU of the collector's background threads (the publisher's decode,
the Redis writer's encode and XADDs) and of redis-server, per published step, this tree beside the previous main.

The model's thread is driven as the vLLM plugin drives it (begin_step, each layer's record, end_step) at a fixed
step rate, on the CPU; its own time is not counted here (bench.collector and bench.vllm_plugin measure the model's
side). Two shapes: the vLLM engine tests' tiny Qwen3-MoE (2 layers x 8 experts, top-2, 8 decode tokens a step)
and DeepSeek-V3's routing (58 layers x 256 experts, top-8, 64 decode tokens a step). Sampled rows are on (the
default 16 tokens per layer in one step of 4).

    python -m bench.publishing [--steps 3000] [--baseline REV] [--turns 3]

Background CPU = the CPU clocks of the collector's threads (moe-monitor-*: the publisher and the Redis writer),
from the monitor's start until every step has been published; redis-server's from its INFO cpu. Each tree runs in
processes of its own, the trees alternating, and the figure is the median over turns.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

from bench.baseline import child_json
from bench.baseline import trees as baseline_trees
from bench.malloc_env import pin_malloc

pin_malloc()

# label -> (layers, experts, top-k, tokens a step, steps a second: the model's thread, counting on the CPU, takes
# about a quarter of that period at most, so it never starves the threads measured)
SHAPES = {"tiny 2x8 top-2, 8 tokens": (2, 8, 2, 8, 400.0), "DeepSeek-V3 58x256 top-8, 64 tokens": (58, 256, 8, 64, 100.0)}


def _threads_cpu_s(prefix: str = "moe-monitor-") -> float:
    """CPU seconds so far of this process's live threads whose name starts with prefix (the publisher's)."""
    return sum(time.clock_gettime(time.pthread_getcpuclockid(thread.ident)) for thread in threading.enumerate()
               if thread.name.startswith(prefix) and thread.ident is not None)


def _redis_cpu_s(client) -> float:
    """redis-server's user + system CPU seconds so far (INFO cpu: microsecond resolution, /proc has 10 ms)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure_shape(redis_url: str, shape: tuple[int, int, int, int, float], steps: int) -> dict[str, float]:
    """{"background_us", "redis_us"}: CPU per published step of one monitor run of `steps` steps."""
    import torch

    from moe_monitor import core
    from moe_monitor.collectors.monitor import ExpertLoadMonitor

    num_layers, num_experts, top_k, tokens, rate = shape
    monitor = ExpertLoadMonitor(num_layers, num_experts, top_k, device="cpu", redis_url=redis_url,
                                run=f"bench-publishing-{os.getpid()}-{num_layers}", nvml=False)
    ids_NK = torch.randint(0, num_experts, (tokens, top_k), generator=torch.Generator().manual_seed(0))
    valid_NK = torch.ones(tokens, top_k, dtype=torch.int64)
    period_s = 1.0 / rate
    client = core.connect(redis_url, timeout_s=5.0)
    redis0 = _redis_cpu_s(client)
    next_s = time.perf_counter()
    for _ in range(steps):
        monitor.begin_step(tokens=tokens)
        for layer in range(num_layers):
            monitor.counter.record(layer, ids_NK, valid_NK)
        monitor.end_step(phase="decode", tokens=tokens)
        next_s += period_s
        time.sleep(max(0.0, next_s - time.perf_counter()))
    deadline = time.monotonic() + 120
    while monitor.publisher.published_steps < steps and time.monotonic() < deadline:
        time.sleep(0.01)
    published = monitor.publisher.published_steps
    background_s = _threads_cpu_s()  # the publisher's threads start with the monitor
    redis_s = _redis_cpu_s(client) - redis0
    monitor.close()
    client.close()
    if published < steps:
        raise SystemExit(f"only {published} of {steps} steps were published")
    return {"background_us": 1e6 * background_s / steps, "redis_us": 1e6 * redis_s / steps}


def measure(steps: int) -> dict[str, dict[str, float]]:
    """{shape: figures} for this process's moe_monitor, against a private redis-server."""
    import torch

    from moe_monitor.demo.localredis import RedisServer

    torch.set_num_threads(1)
    server = RedisServer(tempfile.mkdtemp(prefix="bench-redis-"))
    try:
        return {label: measure_shape(server.url, shape, steps)
                for label, shape in SHAPES.items()}
    finally:
        server.stop()


def _in_child(package_root, args) -> dict[str, dict[str, float]]:
    return child_json("bench.publishing", ["--steps", str(args.steps)], package_root, timeout_s=1800)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000, help="steps per shape and process")
    parser.add_argument("--baseline", metavar="REV", default=os.environ.get("MOE_BENCH_BASELINE", ""),
                        help="also measure moe_monitor as of this git revision, the trees alternating")
    parser.add_argument("--turns", type=int, default=3, help="processes per tree")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.steps)))
        return 0
    print(f"publishing cost per step (CPU of the collector's background threads and of redis-server), {args.steps} "
          f"steps a shape; median of {args.turns} processes per tree")
    trees = baseline_trees(args.baseline)
    runs: dict[str, list[dict]] = {tree: [] for tree in trees}
    for _ in range(args.turns):
        for tree, root in trees.items():
            runs[tree].append(_in_child(root, args))
    for label in SHAPES:
        figures = {tree: {key: statistics.median(r[label][key] for r in results) for key in ("background_us", "redis_us")}
                   for tree, results in runs.items()}
        print(f"  {label}")
        for tree, got in figures.items():
            print(f"    {tree[:12]:>12s}  background threads {got['background_us']:7.1f} us  redis-server "
                  f"{got['redis_us']:6.1f} us  total {got['background_us'] + got['redis_us']:7.1f} us")
        if len(figures) == 2:
            new, old = figures["this tree"], figures[args.baseline]
            print(f"    this tree / {args.baseline[:12]}: background {new['background_us'] / old['background_us']:.2f}x, "
                  f"redis-server {new['redis_us'] / old['redis_us']:.2f}x, total "
                  f"{(new['background_us'] + new['redis_us']) / (old['background_us'] + old['redis_us']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
