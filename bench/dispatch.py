"""Dispatch-aware planning benchmark: per-step tails of layouts planned for the lp and even dispatch policies.

Run: .venv/bin/python -m bench.dispatch [--baseline REV] [--turns 3]   (re-execs itself with fixed glibc malloc
settings)

Traces: per-step counts sampled (numpy multinomial, planner.synthetic.sampled_steps) from the real DeepSeek-V3
popularity of the 4 decode files in tests/data/sglang_deepseek_v3 (provenance: tests/data/README.md), MoE layers
3..3+LAYERS-1 (fewer than the 58 to keep the run short), decode batches of 64-256 tokens on each of 32 ranks (drawn
per rank and step) x top-8, G = 32 GPUs, R = 32; SEEDS seeds per file. Each case fits on FIT_STEPS steps and is
scored on the next FIT_STEPS steps (held out).

- (a) lp dispatch: our layout (plan, objective tail, dispatch lp) under lp, per-step p99 imbalance (max / mean
  GPU load of one step and layer, p99 over all held-out (step, layer) pairs, core.steptails); goal <= 1.04.
- (b) even dispatch: our tail-aware layout (objective tail, dispatch even) against EPLB's layout fitted on the
  same window's sum: per-step p99 excess (p99 imbalance - 1); goal >= 20% less.
- beside (b), the noise floor of the even split: sampling noise alone, for a layout whose every GPU has the
  same mean and the same variance (a GPU's per-step variance is the sum over its slots of count / replicas^2,
  so the replica counts fix the total; equal shares of it are the best any layout does), Gaussian per GPU;
- the lp solver (core.dispatch, core.lpsplit): DispatchModel.gpu_loads of a 600-step window of all 58 MoE layers
  on 32 GPUs (256 experts + 32 redundant slots, the default plan's layout), goal <= 1 s, beside the previous main
  (BASELINE or --baseline REV, bench/baseline.py): each tree in a child process of its own, turns interleaved,
  median of every timed call; and exactness: the busiest GPU against scipy's HiGHS (tests/support/lp_reference)
  on sampled pairs of that window and on the stress layouts of tests/support/lp_cases (random, crowded with ties
  and idle experts, chains and rings of replicated experts), as the largest absolute gap in tokens.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.malloc_env import pin_malloc

pin_malloc()
ROOT = Path(__file__).resolve().parents[1]

import numpy as np

from bench.baseline import child_json, trees
from moe_monitor.core.dispatch import DispatchModel
from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.core.steptails import step_tails
from moe_monitor.planner.api import plan
from moe_monitor.planner.eplb_ref import eplb_global
from moe_monitor.planner.synthetic import sampled_steps
from moe_monitor.planner.windows import split_windows

DATA = ROOT / "tests" / "data" / "sglang_deepseek_v3"
G, R, TOP_K, RANKS = 32, 32, 8, 32
LAYERS, FIT_STEPS, SEEDS = 12, 600, (0, 1)
FIRST_MOE_LAYER = 3
BASELINE = "2b041ee"   # the previous main (its lp dispatch water-filled)
LP_CALLS, LP_TURNS, LP_SAMPLED_PAIRS, LP_TIMED = 3, 3, 200, 2


def decode_popularity() -> dict[str, np.ndarray]:
    """name -> [58, 256] popularity of the MoE layers of each decode file."""
    out = {}
    for f in sorted(DATA.glob("decode_*.json")):
        out[f.stem] = np.array(json.loads(f.read_text())["logical_count"], dtype=np.float64)[FIRST_MOE_LAYER:]
    return out


def trace(popularity_LE: np.ndarray, steps: int, seed: int) -> np.ndarray:
    """Per-step counts [steps, L, E]: batches of 64-256 tokens per rank (per rank and step), summed over ranks."""
    rng = np.random.default_rng(seed + 1000)
    tokens_T = rng.integers(64, 257, (steps, RANKS)).sum(1)
    return sampled_steps(popularity_LE, steps, tokens_T, top_k=TOP_K, seed=seed)


def p99(counts_TLE: np.ndarray, layout_LP: np.ndarray, dispatch: str) -> float:
    """p99 over all (step, layer) pairs of the per-step imbalance under ``dispatch``."""
    value = step_tails(counts_TLE, layout_LP, G, dispatch).imbalance_summary()["p99"]
    return float("nan") if value is None else value


def even_noise_floor(counts_TLE: np.ndarray, layout_LP: np.ndarray, seed: int = 0) -> float:
    """p99 over (step, layer) pairs of max / mean of G GPU loads mean + sqrt(V / G) Z, Z ~ N(0, 1) per GPU, where
    V = sum_e count_e / replicas_e is the step's total Poisson variance of the slot loads under even split."""
    rep_LE = replica_counts(layout_LP, counts_TLE.shape[2])
    total_TL = counts_TLE.sum(-1)
    var_TL = (counts_TLE / rep_LE[None]).sum(-1)
    busy = total_TL > 0
    mean, sd = total_TL[busy] / G, np.sqrt(var_TL[busy] / G)
    loads_XG = mean[:, None] + sd[:, None] * np.random.default_rng(seed).standard_normal((mean.size, G))
    return float(np.percentile(loads_XG.max(-1) / loads_XG.mean(-1), 99))


def case(name: str, popularity_LE: np.ndarray, seed: int) -> dict[str, float]:
    steps = trace(popularity_LE[:LAYERS], 2 * FIT_STEPS, seed)
    fit, held = steps[:FIT_STEPS], steps[FIT_STEPS:]
    windows = split_windows(fit)
    eplb = eplb_global(fit.sum(0), G, R)
    window = plan(windows, G, R).layout_LP
    tail_even = plan(windows, G, R, objective="tail", dispatch="even", steps=fit).layout_LP
    tail_lp = plan(windows, G, R, objective="tail", dispatch="lp", steps=fit).layout_LP
    row = {"eplb even": p99(held, eplb, "even"), "window even": p99(held, window, "even"),
           "tail even": p99(held, tail_even, "even"), "eplb lp": p99(held, eplb, "lp"),
           "window lp": p99(held, window, "lp"), "tail-lp lp": p99(held, tail_lp, "lp"),
           "even floor": even_noise_floor(held, tail_even, seed)}
    print(f"  {name:24s} seed {seed}  " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()))
    return row


def lp_cases(popularity_LE: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray, int, list]]:
    """name -> (layout, counts [T, L, E], GPUs, the (step, layer) pairs checked against HiGHS). The first two are
    timed: 600 held-out steps of all 58 MoE layers on the default plan's layout (the goal's case), and 600 tiny
    decode steps (64 tokens x top-8 a step, most replicated experts idle or nearly: the exact path's worst
    regime among real-shaped steps) on the same layout."""
    from tests.support.lp_cases import chain_counts, chain_layout, crowded_case, random_layout
    steps = trace(popularity_LE, 2 * FIT_STEPS, 7)
    layout = plan(split_windows(steps[:FIT_STEPS]), G, R).layout_LP
    held = steps[FIT_STEPS:]
    rng = np.random.default_rng(0)
    sampled = sorted({(int(t), int(layer)) for t, layer in zip(rng.integers(0, FIT_STEPS, LP_SAMPLED_PAIRS),
                                                                 rng.integers(0, held.shape[1], LP_SAMPLED_PAIRS))})

    def every(counts):
        return [(t, layer) for t in range(counts.shape[0]) for layer in range(counts.shape[1])]

    tiny = sampled_steps(popularity_LE, FIT_STEPS, np.full(FIT_STEPS, 64), top_k=TOP_K, seed=8)
    cases = {"600 steps x 58 layers x 32 GPUs": (layout, held, G, sampled),
             "600 tiny steps (64 tokens)": (layout, tiny, G, sampled)}
    for seed in range(6):
        rng = np.random.default_rng(seed)
        lay = random_layout(rng, 4, 24, 6, redundant=12, allow_duplicates=seed % 2 == 1)
        counts = rng.gamma(0.5, 40.0, size=(5, 4, 24)).round()
        cases[f"random 24 experts on 6 GPUs, seed {seed}"] = (lay, counts, 6, every(counts))
    for seed in range(40):
        lay, counts, gpus = crowded_case(seed)
        cases[f"crowded {seed}"] = (lay, counts, gpus, every(counts))
    for ring in (False, True):
        lay = chain_layout(16, ring)
        counts = chain_counts(lay, 16)
        cases["ring of 16 GPUs" if ring else "chain of 16 GPUs"] = (lay, counts, 16, every(counts))
    return cases


def lp_child(path: str) -> None:
    """--child PATH: this process's moe_monitor on the cases saved at PATH; one JSON line: the timed cases'
    seconds per gpu_loads call (after one untimed call) and every case's busiest GPU on its checked pairs."""
    saved = np.load(path, allow_pickle=True)
    cases = saved["cases"].item()
    out: dict = {"seconds": {}, "busiest": {}}
    for i, (name, (layout, counts, gpus, pairs)) in enumerate(cases.items()):
        model = DispatchModel(layout, counts.shape[2], gpus, "lp")
        loads = model.gpu_loads(counts)
        if i < LP_TIMED:
            out["seconds"][name] = []
            for _ in range(LP_CALLS):
                t0 = time.perf_counter()
                model.gpu_loads(counts)
                out["seconds"][name].append(time.perf_counter() - t0)
        out["busiest"][name] = [float(loads[t, layer].max()) for t, layer in pairs]
    print(json.dumps(out))


def lp_report(popularity_LE: np.ndarray, baseline: str, turns: int) -> tuple[float, float]:
    """Prints the lp solver's time and exactness for this tree beside the baseline's; (this tree's median
    seconds, its largest gap to HiGHS in tokens)."""
    from tests.support.lp_reference import busiest_gpu_optimum
    cases = lp_cases(popularity_LE)
    optimum = {name: [busiest_gpu_optimum(counts[t, layer], layout[layer], gpus) for t, layer in pairs]
               for name, (layout, counts, gpus, pairs) in cases.items()}
    found = trees(baseline)
    runs: dict[str, list[dict]] = {tree: [] for tree in found}
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as folder:
        path = str(Path(folder) / "cases.npz")
        np.savez(path, cases=np.array(cases, dtype=object))
        for _ in range(turns):
            for tree, root in found.items():
                runs[tree].append(child_json("bench.dispatch", [path], root))
    names = list(cases)
    layout0, counts0 = cases[names[0]][:2]
    print(f"\nlp solver: DispatchModel(...).gpu_loads of {counts0.shape[0]} steps x {counts0.shape[1]} layers x {G} "
          f"GPUs ({counts0.shape[2]} experts + {layout0.shape[1] - counts0.shape[2]} redundant slots); each tree in "
          f"its own process, {turns} turns interleaved x {LP_CALLS} calls, median")
    medians: dict[str, dict[str, float]] = {}
    gaps = {}
    for tree, got in runs.items():
        medians[tree] = {name: statistics.median(s for run in got for s in run["seconds"][name])
                         for name in names[:LP_TIMED]}
        busiest = got[0]["busiest"]
        gaps[tree] = {name: max(abs(b - o) for b, o in zip(busiest[name], optimum[name])) for name in cases}
    for name in names[:LP_TIMED]:
        cells = "   ".join(f"{tree} {medians[tree][name]:.3f} s" for tree in runs)
        ratio = (f"   {baseline} / this tree: {medians[baseline][name] / medians['this tree'][name]:.1f}x"
                 if len(runs) > 1 else "")
        print(f"  {name:34s} {cells}{ratio}")
    name0 = names[0]
    groups = {"600-step case, sampled pairs": [name0],
              "600 tiny steps, sampled pairs": [names[1]],
              "random layouts (6 seeds)": [n for n in cases if n.startswith("random")],
              "crowded layouts: ties, idle experts (40)": [n for n in cases if n.startswith("crowded")],
              "chains and rings of replicated experts": [n for n in cases if "16 GPUs" in n]}
    print("  exactness: largest |busiest GPU - HiGHS optimum| in tokens (pairs checked)")
    for label, names in groups.items():
        n = sum(len(cases[name][3]) for name in names)
        cells = "  ".join(f"{tree} {max(gaps[tree][name] for name in names):.2e}" for tree in runs)
        print(f"    {label:42s} ({n:4d})  {cells}")
    worst = max(gaps["this tree"].values())
    return medians["this tree"][name0], worst


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", default=BASELINE,
                        help="the revision whose lp solver is timed beside this tree's ('' for none)")
    parser.add_argument("--turns", type=int, default=LP_TURNS, help="child processes per tree, interleaved")
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        lp_child(args.child)
        return
    pops = decode_popularity()
    t0 = time.perf_counter()
    print(f"per-step tails, {len(pops)} decode files x {len(SEEDS)} seeds, layers {FIRST_MOE_LAYER}.."
          f"{FIRST_MOE_LAYER + LAYERS - 1}, G={G}, R={R}, batches 64-256 tokens x {RANKS} ranks x top-{TOP_K}; "
          f"fit on {FIT_STEPS} steps, p99 of the next {FIT_STEPS} (held out)")
    rows = [case(name, pop, seed) for name, pop in pops.items() for seed in SEEDS]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    worst_lp = max(r["tail-lp lp"] for r in rows)
    print("  mean over cases          " + "  ".join(f"{k} {v:.4f}" for k, v in mean.items()))
    less = 1 - (mean["tail even"] - 1) / (mean["eplb even"] - 1)
    print(f"  ({time.perf_counter() - t0:.0f} s)")
    secs, gap = lp_report(next(iter(pops.values())), args.baseline, args.turns)
    print("\ngoals")
    print(f"  (a) lp dispatch on our layout, per-step p99 imbalance: mean {mean['tail-lp lp']:.4f}, worst case "
          f"{worst_lp:.4f} (EPLB's layout under lp {mean['eplb lp']:.4f})   goal <= 1.04   "
          f"{verdict(worst_lp <= 1.04)}")
    print(f"  (b) even split, our tail-aware layout vs EPLB: p99 excess {mean['tail even'] - 1:.4f} vs "
          f"{mean['eplb even'] - 1:.4f} = {less:.1%} less   goal >= 20% less   {verdict(less >= 0.20)}")
    floor_less = 1 - (mean["even floor"] - 1) / (mean["eplb even"] - 1)
    print(f"      noise floor of any layout with these replica counts under even split: p99 excess "
          f"{mean['even floor'] - 1:.4f} = {floor_less:.1%} less than EPLB at most (sampling noise of "
          f"{RANKS} x 64-256 tokens x top-{TOP_K} per step)")
    print(f"  lp solver, 600 steps x 58 layers x 32 GPUs: {secs:.2f} s   goal <= 1 s   {verdict(secs <= 1.0)}")
    print(f"  lp exact: largest gap to HiGHS {gap:.1e} tokens   goal: rounding (<= 1e-6)   {verdict(gap <= 1e-6)}")


if __name__ == "__main__":
    main()
