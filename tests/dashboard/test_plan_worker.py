"""The What-if's computations off the page's thread (dashboard.live.plan_worker): an ask answers at once, one
computation runs at a time on one daemon thread for the whole server, each key computes once whoever asks, a key
its owner left is dropped (queued: never run; running: its result thrown away), an error is an answer, and keys
and owners are bounded."""
import threading

import pytest

from moe_monitor.dashboard.live import plan_worker
from tests.support.waiting import wait_until


@pytest.fixture(autouse=True)
def fresh():
    plan_worker.forget()
    yield
    plan_worker.forget()


def _gate():
    """(a computation that waits for the event, the event, the list it appends to when it runs)."""
    gate, ran = threading.Event(), []

    def compute():
        ran.append(1)
        assert gate.wait(30)
        return "planned"

    return compute, gate, ran


def test_an_ask_answers_at_once_and_the_result_once_done():
    compute, gate, ran = _gate()
    prepared = []

    def prepare():
        prepared.append(1)
        return compute

    first = plan_worker.ask(("plan", 1), prepare, owner="a")
    assert not first.done and first.value is None and first.asked_s > 0
    again = plan_worker.ask(("plan", 1), prepare, owner="b")   # another session, the same key: the same computation
    assert not again.done and again.asked_s == first.asked_s
    gate.set()
    assert plan_worker.wait_idle(30)
    done = plan_worker.ask(("plan", 1), prepare, owner="a")
    assert done.done and done.value == "planned" and done.error is None
    assert prepared == [1] and ran == [1]


def test_one_at_a_time_oldest_first_and_the_queue_says_how_many_are_ahead():
    compute, gate, ran = _gate()
    order = []
    plan_worker.ask(("slow",), lambda: compute, owner="a")
    assert plan_worker.ask(("b",), lambda: lambda: order.append("b"), owner="b").ahead == 1
    assert plan_worker.ask(("c",), lambda: lambda: order.append("c"), owner="c").ahead == 2
    assert plan_worker.peek(("b",)).done is False and order == []  # waits behind the slow one
    gate.set()
    assert plan_worker.wait_idle(30)
    assert order == ["b", "c"]
    assert [t.name for t in threading.enumerate()].count("moe-whatif-planner") == 1


def test_a_key_its_owner_left_is_dropped_queued_or_running():
    compute, gate, ran = _gate()
    queued = []
    plan_worker.ask(("plan", "R=4"), lambda: compute, owner="session")
    plan_worker.ask(("advice",), lambda: lambda: "advice", owner="other")
    assert wait_until(lambda: ran)  # R=4 runs
    # the session asks for another plan: its R=4 plan (running) is dropped and its result will be thrown away
    plan_worker.ask(("plan", "R=0"), lambda: lambda: queued.append("R=0") or "R=0 plan", owner="session")
    assert plan_worker.peek(("plan", "R=4")) is None
    # and again, before R=0 ran: that one is dropped too and never runs
    plan_worker.ask(("plan", "R=2"), lambda: lambda: "R=2 plan", owner="session")
    assert plan_worker.peek(("plan", "R=0")) is None
    gate.set()
    assert plan_worker.wait_idle(30)
    assert queued == [] and ran == [1]
    assert plan_worker.peek(("plan", "R=2")).value == "R=2 plan"
    assert plan_worker.peek(("advice",)).value == "advice"  # another owner's key is kept
    assert plan_worker.ask(("plan", "R=4"), lambda: lambda: "again", owner="session").done is False  # asked anew


def test_release_drops_a_key_no_one_else_holds():
    plan_worker.ask(("plan",), lambda: lambda: "p", owner="a")
    plan_worker.ask(("plan",), lambda: lambda: "p", owner="b")
    assert plan_worker.wait_idle(30)
    plan_worker.release("a")
    assert plan_worker.peek(("plan",)).value == "p"      # b still holds it
    plan_worker.release("b")
    assert plan_worker.peek(("plan",)) is None


def test_an_error_is_the_answer():
    def refuse():
        raise ValueError("redundant slots must split over the GPUs")

    plan_worker.ask(("plan",), lambda: refuse, owner="a")
    assert plan_worker.wait_idle(30)
    answer = plan_worker.peek(("plan",))
    assert answer.done and isinstance(answer.error, ValueError) and "split" in str(answer.error)


def test_keys_and_owners_are_bounded():
    for i in range(plan_worker.MAX_KEYS + 5):
        plan_worker.ask(("plan", i), lambda: lambda: "p", owner=("session", i))
        assert plan_worker.wait_idle(30)
    assert len(plan_worker._ENTRIES) == plan_worker.MAX_KEYS
    for i in range(plan_worker.MAX_OWNERS + 5):
        plan_worker.ask(("same",), lambda: lambda: "p", owner=("tab", i))
    assert len(plan_worker._OWNED) == plan_worker.MAX_OWNERS
    assert plan_worker.wait_idle(30)
