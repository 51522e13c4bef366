"""The What-if page plans off its thread (dashboard.live.plan_worker): while the planner is busy the page shows the
current layout's figures and a "planning" line, then the plan's, with the numbers of a direct planner call on the
page's frozen windows; a session that changes its inputs while it waits leaves its old plan behind. AppTest
against a real redis-server; the worker's thread is held busy by a computation the test releases, and the page
waits for it at most MAX_WAIT_S (0 here: the run ends at once, as it does after MAX_WAIT_S in a browser). A failure
(not a refusal) of a computation or of its prepare is a line on the page, asked again on the next run."""
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from streamlit.runtime.memory_media_file_storage import _calculate_file_id

from moe_monitor import core
from moe_monitor.dashboard.figures.units import format_number
from moe_monitor.dashboard.live import plan_worker
from moe_monitor.dashboard.views.whatif import page as whatif_page
from moe_monitor.dashboard.views.whatif.controls import STATE_KEY
from moe_monitor.dashboard.whatif import score as whatif_score
from moe_monitor.planner.api import plan
from tests.support import synthfill
from tests.support.apptest import app_test, open_page

RUN, L, E, G = "background", 4, 16, 4


@pytest.fixture
def busy(redis_url, monkeypatch):
    """(Redis URL, the event that frees the worker): a filled run, and the worker's thread held by another
    session's computation until the event is set."""
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, RUN, steps=40, num_layers=L, num_experts=E, gpus=G)
    plan_worker.forget()
    gate, ran = threading.Event(), threading.Event()

    def hold():
        ran.set()
        return gate.wait(60)

    plan_worker.ask(("another session's plan",), lambda: hold, owner="another session")
    assert ran.wait(30)
    monkeypatch.setattr(whatif_page, "MAX_WAIT_S", 0.0)
    monkeypatch.setenv("REDIS_URL", redis_url)
    yield redis_url, gate
    gate.set()
    assert plan_worker.wait_idle(60)
    plan_worker.forget()


@pytest.fixture
def idle(redis_url, monkeypatch):
    """A filled run, the worker free; the page ends its run at once (MAX_WAIT_S 0)."""
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, RUN, steps=40, num_layers=L, num_experts=E, gpus=G)
    plan_worker.forget()
    monkeypatch.setattr(whatif_page, "MAX_WAIT_S", 0.0)
    monkeypatch.setenv("REDIS_URL", redis_url)
    yield redis_url
    assert plan_worker.wait_idle(60)
    plan_worker.forget()


def _titles(at) -> list[str]:
    return [json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]


def _metric(at, label: str):
    return next(m for m in at.metric if m.label == label)


def test_current_layout_first_then_the_plan_with_a_direct_planners_numbers(busy):
    _, gate = busy
    at = app_test().run()
    open_page(at, "page_files/whatif.py")
    assert not at.exception, at.exception
    state = at.session_state[STATE_KEY]
    data = state.windows[1]
    current_LP = np.asarray(core.contiguous_layout(L, E))
    before = whatif_score.score(current_LP, data.score_TLE, G)
    # before the plan: the current layout's figures, a line that says what is computed, nothing of the plan
    assert _metric(at, "balancedness (score window), current").value == format_number(before.balancedness)
    assert _metric(at, "per-step balancedness, current").value == format_number(before.step_balancedness)
    assert any(t.startswith("Layer ") and "current layout" in t for t in _titles(at)), _titles(at)
    assert any("planning …" in c.value and "1 computation(s) ahead" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    assert any(c.value.startswith("Rebalance advisor: deciding") for c in at.caption)
    assert not at.get("download_button") and not [m for m in at.metric if m.label == "balancedness (score window)"]
    assert not any("Dispatch policies" in s.value for s in at.subheader)
    assert any("Replica budget" in t for t in _titles(at))  # what needs no plan is all there

    gate.set()
    assert plan_worker.wait_idle(60)
    at.run()
    assert not at.exception, at.exception
    want = plan(data.fit_WLE, G, 4)  # the page's default R for 16 experts on 4 GPUs, its default policy
    after = whatif_score.score(want.layout_LP, data.score_TLE, G)
    shown = _metric(at, "balancedness (score window)")
    assert shown.value == format_number(after.balancedness)
    assert f"vs current {format_number(before.balancedness)}" in shown.delta
    assert _metric(at, "per-step balancedness").value == format_number(after.step_balancedness)
    (button,) = at.get("download_button")
    text = json.dumps({"physical_to_logical_map": np.asarray(want.layout_LP).tolist()})
    assert Path(button.proto.url).stem == _calculate_file_id(text.encode(), "application/json", "expert_layout.json")
    assert any(t.endswith("current vs what-if") for t in _titles(at))
    assert any("Dispatch policies" in s.value for s in at.subheader)
    assert not any("planning …" in c.value for c in at.caption)
    assert any(c.value.startswith(f"Policy {want.policy} · 0 manual edit(s)") for c in at.caption)


def test_a_session_that_changes_its_inputs_leaves_its_old_plan(busy):
    at = app_test().run()
    open_page(at, "page_files/whatif.py")
    plans = lambda: sorted(k[3] for k in plan_worker._ENTRIES if k[0] == "plan")  # noqa: E731 (R of each plan asked)
    assert plans() == [4]
    at.selectbox(key="whatif_r").set_value(0).run()
    assert not at.exception, at.exception
    assert plans() == [0]  # R = 4's computation, never started, is dropped
    assert any("planning …" in c.value for c in at.caption)


def _once(exc: BaseException, then):
    """A callable that raises exc on its first call, then calls then; and the list of its calls."""
    calls = []

    def call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise exc
        return then(*args, **kwargs)

    return call, calls


def _settled(at):
    """Runs the page again until nothing is waited for (each run asks; the worker computes in between)."""
    for _ in range(5):
        assert plan_worker.wait_idle(60)
        at.run()
        assert not at.exception, at.exception
        if not any("…" in c.value for c in at.caption):
            return at
    raise AssertionError([c.value for c in at.caption])


def test_a_failed_plan_is_a_line_then_asked_again(idle, monkeypatch):
    flaky, calls = _once(MemoryError("no room for the plan"), plan)
    monkeypatch.setattr(whatif_page, "plan", flaky)
    at = app_test().run()
    at.switch_page("page_files/whatif.py")
    told = []
    for _ in range(4):  # the run that reads the failure says so (and asks nothing more); the next asks again
        at.run()
        assert not at.exception, at.exception
        told += [e.value for e in at.error if "Planning failed (MemoryError: no room for the plan)" in e.value]
        if told:
            break
        assert plan_worker.wait_idle(60)
    assert told and calls == [1]
    _settled(at)
    assert len(calls) == 2 and not at.error
    assert _metric(at, "balancedness (score window)")


def test_a_failed_advice_copy_is_the_advisors_line_then_asked_again(busy, monkeypatch):
    _, gate = busy  # the plan waits behind another session's: the run ends with the advisor's line drawn
    prepare = whatif_page._Jobs._prepare_advice
    flaky, calls = _once(MemoryError("cannot copy the window"), prepare)
    monkeypatch.setattr(whatif_page._Jobs, "_prepare_advice", flaky)
    at = app_test().run()
    at.switch_page("page_files/whatif.py").run()  # the page's opening run only looks (views.common.opening_tick)
    assert not at.exception, at.exception
    assert calls == []
    at.run()  # the next run asks
    assert not at.exception, at.exception  # the copy failed on the page's thread, in ask: an answer, not raised
    assert any("no decision on this window (it failed: MemoryError: cannot copy the window" in c.value
               for c in at.caption), [c.value for c in at.caption]
    gate.set()
    assert any("no decision on this window (it failed: MemoryError: cannot copy the window" in c.value
               for c in at.caption), [c.value for c in at.caption]
    _settled(at)
    assert len(calls) == 2
    assert not any("it failed" in c.value for c in at.caption)
    assert any(m.label == "balancedness (score window)" for m in at.metric)
