"""Server-side cost of one live dashboard tick: a window of 600 steps x 58 layers x 256 experts from Redis.

Starts its own redis-server on a free loopback port (never touches another Redis), fills one run with
600 steps written by core.encode_step (DeepSeek-V3 shape, skewed counts, 32 GPUs contiguous), then for
each page times what the server does per tick: poll Redis for the new entries (5 new steps written before
every tick, untimed), fold them into the window, resolve the layout, analyse, build the page's Vega-Lite
charts and serialise them as st.vega_lite_chart does (spec JSON, datasets as Arrow IPC). Prints the median over the
repeats and the figure payload per tick (bytes of the figures' JSON summed), plus the one-off cold start
(the first poll reading the whole 600-step backlog). Then, side by side on two more runs with the same
traffic, overview ticks of a run whose engine rebalanced mid-window (a core.LayoutRecord in force from the
middle of the window: the tick it arrives recomputes the rows from that step, the next ones only the new
rows) against ticks of a run without layout changes; and overview ticks of a run priced in time (its metadata
names a GPU profile) against the same traffic in tokens only.

    python -m bench.dashboard [--repeats 30] [--steps 600] [--layers 58] [--experts 256]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from bench.malloc_env import pin_malloc

pin_malloc()

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from moe_monitor import core
from moe_monitor.core.loadmodel import weighted_loads
from moe_monitor.dashboard.analytics import answer as answers
from moe_monitor.dashboard.analytics.balance import step_vs_window
from moe_monitor.dashboard.analytics.experts import dead_experts, hot_experts, js_divergence
from moe_monitor.dashboard.analytics.timecost import time_model_for
from moe_monitor.dashboard.figures import answer as answer_figure
from moe_monitor.dashboard.figures import experts as expert_figures
from moe_monitor.dashboard.figures import gpu as gpu_figures
from moe_monitor.dashboard.figures import load as load_figures
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.demo.localredis import RedisServer
from moe_monitor.exporter.metrics import series_count
from moe_monitor.exporter.server import RunExporter

RUN = "bench"
NEW_STEPS_PER_TICK = 5


class Writer:
    """Writes skewed steps like a collector: a few hot experts per layer that drift slowly."""

    def __init__(self, client, layers: int, experts: int, tokens: int = 4096 * 8, run: str = RUN):
        self.client, self.layers, self.experts, self.tokens, self.run = client, layers, experts, tokens, run
        self.rng = np.random.default_rng(0)
        self.step = 0
        self.base_LE = self.rng.gamma(0.6, size=(layers, experts))

    def write(self, n: int) -> None:
        pipe = self.client.pipeline(transaction=False)
        for _ in range(n):
            self.base_LE *= np.exp(self.rng.normal(0, 0.02, size=self.base_LE.shape))
            p = self.base_LE / self.base_LE.sum(axis=1, keepdims=True)
            counts = np.stack([self.rng.multinomial(self.tokens, row) for row in p]).astype(np.int32)
            rec = core.StepRecord(run=self.run, rank=0, world_size=1, step=self.step, time_s=time.time(),
                                  phase="decode" if self.step % 8 else "prefill", tokens=self.tokens // 8,
                                  counts_LE=counts)
            pipe.xadd(core.steps_key(self.run), core.encode_step(rec))
            self.step += 1
        pipe.zadd(core.RUNS_KEY, {self.run: time.time()})
        pipe.execute()


def page_figures(page: str, watched: WatchedRun, snap) -> list:
    """The figures a page builds per tick (as dashboard/views/<page>.py does)."""
    if page == "overview":  # the answer (its advisor runs off the page's thread) and the details' bars
        layout = snap.layout
        who = answers.named(snap.straggler, layout.gpus, snap.time_rows)
        hot = [] if who.gpu is None else answers.hottest_on(snap.view.counts_sum_LE, layout.layout_LP, layout.gpus,
                                                            who.gpu)
        said = answers.answer(who, snap.straggler, layout.gpus, layout.gpus_per_node, snap.idle_share,
                              snap.stats.mean_G, snap.unit, hot, snap.steps_per_s)
        answer_figure.answer_data(said.series_G, said.gpu, layout.gpus_per_node)
        return [load_figures.gpu_load_bars(snap.latest_G, snap.stats, int(np.argmax(snap.latest_G)), "tokens/step")]
    if page == "devices":
        return [load_figures.load_bands(snap.view.step_T, snap.loads_TG, "tokens/step"),
                load_figures.gpu_time_heatmap(snap.view.step_T, snap.loads_TG, "tokens/step"),
                load_figures.eta_over_time(snap.view.step_T, snap.eta_TL),
                load_figures.layer_eta_heatmap(snap.view.step_T, snap.eta_TL),
                load_figures.step_vs_window_figure(step_vs_window(snap.view.loads_TLG))]
    if page == "experts":
        window, counts_LE = watched.window, snap.view.counts_sum_LE
        hot_experts(counts_LE, 10), dead_experts(counts_LE)
        half = snap.view.num_steps // 2
        older = window.counts_CLE[snap.view.slots_T[:half]].sum(axis=0, dtype=np.int64)
        return [expert_figures.layer_expert_heatmap(counts_LE),
                expert_figures.expert_time_heatmap(snap.view.step_T, window.layer_counts(snap.view.slots_T, 3), 3),
                expert_figures.drift_bars(js_divergence(older, counts_LE - older))]
    rows = [{"time_s": t, "gpu_utilization_percent": 90, "memory_used_bytes": 7e10, "memory_total_bytes": 8e10,
             "power_usage_w": 500.0, "power_limit_w": 700.0, "sm_clock_mhz": 1980, "temperature_c": 60}
            for t in snap.view.time_s_T[-300:]]  # NVML readings as a sampler would send them
    return gpu_figures.nvml_charts(rows, snap.view.time_s_T, snap.loads_TG[:, 0], "GPU 0")


def tick(page: str, watched: WatchedRun) -> int:
    """One server-side tick of a page (in time where the run's metadata gives a cost model, as the pages do);
    returns the figure payload in bytes."""
    watched.tick()
    window = watched.window
    meta = watched.source.meta()
    layout = resolve_layout(meta, window.num_layers, window.num_experts, watched.world_size,
                            changes=watched.layouts.changes, at_step=window.newest_step)
    model, note = time_model_for(meta, layout.gpus, layout.nodes, watched.gpus.names())
    snap = analyse(window, layout, "both", None, time_model=model, time_note=note)
    # what st.vega_lite_chart sends of each chart: its spec's JSON and its datasets as Arrow IPC
    return sum(chart.payload_bytes() for chart in page_figures(page, watched, snap))


def run_meta(run: str, layers: int, experts: int, gpus: int, gpu_profile: str = "") -> core.RunMeta:
    """DeepSeek-V3-shaped metadata, contiguous layout; gpu_profile: a GPU the pages price time for ("": none,
    figures in tokens)."""
    return core.RunMeta(run=run, model_name="deepseek-v3-shaped", layer_names=[f"layers.{i + 3}.mlp" for i in
                        range(layers)], num_experts=experts, top_k=8, hidden_size=7168, moe_intermediate_size=2048,
                        dtype_bytes=2, layout=core.Layout(gpus=gpus, nodes=max(1, gpus // 8),
                                                          physical_to_logical_map=core.contiguous_layout(layers, experts)),
                        gpu_profile=gpu_profile)


def in_time(client, url: str, args, gpus: int) -> None:
    """Overview ticks side by side, alternating, on two runs with the same traffic: one whose metadata names a
    GPU profile (the first line in time: per-row predicted times, the verdict), one in tokens only."""
    writers, watched = {}, {}
    for name, profile in (("tokens", ""), ("time", "H100 SXM")):
        run = f"{RUN}-{name}"
        client.set(core.meta_key(run), core.encode_meta(run_meta(run, args.layers, args.experts, gpus, profile)))
        writers[name] = Writer(client, args.layers, args.experts, run=run)
        writers[name].write(args.steps)
        watched[name] = WatchedRun(RedisSource(client, url, run, args.steps), args.steps)
        started = time.perf_counter()
        tick("overview", watched[name])
        if name == "time":
            cold_ms = (time.perf_counter() - started) * 1e3
    times_ms: dict[str, list[float]] = {"tokens": [], "time": []}
    for _ in range(args.repeats):
        for name in times_ms:
            writers[name].write(NEW_STEPS_PER_TICK)
            started = time.perf_counter()
            tick("overview", watched[name])
            times_ms[name].append((time.perf_counter() - started) * 1e3)
    tokens, timed = statistics.median(times_ms["tokens"]), statistics.median(times_ms["time"])
    print(f"side by side: an overview tick in time (H100 SXM profile: {NEW_STEPS_PER_TICK} new rows priced, the "
          f"verdict over the window) {timed:.1f} ms against {tokens:.1f} ms in tokens only (ratio "
          f"{timed / tokens:.2f}); the first tick in time, pricing the whole window, {cold_ms:.0f} ms")


def rebalance(client, url: str, args, gpus: int) -> None:
    """Overview ticks side by side, alternating, on two runs with the same traffic: one whose engine rebalanced
    in the middle of the window (a random permutation of every layer), one without layout changes."""
    writers, watched = {}, {}
    for name in ("plain", "rebalanced"):
        run = f"{RUN}-{name}"
        client.set(core.meta_key(run), core.encode_meta(run_meta(run, args.layers, args.experts, gpus)))
        writers[name] = Writer(client, args.layers, args.experts, run=run)
        writers[name].write(args.steps)
        watched[name] = WatchedRun(RedisSource(client, url, run, args.steps), args.steps)
        tick("overview", watched[name])
    rng = np.random.default_rng(1)
    map_LP = np.stack([rng.permutation(args.experts) for _ in range(args.layers)])
    client.xadd(core.layouts_key(f"{RUN}-rebalanced"), core.encode_layout_record(core.LayoutRecord(
        run=f"{RUN}-rebalanced", step=args.steps // 2, time_s=time.time(), layout_LP=map_LP, gpus=gpus)))
    times_ms: dict[str, list[float]] = {"plain": [], "rebalanced": []}
    for _ in range(args.repeats + 1):
        for name in times_ms:
            writers[name].write(NEW_STEPS_PER_TICK)
            started = time.perf_counter()
            tick("overview", watched[name])
            times_ms[name].append((time.perf_counter() - started) * 1e3)
    assert len(watched["rebalanced"].layouts) == 1 and not watched["plain"].layouts
    arrived_ms = times_ms["rebalanced"][0]  # the tick that read the layout change
    plain, moved = statistics.median(times_ms["plain"][1:]), statistics.median(times_ms["rebalanced"][1:])
    print(f"side by side: an engine rebalance in force from mid-window costs the tick it arrives {arrived_ms:.1f} ms "
          f"(recomputes {args.steps // 2} rows); afterwards an overview tick {moved:.1f} ms against {plain:.1f} ms "
          f"for the same traffic without layout changes (ratio {moved / plain:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--layers", type=int, default=58)
    parser.add_argument("--experts", type=int, default=256)
    args = parser.parse_args()
    server = RedisServer(tempfile.mkdtemp(prefix="bench-redis-"))
    url = server.url
    try:
        client = core.connect(url, timeout_s=10.0)
        gpus = core.default_gpus(args.experts)
        client.set(core.meta_key(RUN), core.encode_meta(run_meta(RUN, args.layers, args.experts, gpus)))
        writer = Writer(client, args.layers, args.experts)
        writer.write(args.steps)
        print(f"window {args.steps} steps x {args.layers} layers x {args.experts} experts, {gpus} GPUs, "
              f"{NEW_STEPS_PER_TICK} new steps per tick, median of {args.repeats} ticks "
              f"(poll + window + layout + analytics + figures + to_json)")
        for page in ("overview", "devices", "experts", "gpus"):
            watched = WatchedRun(RedisSource(client, url, RUN, args.steps), args.steps)
            started = time.perf_counter()
            tick(page, watched)
            cold_ms = (time.perf_counter() - started) * 1e3
            times_ms, payloads = [], []
            for _ in range(args.repeats):
                writer.write(NEW_STEPS_PER_TICK)
                started = time.perf_counter()
                payloads.append(tick(page, watched))
                times_ms.append((time.perf_counter() - started) * 1e3)
            assert watched.window.size == args.steps
            if page == "overview":
                overview_ms = times_ms
                full_ms = []
                for _ in range(5):
                    started = time.perf_counter()
                    weighted_loads(watched.window.counts_CLE, watched.window._weights_LEG)
                    full_ms.append((time.perf_counter() - started) * 1e3)
                full = statistics.median(full_ms)
            print(f"{page:9s} tick {statistics.median(times_ms):7.1f} ms (p90 "
                  f"{sorted(times_ms)[int(0.9 * (len(times_ms) - 1))]:6.1f})  payload {statistics.median(payloads):>9,.0f} B"
                  f"   cold first tick {cold_ms:7.1f} ms")
        tick_ms = statistics.median(overview_ms)
        print(f"side by side: GPU loads of the whole window recomputed {full:.1f} ms; a whole overview tick, "
              f"which recomputes only the new rows, {tick_ms:.1f} ms (ratio {full / tick_ms:.2f})")
        rebalance(client, url, args, gpus)
        in_time(client, url, args, gpus)
        exporter = RunExporter(client, url, [RUN], args.steps)
        exporter.poll()
        registry = CollectorRegistry()
        registry.register(exporter)
        poll_ms, scrape_ms = [], []
        for _ in range(args.repeats):
            writer.write(NEW_STEPS_PER_TICK)
            started = time.perf_counter()
            exporter.poll()
            poll_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            body = generate_latest(registry)
            scrape_ms.append((time.perf_counter() - started) * 1e3)
        print(f"exporter: poll (read + analyse 3 phases) {statistics.median(poll_ms):.1f} ms every interval; "
              f"a scrape {statistics.median(scrape_ms):.2f} ms ({series_count(exporter.collect())} series, "
              f"{len(body):,} B), the same for every scraper (served from the last poll)")
        for options in ({"per_layer": True}, {"top_experts": 16}):
            wide = RunExporter(client, url, [RUN], args.steps, **options)
            wide.poll()
            print(f"exporter series with {options}: {series_count(wide.collect())}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
