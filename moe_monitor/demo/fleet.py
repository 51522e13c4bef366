"""`python -m moe_monitor.demo.fleet`: a whole data-parallel-attention deployment of the tiny DeepSeek-V3 on the CPU, 32 ranks
by default, each decoding what a real DP-attention rank decodes (32 sequences at a time), published rank by rank
through the real collector so that the aggregator (moe-monitor aggregate) and the dashboard see a deployment.

One process per node (8 ranks by default) runs one forward per step over its ranks' sequences; forward pre-hooks
on the experts modules hand each rank its own routed ids [tokens, 8]. Step ids match across ranks and the
processes step in lockstep (a barrier), as EP ranks do. Traffic: demo.traffic, each node with its own topics on
one drift clock; a round is one prefill step, then `new_tokens` decode steps. Docs: docs/scaling.md, "The fleet
demo".
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import sys
import time

GPUS, NODES = 32, 4  # the layout the runs describe: 256 experts over 32 GPUs in 4 nodes (contiguous)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m moe_monitor.demo.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", required=True, help="Redis URL (redis://, rediss://, a cluster node)")
    parser.add_argument("--run", default="demo-fleet", help="run name")
    parser.add_argument("--ranks", type=int, default=32, help="data-parallel attention ranks (W)")
    parser.add_argument("--ranks-per-process", type=int, default=8, help="ranks hosted by one process (a node)")
    parser.add_argument("--seqs-per-rank", type=int, default=32, help="sequences each rank decodes at a time")
    parser.add_argument("--prompt-len", type=int, default=24, help="prompt tokens per sequence (prefill step)")
    parser.add_argument("--new-tokens", type=int, default=32, help="decode steps per round")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until stopped)")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    return parser.parse_args(argv)


def serve_node(args: argparse.Namespace, ranks: list[int], start_s: float, stop, barrier) -> None:
    """One process: the model, one monitor per hosted rank, rounds of prefill + decode until stop is set;
    every step waits at `barrier` for the other processes' (a broken barrier ends the process)."""
    import threading

    import torch

    from moe_monitor.collectors import ExpertLoadMonitor
    from moe_monitor.demo.model import GPU_PROFILE, IMITATED_SIZES, build_model
    from moe_monitor.demo.traffic import DriftingTraffic

    torch.set_num_threads(1)
    model = build_model()
    traffic = DriftingTraffic(model, seed=1 + ranks[0])
    experts = [(name, module) for name, module in model.named_modules() if name.endswith("mlp.experts")]
    captured: list = [None] * len(experts)

    def capture(index: int):
        def hook(module, args, kwargs):
            captured[index] = kwargs["top_k_index"] if "top_k_index" in kwargs else args[1]
        return hook

    for index, (_, module) in enumerate(experts):
        module.register_forward_pre_hook(capture(index), with_kwargs=True)
    config = model.config
    monitors = [ExpertLoadMonitor(len(experts), config.n_routed_experts, config.num_experts_per_tok,
                                  redis_url=args.redis, run=args.run, layer_names=[name for name, _ in experts],
                                  model_name=config.name_or_path, gpus=GPUS, nodes=NODES, rank=rank,
                                  world_size=args.ranks, nvml=False, gpu_profile=GPU_PROFILE, **IMITATED_SIZES)
                for rank in ranks]
    seqs = args.seqs_per_rank
    generator = torch.Generator().manual_seed(ranks[0])

    def step(input_ids, cache, phase: str):
        barrier.wait()  # lockstep with the other nodes (BrokenBarrierError once one stopped: main aborts it)
        out = model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        rows_per_rank = input_ids.numel() // len(ranks)
        for layer, ids in enumerate(captured):  # ids: int64 [ranks x seqs x tokens, k], rank-major rows
            for i, monitor in enumerate(monitors):
                monitor.record(layer, ids[i * rows_per_rank:(i + 1) * rows_per_rank])
        for monitor in monitors:
            monitor.end_step(phase=phase)
        probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
        top = torch.topk(probs, 20, dim=-1)
        pick = torch.multinomial(top.values, 1, generator=generator)
        return top.indices.gather(1, pick), out.past_key_values

    steps, began = 0, time.monotonic()
    try:
        with torch.inference_mode():
            while not stop.is_set() and not (args.steps and steps >= args.steps):
                traffic.apply(time.time() - start_s)
                prompt = torch.cat([traffic.prompts(seqs, args.prompt_len) for _ in ranks])
                token, cache = step(prompt, None, "prefill")
                steps += 1
                for _ in range(args.new_tokens):
                    if stop.is_set() or args.steps and steps >= args.steps:
                        break
                    token, cache = step(token, cache, "decode")
                    steps += 1
    except threading.BrokenBarrierError:
        pass  # another node stopped
    finally:
        barrier.abort()
        for monitor in monitors:
            monitor.close()
        stats = monitors[0].stats()
        # one write with its newline: print() writes the text and the "\n" apart, and the nodes share one pipe
        sys.stdout.write(f"demo.fleet: ranks {ranks[0]}-{ranks[-1]}: {steps} steps, "
                         f"{steps / (time.monotonic() - began):.1f} steps/s; rank {ranks[0]}: published "
                         f"{stats.get('published_steps')}, dropped {stats.get('dropped_steps')}\n")
        sys.stdout.flush()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not 1 <= args.ranks <= 1024 or args.ranks_per_process < 1:
        print("demo.fleet: --ranks must be 1..1024 and --ranks-per-process >= 1", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    start_s = time.time()
    groups = [list(range(first, min(first + args.ranks_per_process, args.ranks)))
              for first in range(0, args.ranks, args.ranks_per_process)]
    barrier = ctx.Barrier(len(groups))
    nodes = [ctx.Process(target=serve_node, args=(args, ranks, start_s, stop, barrier), name=f"fleet-node-{i}")
             for i, ranks in enumerate(groups)]
    for node in nodes:
        node.start()
    print(f"demo.fleet: run {args.run!r}: {args.ranks} ranks x {args.seqs_per_rank} sequences in {len(nodes)} "
          f"processes", flush=True)
    deadline = time.monotonic() + args.seconds if args.seconds > 0 else float("inf")
    try:
        while not stop.is_set() and time.monotonic() < deadline and all(node.is_alive() for node in nodes):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    stop.set()
    barrier.abort()
    return _wait_for(nodes, timeout_s=NODE_EXIT_S)


NODE_EXIT_S = 120.0  # a node publishes what it holds (up to 5 s per rank) then exits; a loaded machine is slow


def _wait_for(nodes: list, timeout_s: float) -> int:
    """Join every node process within one shared deadline, terminate those still running; 0 when every node
    exited on its own with code 0, else 1 (each other outcome named once on stderr)."""
    deadline = time.monotonic() + timeout_s
    failed = 0
    for node in nodes:
        node.join(max(0.0, deadline - time.monotonic()))
        if node.is_alive():
            node.terminate()
            node.join(5)
            print(f"demo.fleet: {node.name} did not exit within {timeout_s:.0f} s: terminated", file=sys.stderr)
            failed += 1
        elif node.exitcode != 0:
            print(f"demo.fleet: {node.name} exited with code {node.exitcode}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
