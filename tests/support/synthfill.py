"""WIRE-LEVEL filler for reader-side tests: writes hand-made StepRecords, RunMeta and GpuSamples to Redis
with core.encode_* exactly as a collector would, but without a model. Page tests use the real collector
(tests/realfill.py); this stays for cases a real model cannot produce on demand: several ranks per step,
malformed entries, a run that stopped long ago, exact hand-computed counts.
"""
from __future__ import annotations

import time

import numpy as np

from moe_monitor import core


def make_meta(run: str, num_layers: int, num_experts: int, gpus: int, nodes: int = 1, world_size: int = 1,
              layout: list[list[int]] | None = None, started_s: float | None = None,
              instance: str = "") -> core.RunMeta:
    return core.RunMeta(
        run=run, model_name="synthetic-moe", layer_names=[f"model.layers.{i}.mlp" for i in range(num_layers)],
        num_experts=num_experts, top_k=2, hidden_size=64, moe_intermediate_size=32, dtype_bytes=2,
        layout=core.Layout(gpus=gpus, nodes=nodes,
                           physical_to_logical_map=layout or core.contiguous_layout(num_layers, num_experts)),
        world_size=world_size, started_s=time.time() if started_s is None else started_s, host="synth-host",
        instance=instance,
    )


def skewed_counts(rng: np.random.Generator, num_layers: int, num_experts: int, tokens: int,
                  hot_expert: int = 0, hot_share: float = 0.3) -> np.ndarray:
    """int32 [L, E]: `tokens` routed per layer, hot_share of them to hot_expert, the rest uniform."""
    hot = int(tokens * hot_share)
    counts = rng.multinomial(tokens - hot, np.full(num_experts, 1.0 / num_experts), size=num_layers)
    counts[:, hot_expert] += hot
    return counts.astype(np.int32)


def fill(client, run: str, steps: int = 30, num_layers: int = 4, num_experts: int = 16, gpus: int = 4,
         world_size: int = 1, tokens: int = 256, seed: int = 0, time0_s: float | None = None,
         step_s: float = 0.1, meta: bool = True, gpu_status: str = "unavailable", instance: str = "",
         first_step: int = 0, ranks: list[int] | None = None) -> list[np.ndarray]:
    """Write `steps` steps (ids first_step...) x `world_size` ranks (or only `ranks`) as collector process
    `instance`; return the per-step counts summed over the written ranks ([L, E] each).
    Odd steps are decode, even steps prefill."""
    rng = np.random.default_rng(seed)
    t0 = time.time() - steps * step_s if time0_s is None else time0_s
    if meta:
        client.set(core.meta_key(run), core.encode_meta(make_meta(run, num_layers, num_experts, gpus,
                                                                  world_size=world_size, instance=instance)))
    totals = []
    pipe = client.pipeline(transaction=False)
    for step in range(first_step, first_step + steps):
        total = np.zeros((num_layers, num_experts), dtype=np.int32)
        for rank in (range(world_size) if ranks is None else ranks):
            counts = skewed_counts(rng, num_layers, num_experts, tokens, hot_expert=(step // 10) % num_experts)
            total += counts
            rec = core.StepRecord(run=run, rank=rank, world_size=world_size, step=step,
                                  time_s=t0 + (step - first_step) * step_s, phase="prefill" if step % 2 == 0 else
                                  "decode", tokens=tokens, counts_LE=counts, instance=instance)
            pipe.xadd(core.steps_key(run), core.encode_step(rec))
        totals.append(total)
    if gpu_status == "unavailable":
        sample = core.GpuSample(rank=0, host="synth-host", time_s=t0, status="unavailable",
                                reason="NVML Shared Library Not Found")
        pipe.xadd(core.gpu_key(run), core.encode_gpu_sample(sample))
    pipe.zadd(core.RUNS_KEY, {run: t0 + steps * step_s})
    pipe.execute()
    return totals


def add_bad_entry(client, run: str) -> None:
    """A step entry whose counts have the wrong byte length (what a buggy or foreign writer might send)."""
    client.xadd(core.steps_key(run), {"v": core.SCHEMA_VERSION, "run": run, "rank": 0, "world": 1, "step": 10**6,
                                      "t": "1.0", "phase": "decode", "tokens": 1, "L": 4, "E": 16,
                                      "counts": b"\x00\x01\x02", "dropped": 0})


def fill_skewed(client, run: str, steps: int = 20, num_layers: int = 2, num_experts: int = 8, gpus: int = 4,
                tokens: int = 64) -> None:
    """A run whose every token of every layer goes to expert 0 (contiguous layout): GPU 0 of `gpus` does all
    the work, so balancedness is exactly 1 / gpus. Steps end at the current time, one second apart."""
    client.set(core.meta_key(run), core.encode_meta(make_meta(run, num_layers, num_experts, gpus=gpus)))
    counts = np.zeros((num_layers, num_experts), dtype=np.int32)
    counts[:, 0] = tokens
    now = time.time()
    for step in range(steps):
        rec = core.StepRecord(run=run, rank=0, world_size=1, step=step, time_s=now - steps + step,
                              phase="decode", tokens=tokens, counts_LE=counts)
        client.xadd(core.steps_key(run), core.encode_step(rec))
    client.zadd(core.RUNS_KEY, {run: now})


def alternating_phases(steps: int = 240, num_layers: int = 2, num_experts: int = 64, tokens: int = 40_000,
                       seed: int = 3) -> np.ndarray:
    """float [T, L, E]: two phases that alternate step by step, each with its own 8 hot experts (6x the others):
    their sum is flat, so any layout balances the window, while a layout that puts one phase's hot experts
    together has a busy GPU every step (the tail objective's case)."""
    rng = np.random.default_rng(seed)
    pop_TLE = np.ones((steps, num_layers, num_experts))
    for t in range(steps):
        pop_TLE[t, :, (t % 2) * 8:(t % 2) * 8 + 8] = 6.0
    return np.stack([[rng.multinomial(tokens, p / p.sum()) for p in pop_TLE[t]] for t in range(steps)]).astype(float)
