"""The per-step tails on the Overview and Devices pages (AppTest against the tests' own redis-server): under the
run's dispatch policy by default, the numbers of core.steptails on the same steps, another policy picked to
compare."""
from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from moe_monitor import core
from moe_monitor.core.steptails import step_tails
from tests.support.apptest import app_test, open_page, whole
from tests.support.synthfill import fill, make_meta

RUN = "tails-run"
L, E, G = 4, 16, 4
LAYOUT = [[*range(E), 0, 1, 2, 3] for _ in range(L)]  # experts 0-3 twice: P = 20, 5 slots per GPU


@pytest.fixture(scope="module")
def filled(redis_server):
    client = redis_server.client()
    client.flushdb()
    totals = fill(client, RUN, steps=30, num_layers=L, num_experts=E, gpus=G, meta=False)
    meta = make_meta(RUN, L, E, G, layout=LAYOUT)
    meta.dispatch = "round_robin"
    client.set(core.meta_key(RUN), core.encode_meta(meta))
    return redis_server.url, np.stack(totals)


def _app(url, monkeypatch) -> AppTest:
    monkeypatch.setenv("REDIS_URL", url)
    at = app_test().run()
    assert not at.exception, at.exception
    return whole(at)


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_overview_shows_the_per_step_tails_under_the_runs_policy(filled, monkeypatch):
    url, counts_TLE = filled
    at = _app(url, monkeypatch)
    want = step_tails(counts_TLE, np.asarray(LAYOUT), G, "round_robin")
    assert _metric(at, "step imbalance p99") == f"{want.imbalance_summary()['p99']:.3f}"
    assert _metric(at, "step imbalance p50") == f"{want.imbalance_summary()['p50']:.3f}"
    assert _metric(at, "expert skew p99") == f"{want.skew_summary()['p99']:.3f}"
    assert _metric(at, "share of the ideal") == f"{want.ideal_fraction:.1%}"
    assert _metric(at, "window imbalance") == f"{want.window_imbalance:.3f}"
    assert any("dispatch policy **round_robin** (the run's)" in c.value and "over 30 of 30 steps" in c.value
               for c in at.caption)
    at.selectbox(key="overview_dispatch_policy").set_value("ideal").run()
    assert not at.exception, at.exception
    assert _metric(at, "step imbalance max") == "1.000"
    assert any("**ideal** (compared; the run's is round_robin)" in c.value for c in at.caption)


def test_devices_shows_the_per_layer_table(filled, monkeypatch):
    url, counts_TLE = filled
    at = _app(url, monkeypatch)
    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    at.selectbox(key="devices_dispatch_policy").set_value("lp").run()
    assert not at.exception, at.exception
    want = step_tails(counts_TLE, np.asarray(LAYOUT), G, "lp").layer_summary()
    table = next(df.value for df in at.dataframe if "per-step imbalance p50" in df.value.columns)
    assert len(table) == L
    np.testing.assert_allclose(table["p99"].to_numpy(dtype=float), np.asarray(want["p99"], dtype=float), rtol=1e-9)


def test_whatif_shows_the_policies_table(filled, monkeypatch):
    url, counts_TLE = filled
    at = _app(url, monkeypatch)
    open_page(at, "page_files/whatif.py")
    assert not at.exception, at.exception
    table = next(df.value for df in at.dataframe if "per-step imbalance p99" in df.value.columns)
    assert list(table["layout"]) == ["current"] * 4 + ["what-if"] * 4
    assert list(table["dispatch"])[:4] == ["even", "round_robin (this run's)", "lp", "ideal"]
    score = counts_TLE[-max(1, min(64, len(counts_TLE) // 4)):]  # the page's default score window
    for row, policy in zip(table.head(4).itertuples(index=False), ("even", "round_robin", "lp", "ideal")):
        want = step_tails(score, np.asarray(LAYOUT), G, policy)
        assert row.steps == want.steps
        assert row[3] == pytest.approx(want.imbalance_summary()["p99"])  # per-step imbalance p99
        assert row[7] == pytest.approx(want.window_imbalance)
    assert table["per-step imbalance p99"].iloc[3] == pytest.approx(1.0)  # ideal: every GPU at the mean


def test_lp_scores_the_newest_steps_only():
    from moe_monitor.dashboard.whatif import policies

    rng = np.random.default_rng(3)
    counts = rng.poisson(5.0, size=(10, L, E))
    tails = policies.policy_tails(np.asarray(LAYOUT), counts, G, "lp", lp_steps=4)
    want = step_tails(counts[-4:], np.asarray(LAYOUT), G, "lp")
    assert tails.steps == 4 and tails.imbalance_summary() == pytest.approx(want.imbalance_summary())
    assert policies.policy_tails(np.asarray(LAYOUT), counts, G, "even", lp_steps=4).steps == 10
    ideal, even = (step_tails(counts, np.asarray(LAYOUT), G, p) for p in ("ideal", "even"))
    rows = policies.policy_table({("what-if", "lp"): tails, ("current", "ideal"): ideal, ("current", "even"): even})
    assert [(r["layout"], r["dispatch"]) for r in rows] == [("current", "even"), ("current", "ideal"),
                                                            ("what-if", "lp")]
