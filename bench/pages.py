"""Each page's time to its first chart in headless Debian chromium, this tree beside the previous main.

One private redis-server (never another Redis) holds a live run shaped like `make demo`'s (4 MoE layers x 256
experts, top-8, 32 GPUs on 4 nodes, DeepSeek-V3's expert sizes on an H100 profile) that a writer thread keeps
extending at 10 steps a second. The dashboard of this tree and the one of MOE_BENCH_BASELINE (or --baseline REV;
git archive, bench/baseline.py) serve it side by side; for each repeat, each tree and each page, a new browser
context opens the page and the time until a chart on screen has drawn is taken (a new session on a warm
server). Medians of the repeats, interleaved, beside the floor: a bare Streamlit page with one small live
Vega-Lite chart (what Streamlit and chromium take before a page of ours does anything); and the same in a new tab
of a browser that opened the dashboard before (its scripts cached, as a returning user's); and from a click on the
page in the sidebar of an Overview just opened, once drawn whole. Then blank-chart frames over --watch-s seconds
of live refresh per page (tests/dashboard/blankframes.py).

    python -m bench.pages [--repeats 5] [--baseline REV] [--watch-s 10] [--pages overview,devices]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.baseline import REPO, child_cwd, child_env, imported_from, trees
from bench.malloc_env import pin_malloc

pin_malloc()

import numpy as np

from moe_monitor import core
from moe_monitor.demo.localredis import RedisServer, free_port
from tests.dashboard.blankframes import CHARTS, DRAWN, SAMPLER
from tests.support.browserkit import CHROMIUM, CHROMIUM_ARGS, SIDEBAR_WIDGETS, STREAMLIT_APP, wait_http

RUN = "bench-pages"
PAGES = ("overview", "devices", "experts", "gpus", "time", "what-if")
LAYERS, EXPERTS, TOP_K, GPUS, NODES = 4, 256, 8, 32, 4
FLOOR_APP = """import numpy as np, pandas as pd, streamlit as st
st.title("Floor")
@st.fragment(run_every=1.0)
def live():
    data = pd.DataFrame({"gpu": np.arange(32), "value": np.random.rand(32)})
    st.vega_lite_chart(data, {"mark": "bar", "encoding": {"x": {"field": "gpu", "type": "ordinal"},
                                                        "y": {"field": "value", "type": "quantitative"}}},
                       width="stretch")
live()
"""  # the floor: a bare Streamlit page whose only content is one small live Vega-Lite chart
ONE_DRAWN = [CHARTS, 1]  # DRAWN's argument: a chart on screen has drawn
# a navigation's charts: those not on screen before the click (MARK_BEFORE marks those)
MARK_BEFORE = "(charts) => document.querySelectorAll(charts).forEach(c => { c.dataset.before = '1'; })"
ONE_DRAWN_SINCE = [CHARTS + ":not([data-before])", 1]
# the Overview drawn whole (its second run: the sidebar's widgets and the details' expander on screen)
WHOLE = """() => document.querySelector('""" + SIDEBAR_WIDGETS + """')
    && [...document.querySelectorAll('[data-testid="stExpander"]')].some(e => e.textContent.includes('Every figure'))"""


def write(url: str, stop: threading.Event) -> None:
    """The run's metadata, then decode steps (a prefill step every tenth) and their layer timings at 10 a
    second until stop."""
    client = core.connect(url)
    client.set(core.meta_key(RUN), core.encode_meta(core.RunMeta(
        run=RUN, model_name="deepseek-v3-shaped", layer_names=[f"model.layers.{i + 1}.mlp" for i in range(LAYERS)],
        num_experts=EXPERTS, top_k=TOP_K, hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=1,
        act_dtype_bytes=2, gpu_profile="H100 SXM",
        layout=core.Layout(GPUS, NODES, core.contiguous_layout(LAYERS, EXPERTS)))))
    rng = np.random.default_rng(0)
    weights = rng.gamma(0.6, size=(LAYERS, EXPERTS))
    weights /= weights.sum(axis=1, keepdims=True)
    step = 0
    while not stop.is_set():
        tokens = 2048 if step % 10 == 0 else 64
        counts = np.stack([rng.multinomial(tokens * TOP_K, w) for w in weights]).astype(np.int32)
        now = time.time()
        client.xadd(core.steps_key(RUN), core.encode_step(core.StepRecord(
            run=RUN, rank=0, world_size=1, step=step, time_s=now, phase="prefill" if step % 10 == 0 else
            "decode", tokens=tokens, counts_LE=counts)))
        layer_s = np.full(LAYERS, 1e-4 * (1 + tokens / 64), dtype=np.float32)  # the Time page's layer timings
        client.xadd(core.timings_key(RUN), core.encode_timing(core.TimingRecord(
            run=RUN, rank=0, world_size=1, step=step, time_s=now, dispatch_s_L=layer_s * 0.1,
            compute_s_L=layer_s * 0.5, combine_s_L=layer_s * 0.1, layer_s_L=layer_s)))
        client.zadd(core.RUNS_KEY, {RUN: time.time()})
        step += 1
        stop.wait(0.1)


def serve_floor(work: Path, port: int) -> subprocess.Popen:
    """FLOOR_APP served on port: what Streamlit and chromium take before any page of ours does anything."""
    (work / "floor.py").write_text(FLOOR_APP)
    args = [a if a != "moe_monitor/dashboard/app.py" else str(work / "floor.py") for a in STREAMLIT_APP]
    with open(work / "floor.log", "w") as out:
        proc = subprocess.Popen([sys.executable, *args, "--server.port", str(port)], cwd=work, env=child_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/_stcore/health", 120, proc)
    return proc


def serve(root: Path | None, port: int, redis_url: str, log: Path, rev: str = "") -> subprocess.Popen:
    """The dashboard of the tree at root (None: this one) on port, reading redis_url; a baseline (root exported
    from rev) serves with rev's own .streamlit/config.toml (this tree's when rev has none)."""
    cwd = child_cwd(root)
    if root is not None:
        imported_from(root)
        own = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:.streamlit/config.toml"], capture_output=True,
                             timeout=60)
        if own.returncode == 0:
            (cwd / ".streamlit").mkdir(exist_ok=True)
            (cwd / ".streamlit" / "config.toml").write_bytes(own.stdout)
        else:
            shutil.copytree(REPO / ".streamlit", cwd / ".streamlit", dirs_exist_ok=True)
    app = str(cwd / "moe_monitor" / "dashboard" / "app.py")
    args = [a if a != "moe_monitor/dashboard/app.py" else app for a in STREAMLIT_APP]
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args, "--server.port", str(port)], cwd=cwd,
                                env={**child_env(), "REDIS_URL": redis_url}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/_stcore/health", 120, proc)
    return proc


def stop_all(procs, server: RedisServer, work: Path) -> None:
    """Stop the servers' process groups (SIGTERM, SIGKILL after 20 s), the Redis server, and remove work."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
    server.stop()
    shutil.rmtree(work, ignore_errors=True)


def first_chart_s(browser, url: str, context=None) -> float:
    """Seconds from asking for url until a chart on screen has drawn: in a new browser context (nothing cached),
    or in a new tab of `context` (a browser that opened the dashboard before: its scripts cached)."""
    own = context is None
    context = browser.new_context(viewport={"width": 1600, "height": 1000}) if own else context
    page = context.new_page()
    try:
        began = time.perf_counter()
        page.goto(url)
        page.wait_for_function(DRAWN, arg=ONE_DRAWN, timeout=120_000)
        return time.perf_counter() - began
    finally:
        page.close()
        if own:
            context.close()


def navigated_s(browser, base: str, page: str) -> float:
    """Seconds from a click on `page` in the sidebar's navigation, on the Overview of a new session drawn whole,
    until a chart of that page has drawn: what a user who opened the dashboard waits for each page after the
    first."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        tab = context.new_page()
        tab.goto(f"{base}/overview")
        tab.wait_for_function(DRAWN, arg=ONE_DRAWN, timeout=120_000)
        tab.wait_for_function(WHOLE, timeout=120_000)
        tab.evaluate(MARK_BEFORE, CHARTS)
        began = time.perf_counter()
        tab.click(f'[data-testid="stSidebarNav"] a[href$="/{page}"]')
        tab.wait_for_function(DRAWN, arg=ONE_DRAWN_SINCE, timeout=120_000)
        return time.perf_counter() - began
    finally:
        context.close()


def print_medians(seconds: dict[tuple[str, str], list[float]], names: list[str], pages) -> None:
    """A line per page: each tree's median seconds, and this tree's over the baseline's."""
    for page in pages:
        medians = [statistics.median(seconds[(n, page)]) for n in names]
        ratio = "" if len(names) < 2 else f"  ratio {medians[0] / medians[1]:.2f}"
        print(f"  {page:9s} " + " · ".join(f"{n} {m:5.2f} s" for n, m in zip(names, medians)) + ratio)


def blank_frames(browser, url: str, watch_s: float) -> dict:
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        page.goto(url)
        page.wait_for_function(DRAWN, arg=ONE_DRAWN, timeout=120_000)
        return page.evaluate(SAMPLER, int(watch_s * 1000))
    finally:
        context.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", default=os.environ.get("MOE_BENCH_BASELINE", ""))
    parser.add_argument("--watch-s", type=float, default=10.0)
    parser.add_argument("--pages", default=",".join(PAGES), help="comma-separated, of " + ", ".join(PAGES))
    args = parser.parse_args()
    pages = [p for p in args.pages.split(",") if p in PAGES]
    if not Path(CHROMIUM).exists():
        print(f"  no {CHROMIUM}: bash scripts/system-deps.sh --with-browser, then again")
        return 0
    from playwright.sync_api import sync_playwright

    found = trees(args.baseline)
    work = Path(tempfile.mkdtemp(prefix="bench-pages-"))
    server, stop = RedisServer(work), threading.Event()
    writer = threading.Thread(target=write, args=(server.url, stop), daemon=True)
    procs: dict[str, subprocess.Popen] = {}
    urls: dict[str, str] = {}
    try:
        writer.start()
        for name, root in found.items():
            port = free_port()
            procs[name] = serve(root, port, server.url, work / f"{len(procs)}.log", name)
            urls[name] = f"http://127.0.0.1:{port}"
        port = free_port()
        procs["floor"] = serve_floor(work, port)
        floor_url, floor_s, floor_warm_s = f"http://127.0.0.1:{port}/", [], []
        time.sleep(3.0)  # the window fills with live steps
        times: dict[tuple[str, str], list[float]] = {(n, p): [] for n in found for p in pages}
        warm: dict[tuple[str, str], list[float]] = {(n, p): [] for n in found for p in pages}
        clicked: dict[tuple[str, str], list[float]] = {(n, p): [] for n in found for p in pages if p != "overview"}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            first_chart_s(browser, floor_url)
            floor_cached = browser.new_context(viewport={"width": 1600, "height": 1000})
            first_chart_s(browser, floor_url, floor_cached)
            cached = {name: browser.new_context(viewport={"width": 1600, "height": 1000}) for name in found}
            for name in found:  # warm-up: each server imports its pages once, untimed; each cached browser loads them
                for page in pages:
                    first_chart_s(browser, f"{urls[name]}/{page}")
                    first_chart_s(browser, f"{urls[name]}/{page}", cached[name])
            for _ in range(args.repeats):
                floor_s.append(first_chart_s(browser, floor_url))
                floor_warm_s.append(first_chart_s(browser, floor_url, floor_cached))
                for name in found:
                    for page in pages:
                        times[(name, page)].append(first_chart_s(browser, f"{urls[name]}/{page}"))
                        warm[(name, page)].append(first_chart_s(browser, f"{urls[name]}/{page}", cached[name]))
                        if page != "overview":
                            clicked[(name, page)].append(navigated_s(browser, urls[name], page))
            print(f"time to the first chart on screen, {LAYERS} layers x {EXPERTS} experts, {GPUS} GPUs, live at "
                  f"10 steps/s, 1600x1000; median of {args.repeats} new sessions each (interleaved):")
            names = list(found)
            print_medians(times, names, pages)
            print(f"  the floor: a bare Streamlit page with one small live Vega-Lite chart {statistics.median(floor_s):5.2f} s"
                  "  (goal for each page: 2 s)")
            print("the same in a new tab of a browser that opened the dashboard before (its scripts cached):")
            print_medians(warm, names, pages)
            print(f"  the floor {statistics.median(floor_warm_s):5.2f} s")
            print("from a click on the page in the sidebar, on the Overview of a new session drawn whole:")
            print_medians(clicked, names, [p for p in pages if p != "overview"])
            print(f"blank-chart frames over {args.watch_s:.0f} s of live refresh (frames seen):")
            for page in (p for p in pages if p != "what-if"):  # What-if does not refresh on its own
                cells = []
                for name in names:
                    seen = blank_frames(browser, f"{urls[name]}/{page}", args.watch_s)
                    cells.append(f"{name} {seen['blank']} of {seen['frames']}")
                print(f"  {page:9s} " + " · ".join(cells))
            browser.close()
    finally:
        stop.set()
        stop_all(procs.values(), server, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
