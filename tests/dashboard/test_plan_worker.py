"""The What-if's computations off the page's thread (dashboard.live.plan_worker): an ask answers at once, one
computation runs at a time on one daemon thread for the whole server, each key computes once whoever asks, a key
its owner left is dropped (queued: never run; running: its result thrown away), a held key is never evicted (many
sessions each get their answer, computed once), an error is an answer (a failure told afresh, then retried),
prepare runs outside the lock, and keys and owners are bounded."""
import threading
from collections import Counter

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
    assert answer.done and answer.error == plan_worker.Failure("ValueError", "redundant slots must split over the GPUs",
                                                               refused=True)
    assert plan_worker.ask(("plan",), lambda: refuse, owner="a").error.refused  # a refusal is kept: not retried
    assert plan_worker.peek(("plan",)) is not None


def test_keys_and_owners_are_bounded(monkeypatch):
    for i in range(plan_worker.MAX_KEYS + 5):  # sessions that asked, then closed their tabs
        plan_worker.ask(("plan", i), lambda: lambda: "p", owner=("session", i))
        assert plan_worker.wait_idle(30)
    assert len(plan_worker._ENTRIES) == plan_worker.MAX_KEYS + 5  # held: kept, within MAX_HELD_KEYS
    monkeypatch.setattr(plan_worker, "LAPSE_S", -1.0)  # their owners lapsed: their keys make room
    plan_worker.ask(("plan", "new"), lambda: lambda: "p", owner="new")
    assert len(plan_worker._ENTRIES) == plan_worker.MAX_KEYS
    assert plan_worker.peek(("plan", 0)) is None and plan_worker.peek(("plan", "new")) is not None
    for i in range(plan_worker.MAX_OWNERS + 5):
        plan_worker.ask(("same",), lambda: lambda: "p", owner=("tab", i))
    assert len(plan_worker._OWNED) == plan_worker.MAX_OWNERS
    assert plan_worker.wait_idle(30)


def test_twenty_sessions_with_different_inputs_each_get_their_answer_computed_once():
    """20 owners (about 7 What-if sessions) ask 20 keys while the worker is busy, then each asks again until
    answered, as a page does: no key is evicted, so none is prepared or computed twice, and the running one's
    result is kept."""
    compute, gate, ran = _gate()
    plan_worker.ask(("another session's plan",), lambda: compute, owner="blocker")
    assert wait_until(lambda: ran)
    prepared, started, answers = Counter(), Counter(), {}

    def prepare(i):
        prepared[i] += 1

        def planned():
            started[i] += 1
            return ("plan", i)

        return planned

    def ask(i):
        return plan_worker.ask(("plan", i), lambda: prepare(i), owner=("session", i))

    for i in range(20):
        assert not ask(i).done
    assert all(plan_worker.peek(("plan", i)) is not None for i in range(20))
    gate.set()

    def everyone_answered():
        for i in set(range(20)) - set(answers):
            answer = ask(i)
            if answer.done:
                answers[i] = answer.value
                plan_worker.release(("session", i))  # the page's cache holds it now
        return len(answers) == 20

    assert wait_until(everyone_answered, timeout_s=60)
    assert answers == {i: ("plan", i) for i in range(20)}
    assert prepared == started == Counter(range(20))
    assert ran == [1] and plan_worker.peek(("another session's plan",)).value == "planned"


def test_a_page_that_only_watches_keeps_its_key(monkeypatch):
    """After MAX_WAIT_S the page only peeks (with its owner name): others asking meanwhile do not push it out."""
    monkeypatch.setattr(plan_worker, "MAX_OWNERS", 4)
    compute, gate, ran = _gate()
    plan_worker.ask(("slow",), lambda: compute, owner="blocker")
    asked = plan_worker.ask(("plan", "mine"), lambda: lambda: "mine", owner="watcher")
    for i in range(10):
        plan_worker.ask(("plan", i), lambda: lambda: "p", owner=("other", i))
        watched = plan_worker.peek(("plan", "mine"), "watcher")
        assert watched is not None and watched.asked_s == asked.asked_s
        plan_worker.peek(("slow",), "blocker")
    gate.set()
    assert plan_worker.wait_idle(30)
    assert plan_worker.peek(("plan", "mine"), "watcher").value == "mine"


def test_beyond_the_hard_cap_a_new_key_is_busy_then_queued_in_its_first_place(monkeypatch):
    monkeypatch.setattr(plan_worker, "MAX_KEYS", 2)
    monkeypatch.setattr(plan_worker, "MAX_HELD_KEYS", 3)
    compute, gate, ran = _gate()
    plan_worker.ask(("slow",), lambda: compute, owner="a")
    assert wait_until(lambda: ran)
    plan_worker.ask(("b",), lambda: lambda: "b", owner="b")
    plan_worker.ask(("c",), lambda: lambda: "c", owner="c")
    prepared = []
    busy = plan_worker.ask(("d",), lambda: prepared.append(1) or (lambda: "d"), owner="d")
    assert busy.busy and not busy.done and busy.ahead == 3 and prepared == []  # not prepared, not queued
    assert plan_worker.peek(("d",)) is None and set(plan_worker._ENTRIES) == {("slow",), ("b",), ("c",)}
    assert plan_worker.ask(("d",), lambda: lambda: "d", owner="d").asked_s == busy.asked_s
    gate.set()
    assert plan_worker.wait_idle(30)
    for owner in "bc":  # their pages pick their answers up
        plan_worker.release(owner)
    later = plan_worker.ask(("e",), lambda: lambda: "e", owner="e")
    queued = plan_worker.ask(("d",), lambda: lambda: "d", owner="d")
    assert not queued.busy and queued.asked_s == busy.asked_s < later.asked_s
    assert plan_worker.wait_idle(30)
    assert plan_worker.peek(("d",)).value == "d" and plan_worker.peek(("slow",)).value == "planned"


def test_lapsed_keys_make_room_done_first_never_the_running_one(monkeypatch):
    monkeypatch.setattr(plan_worker, "MAX_KEYS", 2)
    monkeypatch.setattr(plan_worker, "MAX_HELD_KEYS", 3)
    plan_worker.ask(("done",), lambda: lambda: "done", owner="t1")
    assert plan_worker.wait_idle(30)
    compute, gate, ran = _gate()
    plan_worker.ask(("running",), lambda: compute, owner="t2")
    assert wait_until(lambda: ran)
    plan_worker.ask(("queued",), lambda: lambda: "queued", owner="t3")
    assert plan_worker.ask(("new",), lambda: lambda: "new", owner="t4").busy  # all held: no room
    monkeypatch.setattr(plan_worker, "LAPSE_S", -1.0)  # their tabs closed
    plan_worker.ask(("new",), lambda: lambda: "new", owner="t4")
    assert set(plan_worker._ENTRIES) == {("running",), ("new",)}
    gate.set()
    assert plan_worker.wait_idle(30)
    assert plan_worker.peek(("running",)).value == "planned" and plan_worker.peek(("new",)).value == "new"


def test_a_failure_is_told_afresh_to_each_owner_then_retried():
    calls, both_asked = [], threading.Event()

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            assert both_asked.wait(30)  # else b could be told at its first ask, before a is
            raise MemoryError("no room for the copy")
        return "planned"

    plan_worker.ask(("plan",), lambda: flaky, owner="a")
    plan_worker.ask(("plan",), lambda: flaky, owner="b")
    both_asked.set()
    assert plan_worker.wait_idle(30)
    told = plan_worker.ask(("plan",), lambda: flaky, owner="a")
    assert told.done and told.error == plan_worker.Failure("MemoryError", "no room for the copy", refused=False)
    raised = [told.error.exception() for _ in range(5)]  # no shared object whose traceback grows at each raise
    assert len({id(e) for e in raised}) == 5
    assert all(type(e) is plan_worker.Failed and e.__traceback__ is None for e in raised)
    assert str(raised[0]) == "MemoryError: no room for the copy"
    assert plan_worker.ask(("plan",), lambda: flaky, owner="b").error == told.error  # b is told too
    assert plan_worker.peek(("plan",)) is None  # then the key is dropped: the next ask retries it
    assert not plan_worker.ask(("plan",), lambda: flaky, owner="a").done
    assert plan_worker.wait_idle(30)
    assert plan_worker.ask(("plan",), lambda: flaky, owner="a").value == "planned" and len(calls) == 2


def test_prepare_runs_outside_the_lock_and_its_failure_is_the_keys_answer():
    copying, copied = threading.Event(), threading.Event()

    def slow_prepare():  # the advisor's copy of the window's counts
        copying.set()
        assert copied.wait(30)
        return lambda: "advice"

    asker = threading.Thread(target=plan_worker.ask, args=(("advice",), slow_prepare, "a"), daemon=True)
    asker.start()
    assert copying.wait(30)
    others = threading.Event()

    def another_session():
        plan_worker.ask(("plan",), lambda: lambda: "p", owner="b")
        plan_worker.peek(("plan",))
        others.set()

    threading.Thread(target=another_session, daemon=True).start()
    assert others.wait(10)  # answered while the copy goes on
    copied.set()
    asker.join(30)
    assert plan_worker.wait_idle(30)
    assert plan_worker.peek(("advice",)).value == "advice" and plan_worker.peek(("plan",)).value == "p"

    def boom():
        raise MemoryError("cannot copy the window")

    answer = plan_worker.ask(("advice", 2), boom, owner="c")  # raised nothing here
    assert answer.done and answer.error == plan_worker.Failure("MemoryError", "cannot copy the window", False)
    assert plan_worker.peek(("advice", 2)) is None  # told: a later ask prepares it again
    assert not plan_worker.ask(("advice", 2), lambda: lambda: "advice", owner="c").done
