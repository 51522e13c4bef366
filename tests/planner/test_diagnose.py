"""planner.diagnose: the pure analytics of `moe-monitor diagnose`, on generated counts and hand-made loads."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor.planner.advisor import advise
from moe_monitor.planner.api import plan
from moe_monitor.planner.diagnose import (
    CANDIDATES,
    Candidate,
    diagnose,
    hot_persistence,
    rank_persistence,
    score_candidates,
    verdict,
    window_bounds,
    window_sums,
)
from moe_monitor.planner.diagnose_budget import advisor_layouts, repair_layouts, repaired_layout
from moe_monitor.planner.loads import duplicates_on_gpu
from moe_monitor.planner.repair import experts_copied
from moe_monitor.planner.simulate import CostModel, straggler_tokens

E, G, L = 32, 8, 2
CHEAP = CostModel(link_gbps=1e6)        # migration nearly free


def traffic(steps: int, period: int, seed: int = 0, tokens: int = 4096) -> np.ndarray:
    """counts [steps, L, E]: a skewed popularity, its experts permuted afresh every `period` steps."""
    rng = np.random.default_rng(seed)
    base = np.sort(rng.dirichlet(np.full(E, 0.3)))[::-1]
    out = np.empty((steps, L, E))
    for t in range(steps):
        if t % period == 0:
            pop = np.stack([base[rng.permutation(E)] for _ in range(L)])
        for layer in range(L):
            out[t, layer] = rng.multinomial(tokens, pop[layer])
    return out


def contiguous() -> np.ndarray:
    return np.tile(np.arange(E), (L, 1))


def test_window_sums_and_bounds():
    values = np.arange(7)[:, None] * np.ones((1, 2))
    assert window_sums(values, 3)[:, 0].tolist() == [3, 12]           # the partial tail window left out
    assert window_bounds(7, 3) == [(3, 6), (6, 7)]


def test_rank_persistence_persistent_vs_transient():
    """Two GPUs: loads [3, 1] every step stay in the window sum (share 1); the hot GPU alternating each step
    sums to [4, 4] over two steps (share 0). Per-step excess 3 / 2 - 1 = 0.5 either way."""
    fixed = np.tile([[3.0, 1.0]], (8, 1, 1))                          # [T=8, L=1, G=2]
    out = rank_persistence(fixed, every=2)
    assert out["mean_step_excess"] == pytest.approx(0.5) and out["persistent_share"] == pytest.approx(1.0)
    assert out["same_busiest_share"] == 1.0 and out["modal_busiest_share"] == 1.0 and out["chance_share"] == 0.5
    alternating = np.array([[[3.0, 1.0]], [[1.0, 3.0]]] * 4)
    out = rank_persistence(alternating, every=2)
    assert out["mean_step_excess"] == pytest.approx(0.5) and out["persistent_share"] == pytest.approx(0.0)
    assert out["same_busiest_share"] == 0.0 and out["modal_busiest_share"] == 0.5


def test_rank_persistence_idle_and_balanced():
    out = rank_persistence(np.zeros((4, 1, 2)), every=2)
    assert out["persistent_share"] is None and out["same_busiest_share"] is None
    out = rank_persistence(np.ones((4, 1, 2)), every=2)                 # balanced: no busiest GPU to name
    assert out["mean_step_excess"] == 0.0 and out["persistent_share"] is None
    assert out["same_busiest_share"] is None and out["modal_busiest_share"] is None


def test_hot_persistence_fixed_and_moving():
    steps, every = 40, 10
    fixed = hot_persistence(traffic(steps, period=steps), every, hot_experts=2)
    assert fixed["windows"] == 4 and fixed["hot_overlap"] == pytest.approx(1.0)
    assert fixed["hot_run_steps"] == pytest.approx(40.0)              # hot for the whole trace
    counts = np.zeros((steps, 1, E))
    for w in range(4):                                               # disjoint hot pairs, one per window
        counts[w * every:(w + 1) * every, 0, [2 * w, 2 * w + 1]] = 100
        counts[w * every:(w + 1) * every, 0, 20:] = 1
    moving = hot_persistence(counts, every, hot_experts=2)
    assert moving["hot_overlap"] == 0.0 and moving["hot_run_steps"] == pytest.approx(10.0)
    assert hot_persistence(counts, every)["hot_experts"] == 2        # default E / 16


def test_candidates_in_force_priced_like_the_advisor():
    counts = traffic(60, period=60)
    cands = score_candidates(counts, contiguous(), G, 8, every=20)
    assert [c.name for c in cands] == list(CANDIDATES)
    in_force = cands[0]
    cost = CostModel()
    want = straggler_tokens(counts[20:], contiguous(), G).sum() * cost.seconds_per_token_slot
    assert in_force.steps == 40 and in_force.straggler_s == pytest.approx(want) and in_force.migration_s == 0
    assert cands[1].dispatch == "lp" and cands[1].straggler_s == pytest.approx(want)   # P = E: lp = even
    ideal = cands[-1]
    assert ideal.straggler_s == pytest.approx(0.0, abs=1e-12) and ideal.imbalance_p99 == pytest.approx(1.0)


def test_eplb_replan_migration_is_experts_copied():
    counts = traffic(60, period=60)
    cost = CostModel()
    eplb = score_candidates(counts, contiguous(), G, 8, every=20, cost=cost)[2]
    first = plan(counts[0:20].sum(0), G, 8, policy="eplb").layout_LP
    second = plan(counts[20:40].sum(0), G, 8, policy="eplb").layout_LP
    moves = experts_copied(contiguous(), first, G) + experts_copied(first, second, G)
    assert eplb.moves == moves and eplb.migration_s == pytest.approx(cost.migration_seconds(moves))
    assert eplb.changes == 2


def test_persistent_popularity_replanning_pays():
    d = diagnose(traffic(80, period=80), contiguous(), G, 8, every=20, cost=CHEAP)
    assert d.verdict["replan_pays"] is True
    assert d.ranks["persistent_share"] > 0.8 and d.hot["hot_overlap"] > 0.8
    by = {c.name: c for c in d.candidates}
    assert by["ours_replan"].imbalance_p99 < by["in_force"].imbalance_p99
    assert by["ours_replan_lp"].straggler_s <= by["ours_replan"].straggler_s * (1 + 1e-6)


def test_fast_moving_popularity_replanning_does_not_pay():
    """The popularity moves every 2 steps, the re-plan every 20: a layout fitted on the last window is no
    better than the one in force, and its migration (default prices) is lost."""
    d = diagnose(traffic(80, period=2), contiguous(), G, 8, every=20)
    assert d.verdict["replan_pays"] is False
    assert d.ranks["persistent_share"] < 0.5 and d.hot["hot_overlap"] < 0.5
    payload = d.to_json()
    assert [c["name"] for c in payload["candidates"]] == list(CANDIDATES)
    assert payload["verdict"]["text"].startswith("re-planning does not pay")


def test_repair_never_copies_more_than_its_budget_per_change():
    """Drifting popularity, a budget of 3 copies: every window's change copies at most 3 experts from the layout
    before, and the candidate's moves are those copies summed."""
    counts = traffic(100, period=30, seed=3)
    budget = 3
    bounds = window_bounds(100, 20)
    layouts = repair_layouts(counts, contiguous(), bounds, 20, G, budget)
    prev, total = contiguous(), 0
    for lay in layouts:
        copied = experts_copied(prev, lay, G)
        assert copied <= budget
        prev, total = lay, total + copied
    assert total > 0
    by = {c.name: c for c in score_candidates(counts, contiguous(), G, 8, every=20, max_moves=budget)}
    assert by["ours_repair"].moves == total and by["ours_repair"].moves <= budget * by["ours_repair"].changes
    assert by["ours_repair_lp"].moves == total
    assert by["advisor"].moves <= budget * by["advisor"].changes
    none = {c.name: c for c in score_candidates(counts, contiguous(), G, 8, every=20, max_moves=0)}
    assert none["ours_repair"].moves == 0 and none["ours_repair"].changes == 0


def test_repair_holds_layers_it_cannot_repair():
    """Layer 0 holds expert 0 twice on GPU 0 (repair cannot start there): held as it is; layer 1 is repaired."""
    counts = traffic(40, period=40)
    lay = np.tile(np.concatenate([np.arange(E), np.arange(8)]), (L, 1))      # P = 40, 5 slots per GPU
    lay[0, 1] = 0
    assert duplicates_on_gpu(lay, G).tolist() == [True, False]
    out = repaired_layout(counts[:20], lay, G, max_moves=8)
    assert (out[0] == lay[0]).all() and not (out[1] == lay[1]).all()
    assert experts_copied(lay, out, G) <= 8


def test_advisor_candidate_follows_advise():
    counts = traffic(80, period=80)
    cost = CostModel(link_gbps=50.0)
    bounds = window_bounds(80, 20)
    layouts = advisor_layouts(counts, contiguous(), bounds, 20, G, 8, max_moves=16, cost=cost)
    sched = advise(counts, G, 8, initial_LP=contiguous(), every=20, window=20, max_moves=16, cost=cost)
    for (a, _), lay in zip(bounds, layouts):
        want = [ch for ch in sched.changes if ch.step <= a][-1].layout_LP
        assert (lay == want).all()


def test_persistent_popularity_repair_loses_less_than_the_layout_in_force():
    """Default prices, enough tokens that straggler time outweighs a few copies: repairing within the
    advisor's budget every window loses less time than holding the layout in force, and so does the advisor."""
    counts = traffic(80, period=80, tokens=1 << 20)
    by = {c.name: c for c in score_candidates(counts, contiguous(), G, 8, every=20)}
    assert by["ours_repair"].moves > 0
    assert by["ours_repair"].lost_s < by["in_force"].lost_s
    assert by["advisor"].lost_s < by["in_force"].lost_s
    assert verdict(list(by.values()))["replan_pays"] is True


def test_verdict_by_hand():
    def cand(name, straggler, migration=0.0, changes=1):
        return Candidate(name, "even", 1000, 1.0, straggler, migration, changes=changes)
    v = verdict([cand("in_force", 10.0), cand("in_force_lp", 1.0), cand("eplb_replan", 2.0, 5.0),
                 cand("ours_replan", 1.0, 5.0), cand("ours_replan_lp", 0.5, 5.0), cand("ideal", 0.0)])
    assert v["replan_pays"] is True and v["best_replan"] == "ours_replan" and v["lp_on"] == "ours_replan"
    assert v["replan_gain_s_per_1000_steps"] == pytest.approx(9.0) and v["replan_migration_s_per_1000_steps"] == 5.0
    assert v["lp_lost_time_cut"] == pytest.approx(0.5 / 6.0) and v["lp_worth_it"] is False
    v = verdict([cand("in_force", 10.0), cand("in_force_lp", 9.5), cand("eplb_replan", 2.0, 9.0),
                 cand("ours_replan", 4.0, 7.0), cand("ours_replan_lp", 1.0, 1.0), cand("ideal", 0.0)])
    assert v["replan_pays"] is False and v["lp_on"] == "in_force"        # LP judged on the layout in force
    assert v["lp_lost_time_cut"] == pytest.approx(0.05) and v["lp_worth_it"] is False
    v = verdict([cand("in_force", 10.0), cand("in_force_lp", 8.0), cand("eplb_replan", 2.0, 9.0),
                 cand("ours_replan", 4.0, 7.0), cand("ours_replan_lp", 1.0, 7.0), cand("ideal", 0.0)])
    assert v["lp_worth_it"] is True and v["lp_lost_time_cut"] == pytest.approx(0.2)


def test_verdict_counts_the_budgeted_replans():
    """Full re-plans lose to the layout in force on migration, the repair within budget wins: re-planning pays,
    and LP is judged on the repair's layouts (the best re-plan with an LP twin)."""
    def cand(name, straggler, migration=0.0, changes=1):
        return Candidate(name, "even", 1000, 1.0, straggler, migration, changes=changes)
    v = verdict([cand("in_force", 10.0), cand("in_force_lp", 9.0), cand("eplb_replan", 2.0, 30.0),
                 cand("ours_replan", 1.0, 30.0), cand("ours_replan_lp", 0.5, 30.0), cand("ours_repair", 6.0, 1.0),
                 cand("ours_repair_lp", 5.0, 1.0), cand("advisor", 8.0, 0.5), cand("advisor_lp", 7.0, 0.5),
                 cand("ideal", 0.0)])
    assert v["replan_pays"] is True and v["best_replan"] == "ours_repair" and v["lp_on"] == "ours_repair"
    assert v["lp_lost_time_cut"] == pytest.approx(1.0 / 7.0) and v["lp_worth_it"] is True
    assert v["text"].startswith("re-planning pays: ours_repair saves 4.000 s") and "ours_repair's lost time" in v["text"]
    assert v["lp_borderline"] is False


def test_verdict_leaves_out_replans_that_never_change():
    """An advisor that declines every change is the layout in force under even dispatch: not a re-plan that
    pays, even when --dispatch makes the layout in force look worse; a 9 % LP cut is borderline."""
    def cand(name, straggler, migration=0.0, changes=1):
        return Candidate(name, "even", 1000, 1.0, straggler, migration, changes=changes)
    v = verdict([cand("in_force", 10.0), cand("in_force_lp", 9.1), cand("eplb_replan", 2.0, 30.0),
                 cand("advisor", 9.0, 0.0, changes=0), cand("ideal", 0.0)])
    assert v["replan_pays"] is False and v["best_replan"] == "eplb_replan" and v["lp_on"] == "in_force"
    assert v["lp_borderline"] is True and v["lp_worth_it"] is False
    assert "borderline" in v["text"] and v["text"].endswith("advisor never changed the layout")


@pytest.mark.parametrize("kwargs, words", [
    ({"every": 60}, "more than --every"),
    ({"layout": np.tile(np.arange(E), (3, 1))}, "layers"),
    ({"counts": -np.ones((30, L, E))}, "negative"),
    ({"dispatch": "fastest"}, "unknown dispatch policy"),
    ({"redundant": -1}, "--redundant"),
])
def test_bad_input(kwargs, words):
    args = {"counts": traffic(30, period=30), "layout": contiguous(), "redundant": 8, "every": 10,
            "dispatch": "even", **kwargs}
    with pytest.raises(ValueError, match=words):
        diagnose(args["counts"], args["layout"], G, args["redundant"], every=args["every"],
                 dispatch=args["dispatch"])


def test_in_force_under_lp_is_its_lp_candidate():
    counts = traffic(40, period=40)
    rng = np.random.default_rng(4)
    layout = np.stack([np.concatenate([rng.permutation(E), rng.choice(E, 8, replace=False)]) for _ in range(L)])
    cands = score_candidates(counts, layout, G, 8, every=20, dispatch="lp")
    assert cands[0].dispatch == cands[1].dispatch == "lp" and cands[0].straggler_s == cands[1].straggler_s
    even = score_candidates(counts, layout, G, 8, every=20)
    assert even[1].straggler_s == pytest.approx(cands[1].straggler_s)
    assert even[1].straggler_s <= even[0].straggler_s                 # lp never worse than even
