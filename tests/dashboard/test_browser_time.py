"""The Overview's first line in time, in a real browser (a private redis-server filled by the real collector,
`streamlit run app.py` against it, headless Debian chromium through playwright), and in Streamlit's AppTest.

The run declares DeepSeek-V3's expert sizes (FP8) and the H100 SXM profile. 4 GPUs in 2 nodes, 2 experts each;
every decode step sends 8 tokens to each of experts 0 and 1 (GPU 0) and 8 to each of experts 2, 4, 6: GPU 0
runs 2 active experts, the others 1, and every expert is far below the ridge (weight reads bound it), so the
layers wait for GPU 0 because of its active experts, while its tokens are only 2x the others'."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe_monitor.collectors import ExpertLoadMonitor
from tests.support.apptest import open_page, run_app
from tests.support.browserkit import app_on_private_redis, chromium_page

RUN = "time-run"
IDS = torch.tensor([[0, 1]] * 8 + [[2, 4]] * 8 + [[6, 6]] * 4).reshape(-1, 2)  # expert 6: 8 of the 40 picks
FIRST = "The MoE layers lose"
ANSWER = "GPU 0 (node 0) holds the MoE layers back"
WHY = "Why: it runs 2.0 active experts per layer against a mean of 1.2"
LABEL = "predicted for H100 SXM, hidden 7168 x expert 2048 x 3 matrices, fp8 weights"


def fill(url: str, steps: int = 12, declared: bool = True, dispatch: str = "even") -> None:
    sizes = dict(hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=1, act_dtype_bytes=2,
                 gpu_profile="H100 SXM") if declared else {}
    mon = ExpertLoadMonitor(2, 8, 2, redis_url=url, run=RUN, gpus=4, nodes=2, nvml=False, dispatch=dispatch,
                            **sizes)
    for _ in range(steps):
        for layer in range(2):
            mon.record(layer, IDS)
        mon.end_step("decode")
    mon.close()


def test_overview_first_line_in_time(redis_server, monkeypatch):
    redis_server.client().flushdb()
    fill(redis_server.url)
    at = run_app(redis_server.url, monkeypatch)
    first = at.warning[0].value  # the answer, above everything but the page's caption
    assert first.removeprefix(":red[●] ").startswith(f"**{ANSWER}**: they lose ") and WHY in first and "GPU-hours a day" in first, first
    assert any("× faster if every GPU finished at the mean" in c.value and LABEL in c.value for c in at.caption)
    assert any(md.value.startswith(f"**{FIRST} ") for md in at.main.markdown)  # the details keep the long form


def test_an_engine_that_evens_gpu_tokens_gets_router_skew_and_active_experts(redis_server, monkeypatch):
    redis_server.client().flushdb()
    fill(redis_server.url, dispatch="ideal")
    at = run_app(redis_server.url, monkeypatch)
    info = [i.value for i in at.info]
    assert any("evens GPU tokens by construction (dispatch ideal)" in v and "max/mean 1.60" in v for v in info), info
    redis_server.client().flushdb()
    fill(redis_server.url)
    assert not any("by construction" in i.value for i in run_app(redis_server.url, monkeypatch).info)


def test_overview_warns_when_rebalancing_stopped_while_imbalanced(redis_server, monkeypatch):
    import time

    import numpy as np

    from moe_monitor import core

    client = redis_server.client()
    client.flushdb()
    fill(redis_server.url)
    now = time.time()
    for k, step in enumerate((2, 4, 6)):   # every 10 minutes, the last an hour ago
        layout_LP = np.roll(np.arange(8, dtype=np.int32), k + 1)[None].repeat(2, axis=0)
        client.xadd(core.layouts_key(RUN), core.encode_layout_record(core.LayoutRecord(
            run=RUN, step=step, time_s=now - 3600 - 600 * (2 - k), layout_LP=layout_LP, gpus=4, nodes=2)))
    at = run_app(redis_server.url, monkeypatch)
    warnings = [w.value for w in at.warning]
    assert any(w.startswith("Rebalancing: 3 rebalances, the last 3,6") and "looks stopped (usually every 600 s)" in w
               and "check the engine's rebalancer" in w for w in warnings), warnings


def test_devices_active_experts_and_regimes(redis_server, monkeypatch):
    redis_server.client().flushdb()
    fill(redis_server.url)
    at = run_app(redis_server.url, monkeypatch)
    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    table = at.dataframe[-1].value
    assert table["active experts/GPU, max"].tolist() == [2.0, 2.0] and table["mean"].tolist() == [1.25, 1.25]
    assert table["regime"].tolist() == ["memory-bound"] * 2 and table["tokens per active expert"].tolist() == [8.0, 8.0]
    assert any("Active experts per GPU, max/mean: 1.60 (median layer). 2 of 2 layers memory-bound" in md.value
               for md in at.markdown)


def test_overview_without_dimensions_says_so_in_tokens(redis_server, monkeypatch):
    redis_server.client().flushdb()
    fill(redis_server.url, declared=False)
    at = run_app(redis_server.url, monkeypatch)
    first = at.warning[0].value
    assert first.removeprefix(":red[●] ").startswith(
        "**GPU 0 (node 0) holds the MoE layers back** (in tokens: no model dimensions/GPU profile): busiest in "), first
    assert any(md.value.startswith("**No model dimensions/GPU profile: figures in tokens — idle share ")
               for md in at.main.markdown)
    assert any("hidden_size" in c.value and "gpu_profile" in c.value for c in at.caption)


@pytest.fixture
def app_url(tmp_path: Path):
    with app_on_private_redis(tmp_path, lambda server: fill(server.url)) as url:
        yield url


@pytest.mark.browser
def test_overview_first_line_in_time_in_chromium(app_url, tmp_path):
    with chromium_page(1600, 1000) as page:
        page.goto(app_url)
        answer = page.locator('[data-testid="stAlert"]', has_text=ANSWER).first
        answer.wait_for(timeout=90_000)
        first = answer.inner_text()
        assert first.removeprefix("● ").startswith(ANSWER) and WHY in first, first
        main = page.locator('[data-testid="stMain"]')
        main.get_by_text(LABEL, exact=False).first.wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(tmp_path / "overview-time.png"))
