"""The What-if page in a real browser: a private redis-server filled by the real collector, `streamlit run
app.py` against it, headless Debian chromium through playwright. Clicking a GPU bar of the Vega-Lite chart lists
that GPU's experts, and clicking one of them picks it for an edit; a screenshot lands in the test's tmp_path.
Apply: off, the page says so and offers no button; on (the server's MOE_APPLY_RUNS and secret), the EP runtime's own request watch refuses the page's request
as expired (a 1 ms request lifetime) or too large (a runtime that holds one slot per rank), and an unsigned and an
other-run request written into the run's request stream by someone else, and the page shows each reason."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from moe_monitor.demo.localredis import RedisServer
from tests.support.browserkit import chromium_page, serving_app

ROOT = Path(__file__).resolve().parents[2]
RUN = "whatif-browser"


APPLY_SECRET = "browser-whatif-apply-secret-0123456789"
APPLY_ENV = ("MOE_APPLY_RUNS", "MOE_APPLY_SECRET", "MOE_APPLY_SECRET_FILE", "MOE_APPLY_TTL_S")


@contextlib.contextmanager
def _app(tmp_path, apply_env: dict[str, str]):
    """(app URL, Redis URL): a filled private redis-server and `streamlit run app.py` with apply_env."""
    from tests.support.realfill import fill_with_collector

    server = RedisServer(tmp_path)
    try:
        fill_with_collector(server.url, RUN, steps=40)
        env = {k: v for k, v in os.environ.items() if k not in APPLY_ENV}
        env.update(REDIS_URL=server.url, **apply_env)
        with serving_app(tmp_path / "streamlit.log", env) as url:
            yield url, server.url
    finally:
        server.stop()


@pytest.fixture
def app_url(tmp_path):
    with _app(tmp_path, {}) as (url, _redis_url):
        yield url


# The bars of one colour on a Vega-Lite chart's canvas, left to right: [{x, y, height}] in page pixels (x, y: the
# bar's centre). Reads the canvas's pixels, so it finds what the user sees, whatever the chart's data.
BARS_OF = """(chart, rgb) => {
  const canvas = chart.querySelector('canvas');
  if (!canvas || !canvas.width) return [];
  const box = canvas.getBoundingClientRect();
  const scale = canvas.width / box.width;
  const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  const hit = (x, y) => { const i = 4 * (y * canvas.width + x);
    return px[i + 3] > 200 && rgb.every((c, k) => Math.abs(px[i + k] - c) <= 8); };
  const bars = [];
  let run = null;
  for (let x = 0; x < canvas.width; x++) {
    let top = -1, bottom = -1;
    for (let y = 0; y < canvas.height; y++) if (hit(x, y)) { if (top < 0) top = y; bottom = y; }
    if (top >= 0 && run) { run.x1 = x; run.top = Math.min(run.top, top); run.bottom = Math.max(run.bottom, bottom); }
    else if (top >= 0) run = {x0: x, x1: x, top, bottom};
    else if (run) { bars.push(run); run = null; }
  }
  if (run) bars.push(run);
  return bars.filter(b => b.x1 - b.x0 >= 3 * scale).map(b => ({
    x: box.left + (b.x0 + b.x1 + 1) / 2 / scale, y: box.top + (b.top + b.bottom + 1) / 2 / scale,
    height: (b.bottom - b.top + 1) / scale}));
}"""
WHATIF_BLUE, PICKED_RED = [0x1F, 0x77, 0xB4], [0xD6, 0x27, 0x28]


def _bars_once(page, chart, rgb: list[int], enough: str) -> list[dict]:
    """The chart's bars of colour rgb as soon as `enough` (a JS condition on `bars`) holds."""
    condition = f"([chart, rgb]) => {{ const bars = ({BARS_OF})(chart, rgb); return ({enough}) ? bars : null; }}"
    return page.wait_for_function(condition, arg=[chart.element_handle(), rgb], timeout=30_000).json_value()


@pytest.mark.browser
def test_click_gpu_bar_lists_its_experts_and_an_expert_bar_picks_it(app_url, tmp_path):
    with chromium_page(1500, 2600) as page:
        page.goto(f"{app_url}/what-if")
        page.get_by_text("Click a GPU bar").wait_for(timeout=90_000)  # drawn once the plan is in
        assert page.get_by_text("Experts on GPU").count() == 0
        charts = page.locator('[data-testid="stVegaLiteChart"]')
        bars_chart = charts.first                                   # the before/after bars come first
        # one what-if bar per GPU, GPU 0 leftmost, then the legend's swatch on the right
        bars = _bars_once(page, bars_chart, WHATIF_BLUE, "bars.length === 5")[:4]
        gpu = max(range(len(bars)), key=lambda i: bars[i]["height"])
        page.mouse.click(bars[gpu]["x"], bars[gpu]["y"])
        page.get_by_text(f"Experts on GPU {gpu} ").wait_for(timeout=30_000)
        expect(page.get_by_label("GPU", exact=True)).to_have_value(str(gpu))
        page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
        expert_chart = charts.nth(1)                                # the GPU's experts, below the bars
        expert_bars = _bars_once(page, expert_chart, WHATIF_BLUE, "bars.length > 0")
        assert expert_chart.evaluate(BARS_OF, PICKED_RED) == []    # no expert picked yet
        first = expert_bars[0]                                      # the heaviest expert on the GPU
        page.mouse.click(first["x"], first["y"])
        expect(page.get_by_label("expert", exact=True)).not_to_have_value("", timeout=30_000)
        picked = _bars_once(page, expert_chart, PICKED_RED, "bars.length === 1")  # its bar turns red
        assert abs(picked[0]["x"] - first["x"]) < 3, (picked, first)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(tmp_path / "whatif.png"), full_page=True)
        assert (tmp_path / "whatif.png").stat().st_size > 10_000


@pytest.mark.browser
def test_apply_off_says_so(app_url):
    with chromium_page(1500, 2600) as page:
        page.goto(f"{app_url}/what-if")
        page.get_by_text("Apply is off on this dashboard").wait_for(timeout=90_000)
        assert page.get_by_text("--apply-run RUN --apply-secret-file FILE").count() >= 1
        assert page.get_by_role("button", name="Apply to the running engine").count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0


def _watcher(redis_url: str, max_slots_per_rank: int = 512):
    """The EP runtime's own request watch (demo.ep.watch.LayoutWatcher) for RUN, sized from the run's metadata."""
    from moe_monitor import core
    from moe_monitor.demo.ep.admission import RequestRules
    from moe_monitor.demo.ep.watch import LayoutWatcher

    client = core.connect(redis_url, timeout_s=2.0)
    meta = core.decode_meta(client.get(core.meta_key(RUN)))
    client.close()
    rules = RequestRules(run=RUN, num_layers=len(meta.layer_names), num_experts=meta.num_experts,
                         ranks=meta.layout.gpus, max_slots_per_rank=max_slots_per_rank,
                         max_replicas_per_expert=meta.layout.gpus)
    return meta, LayoutWatcher(redis_url, rules, "browser-test-runtime", APPLY_SECRET.encode(), poll_s=0.05)


def _foreign_requests(redis_url: str, meta) -> None:
    """Two requests into RUN's request stream from a writer without the page: one unsigned (a bare layout
    record), one signed with the secret but naming another run."""
    import time

    import numpy as np

    from moe_monitor import core
    from moe_monitor.core.layout_requests import encode_layout_request, sign_request

    layout_LP = np.asarray(meta.layout.physical_to_logical_map, dtype=np.int32)
    record = core.LayoutRecord(run=RUN, step=1, time_s=time.time(), layout_LP=layout_LP,
                               gpus=meta.layout.gpus, source="apply", instance="somebody")
    other = core.LayoutRecord(run="another-run", step=1, time_s=time.time(),
                              layout_LP=layout_LP, gpus=meta.layout.gpus, source="apply",
                              instance="somebody")
    client = core.connect(redis_url, timeout_s=2.0)
    client.xadd(core.layout_requests_key(RUN), core.encode_layout_record(record))
    client.xadd(core.layout_requests_key(RUN), encode_layout_request(sign_request(other, APPLY_SECRET.encode())))
    client.close()


def _apply_from_the_page(page, url: str) -> None:
    page.goto(f"{url}/what-if")
    page.get_by_role("button", name="Apply to the running engine").click(timeout=90_000)
    page.get_by_text(f"Switch the engine of run {RUN}").wait_for(timeout=30_000)
    page.get_by_role("button", name="Confirm: apply").click(timeout=30_000)


@pytest.mark.browser
def test_apply_on_shows_the_engines_refusals_of_expired_unsigned_and_other_run_requests(tmp_path):
    env = {"MOE_APPLY_RUNS": RUN, "MOE_APPLY_SECRET": APPLY_SECRET, "MOE_APPLY_TTL_S": "0.001"}
    with _app(tmp_path, env) as (url, redis_url):
        meta, watcher = _watcher(redis_url)
        try:
            with chromium_page(1500, 2600) as page:
                _apply_from_the_page(page, url)
                # on screen only: a rerun can leave the previous run's elements in the page, stale and zero pixels
                # tall, until Streamlit drops them (seen on the live pages); a count of every match includes them
                reason = page.get_by_text("Last request from this page: refused: expired (").filter(visible=True)
                reason.wait_for(timeout=30_000)
                page.get_by_role("button", name="Confirm: apply").wait_for(state="detached", timeout=30_000)
                expect(reason).to_have_count(1)
                expect(page.get_by_text("requested at step").filter(visible=True)).to_have_count(0)  # replaced
                _foreign_requests(redis_url, meta)
                page.get_by_text("refused: bad signature (the request is unsigned").wait_for(timeout=30_000)
                page.get_by_text("refused: another run (the request is for run 'another-run'").wait_for(
                    timeout=30_000)
                expect(reason).to_have_count(1)  # the page's own answer stays while the others arrive
                assert page.get_by_role("button", name="Confirm: apply").count() == 0
                assert page.locator('[data-testid="stException"]').count() == 0
                page.screenshot(path=str(tmp_path / "whatif-refused.png"), full_page=True)
        finally:
            watcher.close()
        assert watcher.refused == 3


@pytest.mark.browser
def test_apply_on_shows_the_engines_refusal_of_a_layout_too_large_for_its_ranks(tmp_path):
    env = {"MOE_APPLY_RUNS": RUN, "MOE_APPLY_SECRET": APPLY_SECRET}
    with _app(tmp_path, env) as (url, redis_url):
        _meta, watcher = _watcher(redis_url, max_slots_per_rank=1)  # the run's layout puts more slots on a rank
        try:
            with chromium_page(1500, 2600) as page:
                _apply_from_the_page(page, url)
                page.get_by_text("Last request from this page: refused: too large (").wait_for(timeout=30_000)
                assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            watcher.close()
        assert watcher.refused == 1
