"""The per-step tails in a real browser (the pattern of test_browser_whatif.py: a private redis-server, `streamlit
run app.py` against it, headless Debian chromium through playwright): the Overview shows the per-step imbalance and
expert skew under the run's dispatch policy, the What-if page the table of layouts x dispatch policies. Every wait
is on a condition."""
from __future__ import annotations

from pathlib import Path

import pytest

from moe_monitor import core
from tests.support import synthfill
from tests.support.browserkit import app_on_private_redis, chromium_page

RUN = "tails-browser"
L, E, G = 4, 16, 4
LAYOUT = [[*range(E), 0, 1, 2, 3] for _ in range(L)]  # experts 0-3 twice


@pytest.fixture
def app_url(tmp_path: Path):
    def fill(server) -> None:
        client = server.client()
        synthfill.fill(client, RUN, steps=40, num_layers=L, num_experts=E, gpus=G, meta=False)
        meta = synthfill.make_meta(RUN, L, E, G, layout=LAYOUT)
        meta.dispatch = "round_robin"
        client.set(core.meta_key(RUN), core.encode_meta(meta))

    with app_on_private_redis(tmp_path, fill) as url:
        yield url


def _wait_text(page, text: str, where) -> None:
    """Wait until `text` shows: until the run that the phase click started has redrawn the details, they still
    show the phase before (one of the fill's two alternating phases, half the steps), so the caption's count
    is waited for, never read at one moment."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.get_by_text(text).first.wait_for(timeout=60_000)
    except PlaywrightTimeout:
        raise AssertionError(f"{text!r} never showed; the caption read {where.first.inner_text()!r}") from None


@pytest.mark.browser
def test_overview_shows_the_per_step_tails_and_whatif_the_policies(app_url, tmp_path):
    with chromium_page(1500, 2600) as page:
        page.goto(f"{app_url}/overview")
        page.locator('[data-testid="stSidebar"]').get_by_text("both", exact=True).click(timeout=90_000)  # every step
        page.get_by_text("phase: both", exact=False).first.wait_for(timeout=30_000)
        page.get_by_text("Every figure:", exact=False).first.click(timeout=90_000)  # one click down
        page.get_by_text("step imbalance p99").wait_for(timeout=90_000)
        page.get_by_text("expert skew p99").first.wait_for(timeout=30_000)
        caption = page.get_by_text("Per-step figures under dispatch policy")
        caption.wait_for(timeout=30_000)
        _wait_text(page, "(the run's), over 40 of 40 steps", caption)
        assert page.get_by_text("(the run's), over 40 of 40 steps").count() == 1
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(tmp_path / "overview-tails.png"), full_page=True)

        page.goto(f"{app_url}/what-if")
        page.get_by_text("Dispatch policies: per-step tails").wait_for(timeout=90_000)
        caption = page.get_by_text("lp on the newest")
        caption.wait_for(timeout=30_000)
        table = page.locator('[data-testid="stDataFrame"]').filter(has=page.get_by_text("per-step imbalance p99"))
        table.first.wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(tmp_path / "whatif-policies.png"), full_page=True)
