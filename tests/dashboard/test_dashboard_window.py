"""The step window: ranks summed, ring eviction, phase sums, cached loads equal a full recompute."""
import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core.loadmodel import gpu_weights, weighted_loads
from moe_monitor.dashboard.live.window import StepWindow
from tests.support.assembled import add_rank


def rec(step, counts, rank=0, world=1, phase="decode", tokens=4, t=None):
    return core.StepRecord(run="w", rank=rank, world_size=world, step=step, time_s=float(step if t is None else t),
                           phase=phase, tokens=tokens, counts_LE=np.asarray(counts, dtype=np.int32))


P2L = [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_ranks_of_a_step_are_summed():
    w = StepWindow(4, 2, 4)
    add_rank(w, rec(0, [[1, 0, 0, 0], [0, 0, 0, 1]], rank=0, world=2))
    add_rank(w, rec(0, [[0, 2, 0, 0], [0, 0, 3, 0]], rank=1, world=2, tokens=6))
    view = w.view("both", P2L, 2)
    assert view.num_steps == 1 and list(view.ranks_T) == [2] and list(view.tokens_T) == [10]
    np.testing.assert_allclose(view.loads_TLG[0], [[3, 0], [0, 4]])
    with pytest.raises(ValueError, match="twice"):
        add_rank(w, rec(0, [[1, 0, 0, 0], [0, 0, 0, 1]], rank=1, world=2))


def test_ring_evicts_oldest_and_keeps_sums():
    rng = np.random.default_rng(0)
    w = StepWindow(3, 2, 4)
    all_counts = [rng.integers(0, 9, size=(2, 4)) for _ in range(5)]
    for step, counts in enumerate(all_counts):
        add_rank(w, rec(step, counts, phase="prefill" if step % 2 == 0 else "decode"))
    view = w.view("both", P2L, 2)
    assert list(view.step_T) == [2, 3, 4]
    np.testing.assert_array_equal(view.counts_sum_LE, sum(all_counts[2:]))
    prefill = w.view("prefill", P2L, 2)
    assert list(prefill.step_T) == [2, 4]
    np.testing.assert_array_equal(prefill.counts_sum_LE, all_counts[2] + all_counts[4])
    with pytest.raises(ValueError, match="older than the window"):
        add_rank(w, rec(1, all_counts[0]))


def test_mixed_phases_across_ranks_become_mixed():
    w = StepWindow(2, 1, 2)
    add_rank(w, rec(0, [[1, 1]], rank=0, world=2, phase="prefill"))
    add_rank(w, rec(0, [[1, 1]], rank=1, world=2, phase="decode"))
    assert list(w.view("both", [[0, 1]], 1).phase_T) == ["mixed"]
    assert w.view("prefill", [[0, 1]], 1).num_steps == 0


def test_cached_loads_match_full_recompute_after_updates_and_layout_change():
    rng = np.random.default_rng(2)
    w = StepWindow(5, 2, 4)
    for step in range(8):
        for rank in range(2):
            add_rank(w, rec(step, rng.integers(0, 20, size=(2, 4)), rank=rank, world=2))
            w.view("both", P2L, 2)  # the cache is refreshed between ranks on purpose
    slots = w.ordered_slots()
    for p2l, gpus in ((P2L, 2), ([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 0, 0]], 3)):
        expected = weighted_loads(w.counts_CLE[slots], gpu_weights(p2l, 4, gpus))
        np.testing.assert_allclose(w.view("both", p2l, gpus).loads_TLG, expected)


def test_latest_complete_waits_for_all_ranks():
    w = StepWindow(4, 1, 2)
    add_rank(w, rec(0, [[1, 1]], rank=0, world=2))
    add_rank(w, rec(0, [[1, 1]], rank=1, world=2))
    add_rank(w, rec(1, [[1, 1]], rank=0, world=2))
    view = w.view("both", [[0, 1]], 1)
    assert w.latest_complete(view) == 0


def test_wrong_shape_is_refused():
    w = StepWindow(2, 2, 4)
    with pytest.raises(ValueError, match="this run is"):
        add_rank(w, rec(0, [[1, 2, 3]]))


def test_steps_missing_ranks_stay_out_of_window_statistics_until_the_grace_period(redis_url):
    import time

    from moe_monitor.dashboard.live.watched import WatchedRun
    from moe_monitor.dashboard.live.window import PENDING_GRACE_S
    from moe_monitor.dashboard.sources.redis import RedisSource
    from tests.support import synthfill

    client = core.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 0.5
    complete = synthfill.fill(client, "part", steps=5, world_size=3, time0_s=t0)
    synthfill.fill(client, "part", steps=1, first_step=5, world_size=3, ranks=[0, 2], time0_s=t0 + 0.5, meta=False)
    # deadline 0: step 5, short of rank 1, is assembled at once; the window keeps it out of views for the grace
    watched = WatchedRun(RedisSource(client, redis_url, "part", window_steps=20), window_steps=20, deadline_s=0.0)
    watched.tick()
    p2l = [list(range(16))] * 4
    view = watched.window.view("both", p2l, 4)
    assert list(view.step_T) == [0, 1, 2, 3, 4] and list(view.ranks_T) == [3] * 5
    np.testing.assert_array_equal(view.counts_sum_LE, sum(complete))
    late = watched.window.view("both", p2l, 4, now_s=time.time() + PENDING_GRACE_S + 1)
    assert list(late.step_T) == [0, 1, 2, 3, 4, 5] and late.ranks_T[-1] == 2
