"""What counting costs inside a compiled forward: the vLLM plugin's per-layer ops (DeviceCounter.record under a
gate, as its capture function calls it) traced by torch.compile into a small MoE-shaped forward on the CPU, with
the step buffer in int32 (this tree's STEP_DTYPE) and in int64 (the type before it), beside the same forward
without counting, all three in one run.

    python -m bench.capture_compiled [--layers 2] [--tokens 8] [--calls 4000] [--turns 5]

The forward: per layer a router (matmul, top-k) and an expert-shaped matmul; its ids feed the output, so nothing
is dead code. Each variant is compiled once (dynamic shapes, as vLLM compiles); turns alternate the variants and
the figure is the median over turns of the microseconds a call. Inductor lowers a put_ (accumulate) into an int32
target to an atomic add inside the layer's fused kernel; an int64 target stays an aten.index_put_ call of its own.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

from bench.malloc_env import pin_malloc

pin_malloc()
warnings.filterwarnings("ignore")

HIDDEN, EXPERTS, TOP_K = 128, 8, 2


def build(num_layers: int, dtype, counting: bool):
    """A compiled forward (x [T, HIDDEN] -> [T, HIDDEN]) counting its routing into a DeviceCounter of step
    buffer type dtype (counting False: no counter)."""
    import torch

    from moe_monitor.collectors import counter as counter_module

    torch.manual_seed(0)
    router_HE = torch.randn(HIDDEN, EXPERTS)
    expert_HH = torch.randn(HIDDEN, HIDDEN) / HIDDEN
    previous, counter_module.STEP_DTYPE = counter_module.STEP_DTYPE, dtype
    try:
        counter = counter_module.DeviceCounter(num_layers, EXPERTS, TOP_K, "cpu", sample_tokens=16)
    finally:
        counter_module.STEP_DTYPE = previous
    gate_T = torch.ones(4096, dtype=dtype)

    def forward(x):
        for layer in range(num_layers):
            ids = torch.topk(x @ router_HE, TOP_K).indices
            if counting:  # what the vLLM plugin's capture function does with the layer's topk_ids
                rows = ids.shape[0]
                counter.record(layer, ids, gate_T[:rows].unsqueeze(1).expand(rows, TOP_K))
            x = torch.relu(x @ expert_HH) + ids.sum(dim=1, keepdim=True)
        return x

    return torch.compile(forward, dynamic=True), counter


def per_call_us(fn, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(args.tokens, HIDDEN)
    variants = {"no counting": build(args.layers, torch.int32, False)[0],
                "int32 (this tree)": build(args.layers, torch.int32, True)[0],
                "int64 (before)": build(args.layers, torch.int64, True)[0]}
    for fn in variants.values():  # compiled here, then warm
        for _ in range(200):
            fn(x)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.turns):
        for name, fn in variants.items():
            times[name].append(per_call_us(fn, x, args.calls))
    base = statistics.median(times["no counting"])
    print(f"compiled forward on the CPU, {args.layers} MoE layers x {EXPERTS} experts, top-{TOP_K}, {args.tokens} "
          f"tokens, 1 thread; median of {args.turns} turns of {args.calls} calls")
    for name, samples in times.items():
        median = statistics.median(samples)
        extra = "" if name == "no counting" else f"   counting +{median - base:.1f} us a call"
        print(f"  {name:<18} {median:8.1f} us a call  x{median / base:.3f}{extra}")


if __name__ == "__main__":
    main()
