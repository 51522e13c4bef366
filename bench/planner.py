"""Planner benchmark: first the default's goals (the command a user runs, `moe-monitor plan` with no --policy),
each beside its goal and beside the previous main (BASELINE, measured in a child process whose moe_monitor is
that revision's, bench/baseline.py): leave-one-out over the 12 DeepSeek-V3 workloads, the margin against EPLB
fitted on the last window under random-walk drift, the small cases of vLLM's EPLB tests (EPLB, ours, the
optimum), and the tail objective's share of the gap from EPLB to the noise floor. Then: speed side by side
with the EPLB-parity policy, fitted-window gaps, hierarchical numbers, leave-one-out held-out table on the 12 DeepSeek-V3 workloads, next-window drift scores, and a
closing table of the issue's anchors (EPLB parity vs ours), and the rebalance advisor's goals: total time
lost (straggler + migration, planner.simulate's cost model) of the advisor against static and periodic
re-plans on drifting per-step traces, and next-window excess imbalance of the robust plan against EPLB fitted
on the last window under random-walk drift.

Run: .venv/bin/python -m bench.planner [--baseline REV]   (re-execs itself with fixed glibc malloc settings)
Held-out measure: per held-out file, mean over its 58 MoE layers of max/mean GPU load; then the mean
and the worst across the 12 files. Default: plan() with no policy, fitted on the 11 other files stacked as
windows (each normalised per layer by the planner); robust: on the 11 other files (each normalised);
EPLB: the EPLB-parity global policy fitted on the raw sum of the 11 other files. R = 32, G = 32.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.malloc_env import pin_malloc

# the planner allocates large temporaries: keep them out of mmap and never trim
pin_malloc({"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824",
            "MALLOC_TOP_PAD_": "268435456"})
ROOT = Path(__file__).resolve().parents[1]

import numpy as np

from bench.baseline import child_json, export_package
from moe_monitor.core.loadmodel import gpu_loads
from moe_monitor.planner.advisor import advise, initial_layout, periodic_schedule, static_schedule
from moe_monitor.planner.api import plan
from moe_monitor.planner.bounds import best_bound, group_partition_bound
from moe_monitor.planner.eplb_ref import eplb_global, eplb_hierarchical
from moe_monitor.planner.loads import layer_imbalance
from moe_monitor.planner.simulate import CostModel, simulate
from moe_monitor.planner.synthetic import drifting_windows, skewed_counts

DATA = ROOT / "tests" / "data" / "sglang_deepseek_v3"
G = 32
BASELINE = "2b041ee"   # the previous main
DRIFT_SEEDS = {"bench seeds 0-2": (0, 1, 2), "fresh seeds 10-12": (10, 11, 12)}
# the inputs of vLLM's EPLB unit tests, as facts:
# (name, weights [L][E], physical slots, groups, nodes, GPUs)
SMALL_CASES = (
    ("basic (DeepSeek's example)", [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                                    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]], 16, 4, 2, 8),
    ("equal weights", [[50] * 8], 8, 2, 2, 4),
    ("extreme weight imbalance", [[1000, 1, 1, 1, 1, 1, 1, 1]], 12, 2, 2, 4),
    ("multiple layers", [[10, 20, 30, 40, 50, 60], [60, 50, 40, 30, 20, 10], [25] * 6], 8, 2, 2, 4),
    ("parameter validation", [[10, 20, 30, 40]], 8, 3, 2, 4),
    ("small_scale_hierarchical", [[100, 50, 200, 75, 150, 25, 300, 80]], 12, 4, 2, 4),
    ("global load balance fallback", [[10, 20, 30, 40, 50, 60]], 8, 3, 2, 4),
    ("device compatibility", [[10, 20, 30, 40]], 6, 2, 1, 2),
    ("additional cases 1", [[50, 100, 75, 120, 90, 60, 80, 110, 40, 70, 95, 85, 65, 55, 45, 35]], 24, 8, 4, 8),
    ("additional cases 2", [[200, 150, 100, 50, 25, 12], [12, 25, 50, 100, 150, 200]], 10, 3, 1, 2),
)


def load():
    files = sorted(DATA.glob("*.json"))
    return [f.stem for f in files], np.array([json.loads(f.read_text())["logical_count"] for f in files], float)


def default_figures(C) -> dict:
    """The default's figures with whichever moe_monitor this process imports (this tree, or the baseline's in a
    child): leave-one-out per held-out file, next-window excess per drift window, small cases' max GPU load per
    layer. Only APIs the baseline has too."""
    loo = [float(layer_imbalance(C[k], plan(np.delete(C, k, axis=0), G, 32).layout_LP, G).mean())
           for k in range(C.shape[0])]
    drift_ex = {}
    for label, seeds in DRIFT_SEEDS.items():
        ex = []
        for seed in seeds:
            c = drifting_windows(windows=12, layers=16, seed=seed)
            ex += [float(layer_imbalance(c[t], plan(c[:t], G, 32).layout_LP, G).mean() - 1) for t in range(4, 12)]
        drift_ex[label] = ex
    small = {}
    for name, w, slots, _, _, gpus in SMALL_CASES:
        c = np.array(w, dtype=float)
        small[name] = gpu_loads(c, plan(c, gpus, slots - c.shape[1]).layout_LP, gpus).max(-1).tolist()
    return {"loo": loo, "drift": drift_ex, "small": small}


def eplb_small(c, slots: int, groups: int, nodes: int, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """(max GPU load per layer, whether some GPU holds two copies of one expert) of EPLB as vLLM runs it:
    hierarchical where groups split the experts and nodes split the groups, else global."""
    from moe_monitor.planner.loads import duplicates_on_gpu
    E = c.shape[1]
    R = slots - E
    if E % groups == 0 and groups % nodes == 0 and gpus % nodes == 0 and R % nodes == 0:
        lay = eplb_hierarchical(c, gpus, R, nodes, groups)
    else:
        lay = eplb_global(c, gpus, R)
    return gpu_loads(c, lay, gpus).max(-1), duplicates_on_gpu(lay, gpus)


def default_goals(C, baseline: str) -> None:
    """The default's goals, this tree beside the previous main (module docstring)."""
    t0 = time.perf_counter()
    now = default_figures(C)
    t_now = time.perf_counter() - t0
    prev, why = None, "not asked"
    if baseline:
        root, why = export_package(baseline)
        if root is not None:
            prev = child_json("bench.planner", [], root)
    col = baseline if prev is not None else "previous main"

    def old(key: str, fmt: str = ".4f", minus: float | None = None, label: str = "") -> str:
        if prev is None:
            return "n/a"
        v = prev[key][label] if label else prev[key]
        return format(np.mean(v) if minus is None else minus - np.mean(v), fmt)

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    loo = np.array(now["loo"])
    rob, epl = [], []
    for k in range(C.shape[0]):
        train = np.delete(C, k, axis=0)
        rob.append(layer_imbalance(C[k], plan(train, G, 32, policy="robust").layout_LP, G).mean())
        epl.append(layer_imbalance(C[k], eplb_global(train.sum(0), G, 32), G).mean())
    print("the default (`moe-monitor plan --load F --gpus 32 --redundant 32`, no --policy): its goals"
          f"{'' if prev is not None else f' (previous main: {why})'}")
    print(f"  {'figure':46s} {'this tree':>10s} {col:>13s}  goal")
    print(f"  {'leave-one-out, mean over 12 files':46s} {loo.mean():10.4f} "
          f"{old('loo'):>13s}  <= 1.03  {verdict(loo.mean() <= 1.03)}")
    prev_worst = f"{np.max(prev['loo']):.4f}" if prev is not None else "n/a"
    print(f"  {'leave-one-out, worst file':46s} {loo.max():10.4f} "
          f"{prev_worst:>13s}  <= 1.08  {verdict(loo.max() <= 1.08)}")
    print(f"    beside it: --policy robust {np.mean(rob):.4f} / {np.max(rob):.4f}, EPLB on the 11 files' sum "
          f"{np.mean(epl):.4f} / {np.max(epl):.4f} (mean / worst)")
    for label, seeds in DRIFT_SEEDS.items():
        eplb_ex = []
        for seed in seeds:
            c = drifting_windows(windows=12, layers=16, seed=seed)
            eplb_ex += [layer_imbalance(c[t], eplb_global(c[t - 1], G, 32), G).mean() - 1 for t in range(4, 12)]
        base = float(np.mean(eplb_ex))
        ours = float(np.mean(now["drift"][label]))
        print(f"  {'drift ' + label + ': margin vs EPLB-last':46s} {base - ours:+10.4f} "
              f"{old('drift', '+.4f', base, label):>13s}  >= 0  {verdict(ours <= base)}")
        print(f"    next-window excess (max/mean - 1), {len(seeds)} seeds x 8 windows, 16 layers: default {ours:.4f}"
              f", EPLB on the last window {base:.4f} ({1 - ours / base:+.1%} less); default lower on "
              f"{np.mean(np.array(now['drift'][label]) < np.array(eplb_ex)):.0%} of the windows")
    print(f"  ({t_now:.0f} s for this tree's default figures)")
    small_cases(now, prev, col)


def small_cases(now: dict, prev: dict | None, col: str) -> None:
    """The table of vLLM's EPLB test inputs: EPLB (as vLLM runs it), ours (default) here and before, optimum."""
    print("\nsmall cases from vLLM's EPLB tests: max GPU load per layer (one copy of an expert per GPU in ours)")
    print(f"  {'case':34s} {'G':>2s} {'P':>3s} {'EPLB':>9s} {col:>13s} {'ours':>9s} {'optimum':>10s}  goal: ours <= EPLB "
          "(where EPLB keeps one copy per GPU), = optimum")
    fails = 0
    for name, w, slots, groups, nodes, gpus in SMALL_CASES:
        c = np.array(w, dtype=float)
        eplb_max, dup = eplb_small(c, slots, groups, nodes, gpus)
        res = plan(c, gpus, slots - c.shape[1])
        for layer in range(c.shape[0]):
            ours = now["small"][name][layer]
            opt = (f"{res.max_load_L[layer]:.2f}" if res.optimal_L[layer]
                   else f">={res.bound_load_L[layer]:.2f}")
            ok = (dup[layer] or ours <= eplb_max[layer] * (1 + 1e-9)) and (
                not res.optimal_L[layer] or ours <= res.max_load_L[layer] * (1 + 1e-9))
            fails += not ok
            label = name if c.shape[0] == 1 else f"{name} L{layer}"
            prev_s = f"{prev['small'][name][layer]:.2f}" if prev is not None else "n/a"
            print(f"  {label:34s} {gpus:2d} {slots:3d} {eplb_max[layer]:8.2f}{'*' if dup[layer] else ' '} "
                  f"{prev_s:>13s} {ours:9.2f} {opt:>10s}  {'PASS' if ok else 'FAIL'}")
    print(f"  * EPLB puts two copies of one expert on one GPU there, which the planner's rule forbids: ours is held to "
          f"the optimum there, not to EPLB; {fails} case(s) fail")


def tail_floor_share(files: int = 4, seeds: tuple[int, ...] = (0, 1)) -> None:
    """The tail objective against its floor (bench.dispatch's setting and traces: decode popularity,
    12 MoE layers, 32 ranks x 64-256 tokens x top-8, fit on 600 steps, p99 of the next 600): under an even split,
    the share of the gap from EPLB's p99 excess to the noise floor's that the tail layout closes; and the
    two-phase case where planning for the tail pays (tests/planner/test_plan_dispatch.py's construction)."""
    from bench.dispatch import FIT_STEPS, LAYERS, decode_popularity, even_noise_floor, p99, trace
    from moe_monitor.planner.windows import split_windows

    t0 = time.perf_counter()
    rows = []
    for pop in list(decode_popularity().values())[:files]:
        for seed in seeds:
            steps = trace(pop[:LAYERS], 2 * FIT_STEPS, seed)
            fit, held = steps[:FIT_STEPS], steps[FIT_STEPS:]
            tail = plan(split_windows(fit), G, 32, objective="tail", dispatch="even", steps=fit).layout_LP
            rows.append((p99(held, eplb_global(fit.sum(0), G, 32), "even"), p99(held, tail, "even"),
                         even_noise_floor(held, tail, seed)))
    e, t, f = np.mean(rows, axis=0) - 1
    share = (e - t) / (e - f) if e > f else float("nan")
    print(f"\ntail objective under even split ({files} decode files x seeds {seeds}, as bench.dispatch): p99 excess EPLB {e:.4f}, tail "
          f"layout {t:.4f}, noise floor {f:.4f}: closes {share:.0%} of the gap from EPLB to the floor   goal >= 80%"
          f"   {'PASS' if share >= 0.8 else 'FAIL'}")
    from moe_monitor.core.steptails import step_tails
    from tests.support.synthfill import alternating_phases

    g, steps2 = 8, alternating_phases()
    fit2, held2 = steps2[:160], steps2[160:]

    def p99_8(lay):
        return step_tails(held2, lay, g, "even").imbalance_summary()["p99"]
    window = p99_8(plan(split_windows(fit2), g, 8).layout_LP)
    tail2 = p99_8(plan(split_windows(fit2), g, 8, objective="tail", steps=fit2).layout_LP)
    print(f"  two alternating phases (64 experts, 8 GPUs, R=8): p99 {window:.2f} with the window layout, {tail2:.2f} "
          f"with the tail layout  ({time.perf_counter() - t0:.0f} s)")


def child_main() -> None:
    """--child: the default's figures as one JSON line (run with the baseline's moe_monitor)."""
    names, C = load()
    print(json.dumps(default_figures(C[:, C[0].sum(1) > 0])))


def speed(c, runs=9):
    out = {}
    for R in (32, 0):
        t_ours, t_eplb = [], []
        plan(c, G, R, policy="refined")
        eplb_global(c, G, R)
        for _ in range(runs):
            t0 = time.perf_counter()
            eplb_global(c, G, R)
            t1 = time.perf_counter()
            plan(c, G, R, policy="refined")
            t2 = time.perf_counter()
            t_eplb.append(t1 - t0)
            t_ours.append(t2 - t1)
        me, mo = np.median(t_eplb) * 1e3, np.median(t_ours) * 1e3
        print(f"speed 61x256, R={R}, G=32 (median of {runs} interleaved runs)")
        print(f"  EPLB-parity global   {me:8.1f} ms")
        print(f"  planner (refined)    {mo:8.1f} ms   (layout + refinement + bounds + predictions)")
        print(f"  ratio planner/EPLB   {mo / me:8.2f}x")
        out[R] = (me, mo)
    return out


def fitted(names, C):
    print("\nfitted window: gap to lower bound (imbalance / bound - 1), mean / max over MoE layers")
    cases = [(f"synthetic sigma=0.7 seed={s}", skewed_counts(seed=s)) for s in (0, 1)]
    cases += [(n, C[i][C[i].sum(1) > 0]) for i, n in enumerate(names)]
    print(f"  {'case':34s} {'R':>3s}  {'EPLB mean':>9s} {'EPLB max':>9s}  {'ours mean':>9s} {'ours max':>9s}"
          f"  {'>0.1%':>5s}")
    res = {}
    for name, c in cases:
        for R in (0, 32, 64):
            b = best_bound(c, G, R)
            ge = layer_imbalance(c, eplb_global(c, G, R), G) / b - 1
            go = plan(c, G, R, policy="refined").gap_L
            res[name, R] = (ge, go)
            print(f"  {name:34s} {R:3d}  {ge.mean():9.4%} {ge.max():9.4%}  {go.mean():9.4%} {go.max():9.4%}"
                  f"  {int((go > 0.001).sum()):5d}")
    return res


def hierarchical():
    c = skewed_counts(seed=0)
    print("\nhierarchical, 58 synthetic layers (sigma=0.7), N=4 nodes, K=8 groups")
    floor = group_partition_bound(c, G, 4, 8)
    print(f"  group floor             mean {floor.mean():.4f} worst {floor.max():.4f}")
    out = {}
    for R in (32, 64):
        e = layer_imbalance(c, eplb_hierarchical(c, G, R, 4, 8), G)
        res = plan(c, G, R, nodes=4, groups=8, policy="hierarchical")
        print(f"  R={R:2d} EPLB hierarchical  mean {e.mean():.4f} worst {e.max():.4f}")
        print(f"  R={R:2d} ours (cross-node)  mean {res.imbalance_L.mean():.4f} worst {res.imbalance_L.max():.4f}"
              f"  off-node share {res.off_node_L.mean():.3f}")
        out[R] = (e, res.imbalance_L)
    return out


def leave_one_out(names, C):
    C = C[:, C[0].sum(1) > 0]
    print("\nleave-one-out, R=32, G=32: per held-out file, mean over 58 layers of max/mean (worst layer); ours: the "
          "default")
    rows = []
    t0 = time.perf_counter()
    for k, n in enumerate(names):
        train = np.delete(C, k, axis=0)
        e = layer_imbalance(C[k], eplb_global(train.sum(0), G, 32), G)
        o = layer_imbalance(C[k], plan(train, G, 32).layout_LP, G)
        rows.append((e.mean(), e.max(), o.mean(), o.max()))
        print(f"  {n:24s} EPLB {e.mean():.4f} ({e.max():.3f})   ours {o.mean():.4f} ({o.max():.3f})")
    r = np.array(rows)
    print(f"  {'mean over files':24s} EPLB {r[:, 0].mean():.4f}           ours {r[:, 2].mean():.4f}")
    print(f"  {'worst file':24s} EPLB {r[:, 0].max():.4f}           ours {r[:, 2].max():.4f}")
    print(f"  {'worst layer':24s} EPLB {r[:, 1].max():.4f}           ours {r[:, 3].max():.4f}")
    print(f"  ({time.perf_counter() - t0:.1f} s for 12 fits of each)")
    return r


def drift():
    c = drifting_windows(windows=12, layers=16, seed=5)
    print("\ndrift (synthetic random-walk popularity, 16 layers): fit on windows 0..t-1, score on t")
    res = {"EPLB on sum": [], "ours decay=1.0": [], "ours decay=0.6": []}
    for t in range(4, 12):
        res["EPLB on sum"].append(layer_imbalance(c[t], eplb_global(c[:t].sum(0), G, 32), G).mean())
        for d in (1.0, 0.6):
            lay = plan(c[:t], G, 32, policy="robust", decay=d).layout_LP
            res[f"ours decay={d}"].append(layer_imbalance(c[t], lay, G).mean())
    for k, v in res.items():
        print(f"  {k:16s} mean {np.mean(v):.4f} worst {np.max(v):.4f}")


def anchors(sp, fit, hier, loo):
    """The issue's anchors in one compact table: EPLB parity beside ours."""
    syn = [k for k in fit if k[0].startswith("synthetic")]
    real = [k for k in fit if not k[0].startswith("synthetic")]

    def agg(keys, R, who):
        v = [fit[k][who] for k in keys if k[1] == R]
        return f"{np.mean([x.mean() for x in v]):.3%} / {max(x.max() for x in v):.3%}"

    rows = [(f"fitted gap, synthetic, R={R} (mean/worst)", agg(syn, R, 0), agg(syn, R, 1), "<= 0.1% worst")
            for R in (32, 64, 0)]
    rows += [(f"fitted gap, 12 real files, R={R}", agg(real, R, 0), agg(real, R, 1), "<= 0.1% worst")
             for R in (32, 0)]
    for R, (e, o) in hier.items():
        rows.append((f"hierarchical 58 synthetic, R={R} (mean/worst)", f"{e.mean():.4f} / {e.max():.4f}",
                     f"{o.mean():.4f} / {o.max():.4f}", "mean <= 1.02, worst <= 1.06"))
    rows.append(("leave-one-out 12 files R=32 (mean/worst file)", f"{loo[:, 0].mean():.4f} / {loo[:, 0].max():.4f}",
                 f"{loo[:, 2].mean():.4f} / {loo[:, 2].max():.4f}", "mean <= 1.03, worst <= 1.08"))
    for R, (me, mo) in sp.items():
        rows.append((f"speed 61x256 R={R} ms (ratio)", f"{me:.1f}", f"{mo:.1f} ({mo / me:.1f}x)",
                     "<= 500 ms" if R else "<= 1000 ms"))
    print("\nanchors (EPLB parity vs ours)")
    print(f"  {'anchor':48s} {'EPLB':>22s} {'ours':>22s}  target")
    for name, e, o, tgt in rows:
        print(f"  {name:48s} {e:>22s} {o:>22s}  {tgt}")


ADV_SEEDS = (0, 1, 2)
ADV_STEPS, ADV_LAYERS, ADV_TOKENS, ADV_DRIFT = 4000, 12, 65536, 0.01
PERIODS = (250, 500, 1000, 2000)


def advisor_goal(link_gbps=400.0, seeds=ADV_SEEDS):
    """Goal (a): per seed, a drifting per-step trace (synthetic random walk of log-popularity, sigma 0.9, step
    ADV_DRIFT per step; ADV_TOKENS expert assignments per layer per step, i.e. 8192 tokens x top-8); every
    policy starts from the same layout planned on the first 1,000 steps; periodic = EPLB on the last 1,000
    steps every N; the advisor decides every 250 steps. Sums over seeds."""
    cost = CostModel(link_gbps=link_gbps)
    print(f"\nadvisor vs periodic re-plans: {len(seeds)} seeds x {ADV_STEPS} steps, {ADV_LAYERS} layers x 256 "
          f"experts, G=32, R=32, drift {ADV_DRIFT}/step, link {link_gbps:g} Gb/s shared "
          f"({cost.seconds_per_token_slot:.3g} s per token-slot, {cost.bytes_per_expert / 1e6:.0f} MB per expert)")
    totals: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    for seed in seeds:
        c = drifting_windows(windows=ADV_STEPS, layers=ADV_LAYERS, sigma=0.9, drift=ADV_DRIFT, tokens=ADV_TOKENS,
                             seed=seed)
        init = initial_layout(c, G, 32)
        scheds = {"static": static_schedule(init, G)}
        scheds |= {f"periodic N={n}": periodic_schedule(c, G, 32, n, initial_LP=init, cost=cost) for n in PERIODS}
        scheds["advisor"] = advise(c, G, 32, initial_LP=init, cost=cost)
        for name, sc in scheds.items():
            r = simulate(c, sc, cost)
            acc = totals.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            for i, v in enumerate((r.straggler_s, r.migration_s, r.total_s, r.moves)):
                acc[i] += v
    print(f"  {'policy':16s} {'straggler s':>11s} {'migration s':>11s} {'total s':>9s} {'moves':>7s}")
    for name, (st_s, mi_s, tot, mv) in totals.items():
        print(f"  {name:16s} {st_s:11.3f} {mi_s:11.3f} {tot:9.3f} {int(mv):7d}")
    best = min((k for k in totals if k.startswith("periodic")), key=lambda k: totals[k][2])
    adv, per = totals["advisor"], totals[best]
    less = 1 - adv[2] / per[2]
    share = adv[3] / per[3] if per[3] else float("inf")
    print(f"  best periodic: {best}; advisor loses {less:.1%} less time (goal >= 30%), with {share:.1%} of its "
          f"moves (goal <= 25%); vs static: {1 - adv[2] / totals['static'][2]:.1%} less  "
          f"({time.perf_counter() - t0:.0f} s)")
    return less, share


def robust_goal(seeds=(0, 1, 2)):
    """Goal (b): random-walk drift (planner.synthetic.drifting_windows, 12 windows, 16 layers); for t = 4..11
    fit on windows < t, score on window t: excess imbalance (max/mean - 1, mean over layers), robust (on all
    past windows) against EPLB on the last window."""
    print("\nrobust vs EPLB on the last window, next-window excess imbalance (max/mean - 1), "
          f"{len(seeds)} seeds x 8 windows, 16 layers, G=32, R=32")
    ex: dict[str, list[float]] = {"EPLB last window": [], "default (auto)": [], "robust decay=1.0": [],
                                  "robust decay=0.6": [], "hindsight": []}
    for seed in seeds:
        c = drifting_windows(windows=12, layers=16, seed=seed)
        for t in range(4, 12):
            ex["EPLB last window"].append(layer_imbalance(c[t], eplb_global(c[t - 1], G, 32), G).mean() - 1)
            # the default: plan's auto policy, the robust fit whose blend the held-in backtest picks
            ex["default (auto)"].append(layer_imbalance(c[t], plan(c[:t], G, 32).layout_LP, G).mean() - 1)
            for d in (1.0, 0.6):
                lay = plan(c[:t], G, 32, policy="robust", decay=d).layout_LP
                ex[f"robust decay={d}"].append(layer_imbalance(c[t], lay, G).mean() - 1)
            # the floor: refined on the scored window itself (knows the drift that no past fit can)
            ex["hindsight"].append(layer_imbalance(c[t], plan(c[t], G, 32, policy="refined").layout_LP, G).mean() - 1)
    base = np.mean(ex["EPLB last window"])
    out = {}
    for k, v in ex.items():
        red = 1 - np.mean(v) / base
        out[k] = red
        print(f"  {k:18s} mean excess {np.mean(v):.4f}  worst {np.max(v):.4f}"
              + ("" if k.startswith("EPLB") else f"  {red:.1%} less than EPLB"
                 + (" (goal >= 30%)" if k.startswith(("robust", "default"))
                   else " (not a policy: fitted on the future)")))
    worse = np.mean(ex["default (auto)"]) > base
    print(f"  default never worse than EPLB on the last window (goal): {'FAIL' if worse else 'PASS'}")
    floor = drift_floor(G, (256 + 32) // G)
    print(f"  floor for ANY layout fixed before the window: {floor:.4f} = {1 - floor / base:.1%} less than EPLB at "
          f"most (each GPU's {(256 + 32) // G} slots perfectly equal on the last window, then each expert's "
          f"popularity moves by the drift's own N(0, 0.15) in log space: the next window's busiest of {G} GPUs "
          f"sits this far above the mean whatever the layout; a goal of 30% less needs {0.7 * base:.4f})")
    return out


def drift_floor(gpus: int, slots_per_gpu: int, drift: float = 0.15, draws: int = 4000, seed: int = 0) -> float:
    """Expected next-window excess imbalance (max/mean - 1) of the best layout fixed before the window under
    log-space random-walk drift: every slot carries an equal share on the last window and moves by an
    independent lognormal factor exp(N(0, drift^2)) (a GPU's slots hold distinct experts)."""
    rng = np.random.default_rng(seed)
    loads_DG = np.exp(rng.normal(0.0, drift, (draws, gpus, slots_per_gpu))).sum(-1)
    return float(np.mean(loads_DG.max(-1) / loads_DG.mean(-1) - 1.0))


def time_goal(names, C, layers=16, steps=200):
    """The time objective against EPLB and our token default on decode steps drawn from the 4 real decode
    workloads' popularity (first ``layers`` MoE layers each), R = 32, DeepSeek-V3 dimensions in fp8 on the
    H100 SXM profile, round-robin tokens (whole tokens per replica): held-out p99 per layer of the slowest GPU's
    predicted seconds, summed over layers, mean over workloads. bound: the mean GPU under the EPLB layout."""
    from moe_monitor.core.costmodel import ModelDims, TimeModel
    from moe_monitor.core.hardware import GPU_PROFILES
    from moe_monitor.planner.synthetic import sampled_steps
    from moe_monitor.planner.timecost import slowest_and_mean_s

    dims = ModelDims(7168, 2048, 3, weight_bytes=1.0, act_bytes=2.0)
    print("\ntime objective: decode steps from the real DeepSeek-V3 popularity, R=32, H100 SXM, fp8, round-robin;"
          "\n  p99 over held-out steps of the slowest GPU's predicted MoE-layer time, summed over "
          f"{layers} layers (mean of the 4 decode workloads)")
    print(f"  {'GPUs':>4s} {'nodes':>5s} {'tok/rank':>8s} {'EPLB us':>9s} {'tokens us':>9s} {'time us':>9s} "
          f"{'mean-GPU us':>11s} {'time/EPLB':>9s}  goal <= 0.90")
    rows = []
    decode = [i for i, n in enumerate(names) if n.startswith("decode")]
    for gpus, nodes in ((32, 4), (8, 1)):
        model = TimeModel(dims, GPU_PROFILES["H100 SXM"], gpus, nodes)
        for per_rank in (64, 256):
            figs = []
            for i in decode:
                pop = C[i][C[i].sum(1) > 0][:layers]
                fit = sampled_steps(pop, steps, per_rank * gpus, seed=1)
                held = sampled_steps(pop, steps, per_rank * gpus, seed=2)
                eplb = eplb_global(fit.sum(0), gpus, 32)
                tokens = plan(fit.sum(0), gpus, 32).layout_LP
                timed = plan(fit.sum(0), gpus, 32, objective="time", steps=fit, time_model=model,
                             dispatch="round_robin").layout_LP
                times = [slowest_and_mean_s(held, lay, gpus, "round_robin", model) for lay in (eplb, tokens, timed)]
                p99 = [np.percentile(slowest_TL, 99, axis=0).sum() for slowest_TL, _ in times]
                mean_TL = times[0][1]                     # the mean GPU under EPLB's layout
                figs.append(p99 + [np.percentile(mean_TL, 99, axis=0).sum()])
            e, t, m, b = (np.mean(col) * 1e6 for col in zip(*figs))
            rows.append(m / e)
            print(f"  {gpus:4d} {nodes:5d} {per_rank:8d} {e:9.1f} {t:9.1f} {m:9.1f} {b:11.1f} {m / e:9.3f}  "
                  f"{'PASS' if m / e <= 0.90 else 'MISS'}")
    print("  mean-GPU: the EPLB layout's mean GPU; where it is within 10% of EPLB, balancing the same slots cannot "
          "reach the goal")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", metavar="REV", default=BASELINE,
                        help="the previous main the default's goals are printed beside ('' for none)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main()
        return
    names, C = load()
    default_goals(C[:, C[0].sum(1) > 0], args.baseline)
    tail_floor_share()
    sp = speed(C[names.index("prefill_in1024")])
    fit = fitted(names, C)
    hier = hierarchical()
    loo = leave_one_out(names, C)
    drift()
    anchors(sp, fit, hier, loo)
    robust_goal()
    advisor_goal()
    advisor_goal(link_gbps=32 * 400.0, seeds=(0,))   # sensitivity: 32 links of 400 Gb/s moving in parallel
    time_goal(names, C)


if __name__ == "__main__":
    main()
