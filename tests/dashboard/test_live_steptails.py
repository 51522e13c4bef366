"""dashboard.live.steptails: the per-step figures of a live window equal core.steptails on the same steps, each
step solved once (per policy and layout), each under the layout in force at its step."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.core.dispatch import DISPATCH_POLICIES, DispatchModel
from moe_monitor.core.steptails import tails_of
from moe_monitor.dashboard.live import steptails as live
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.layout_changes import LayoutChange
from moe_monitor.dashboard.live.window import StepWindow
from tests.support.assembled import add_rank
from tests.support.solvecount import count_solved_steps

L, E, G = 3, 8, 4
REPLICATED = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 0, 2]] * L)  # experts 0, 1, 2 on two or three GPUs (S = 3)
OTHER = np.array([[7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4]] * L)


def _window(steps: int, capacity: int = 64, seed: int = 0) -> StepWindow:
    window = StepWindow(capacity, L, E, membudget.MemoryBudget(1 << 28))
    rng = np.random.default_rng(seed)
    for step in range(steps):
        _add(window, step, rng)
    return window


def _add(window: StepWindow, step: int, rng, rank: int = 0, world: int = 1) -> None:
    counts = rng.poisson(rng.uniform(0, 30, size=(L, E))).astype(np.int32)
    counts[2] = 0 if step % 5 == 0 else counts[2]  # an idle pair now and then
    add_rank(window, core.StepRecord(run="w", rank=rank, world_size=world, step=step, time_s=1.0e9 + step, phase="decode",
                               tokens=int(counts.sum()), counts_LE=counts))


def _layout(map_LP=REPLICATED, changes=()):
    return resolve_layout(_meta(map_LP), L, E, changes=changes)


def _meta(map_LP):
    return core.RunMeta(run="w", model_name="m", layer_names=[f"l{i}" for i in range(L)], num_experts=E, top_k=2,
                        hidden_size=0, moe_intermediate_size=0, dtype_bytes=2,
                        layout=core.Layout(G, 1, [list(r) for r in map_LP]))


def _assert_same(got, want):
    np.testing.assert_array_equal(np.isnan(got.imbalance_TL), np.isnan(want.imbalance_TL))
    np.testing.assert_allclose(got.imbalance_TL, want.imbalance_TL, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(got.skew_TL, want.skew_TL, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(got.window_loads_LG, want.window_loads_LG, rtol=1e-6)
    assert got.imbalance_summary() == pytest.approx(want.imbalance_summary())
    assert got.skew_summary() == pytest.approx(want.skew_summary())
    assert got.ideal_fraction == pytest.approx(want.ideal_fraction)
    assert got.window_imbalance == pytest.approx(want.window_imbalance, rel=1e-6)


@pytest.mark.parametrize("policy", DISPATCH_POLICIES)
def test_equal_to_core_steptails_on_the_same_window(policy):
    window = _window(40)
    layout = _layout()
    assert layout.gpus == G
    slots = window.ordered_slots()
    got = live.live_tails(window, slots, layout, policy, max_rows=None)
    want = tails_of(DispatchModel(REPLICATED, E, G, policy), window.counts_CLE[slots])
    _assert_same(got.tails, want)
    assert got.pending == 0 and got.solved_now == 40 and list(got.step_T) == list(range(40))


def test_each_step_is_solved_once_and_only_new_steps_cost_a_tick(monkeypatch):
    solved = count_solved_steps(monkeypatch)
    window, layout = _window(30, capacity=32), _layout()
    first = live.live_tails(window, window.ordered_slots(), layout, "lp", max_rows=None)
    again = live.live_tails(window, window.ordered_slots(), layout, "lp", max_rows=None)
    assert (first.solved_now, again.solved_now, sum(solved)) == (30, 0, 30)
    rng = np.random.default_rng(5)
    for step in range(30, 35):  # the ring wraps: 3 rows leave, 5 arrive
        _add(window, step, rng)
    slots = window.ordered_slots()
    later = live.live_tails(window, slots, layout, "lp", max_rows=None)
    assert later.solved_now == 5 and sum(solved) == 35
    _assert_same(later.tails, tails_of(DispatchModel(REPLICATED, E, G, "lp"), window.counts_CLE[slots]))
    assert live.live_tails(window, slots, layout, "even").solved_now == 32  # another policy: its own rows


def test_a_row_that_changed_is_solved_again():
    window = StepWindow(8, L, E, membudget.MemoryBudget(1 << 26))
    rng = np.random.default_rng(1)
    for step in range(4):
        _add(window, step, rng, rank=0, world=2)
    layout = _layout()
    live.live_tails(window, window.ordered_slots(), layout, "round_robin")
    _add(window, 2, rng, rank=1, world=2)  # a late rank of step 2
    slots = window.ordered_slots()
    got = live.live_tails(window, slots, layout, "round_robin")
    assert got.solved_now == 1
    _assert_same(got.tails, tails_of(DispatchModel(REPLICATED, E, G, "round_robin"), window.counts_CLE[slots]))


def test_each_step_uses_the_layout_in_force():
    window = _window(20)
    changes = (LayoutChange.of(12, OTHER, G, 1, "engine", 1.0),)
    layout = _layout(REPLICATED, changes)
    assert len(layout.schedule) == 2
    slots = window.ordered_slots()
    got = live.live_tails(window, slots, layout, "lp", max_rows=None)
    before = tails_of(DispatchModel(REPLICATED, E, G, "lp"), window.counts_CLE[slots[:12]])
    after = tails_of(DispatchModel(OTHER, E, G, "lp"), window.counts_CLE[slots[12:]])
    np.testing.assert_allclose(got.tails.imbalance_TL, np.concatenate([before.imbalance_TL, after.imbalance_TL]),
                               equal_nan=True)
    np.testing.assert_allclose(got.tails.window_loads_LG, before.window_loads_LG + after.window_loads_LG, rtol=1e-6)


def test_lp_catches_up_on_a_backlog_newest_first():
    window, layout = _window(50), _layout()
    slots = window.ordered_slots()
    first = live.live_tails(window, slots, layout, "lp", max_rows=20)
    assert (first.tails.steps, first.pending, list(first.step_T)) == (20, 30, list(range(30, 50)))
    second = live.live_tails(window, slots, layout, "lp", max_rows=20)
    third = live.live_tails(window, slots, layout, "lp", max_rows=20)
    assert (second.pending, third.pending, third.solved_now) == (10, 0, 10)
    _assert_same(third.tails, tails_of(DispatchModel(REPLICATED, E, G, "lp"), window.counts_CLE[slots]))
    assert live.live_tails(window, slots, layout, "lp").solved_now == 0


def test_refusals():
    window = _window(3)
    with pytest.raises(ValueError, match="unknown dispatch policy"):
        live.live_tails(window, window.ordered_slots(), _layout(), "fastest")
    tight = StepWindow(4, L, E, membudget.MemoryBudget(StepWindow.step_bytes(L, E) * 4 +
                                                       StepWindow.fixed_bytes(L, E) + 16))
    with pytest.raises(ValueError, match="per-step figures of this window"):
        live.live_tails(tight, tight.ordered_slots(), _layout(), "even")
