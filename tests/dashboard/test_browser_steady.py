"""Steady refresh on every live page, as a user sees it at 1600x1000 in headless Debian chromium: a run that keeps
writing (two ranks on two GPUs, their layer timings, their NVML readings, one layout change), and not one frame in
which a chart on screen is blank or missing over 30 s of refresh on Devices, Experts, the GPU panel and Time (their
charts are Vega-Lite charts whose specs do not change between ticks, updated in place)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.demo.localredis import RedisServer
from tests.dashboard.blankframes import CHARTS, DRAWN, SAMPLER
from tests.support import synthfill
from tests.support.browserkit import chromium_page, serving_app

RUN = "steady"
L, E, G = 4, 16, 2
CHANGE_AT = 40  # the step a layout applied from: every time chart carries its mark
PAGES = {"devices": 5, "experts": 3, "gpus": 1, "time": 5}  # charts each page draws at least


def _nvml(rank: int, now: float, step: int) -> core.GpuSample:
    gpu = {"index": 0, "name": "H100", "uuid": f"GPU-{rank}", "gpu_utilization_percent": 60 + step % 30,
           "memory_used_bytes": 40 << 30, "memory_total_bytes": 80 << 30, "power_usage_w": 400.0 + step % 50,
           "power_limit_w": 700.0, "sm_clock_mhz": 1980, "temperature_c": 55}
    return core.GpuSample(rank=rank, host=f"node-{rank}", time_s=now, status="ok", gpus=[gpu])


def _write(url: str, stop: threading.Event) -> None:
    """Decode steps every 0.1 s (a prefill step every tenth) from 2 ranks, expert 3 hot; per step each rank's
    layer timings; NVML readings every fifth step; the layout reversed from step CHANGE_AT on."""
    client = core.connect(url)
    client.set(core.meta_key(RUN), core.encode_meta(synthfill.make_meta(RUN, L, E, G, world_size=G)))
    rng = np.random.default_rng(0)
    step = 0
    while not stop.is_set():
        now = time.time()
        pipe = client.pipeline()
        for rank in range(G):
            counts = synthfill.skewed_counts(rng, L, E, 128, hot_expert=3)
            pipe.xadd(core.steps_key(RUN), core.encode_step(core.StepRecord(
                run=RUN, rank=rank, world_size=G, step=step, time_s=now, phase="prefill" if step % 10 == 0
                else "decode", tokens=128, counts_LE=counts)))
            layer_s = np.full(L, 1e-3 * (1 + rank + step % 3), dtype=np.float32)
            pipe.xadd(core.timings_key(RUN), core.encode_timing(core.TimingRecord(
                run=RUN, rank=rank, world_size=G, step=step, time_s=now, dispatch_s_L=layer_s * 0.1,
                compute_s_L=layer_s * 0.4, combine_s_L=layer_s * 0.1, layer_s_L=layer_s)))
            if step % 5 == 0:
                pipe.xadd(core.gpu_key(RUN), core.encode_gpu_sample(_nvml(rank, now, step)))
        if step == CHANGE_AT:
            pipe.xadd(core.layouts_key(RUN), core.encode_layout_record(core.LayoutRecord(
                run=RUN, step=step, time_s=now, layout_LP=np.tile(np.arange(E, dtype=np.int32)[::-1], (L, 1)),
                gpus=G, nodes=1, source="apply")))
        pipe.zadd(core.RUNS_KEY, {RUN: now})
        pipe.execute()
        step += 1
        stop.wait(0.1)


@pytest.fixture(scope="module")
def live_app(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("steady")
    server = RedisServer(tmp_path)
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(server.url, stop), daemon=True)
    try:
        writer.start()
        with serving_app(tmp_path / "streamlit.log", dict(os.environ, REDIS_URL=server.url)) as url:
            yield url
    finally:
        stop.set()
        writer.join(10)
        server.stop()


@pytest.mark.browser
@pytest.mark.parametrize("page_name", list(PAGES))
def test_no_chart_blanks_over_30_s_of_live_refresh(live_app, page_name):
    with chromium_page(1600, 1000) as page:
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{live_app}/{page_name}")
        # the page's charts drawn, the layout change in view (its steps have arrived)
        page.wait_for_function(DRAWN, arg=[CHARTS, PAGES[page_name]], timeout=180_000)
        if page_name != "gpus":
            page.get_by_text(f"layout: layout applied at step {CHANGE_AT}", exact=False).first.wait_for(timeout=120_000)
        seen = page.evaluate(SAMPLER, 30_000)
        print(page_name, seen)  # frames seen, with -s
        assert seen["first"] >= PAGES[page_name] and seen["frames"] > 100, seen
        assert seen["blank"] == 0 and seen["fewer"] == 0, seen
        assert page.locator('[data-testid="stException"]').count() == 0
        assert not [e for e in errors if "vega" in e.lower() or "Infinite extent" in e], errors
