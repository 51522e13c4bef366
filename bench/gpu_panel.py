"""The GPU panel with NVML readings from every GPU, this tree beside the previous main, in headless Debian
chromium: a private redis-server holds a live run of G ranks on G EP GPUs (8 to a node) that a writer thread
extends every 0.5 s with each rank's steps and, every second, its NVML reading. For each G, tree and repeat a new
browser context opens /gpus; taken: seconds to the first chart on screen and to every chart the page draws
(12 here: clock against load, five heatmaps, the one-GPU detail's six; 6 in a tree without the all-GPU view),
medians of the repeats, interleaved. Then blank-chart frames over --watch-s seconds of live refresh.

    python -m bench.gpu_panel [--gpus 32,256] [--repeats 3] [--baseline REV] [--watch-s 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.baseline import trees
from bench.malloc_env import pin_malloc
from bench.pages import blank_frames, serve, stop_all

pin_malloc()

from moe_monitor.demo.localredis import RedisServer, free_port
from tests.dashboard.blankframes import CHARTS, DRAWN
from tests.dashboard.test_browser_gpu_panel import HOT_SLOW, _write
from tests.support.browserkit import CHROMIUM, CHROMIUM_ARGS


def chart_times_s(browser, url: str, every: int) -> tuple[float, float]:
    """(seconds to the first chart drawn, to `every` charts drawn) in a new browser context."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        began = time.perf_counter()
        page.goto(url)
        page.wait_for_function(DRAWN, arg=[CHARTS, 1], timeout=120_000, polling="raf")
        first = time.perf_counter() - began
        page.wait_for_function(DRAWN, arg=[CHARTS, every], timeout=120_000, polling="raf")
        return first, time.perf_counter() - began
    finally:
        context.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="32,256", help="comma-separated, of " + ", ".join(map(str, HOT_SLOW)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=os.environ.get("MOE_BENCH_BASELINE", ""))
    parser.add_argument("--watch-s", type=float, default=5.0)
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"  no {CHROMIUM}: bash scripts/system-deps.sh --with-browser, then again")
        return 0
    from playwright.sync_api import sync_playwright

    found = trees(args.baseline)
    for gpus in (int(g) for g in args.gpus.split(",") if int(g) in HOT_SLOW):
        work = Path(tempfile.mkdtemp(prefix="bench-gpu-panel-"))
        server, stop = RedisServer(work), threading.Event()
        writer = threading.Thread(target=_write, args=(server.url, gpus, stop), daemon=True)
        procs: dict[str, subprocess.Popen] = {}
        try:
            writer.start()
            urls = {}
            for name, root in found.items():
                port = free_port()
                procs[name] = serve(root, port, server.url, work / f"{len(procs)}.log")
                urls[name] = f"http://127.0.0.1:{port}/gpus"
            time.sleep(5.0)  # a few NVML readings per GPU
            every = {name: 12 if root is None or (root / "moe_monitor/dashboard/views/gpus.py").read_text().count("every_gpu") else 6
                     for name, root in found.items()}
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in found}
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                for name in found:  # warm-up, untimed
                    chart_times_s(browser, urls[name], every[name])
                for _ in range(args.repeats):
                    for name in found:
                        times[name].append(chart_times_s(browser, urls[name], every[name]))
                print(f"GPU panel, {gpus} EP GPUs with NVML readings, 1600x1000; median of {args.repeats} new "
                      "sessions (interleaved): first chart / every chart")
                for name in found:
                    first = statistics.median(t[0] for t in times[name])
                    last = statistics.median(t[1] for t in times[name])
                    print(f"  {name:10s} {first:5.2f} s / {last:5.2f} s ({every[name]} charts)")
                cells = []
                for name in found:
                    seen = blank_frames(browser, urls[name], args.watch_s)
                    cells.append(f"{name} {seen['blank']} of {seen['frames']}")
                print(f"  blank-chart frames over {args.watch_s:.0f} s: " + " · ".join(cells))
                browser.close()
        finally:
            stop.set()
            writer.join(10)
            stop_all(procs.values(), server, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
