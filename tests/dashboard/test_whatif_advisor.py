"""The rebalance advisor's one decision (planner.advisor.advise_now) and its line on the What-if page: a skewed
run says "rebalance now" and its layout can be shown in the editor; a balanced run says "not worth it yet"."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.planner.advisor import advise, advise_now
from moe_monitor.planner.repair import experts_copied
from moe_monitor.planner.simulate import CostModel
from tests.support import synthfill
from tests.support.apptest import app_test, open_page

L, E, G = 4, 16, 4
COST = CostModel.for_sizes(64, 32, 2)


def _counts(skewed: bool, steps: int = 200, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pop = np.ones(E)
    if skewed:
        pop[0], pop[1] = 30.0, 20.0  # both on GPU 0 of the contiguous layout
    return np.stack([rng.multinomial(4096, pop / pop.sum(), size=L) for _ in range(steps)])


def test_a_skewed_window_is_worth_a_rebalance():
    current = np.tile(np.arange(E), (L, 1))
    advice = advise_now(_counts(True), current, G, COST)
    assert advice.rebalance and advice.moves > 0
    assert advice.moves == experts_copied(current, advice.layout_LP, G)
    assert advice.gain_ratio > advice.migration_ratio > 0
    assert advice.gain_s == pytest.approx(advice.gain_ratio * advice.step_s * advice.horizon_steps)


def test_a_balanced_window_is_not_worth_it_and_agrees_with_the_schedule():
    current = np.tile(np.arange(E), (L, 1))
    counts = _counts(False)
    advice = advise_now(counts, current, G, COST)
    assert not advice.rebalance and advice.gain_ratio < advice.migration_ratio + 1e-12
    # advise() on the same steps (one decision point at the end) schedules no change either
    both = np.concatenate([counts, counts[:1]])
    schedule = advise(both, G, 0, initial_LP=current, every=200, window=200, cost=COST)
    assert len(schedule.changes) == 1


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="layers"):
        advise_now(_counts(True, steps=4), np.tile(np.arange(E), (L + 1, 1)), G, COST)
    idle = advise_now(np.zeros((3, L, E), dtype=np.int64), np.tile(np.arange(E), (L, 1)), G, COST)
    assert not idle.rebalance and idle.moves == 0 and "no tokens" in idle.reason


def _fill(client, run: str, skewed: bool) -> None:
    client.set(core.meta_key(run), core.encode_meta(synthfill.make_meta(run, L, E, gpus=G)))
    for step, counts_LE in enumerate(_counts(skewed, steps=80)):
        rec = core.StepRecord(run=run, rank=0, world_size=1, step=step, time_s=1_700_000_000.0 + step * 0.1,
                              phase="decode", tokens=4096, counts_LE=counts_LE.astype(np.int32))
        client.xadd(core.steps_key(run), core.encode_step(rec))
    client.zadd(core.RUNS_KEY, {run: 1_700_000_100.0 + (1 if skewed else 0)})


@pytest.mark.parametrize("skewed", [True, False])
def test_the_advisor_line_on_the_whatif_page(redis_url, monkeypatch, skewed):
    client = core.connect(redis_url, timeout_s=2.0)
    run = "advise-skewed" if skewed else "advise-balanced"
    _fill(client, run, skewed)
    monkeypatch.setenv("REDIS_URL", redis_url)
    at = app_test()
    at.session_state["run"] = run
    at.run()
    open_page(at, "page_files/whatif.py")
    assert not at.exception, at.exception
    lines = [x.value for x in (*at.success, *at.info) if "Rebalance advisor" in x.value]
    assert len(lines) == 1
    if not skewed:
        assert "not worth it yet (predicted gain" in lines[0]
        return
    assert "rebalance now:" in lines[0] and "predicted gain" in lines[0] and "over the next 1,000 steps" in lines[0]
    moves = int(lines[0].split("rebalance now: ")[1].split(" move")[0])
    at.button(key="whatif_advice_show").click().run()
    assert not at.exception, at.exception
    assert any("rebalance advisor" in c.value and f"{moves} moves" in c.value for c in at.caption)
    shown = next(m.value for m in at.metric if m.label.startswith("moves"))
    assert shown == f"{moves:,}"
    at.button(key="whatif_advice_back").click().run()
    assert not at.exception and not any("rebalance advisor (" in c.value for c in at.caption)
