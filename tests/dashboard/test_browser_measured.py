"""The GPU panel's "Measured vs estimated" in a real browser (the pattern of test_browser_steptails.py: a private
redis-server filled by the real collector, `streamlit run app.py` against it, headless Debian chromium through
playwright). The hand-worked case of test_dashboard_measured.py: even-split estimate 1.333, measured 1.000, won
+0.333. Every wait is on a condition."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.dashboard.test_dashboard_measured import _fill
from tests.support.browserkit import app_on_private_redis, chromium_page


@pytest.fixture
def app_url(tmp_path: Path):
    with app_on_private_redis(tmp_path, lambda server: _fill(server.url, "measured-browser", steps=8,
                                                             physical=True)) as url:
        yield url


@pytest.mark.browser
def test_gpu_panel_shows_what_the_balancer_won(app_url, tmp_path):
    with chromium_page(1500, 2600) as page:
        page.goto(f"{app_url}/gpus")
        page.get_by_text("Measured vs estimated").wait_for(timeout=90_000)
        won = page.locator('[data-testid="stMetric"]').filter(has=page.get_by_text("what the balancer won"))
        won.get_by_text("+0.333", exact=True).wait_for(timeout=30_000)
        page.locator('[data-testid="stMetric"]').filter(has=page.get_by_text("estimated, step 7")) \
            .get_by_text("1.333", exact=True).wait_for(timeout=30_000)
        page.locator('[data-testid="stMetric"]').filter(has=page.get_by_text("measured, step 7")) \
            .get_by_text("1.000", exact=True).wait_for(timeout=30_000)
        page.get_by_text("8 of 8 steps in view have every rank's physical record").wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(tmp_path / "gpus-measured.png"), full_page=True)
