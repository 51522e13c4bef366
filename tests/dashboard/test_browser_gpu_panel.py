"""The GPU panel's all-GPU view in headless Debian chromium at 8, 32 and 256 EP GPUs, as a user sees it at
1600x1000: a run that keeps writing (every rank's steps, its NVML readings once a second; one GPU is the
straggler and another runs low clocks), every heatmap drawn with one row per GPU, the named GPU first in the
table, and not one blank chart frame over 10 s of refresh. Full-page screenshots land in the test's tmp_path;
with MOE_DOCS_SCREENSHOTS naming a folder, the 32-GPU one is the docs' gpus-all.png there."""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.demo.localredis import RedisServer
from tests.dashboard.blankframes import CHARTS, DRAWN, SAMPLER
from tests.dashboard.test_gpu_panel_every_gpu import SLOTS, nvml_reading
from tests.support import synthfill
from tests.support.browserkit import SIDEBAR_WIDGETS, chromium_page, serving_app

ROOT = Path(__file__).resolve().parents[2]
RUN = "every-gpu"
HOT_SLOW = {8: (2, 6), 32: (5, 5), 256: (200, 77)}  # GPUs -> (the straggler, the GPU with low clocks)


def _write(url: str, gpus: int, stop: threading.Event) -> None:
    """Decode steps every 0.5 s from every rank (the straggler's expert hot), each rank's NVML reading every
    second, until stop."""
    hot, slow = HOT_SLOW[gpus]
    client = core.connect(url)
    experts = gpus * SLOTS
    client.set(core.meta_key(RUN), core.encode_meta(synthfill.make_meta(
        RUN, 2, experts, gpus, nodes=max(1, gpus // 8), world_size=gpus)))
    rng = np.random.default_rng(0)
    step = 0
    while not stop.is_set():
        now = time.time()
        pipe = client.pipeline(transaction=False)
        counts = synthfill.skewed_counts(rng, 2, experts, 1024 * gpus, hot_expert=hot * SLOTS, hot_share=0.5)
        for rank in range(gpus):  # the same counts split over the ranks: what matters is their sum
            pipe.xadd(core.steps_key(RUN), core.encode_step(core.StepRecord(
                run=RUN, rank=rank, world_size=gpus, step=step, time_s=now, phase="decode", tokens=1024,
                counts_LE=counts // gpus + (counts % gpus > rank))))
            if step % 2 == 0:
                pipe.xadd(core.gpu_key(RUN), core.encode_gpu_sample(core.GpuSample(
                    rank=rank, host=f"node-{rank // 8}", time_s=now, status="ok",
                    gpus=[nvml_reading(rank, slow, step // 2)])))
        pipe.zadd(core.RUNS_KEY, {RUN: now})
        pipe.execute()
        step += 1
        stop.wait(0.5)


@pytest.fixture(scope="module", params=sorted(HOT_SLOW))
def live_app(request, tmp_path_factory):
    gpus = request.param
    tmp_path = tmp_path_factory.mktemp(f"gpus{gpus}")
    server = RedisServer(tmp_path)
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(server.url, gpus, stop), daemon=True)
    try:
        writer.start()
        with serving_app(tmp_path / "streamlit.log", dict(os.environ, REDIS_URL=server.url)) as url:
            yield gpus, url
    finally:
        stop.set()
        writer.join(10)
        server.stop()


@pytest.mark.browser
def test_every_gpu_on_one_screen_with_the_straggler_marked(live_app, tmp_path):
    gpus, url = live_app
    hot, slow = HOT_SLOW[gpus]
    with chromium_page(1600, 1000) as page:
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{url}/gpus")
        page.get_by_text(f"red outline: GPU {hot}, the GPU the Overview names", exact=False).wait_for(timeout=180_000)
        # the clock-against-load chart, five heatmaps, the detail's load and five NVML panels
        page.wait_for_function(DRAWN, arg=[CHARTS, 12], timeout=120_000)
        # the slow GPU has sent a reading (every rank's first arrives within a tick or two of the first)
        grid = page.locator('[data-testid="stDataFrame"]').first
        grid.wait_for(timeout=60_000)
        page.get_by_text(f"GPU {hot} (node {hot // 8}) expert load, latest step").wait_for(timeout=60_000)
        seen = page.evaluate(SAMPLER, 10_000)
        print(gpus, seen)  # frames seen, with -s
        assert seen["first"] >= 12 and seen["blank"] == 0 and seen["fewer"] == 0, seen
        assert page.locator('[data-testid="stException"]').count() == 0
        assert not [e for e in errors if "vega" in e.lower() or "Infinite extent" in e], errors
        page.screenshot(path=str(tmp_path / f"gpus-{gpus}.png"), full_page=True)
        docs = os.environ.get("MOE_DOCS_SCREENSHOTS")
        if docs and gpus == 32:  # the all-GPU view from its heading down
            page.get_by_role("heading", name="Every GPU").evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_function(DRAWN, arg=[CHARTS, 6], timeout=30_000)
            page.locator(SIDEBAR_WIDGETS).first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "gpus-all.png"), full_page=False)
            shutil.copy(tmp_path / "gpus-all.png", (ROOT / docs) / "gpus-all.png")
