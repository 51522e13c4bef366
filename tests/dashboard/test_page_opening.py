"""A live page opens with its first chart and is drawn whole on its next run (views.common.opening_tick), on
the real app (AppTest) against a real redis-server filled by the real collector. What is drawn stays drawn: a
widget change on the page, or the sidebar's, is no opening."""

import json

import pytest

from moe_monitor.dashboard.live import plan_worker
from tests.support.apptest import app_test

RUN = "opening-run"
WHOLE = {"devices": 5, "experts": 3}  # charts once drawn whole


@pytest.fixture(scope="module")
def filled(redis_server):
    from tests.support.realfill import fill_with_collector

    redis_server.client().flushdb()
    fill_with_collector(redis_server.url, RUN, steps=30)
    return redis_server.url


def charts(at) -> int:
    assert not at.exception, at.exception
    return len(at.get("vega_lite_chart"))


@pytest.mark.parametrize("page", ["devices", "experts"])
def test_a_page_opens_with_its_first_chart_then_is_drawn_whole(filled, monkeypatch, page):
    monkeypatch.setenv("REDIS_URL", filled)
    at = app_test().run()
    assert charts(at) == 1  # the Overview opens with its picture ...
    assert not any(e.label.startswith("Every figure") for e in at.expander)
    assert charts(at.run()) >= 1 and any(e.label.startswith("Every figure") for e in at.expander)  # ... then all
    assert charts(at.switch_page(f"page_files/{page}.py").run()) == 1
    assert charts(at.run()) == WHOLE[page]
    at.sidebar.number_input(key="window_steps").set_value(20).run()  # a sidebar change: no opening
    assert charts(at) == WHOLE[page]
    assert charts(at.switch_page("page_files/overview.py").run()) == 1  # another page, then back: opens again
    assert charts(at.switch_page(f"page_files/{page}.py").run()) == 1
    assert charts(at.run()) == WHOLE[page]


def test_the_whatif_opens_with_the_current_layout_then_its_inputs_and_plan(filled, monkeypatch):
    monkeypatch.setenv("REDIS_URL", filled)
    asked, ask = [], plan_worker.ask
    monkeypatch.setattr(plan_worker, "ask", lambda key, *rest: asked.append(key) or ask(key, *rest))
    at = app_test().run()
    at.switch_page("page_files/whatif.py").run()
    assert asked == []  # the opening run plans nothing (a plan computing beside it would slow its first chart)
    titles = [json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]
    assert len(titles) == 1 and "current layout" in titles[0]  # the current layout's bars, nothing planned yet
    line = next(c.value for c in at.caption if c.value.startswith("Planning inputs: "))  # the picks it opened on
    assert not [w for w in (*at.main.selectbox, *at.main.number_input) if (w.key or "").startswith("whatif_")]
    assert not any("Placement staleness" in s.value for s in at.subheader)
    at.run()  # what the next run draws (the page asks for it itself, a tick later)
    assert not at.exception, at.exception
    assert asked  # the advisor and the plan, asked for by the page drawn whole
    r, policy = at.selectbox(key="whatif_r").value, at.selectbox(key="whatif_policy").value
    assert f"R = {r} redundant slots" in line and f"policy {policy}" in line  # the widgets open on those picks
    assert f"scored on the newest {at.number_input(key='whatif_score').value} steps" in line
    assert any("Placement staleness" in s.value for s in at.subheader)
    assert len(at.get("vega_lite_chart")) > 1
    assert plan_worker.wait_idle(120)  # nothing left computing for the next test


def test_a_new_session_draws_the_sidebars_widgets_on_its_second_run_with_the_same_settings(filled, monkeypatch):
    """The first run of a session takes the widgets' values undrawn (a value kept under a widget's key, else its
    default), so the page's first chart is the run's only heavy element; the next run draws them."""
    monkeypatch.setenv("REDIS_URL", filled)
    at = app_test(phase="auto")
    at.session_state["window_steps"] = 20
    at.run()
    assert charts(at) == 1
    assert not [*at.sidebar.radio, *at.sidebar.selectbox, *at.sidebar.number_input, *at.sidebar.text_input]
    first = at.session_state["settings"]
    assert (first.run, first.phase, first.window_steps, first.layer, first.summed) == (RUN, "auto", 20, None, False)
    at.run()
    assert not at.exception, at.exception
    assert [w.key for w in at.sidebar.radio] == ["source_kind", "phase"]
    assert at.sidebar.selectbox(key="run").value == RUN and at.sidebar.number_input(key="window_steps").value == 20
    assert at.session_state["settings"] == first
    assert any(e.label.startswith("Every figure") for e in at.expander)  # and the Overview whole
