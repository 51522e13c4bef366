"""The collector-restart rule (core.restarts), pure: one rank's restart retires that rank only, most ranks
restarting open a new epoch, a restarted rank rejoins when its step ids reach the others', implausible steps and
world claims are named."""
import numpy as np
import pytest

from moe_monitor.core.restarts import Judgement, RankInstances, capped_world
from moe_monitor.core.steps import StepRecord

J = Judgement


def run_of(world: int, step: int = 100) -> RankInstances:
    rule = RankInstances(max_retired=64)
    for rank in range(world):
        assert rule.judge(rank, f"a{rank}", step, 10.0, world) is J.FIRST
    return rule


def test_one_rank_restarting_is_held_until_its_step_ids_reach_the_others():
    rule = run_of(4)
    assert rule.judge(2, "b2", 0, 20.0, 4) is J.HELD and rule.held == {2} and "a2" in rule.retired
    assert "rank 2" in rule.why and "behind" in rule.why
    assert rule.judge(2, "a2", 101, 21.0, 4) is J.STALE  # its old instance is retired, not the others'
    assert rule.judge(0, "a0", 101, 21.0, 4) is J.CURRENT
    assert rule.judge(2, "b2", 50, 22.0, 4) is J.HELD
    assert rule.judge(2, "b2", 100, 23.0, 4) is J.REJOINED and rule.held == set()  # the slowest rank's newest
    assert rule.judge(2, "b2", 101, 23.0, 4) is J.CURRENT


def test_a_restart_whose_step_ids_go_on_rejoins_at_once_and_an_older_instance_is_stale():
    rule = run_of(4)
    assert rule.judge(1, "b1", 100, 20.0, 4) is J.REJOINED and rule.instance_of_rank[1] == "b1"
    assert rule.judge(1, "z1", 100, 5.0, 4) is J.STALE  # first seen now, but older than b1: late records


def test_most_ranks_restarting_open_a_new_epoch_that_retires_the_others():
    rule = run_of(5)
    assert [rule.judge(r, f"b{r}", 0, 20.0, 5) for r in (0, 1)] == [J.HELD, J.HELD]
    assert rule.judge(2, "b2", 0, 20.0, 5) is J.NEW_EPOCH  # 3 of 5
    assert rule.instance_of_rank == {0: "b0", 1: "b1", 2: "b2"} and {"a3", "a4"} <= set(rule.retired)
    assert rule.judge(3, "a3", 101, 21.0, 5) is J.STALE
    assert rule.judge(3, "b3", 1, 21.0, 5) is J.FIRST
    assert rule.judge(0, "b0", 1, 21.0, 5) is J.CURRENT


def test_a_single_rank_run_restarting_is_a_new_epoch():
    rule = run_of(1)
    assert rule.judge(0, "b0", 0, 20.0, 1) is J.NEW_EPOCH


def test_step_ids_far_ahead_are_implausible_and_change_nothing():
    rule = run_of(2)
    assert rule.judge(0, "a0", 4_600_000_000_000_000_000, 20.0, 2) is J.IMPLAUSIBLE
    assert rule.newest_step[0] == 100 and "beyond the newest" in rule.why
    assert rule.judge(5, "x5", 10**12, 20.0, 2) is J.IMPLAUSIBLE and 5 not in rule.instance_of_rank
    assert rule.judge(0, "a0", 101, 20.0, 2) is J.CURRENT


def test_world_claims_count_under_the_metadata_world_and_a_rank_beyond_it_is_refused():
    rec = StepRecord(run="r", rank=3, world_size=65_536, step=0, time_s=1.0, phase="decode", tokens=1,
                     counts_LE=np.zeros((1, 2), dtype=np.int32))
    capped, why = capped_world(rec, 4)
    assert capped.world_size == 4 and "65536" in why and capped.counts_LE is rec.counts_LE
    assert capped_world(rec, None) == (rec, "") and capped_world(rec, 65_536) == (rec, "")
    with pytest.raises(ValueError, match="run metadata says 2 ranks"):
        capped_world(rec, 2)
