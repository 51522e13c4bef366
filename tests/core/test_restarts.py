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
    assert rule.judge(2, "b2", 0, 20.0, 4) is J.HELD and rule.held == {2} and "a2" in rule.retired  # a2 stopped
    assert "rank 2" in rule.why and "behind" in rule.why
    assert rule.judge(2, "a2", 100, 21.0, 4) is J.STALE  # a late record of its old instance (no newer step)
    assert rule.judge(0, "a0", 101, 21.0, 4) is J.CURRENT
    assert rule.judge(2, "b2", 50, 22.0, 4) is J.HELD
    assert rule.judge(2, "b2", 100, 23.0, 4) is J.REJOINED and rule.held == set()  # the slowest rank's newest
    assert rule.judge(2, "b2", 101, 23.0, 4) is J.CURRENT


def test_a_restart_whose_step_ids_go_on_rejoins_at_once_and_an_older_instance_is_stale():
    rule = run_of(4)
    assert rule.judge(1, "b1", 101, 10.1, 4) is J.REJOINED and rule.instance_of_rank[1] == "b1"  # passed a1
    assert rule.promoted == "b1" and "passed" in rule.why
    assert rule.judge(1, "z1", 100, 5.0, 4) is J.STALE  # first seen now, but older than b1: late records


def test_most_ranks_restarting_open_a_new_epoch_once_the_others_stopped():
    rule = run_of(5)
    assert [rule.judge(r, f"b{r}", 0, 20.0, 5) for r in (0, 1)] == [J.HELD, J.HELD]
    assert rule.judge(2, "b2", 0, 20.0, 5) is J.NEW_EPOCH  # 3 of 5, and a3, a4 wrote nothing for 10 s
    assert rule.instance_of_rank == {0: "b0", 1: "b1", 2: "b2"} and {"a3", "a4"} <= set(rule.retired)
    assert rule.judge(3, "a3", 100, 21.0, 5) is J.STALE  # a late record of a stopped instance
    assert rule.judge(3, "b3", 1, 21.0, 5) is J.FIRST
    assert rule.judge(0, "b0", 1, 21.0, 5) is J.CURRENT


def test_stray_records_of_most_ranks_never_stop_the_ranks_that_keep_writing():
    """One record each for ranks 0, 1, 2 of 4 at step 0 under new instance ids, while the real
    collectors keep writing at 10 steps/s: every later record of theirs counts, and the strays wait."""
    rule = RankInstances(max_retired=64)
    for rank in range(4):
        assert rule.judge(rank, f"a{rank}", 0, 100.0, 4, now_s=0.0) is J.FIRST
    said = [rule.judge(rank, f"stray{rank}", 0, 100.05, 4, now_s=0.05) for rank in range(3)]
    assert said == [J.PENDING] * 3 and not rule.held and rule.instance_of_rank == {r: f"a{r}" for r in range(4)}
    judged = [rule.judge(rank, f"a{rank}", step, 100.0 + step / 10, 4, now_s=step / 10)
              for step in range(1, 31) for rank in range(4)]
    assert judged.count(J.CURRENT) == 120 and rule.instance_of_rank == {r: f"a{r}" for r in range(4)}
    assert {f"stray{r}" for r in range(3)} <= set(rule.retired)  # given up once they wrote nothing for 2 s
    assert rule.judge(0, "stray0", 0, 103.5, 4, now_s=3.5) is J.STALE


def test_a_conflict_is_said_once_and_the_incumbent_keeps_counting():
    rule = run_of(2)
    assert rule.judge(0, "x0", 5, 10.05, 2, now_s=0.05) is J.PENDING and not rule.conflict
    assert rule.judge(0, "a0", 101, 10.1, 2, now_s=0.1) is J.CURRENT and rule.conflict and "both write" in rule.why
    assert rule.judge(0, "x0", 6, 10.15, 2, now_s=0.15) is J.PENDING
    assert rule.judge(0, "a0", 102, 10.2, 2, now_s=0.2) is J.CURRENT and not rule.conflict  # said once


def test_an_instance_retired_while_it_only_paused_comes_back_and_a_new_epoch_it_ended_is_undone():
    rule = run_of(3)  # a0..a2 at step 100, t 10 s
    # the collectors pause for 30 s; meanwhile two records under new ids (ranks 0, 1) look like most of a restart
    assert rule.judge(0, "s0", 0, 40.0, 3, now_s=30.0) is J.HELD
    assert rule.judge(1, "s1", 0, 40.0, 3, now_s=30.0) is J.NEW_EPOCH and "a2" in rule.retired
    # then the real collectors go on: the epoch is undone and each rank's collector counts again
    assert rule.judge(2, "a2", 101, 40.5, 3, now_s=30.5) is J.CURRENT and rule.undone and rule.conflict
    assert "undone" in rule.why and "a2" not in rule.retired
    assert rule.judge(0, "a0", 101, 40.5, 3, now_s=30.5) is J.REJOINED and rule.promoted == "a0"
    assert rule.judge(1, "a1", 101, 40.5, 3, now_s=30.5) is J.REJOINED
    assert rule.instance_of_rank == {0: "a0", 1: "a1", 2: "a2"} and not rule.held


def test_a_rolling_restart_of_most_ranks_keeps_every_rank_that_stays_up():
    """Ranks 0..4 of 8 restart one after another, their step ids from 0; ranks 5..7 stay up and keep counting
    (the restarted ones wait: their step ids cannot be summed with the others')."""
    rule = RankInstances(max_retired=64)
    for rank in range(8):
        rule.judge(rank, f"a{rank}", 100, 10.0, 8, now_s=0.0)
    t = 10.0
    for rank in range(5):
        for step in range(101, 131):  # the others write 3 s while this rank restarts
            t += 0.1
            for other in range(8):
                if rule.instance_of_rank.get(other) == f"a{other}" and other != rank:
                    assert rule.judge(other, f"a{other}", step + 30 * rank, t, 8, now_s=t) is J.CURRENT
        assert rule.judge(rank, f"b{rank}", 0, t, 8, now_s=t) is J.HELD
    assert rule.held == {0, 1, 2, 3, 4} and all(rule.instance_of_rank[r] == f"a{r}" for r in (5, 6, 7))
    assert rule.judge(6, "a6", 300, t + 0.1, 8, now_s=t + 0.1) is J.CURRENT


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
