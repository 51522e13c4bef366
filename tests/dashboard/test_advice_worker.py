"""The advisor off the page's thread: an ask answers at once with the newest finished answer, one computation
runs at a time for the whole server, a key is recomputed only after EVERY_S, and an error is an answer."""
import threading

import pytest

from moe_monitor.dashboard.live import advice_worker


@pytest.fixture(autouse=True)
def fresh():
    advice_worker.forget()
    yield
    assert advice_worker.wait_idle(30)
    advice_worker.forget()


def test_first_ask_answers_at_once_then_the_result_once_finished():
    gate = threading.Event()
    calls = []

    def slow():
        calls.append(1)
        assert gate.wait(30)
        return "rebalance now: 3 moves"

    assert advice_worker.latest(("run", "decode"), lambda: slow, now_s=100.0) == ""   # not waited for
    assert advice_worker.latest(("other", "decode"), lambda: lambda: "x", now_s=100.0) == ""  # one at a time
    gate.set()
    assert advice_worker.wait_idle(30)
    assert advice_worker.latest(("run", "decode"), lambda: slow, now_s=101.0) == "rebalance now: 3 moves"
    assert len(calls) == 1  # within EVERY_S: not recomputed (nor prepared)
    advice_worker.latest(("run", "decode"), lambda: slow, now_s=100.0 + advice_worker.EVERY_S)
    assert advice_worker.wait_idle(30) and len(calls) == 2


def test_an_error_is_the_answer_and_the_page_goes_on():
    def refuse():
        raise ValueError("too few steps")

    advice_worker.latest(("run",), lambda: refuse, now_s=0.0)
    assert advice_worker.wait_idle(30)
    assert advice_worker.latest(("run",), lambda: refuse, now_s=1.0) == "no advice (ValueError: too few steps)"


def test_keys_are_bounded():
    for i in range(advice_worker.MAX_KEYS + 5):
        advice_worker.latest((i,), lambda: lambda: "a", now_s=0.0)
        assert advice_worker.wait_idle(30)
    assert len(advice_worker._ENTRIES) == advice_worker.MAX_KEYS


def test_prepare_runs_only_when_a_computation_starts():
    prepared = []

    def prepare():
        prepared.append(1)
        return lambda: "advice"

    for tick in range(5):  # five refreshes within EVERY_S: one copy of the inputs
        advice_worker.latest(("run",), prepare, now_s=float(tick))
        assert advice_worker.wait_idle(30)
    assert prepared == [1] and advice_worker.latest(("run",), prepare, now_s=5.0) == "advice"
