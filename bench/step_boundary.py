"""What the vLLM plugin's step boundary costs the worker's own thread: RunnerBinding.begin and .end (the gate, the
monitor's begin_step and end_step: the step buffer's copy into a host slot and its reset), this tree beside the
previous main, on the CPU, with the caches cold as a forward leaves them.

    python -m bench.step_boundary [--steps 2000] [--turns 5] [--baseline REV]

Each tree's own RunnerBinding (vllm/binding.py) is bound to a stand-in for a vLLM model runner (the attributes
its constructor reads: two fused-MoE layers of 8 experts, top-2, a router with a capture slot) and publishes to a
private redis-server, as the plugin does. A step: begin() with a decode SchedulerOutput of 8 requests, then end().
Before each of the two, a 32 MB array is read (a forward of even a tiny model evicts the boundary's code and data
from the caches; in a vLLM worker of the tiny Qwen3-MoE the boundary cost 2-4 times its hot figure). Hot: the
same without the reads. Figures: microseconds a step (begin + end), the median over turns; each turn a process of
its own per tree, the trees alternating. No vLLM is needed (nothing of vLLM is imported).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from bench.baseline import child_json
from bench.baseline import trees as baseline_trees
from bench.malloc_env import pin_malloc

pin_malloc()

LAYERS, EXPERTS, TOP_K, TOKENS = 2, 8, 2, 8
EVICT_BYTES = 32 << 20


class _Router:
    """A fused-MoE router's capture slot (set_capture_fn), as the binding attaches to it."""

    capture_fn = None

    def set_capture_fn(self, fn) -> None:
        self.capture_fn = fn


def stand_in_runner():
    """What RunnerBinding's constructor reads of a vLLM model runner, for LAYERS fused-MoE layers on the CPU."""
    import torch

    moe = SimpleNamespace(num_logical_experts=EXPERTS, experts_per_token=TOP_K, hidden_dim=64, intermediate_size=32,
                          num_fused_shared_experts=0)
    names = [f"model.layers.{i}.mlp.experts" for i in range(LAYERS)]
    compilation = SimpleNamespace(static_forward_context={n: SimpleNamespace(router=_Router(), moe_config=moe)
                                                          for n in names},
                                  static_all_moe_layers=names, max_cudagraph_capture_size=0)
    config = SimpleNamespace(
        compilation_config=compilation, additional_config=None,
        model_config=SimpleNamespace(served_model_name="bench-boundary", model="bench-boundary",
                                     hf_text_config=SimpleNamespace(moe_intermediate_size=32), dtype=torch.float32),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, data_parallel_rank=0, data_parallel_size=1,
                                        pipeline_parallel_size=1, enable_expert_parallel=False,
                                        use_sequence_parallel_moe=False))
    return SimpleNamespace(vllm_config=config, device="cpu", eplb_state=None)


def measure(steps: int) -> dict[str, float]:
    """us a step (begin, end) hot and cold, in this process (its moe_monitor)."""
    import numpy as np

    from moe_monitor.collectors.vllm.binding import RunnerBinding
    try:
        from moe_monitor.collectors.vllm.rules import PluginSettings, publishing_rule
    except ImportError:  # a baseline tree from before the plugin's rules were one module
        from moe_monitor.collectors.vllm.scope import publishing_rule
        from moe_monitor.collectors.vllm.settings import PluginSettings
    from moe_monitor.demo.localredis import RedisServer

    server = RedisServer(Path(tempfile.mkdtemp(prefix="bench-boundary-")))
    binding = RunnerBinding(stand_in_runner(), PluginSettings(server.url, "bench-boundary", {"nvml": False}),
                            publishing_rule(0, 1, 0, 1, 1, False))
    scheduled = SimpleNamespace(total_num_scheduled_tokens=TOKENS, scheduled_new_reqs=[],
                                num_scheduled_tokens={f"req-{i}": 1 for i in range(TOKENS)},
                                scheduled_spec_decode_tokens={})
    evict = np.ones(EVICT_BYTES // 8)
    out: dict[str, float] = {}
    try:
        for label, cold in (("hot", False), ("cold", True)):
            begin_ns = end_ns = 0
            for step in range(steps):
                if cold:
                    evict.sum()
                start = time.perf_counter_ns()
                binding.begin(scheduled)
                began = time.perf_counter_ns()
                if cold:
                    evict.sum()
                ending = time.perf_counter_ns()
                binding.end()
                begin_ns, end_ns = begin_ns + began - start, end_ns + time.perf_counter_ns() - ending
                if step % 64 == 63:
                    time.sleep(0.01)  # the publisher's round: steps keep flowing to Redis, as in a server
            out[f"{label}_begin_us"], out[f"{label}_end_us"] = begin_ns / steps / 1e3, end_ns / steps / 1e3
    finally:
        binding.monitor.close()
        server.stop()
    out["published"] = float(binding.monitor.stats()["published_steps"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps hot and cold per process")
    parser.add_argument("--turns", type=int, default=5, help="processes per tree")
    parser.add_argument("--baseline", metavar="REV", default=os.environ.get("MOE_BENCH_BASELINE", ""),
                        help="also measure the binding as of this git revision, the trees alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.steps)))
        return 0
    trees = baseline_trees(args.baseline)
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    for _ in range(args.turns):
        for tree, root in trees.items():
            runs[tree].append(child_json("bench.step_boundary", ["--steps", str(args.steps)], root, timeout_s=900))
    print(f"vLLM plugin step boundary (RunnerBinding.begin + .end) on the worker's thread, {LAYERS} layers x {EXPERTS} "
          f"experts, top-{TOP_K}, {TOKENS} decode tokens, CPU; {args.steps} steps hot and cold (a {EVICT_BYTES >> 20} "
          f"MB read before begin and before end) a process, median of {args.turns} processes per tree")
    totals = {}
    for tree, results in runs.items():
        med = {key: statistics.median(r[key] for r in results) for key in results[0]}
        totals[tree] = {mode: med[f"{mode}_begin_us"] + med[f"{mode}_end_us"] for mode in ("hot", "cold")}
        print(f"  {tree[:12]:>12s}  hot {med['hot_begin_us']:5.1f} + {med['hot_end_us']:5.1f} us   cold "
              f"{med['cold_begin_us']:5.1f} + {med['cold_end_us']:5.1f} = {totals[tree]['cold']:5.1f} us a step"
              f"   (steps published {med['published']:.0f} of {2 * args.steps})")
    if len(totals) == 2:
        new, old = totals["this tree"], totals[args.baseline]
        print(f"  this tree / {args.baseline[:12]}: cold {new['cold'] / old['cold']:.2f}x, hot {new['hot'] / old['hot']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
