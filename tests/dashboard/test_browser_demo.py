"""End to end, as a user sees it: `moe-monitor demo` (private Redis, real DeepSeek-V3-shaped model, collector,
dashboard) opened in headless Debian chromium through playwright: charts render, numbers move, every page
loads without an exception. Screenshots land in the test's tmp_path, and in $MOE_DOCS_SCREENSHOTS when it names a
folder: the docs' page images (docs/img) are these, taken with MOE_DOCS_SCREENSHOTS=docs/img."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.support.browserkit import PORT, SIDEBAR_WIDGETS, chromium_page, serving

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with serving(["-m", "moe_monitor", "demo", "--port", PORT], tmp_path / "demo.log", env, ready_s=120) as url:
        yield url


# the What-if whole (its inputs drawn) with its plan on screen: no figure still "…", no planning line
PLANNED = """() => document.querySelector('[data-testid="stMain"] [data-testid="stSelectbox"]')
    && ![...document.querySelectorAll('[data-testid="stMetricValue"]')].some(e => e.innerText.includes('…'))
    && !/planning …|still computing …/.test(document.body.innerText)"""


def _metric_values(page) -> list[str]:
    return page.locator('[data-testid="stMetricValue"]').all_inner_texts()


def _shot(page, tmp_path: Path, name: str, for_docs: bool = True) -> None:
    path = tmp_path / f"{name}.png"
    page.locator(SIDEBAR_WIDGETS).first.wait_for(timeout=60_000)  # the page as it stays, not its opening run
    page.screenshot(path=str(path), full_page=False)
    docs = os.environ.get("MOE_DOCS_SCREENSHOTS")
    if docs and for_docs:
        shutil.copy(path, (ROOT / docs) / path.name)


@pytest.mark.browser
def test_demo_live_in_chromium(demo, tmp_path):
    with chromium_page(1400, 1000) as page:
        page.goto(demo)
        page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=120_000)  # data arrived: the answer
        page.get_by_text("Every figure:", exact=False).first.click()  # the figures one click down
        page.wait_for_function(
            "() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"]')]"
            ".some(e => /^[0-9]/.test(e.innerText))", timeout=60_000)
        first = _metric_values(page)
        _shot(page, tmp_path, "overview-1", for_docs=False)
        deadline = time.monotonic() + 30
        second = first
        while second == first and time.monotonic() < deadline:
            page.wait_for_timeout(1000)
            second = _metric_values(page)
        _shot(page, tmp_path, "overview")
        assert second != first, f"the overview numbers did not change between ticks: {first}"
        # the first line in time: the demo declares DeepSeek-V3's expert sizes and the H100 SXM profile
        page.get_by_text("of MoE time waiting", exact=False).first.wait_for(timeout=30_000)
        page.get_by_text("predicted for H100 SXM, hidden 7168 x expert 2048", exact=False).first.wait_for(timeout=30_000)
        page.set_viewport_size({"width": 1600, "height": 1000})
        _shot(page, tmp_path, "overview-time")
        page.set_viewport_size({"width": 1400, "height": 1000})
        assert page.get_by_text("Busiest GPU over the window:").count() >= 1
        for path, name in (("devices", "devices"), ("experts", "experts"), ("gpus", "gpus")):
            page.goto(f"{demo}/{path}")
            page.locator('[data-testid="stVegaLiteChart"] canvas').first.wait_for(timeout=60_000)  # a chart drawn
            page.wait_for_timeout(1500)
            assert page.locator('[data-testid="stException"]').count() == 0, f"{name} shows a traceback"
            _shot(page, tmp_path, name)
        assert page.get_by_text("NVML", exact=False).count() >= 1  # the GPU panel says NVML is unavailable
        page.goto(f"{demo}/time")  # the transformers demo times no layers: the page says so, without a traceback
        page.get_by_role("heading", name="Time").wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        assert page.locator('[data-testid="stException"]').count() == 0, "time shows a traceback"
        _shot(page, tmp_path, "time")
        page.goto(f"{demo}/what-if")
        page.locator('[data-testid="stVegaLiteChart"] canvas').first.wait_for(timeout=120_000)
        page.wait_for_function(PLANNED, timeout=180_000)
        page.wait_for_timeout(1000)
        assert page.locator('[data-testid="stException"]').count() == 0, "what-if shows a traceback"
        _shot(page, tmp_path, "whatif")

