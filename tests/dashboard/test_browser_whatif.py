"""The What-if page in a real browser: a private redis-server filled by the real collector, `streamlit run
app.py` against it, headless Debian chromium through playwright. Clicking a GPU bar of the plotly chart
lists that GPU's experts; a screenshot lands in the test's tmp_path."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from moe_monitor.demo.localredis import RedisServer, free_port
from tests.support.browserkit import chromium_page, serving

ROOT = Path(__file__).resolve().parents[2]
RUN = "whatif-browser"


@pytest.fixture
def app_url(tmp_path):
    from tests.support.realfill import fill_with_collector

    server = RedisServer(tmp_path)
    try:
        fill_with_collector(server.url, RUN, steps=40)
        port = free_port()
        env = dict(os.environ, REDIS_URL=server.url)
        with serving(["-m", "streamlit", "run", "moe_monitor/dashboard/app.py", "--server.port", str(port), "--server.headless", "true",
                      "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                     port, tmp_path / "streamlit.log", env) as url:
            yield url
    finally:
        server.stop()


@pytest.mark.browser
def test_click_gpu_bar_lists_its_experts(app_url, tmp_path):
    with chromium_page(1500, 2600) as page:
        page.goto(f"{app_url}/what-if")
        chart = page.locator(".js-plotly-plot").first
        chart.wait_for(timeout=60_000)
        page.get_by_text("Click a GPU bar").wait_for(timeout=30_000)
        assert page.get_by_text("Experts on GPU").count() == 0
        # the what-if trace is the second bar trace; click its tallest bar
        bars = chart.locator(".barlayer .trace").nth(1).locator(".point path")
        bars.first.wait_for(timeout=30_000)
        boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
        gpu = max(range(len(boxes)), key=lambda i: boxes[i]["height"] if boxes[i] else -1)
        box = boxes[gpu]
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        heading = page.get_by_text(f"Experts on GPU {gpu} ")
        heading.wait_for(timeout=30_000)
        page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(tmp_path / "whatif.png"), full_page=True)
        assert (tmp_path / "whatif.png").stat().st_size > 10_000

