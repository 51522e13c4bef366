"""Which phase a window spends its time in: gaps since the step before, summed per phase; mixed or unknown
steps mean "both"; a window without a clock counts steps."""
import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.analytics.phases import main_phase, shares_line, time_by_phase

CODE = {name: i for i, name in enumerate(core.PHASES)}


def _codes(names):
    return np.array([CODE[n] for n in names])


def test_gaps_per_phase_and_the_main_phase():
    times = np.array([0.0, 1.0, 1.1, 1.2, 2.2, 2.3])
    names = ["prefill", "prefill", "decode", "decode", "prefill", "decode"]
    got = time_by_phase(times, _codes(names))
    # gaps 1.0 0.1 0.1 1.0 0.1; the first step takes the median gap, 0.1
    assert got == pytest.approx({"prefill": 0.1 + 1.0 + 1.0, "decode": 0.3})
    assert main_phase(got) == "prefill" and shares_line(got) == "prefill 88% · decode 12%"


def test_mixed_steps_or_nothing_known_mean_both():
    assert main_phase(time_by_phase(np.array([0.0, 1.0, 2.0]), _codes(["mixed", "mixed", "decode"]))) == "both"
    assert main_phase({}) == "both" and time_by_phase(np.zeros(0), np.zeros(0, dtype=int)) == {}
    assert main_phase(time_by_phase(np.array([5.0]), _codes(["train"]))) == "train"  # one step: counted once


def test_a_clock_that_goes_back_or_stands_still_counts_steps():
    got = time_by_phase(np.array([3.0, 3.0, 3.0]), _codes(["decode", "prefill", "decode"]))
    assert got == {"decode": 2.0, "prefill": 1.0}
    back = time_by_phase(np.array([10.0, 9.0, 9.5]), _codes(["decode", "prefill", "prefill"]))
    assert back == pytest.approx({"decode": 0.25, "prefill": 0.5})  # the negative gap counts 0


def test_the_phase_shown_does_not_flip_near_half_and_half():
    near = {"decode": 10.0, "prefill": 11.0}
    assert main_phase(near) == "prefill" and main_phase(near, previous="decode") == "decode"
    assert main_phase({"decode": 10.0, "prefill": 13.0}, previous="decode") == "prefill"  # 10 < 0.8 x 13
    assert main_phase({"mixed": 9.0, "decode": 1.0}, previous="decode") == "both"
