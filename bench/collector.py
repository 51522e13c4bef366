"""Collector overhead: step time of a hooked model over the same model unhooked, measured side by side.

Two copies of one tiny random-weight Qwen3-MoE (8 MoE layers, 128 experts, top-8, hidden 256) on the CPU;
one has the collector attached and publishing to a private redis-server (sampled routing rows on, the
default 16 tokens per layer in one step of 4; NVML sampler on). Calls alternate in random order; the medians of the
per-call times give the ratio. Prefill-shaped steps: 4 x 64 tokens; decode-shaped: 16 sequences x 1 token.

    python -m bench.collector [--reps 200] [--baseline REV]

--baseline REV measures moe_monitor as of REV (make bench: the previous main) in turns with this tree, each in a
process of its own (bench/baseline.py), and prints both side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings

from bench.baseline import child_json, export_package
from bench.malloc_env import pin_malloc

pin_malloc()
warnings.filterwarnings("ignore")

import torch

from moe_monitor.collectors import attach
from moe_monitor.demo.localredis import RedisServer
from tests.support.tiny_models import build

# Qwen3-30B-A3B's routing shape (128 experts, top-8) with tiny widths and 8 of its 48 layers.
SIZES = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, head_dim=32, num_experts=128, n_routed_experts=128,
             num_local_experts=128, moe_num_experts=128, num_experts_per_tok=8, top_k=8, moe_topk=8,
             vocab_size=512)
DECODE_GOAL = 1.02  # hooked / unhooked decode step time


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(a, b, inputs, reps: int) -> tuple[list[float], list[float]]:
    """Seconds per call of a(**inputs) and b(**inputs), the two alternating in random order (on a GPU
    each call is timed to its completion)."""
    times = ([], [])
    with torch.inference_mode():
        for _ in range(3):
            a(**inputs), b(**inputs)
        for _ in range(reps):
            order = [0, 1]
            random.shuffle(order)
            for i in order:
                _sync()
                start = time.perf_counter()
                (a, b)[i](**inputs)
                _sync()
                times[i].append(time.perf_counter() - start)
    return times


def overhead_ratio(m1, m2, inputs, reps: int, rounds: int, redis_url: str) -> tuple[float, float, float]:
    """Hooked/unhooked step-time ratio: the median over pairs of (hooked call / unhooked call run next to
    it), which cancels slow drift of the machine; the roles of two identical model copies swap every round
    (copy 1 hooked, then copy 2 hooked, ...), so a difference between the copies cancels too.
    Returns (ratio, median unhooked ms, median hooked ms)."""
    ratios, hooked_s, plain_s = [], [], []
    for r in range(rounds):
        target, other = (m2, m1) if r % 2 == 0 else (m1, m2)
        monitor = attach(target, redis_url=redis_url, run=f"bench-{r}", gpus=8)
        t_other, t_target = interleaved(other, target, inputs, reps)
        monitor.close()
        ratios += [h / p for h, p in zip(t_target, t_other)]
        plain_s += t_other
        hooked_s += t_target
    return statistics.median(ratios), statistics.median(plain_s) * 1e3, statistics.median(hooked_s) * 1e3


def measure(reps: int, rounds: int, device: str) -> dict[str, tuple[float, float, float, float]]:
    """{shape: (ratio, unhooked ms, hooked ms, A/A control ratio)} for this process's moe_monitor."""
    torch.set_num_threads(1)
    random.seed(0)
    server = RedisServer(tempfile.mkdtemp(prefix="bench-redis-"))
    out = {}
    try:
        m1, m2 = build("qwen3_moe", **SIZES).to(device), build("qwen3_moe", **SIZES).to(device)
        gen = torch.Generator().manual_seed(0)
        shapes = {"prefill 4x64": (4, 64, max(10, reps // 3)), "decode 16x1": (16, 1, reps)}
        for label, (batch, seq, n) in shapes.items():
            ids = torch.randint(3, 500, (batch, seq), generator=gen).to(device)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            ratio, plain_ms, hooked_ms = overhead_ratio(m1, m2, inputs, n, rounds, server.url)
            a, b = interleaved(m1, m2, inputs, n)
            out[label] = (ratio, plain_ms, hooked_ms, statistics.median([y / x for x, y in zip(a, b)]))
    finally:
        server.stop()
    return out


def _in_child(package_root, args) -> dict[str, list[float]]:
    """measure() in a child process whose moe_monitor comes from package_root (None: this tree)."""
    return child_json("bench.collector", ["--reps", str(args.reps), "--rounds", str(args.rounds), "--device",
                                          args.device], package_root)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=100, help="pairs of calls per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; the hooked copy alternates")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--baseline", metavar="REV", default=os.environ.get("MOE_BENCH_BASELINE", ""),
                        help="also measure moe_monitor as of this git revision (the previous main), in turns with "
                             "this tree, each in its own process ($MOE_BENCH_BASELINE)")
    parser.add_argument("--turns", type=int, default=2, help="with --baseline: processes per tree, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.reps, args.rounds, args.device)))
        return 0
    where = "CPU, 1 thread" if args.device == "cpu" else torch.cuda.get_device_name(0)
    print(f"collector overhead, tiny Qwen3-MoE (8 MoE layers x 128 experts, top-8, hidden 256), {where};")
    print("  publishing to a private redis-server with 16 sampled tokens per layer; median of per-pair ratios")
    if not args.baseline:
        return main_this_tree(args)
    old_root, why = export_package(args.baseline)
    if old_root is None:
        print(f"  baseline {args.baseline}: {why}; this tree only")
        return main_this_tree(args)
    runs: dict[str, list[dict]] = {"this tree": [], args.baseline: []}
    for _ in range(args.turns):  # alternate the trees so drift of the machine falls on both
        runs["this tree"].append(_in_child(None, args))
        runs[args.baseline].append(_in_child(old_root, args))
    print(f"  {'shape':13s} {'tree':>12s}  ratio per process (A/A control)")
    for label in runs["this tree"][0]:
        for tree, results in runs.items():
            cells = "  ".join(f"{r[label][0]:.3f} ({r[label][3]:.3f})" for r in results)
            print(f"  {label:13s} {tree[:12]:>12s}  {cells}   median {statistics.median(r[label][0] for r in results):.3f}")
    decode = statistics.median(r["decode 16x1"][0] for r in runs["this tree"])
    print(f"  decode 16x1: this tree {decode:.3f}, goal <= {DECODE_GOAL}: {'PASS' if decode <= DECODE_GOAL else 'FAIL'}")
    return 0


def main_this_tree(args) -> int:
    """This tree alone, in this process."""
    for label, (ratio, plain_ms, hooked_ms, control) in measure(args.reps, args.rounds, args.device).items():
        print(f"  {label:13s} unhooked {plain_ms:8.2f} ms  hooked {hooked_ms:8.2f} ms  ratio {ratio:.3f}"
              f"   (A/A control, both unhooked: {control:.3f}; {args.rounds}x{args.reps} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
