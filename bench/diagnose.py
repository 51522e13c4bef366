"""Diagnose benchmark: does `moe-monitor diagnose` tell a persistent imbalance (re-planning pays) from hot experts
that move faster than the re-plan interval (it does not)?

Two per-step traces from the real DeepSeek-V3 popularity (tests/data/sglang_deepseek_v3/decode_in1000out1000.json:
61 layers x 256 experts, layers 0-2 dense and zero), 32 GPUs, R = 32 redundant slots per layer. Each step, every
one of the 32 ranks decodes a batch of 64-256 tokens (uniform), and each layer's token-slots (tokens x top-8) are
drawn with numpy's multinomial from the layer's popularity (slots drawn independently: the top-k's "no expert
twice" is not modelled). The layout in force is EPLB's plan on the recorded popularity as published:

- persistent: the popularity of every layer has its experts permuted once, at step 0 (a fixed permutation the
  layout in force did not assume), and stays so;
- fast-moving: the popularity is permuted afresh every MOVE_EVERY steps, far faster than the re-plan interval
  (--every EVERY steps).

Goals: persistent -> diagnose says re-planning pays; fast-moving -> it says it does not. The goals are judged
under the advisor's default prices (planner.simulate.CostModel(): one 400 Gb/s link shared by all of a
change's copies), with the re-plans of `moe-monitor diagnose` at its defaults (--max-moves = the advisor's
DEFAULT_MAX_MOVES); the verdict with each GPU's own 400 Gb/s link moving its copies in parallel (link_gbps =
32 x 400, as planner/simulate.py says to model G links) is printed beside it, for information only. Prints one
PASS / FAIL line per goal; exit status 1 on a FAIL.

Run: .venv/bin/python -m bench.diagnose [--layers N] [--steps T] [--every N] [--max-moves K]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from moe_monitor.planner.advisor import DEFAULT_MAX_MOVES
from moe_monitor.planner.api import plan
from moe_monitor.planner.diagnose import diagnose
from moe_monitor.planner.simulate import DEFAULT_LINK_GBPS, CostModel

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "sglang_deepseek_v3" / "decode_in1000out1000.json"
G, R, TOP_K, RANKS = 32, 32, 8, 32
BATCH_MIN, BATCH_MAX = 64, 256          # decode tokens per rank and step
STEPS, EVERY, MOVE_EVERY = 1000, 250, 20


def popularity_LE(layers: int | None) -> np.ndarray:
    """The recorded popularity float64 [L, E] (rows sum to 1; dense layers 0), the first `layers` layers."""
    counts = np.asarray(json.loads(DATA.read_text())["logical_count"], dtype=np.float64)
    counts = counts if layers is None else counts[:layers]
    sums = counts.sum(1, keepdims=True)
    return np.divide(counts, sums, out=np.zeros_like(counts), where=sums > 0)


def trace_TLE(pop_LE: np.ndarray, steps: int, move_every: int, rng: np.random.Generator) -> np.ndarray:
    """Per-step counts float64 [T, L, E]: each layer's popularity permuted every `move_every` steps (from step 0),
    RANKS x U[BATCH_MIN, BATCH_MAX] tokens a step, TOP_K token-slots each, drawn by multinomial."""
    L, E = pop_LE.shape
    active = pop_LE.sum(1) > 0
    out = np.zeros((steps, L, E))
    current = pop_LE
    for t in range(steps):
        if t % move_every == 0:
            current = np.stack([row[rng.permutation(E)] for row in pop_LE])
        slots = int(rng.integers(BATCH_MIN, BATCH_MAX + 1, size=RANKS).sum()) * TOP_K
        for layer in np.flatnonzero(active):
            out[t, layer] = rng.multinomial(slots, current[layer])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description="diagnose: persistent vs fast-moving hot experts")
    ap.add_argument("--layers", type=int, default=None, help="first N layers only (default: all 61)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--every", type=int, default=EVERY)
    ap.add_argument("--move-every", type=int, default=MOVE_EVERY)
    ap.add_argument("--max-moves", type=int, default=DEFAULT_MAX_MOVES, help="expert copies per change at most")
    args = ap.parse_args()
    pop = popularity_LE(args.layers)
    L, E = pop.shape
    per_gpu_links = CostModel(link_gbps=G * DEFAULT_LINK_GBPS)
    shared_link = CostModel()
    initial = plan(np.where(pop.sum(1, keepdims=True) > 0, pop, 1.0), G, R, policy="eplb").layout_LP
    print(f"bench.diagnose: DeepSeek-V3 popularity, {L} layers{'' if args.layers is None else ' (of 61)'} x {E} "
          f"experts, {G} GPUs, R = {R}, {args.steps} steps of {RANKS} ranks x {BATCH_MIN}-{BATCH_MAX} tokens x "
          f"top-{TOP_K}; re-plan every {args.every} steps; layout in force: EPLB on the unpermuted popularity")
    print(f"goals judged with migration priced as the advisor prices it by default: one shared "
          f"{DEFAULT_LINK_GBPS:g} Gb/s link; --max-moves {args.max_moves}")
    rng = np.random.default_rng(20251202)
    failed = False
    goals = (("persistent", args.steps, True), ("fast-moving", args.move_every, False))
    for name, move_every, want_pays in goals:
        t0 = time.perf_counter()
        counts = trace_TLE(pop, args.steps, move_every, rng)
        t1 = time.perf_counter()
        d = diagnose(counts, initial, G, R, every=args.every, cost=shared_link, max_moves=args.max_moves).to_json()
        t2 = time.perf_counter()
        per_gpu = diagnose(counts, initial, G, R, every=args.every, cost=per_gpu_links,
                           max_moves=args.max_moves).to_json()
        ranks, hot = d["rank_persistence"], d["hot_persistence"]
        moved = "never moves" if move_every >= args.steps else f"moves every {move_every} steps"
        print(f"\n[{name}] popularity {moved} (generated in {t1 - t0:.1f} s, diagnosed in {t2 - t1:.1f} s)")
        print(f"  persistent share of the per-step excess {ranks['persistent_share']:.3f}, hot-set overlap of "
              f"consecutive windows {hot['hot_overlap']:.3f}, hot run {hot['hot_run_steps']:.0f} steps, "
              f"expert skew p99 {d['expert_skew']['p99']:.2f}")
        print(f"  {'':<15} {'p99':>6}  lost s / 1,000 steps: one shared link (straggler + migration)   "
              f"| per-GPU links")
        for c, other in zip(d["candidates"], per_gpu["candidates"]):
            print(f"  {c['name']:<15} {c['per_step_imbalance_p99']:6.3f}  {c['lost_s_per_1000_steps']:8.3f} "
                  f"({c['straggler_s_per_1000_steps']:.3f} + {c['migration_s_per_1000_steps']:.3f}, "
                  f"{c['moves']} copies in {c['changes']} changes)".ljust(88)
                  + f"| {other['lost_s_per_1000_steps']:8.3f} ({other['moves']} copies)")
        print(f"  verdict: {d['verdict']['text']}")
        print(f"  (per-GPU links instead: {per_gpu['verdict']['text']})")
        ok = d["verdict"]["replan_pays"] is want_pays
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'} {name} (one shared link): re-planning "
              f"{'pays' if want_pays else 'does not pay'} (diagnose says it "
              f"{'pays' if d['verdict']['replan_pays'] else 'does not pay'}: best re-plan "
              f"{d['verdict']['best_replan']})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
