"""A Megatron-Core training run on the CPU appears live in the dashboard, phase "train": real megatron-core modules
train with attach_megatron() publishing into a private redis-server while `streamlit run app.py` serves it, and
headless Debian chromium (playwright) sees the run, its train steps, and the steps of iterations trained after
the page was opened. Every wait is on a condition."""
from __future__ import annotations

import re
import socket
import warnings
from pathlib import Path

import pytest
import torch

from moe_monitor.collectors.megatron import attach_megatron
from tests.frameworks import megatron_support as ms
from tests.support.browserkit import app_on_private_redis, chromium_page

warnings.filterwarnings("ignore", category=UserWarning)
RUN = "mcore-live"
BEFORE, DURING = 2, 4  # iterations trained before the page opens, and while it is open


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.browser
def test_megatron_training_appears_live_as_train_steps(tmp_path: Path):
    ms.init_parallel(port=_free_port())
    try:
        config = ms.tiny_config()
        model = ms.build_model(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        state: dict = {}

        def start_training(server) -> None:  # before the app starts: the run exists when the page opens
            state["monitor"] = attach_megatron(model, redis_url=server.url, run=RUN, nvml=False)
            for step in range(BEFORE):
                with state["monitor"].iteration():
                    ms.train_iteration(model, optimizer, step)

        with app_on_private_redis(tmp_path, start_training) as url, chromium_page(1500, 2200) as page:
            monitor = state["monitor"]
            page.goto(url)
            page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=120_000)  # the answer's picture
            page.get_by_text(RUN, exact=True).first.wait_for(timeout=30_000)
            page.locator('[data-testid="stSidebar"]').get_by_text("train", exact=True).click()
            page.get_by_text(re.compile(rf"phase: train · {BEFORE} steps in window")).wait_for(timeout=60_000)
            for step in range(BEFORE, BEFORE + DURING):  # trained while the page is open
                with monitor.iteration():
                    ms.train_iteration(model, optimizer, step)
            monitor.close()
            assert monitor.stats()["published_steps"] == BEFORE + DURING
            page.get_by_text(re.compile(rf"phase: train · {BEFORE + DURING} steps in window")) \
                .wait_for(timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.screenshot(path=str(tmp_path / "megatron-live.png"), full_page=True)
    finally:
        ms.shutdown_parallel()
