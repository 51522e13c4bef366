"""A torchtitan training run on the CPU appears live in the dashboard (phase "train").

The tiny DeepSeek-V3 of torchtitan_support trains with the collector attached, publishing into a private
redis-server while `streamlit run app.py` serves it; headless Debian chromium (playwright) opens the overview,
picks the run and the phase "train", and sees the steps arrive as training goes on. Every wait is on a
condition.
"""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

from moe_monitor.collectors.torchtitan import attach
from moe_monitor.demo.localredis import RedisServer
from tests.frameworks import torchtitan_support as tt
from tests.support.browserkit import chromium_page, serving_app

warnings.filterwarnings("ignore", category=UserWarning)  # torchtitan's router: "In CPU autocast, ..."

RUN = "titan-live"


@pytest.mark.browser
def test_a_torchtitan_training_run_shows_live_with_phase_train(tmp_path: Path):
    server = RedisServer(tmp_path)
    model = tt.build_model(seed=5)
    optimizers = tt.build_optimizers(model)
    monitor = attach(model, server.url, run=RUN, optimizers=optimizers)
    try:
        tt.train(model, optimizers, iterations=2, micro_batches=1, seed=5)
        with serving_app(tmp_path / "streamlit.log", dict(os.environ, REDIS_URL=server.url)) as url, \
                chromium_page(1500, 1800) as page:
            page.goto(f"{url}/overview")
            page.get_by_text(re.compile(  # the default, auto, opens on the phase the run spends its time in
                rf"run {RUN} · .*phase: train \(auto: train 100% of the window's time\) · 2 steps in window")
            ).wait_for(timeout=90_000)
            page.locator('[data-testid="stSidebar"]').get_by_text("train", exact=True).click()
            page.get_by_text(re.compile(rf"run {RUN} · .*phase: train · 2 steps in window")).wait_for(timeout=60_000)
            tt.train(model, optimizers, iterations=3, micro_batches=1, seed=6)  # while the page is open
            page.get_by_text(re.compile(rf"run {RUN} · .*phase: train · 5 steps in window")).wait_for(timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.screenshot(path=str(tmp_path / "torchtitan-live.png"), full_page=True)
    finally:
        monitor.close()
        server.stop()
