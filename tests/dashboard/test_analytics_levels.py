"""The good / watch / bad rules of dashboard.analytics.levels: boundaries, values without a level, the words a
tooltip shows, and the thresholds the Overview's answer shares."""
import math

import numpy as np

from moe_monitor.dashboard.analytics import levels
from moe_monitor.dashboard.analytics.answer import Named, answer
from moe_monitor.dashboard.analytics.levels import BAD, GOOD, NONE, WATCH


def test_balancedness_is_good_from_0_9_and_bad_from_0_8_down():
    rule = levels.BALANCEDNESS
    assert [rule.level(v) for v in (1.0, 0.9, 0.85, 0.8, 0.33)] == [GOOD, GOOD, WATCH, BAD, BAD]


def test_idle_share_and_imbalance_mirror_balancedness():
    for eta in (0.95, 0.9, 0.85, 0.8, 0.5):
        want = levels.BALANCEDNESS.level(eta)
        assert levels.IDLE_SHARE.level(1 - eta) == want
        assert levels.IMBALANCE.level(1 / eta) == want
        assert levels.SHARE_OF_IDEAL.level(eta) == want


def test_no_value_has_no_level():
    for value in (None, float("nan"), math.inf, -math.inf):
        assert levels.BALANCEDNESS.level(value) == NONE
    assert levels.IMBALANCE.level(np.float32(1.02)) == GOOD  # numpy scalars are judged too


def test_counts_are_good_at_zero_only():
    assert [levels.DROPPED_STEPS.level(n) for n in (0, 1, 500)] == [GOOD, BAD, BAD]
    assert [levels.SKIPPED_RECORDS.level(n) for n in (0, 1, 10**6)] == [GOOD, WATCH, WATCH]
    assert [levels.POLL_MS.level(ms) for ms in (0.4, 10.0, 40.0, 100.0)] == [GOOD, GOOD, WATCH, BAD]
    assert [levels.SILENT_S.level(s) for s in (0.1, 5.0, 9.0, 15.0, 3600.0)] == [GOOD, GOOD, WATCH, BAD, BAD]


def test_the_words_say_the_thresholds():
    assert levels.BALANCEDNESS.says() == "good at 0.90 or above, bad at 0.80 or below, watch between"
    assert levels.IDLE_SHARE.says() == "good at 10% or below, bad at 20% or above, watch between"
    assert levels.IMBALANCE.says() == "good at 1.11 or below, bad at 1.25 or above, watch between"
    assert levels.DROPPED_STEPS.says() == "good at 0, bad above it"
    assert levels.SKIPPED_RECORDS.says() == "good at 0, worth a look above it"


def test_the_answer_turns_bad_where_the_idle_share_does():
    def tone(idle_share: float) -> str:
        return answer(Named(None), None, 4, 4, idle_share, np.ones(4), "tokens/step", []).tone

    assert tone(levels.IDLE_SHARE.bad - 0.01) == "ok" and levels.IDLE_SHARE.level(levels.IDLE_SHARE.bad - 0.01) == WATCH
    assert tone(levels.IDLE_SHARE.bad) == "warn" and levels.IDLE_SHARE.level(levels.IDLE_SHARE.bad) == BAD
