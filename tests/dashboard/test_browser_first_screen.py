"""The Overview's first screen as a user sees it at 1600x1000 in headless Debian chromium, on a live run that
keeps writing: the answer and its picture above the fold, the phase the run spends its time in shown by default,
and not one frame with a blank chart over 30 s of refresh (the picture is a keyed Vega-Lite chart, updated in
place). The screenshot lands in $MOE_DOCS_SCREENSHOTS when it names a folder (docs/img/first-screen.png)."""
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
from tests.dashboard.blankframes import CHARTS, SAMPLER
from tests.support import synthfill
from tests.support.browserkit import SIDEBAR_WIDGETS, chromium_page, serving_app

ROOT = Path(__file__).resolve().parents[2]
RUN = "live"


def _write(url: str, stop: threading.Event, first_step: int) -> None:
    """A collector's stream on DeepSeek-V3's expert sizes and an H100 profile (the answer in time): decode steps
    every 0.1 s, a prefill step every tenth; expert 3 (GPU 0 of 4) runs hot."""
    client = core.connect(url)
    client.set(core.meta_key(RUN), core.encode_meta(core.RunMeta(
        run=RUN, model_name="synthetic", layer_names=[f"layers.{i}.mlp" for i in range(4)], num_experts=16, top_k=2,
        hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=1, act_dtype_bytes=2, gpu_profile="H100 SXM",
        layout=core.Layout(4, 1, core.contiguous_layout(4, 16)))))
    rng = np.random.default_rng(0)
    step = first_step
    while not stop.is_set():
        counts = synthfill.skewed_counts(rng, 4, 16, 256, hot_expert=3)
        client.xadd(core.steps_key(RUN), core.encode_step(core.StepRecord(
            run=RUN, rank=0, world_size=1, step=step, time_s=time.time(), phase="prefill" if step % 10 == 0
            else "decode", tokens=256, counts_LE=counts)))
        client.zadd(core.RUNS_KEY, {RUN: time.time()})
        step += 1
        stop.wait(0.1)


@pytest.fixture
def live_app(tmp_path):
    server = RedisServer(tmp_path)
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(server.url, stop, 0), daemon=True)
    try:
        writer.start()
        with serving_app(tmp_path / "streamlit.log", dict(os.environ, REDIS_URL=server.url)) as url:
            yield url
    finally:
        stop.set()
        writer.join(10)
        server.stop()


@pytest.mark.browser
def test_the_answer_and_its_picture_are_above_the_fold_and_never_blank(live_app, tmp_path):
    with chromium_page(1600, 1000) as page:
        page.goto(live_app)
        answer = page.locator('[data-testid="stAlert"]', has_text="holds the MoE layers back").first
        answer.wait_for(timeout=120_000)
        assert "GPU 0 (node 0)" in answer.inner_text() and "To do:" in answer.inner_text()
        picture = page.locator('[data-testid="stVegaLiteChart"]').first
        picture.wait_for(timeout=60_000)
        page.get_by_text("phase: decode (auto: decode", exact=False).first.wait_for(timeout=30_000)
        for what, box in (("the answer", answer.bounding_box()), ("the picture", picture.bounding_box())):
            assert box is not None and box["y"] + box["height"] <= 1000, f"{what} ends below the fold: {box}"
        page.locator(SIDEBAR_WIDGETS).first.wait_for(timeout=60_000)  # the sidebar drawn too
        shot = tmp_path / "first-screen.png"
        page.screenshot(path=str(shot), full_page=False)
        if os.environ.get("MOE_DOCS_SCREENSHOTS"):
            shutil.copy(shot, ROOT / os.environ["MOE_DOCS_SCREENSHOTS"] / shot.name)
        seen = page.evaluate(SAMPLER, 30_000)
        assert seen["first"] >= 1 and seen["frames"] > 100, seen
        assert seen["blank"] == 0 and seen["fewer"] == 0, seen
        assert page.locator(CHARTS).count() >= 1
        assert page.locator('[data-testid="stException"]').count() == 0
