"""Server-side cost of one dashboard tick on a 600-step window read from the aggregate stream, DeepSeek-V3's
58 x 256 at 256 ranks (no timed assertion anywhere).

Starts its own redis-server on a free loopback port, writes 600 aggregated steps (core.encode_aggregate: the
ranks of each step summed, 256 ranks present, skewed drifting counts of 64 tokens x top-8 per rank, as the
aggregator writes them) with the aggregator's lease held, then times, per tick, what the server does: the poll
of the aggregate stream (5 new steps written before every tick, untimed), folding them into the window,
resolving the layout, the Overview's analysis, and (--figures) the Overview's figures serialised as
st.vega_lite_chart does. Prints the median and p90 over the repeats, the cold first tick (the 600-step backlog),
and side by side the cost of ingesting the same 5 steps as 5 x 256 per-rank records (what a dashboard sums
itself without the aggregator).

    python -m bench.aggregate_tick [--repeats 30] [--steps 600] [--ranks 256] [--gpus 256] [--figures]
"""
from __future__ import annotations

from bench.malloc_env import pin_malloc

pin_malloc()

import argparse
import statistics
import tempfile
import time

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.aggregate import AggregateReader
from moe_monitor.dashboard.sources.base import Batch, Health
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.demo.localredis import RedisServer

RUN = "tick-agg"
NEW_STEPS_PER_TICK = 5


class AggregateSource:
    """RedisSource.poll with the aggregate hook, reduced to the aggregate stream and the metadata."""

    def __init__(self, client, run: str, window_steps: int):
        self.client, self.run = client, run
        self.reader = AggregateReader(client, run, window_steps)
        self._meta = core.decode_meta(client.get(core.meta_key(run)))

    def poll(self, max_entries: int) -> Batch:
        batch = Batch()
        self.reader.read(batch, max_entries)
        return batch

    def meta(self) -> core.RunMeta:
        return self._meta

    def health(self) -> Health:
        return Health(reachable=True, where="bench")


class Traffic:
    """Per-rank counts of a drifting skewed popularity (64 tokens x top-8 per rank and step)."""

    def __init__(self, layers: int, experts: int, ranks: int):
        self.rng = np.random.default_rng(0)
        self.layers, self.experts, self.ranks = layers, experts, ranks
        self.base_LE = self.rng.gamma(0.6, size=(layers, experts))
        self.step = 0

    def step_counts(self) -> np.ndarray:
        """int32 [R, L, E] of the next step."""
        self.base_LE *= np.exp(self.rng.normal(0, 0.02, size=self.base_LE.shape))
        p_LE = self.base_LE / self.base_LE.sum(axis=1, keepdims=True)
        counts = np.stack([self.rng.multinomial(64 * 8 * self.ranks, row) for row in p_LE])  # [L, E] all ranks
        split = self.rng.dirichlet(np.ones(self.ranks), size=1)[0]
        per_rank = np.floor(counts[None] * split[:, None, None]).astype(np.int32)
        per_rank[0] += (counts - per_rank.sum(axis=0)).astype(np.int32)
        return per_rank

    def aggregate(self, per_rank_RLE: np.ndarray) -> core.AggregateRecord:
        ranks = np.arange(self.ranks)
        rec = core.AggregateRecord(run=RUN, step=self.step, time_s=time.time(), phase="decode",
                                   world_size=self.ranks, counts_LE=per_rank_RLE.sum(axis=0, dtype=np.int64),
                                   ranks_R=ranks, tokens_R=np.full(self.ranks, 64), dropped_R=np.zeros(self.ranks,
                                   dtype=np.int64), instance="epoch-1")
        self.step += 1
        return rec

    def rank_records(self, per_rank_RLE: np.ndarray, step: int, run: str) -> list[core.StepRecord]:
        return [core.StepRecord(run=run, rank=r, world_size=self.ranks, step=step, time_s=time.time(), phase="decode",
                                tokens=64, counts_LE=per_rank_RLE[r], instance=f"c{r}") for r in range(self.ranks)]


def write(client, key: str, entries: list[dict]) -> None:
    pipe = client.pipeline(transaction=False)
    for fields in entries:
        pipe.xadd(key, fields)
    pipe.execute()


def tick(watched: WatchedRun, figures: bool) -> dict[str, float]:
    """One Overview tick; returns its parts in ms."""
    started = time.perf_counter()
    watched.tick()
    polled = time.perf_counter()
    window = watched.window
    layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size,
                            changes=watched.layouts.changes, at_step=window.newest_step)
    snap = analyse(window, layout, "both", None)
    analysed = time.perf_counter()
    if figures:
        from moe_monitor.dashboard.figures import load as load_figures
        fig = load_figures.gpu_load_bars(snap.latest_G, snap.stats, snap.straggler.gpu if snap.straggler else None,
                                         snap.unit)
        fig.payload_bytes()  # what st.vega_lite_chart serialises
    done = time.perf_counter()
    return {"poll+ingest": (polled - started) * 1e3, "layout+analyse": (analysed - polled) * 1e3,
            "figures": (done - analysed) * 1e3, "total": (done - started) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--layers", type=int, default=58)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--figures", action="store_true")
    args = parser.parse_args()
    server = RedisServer(tempfile.mkdtemp(prefix="tick-redis-"))
    try:
        client = core.connect(server.url, timeout_s=30.0)
        meta = core.RunMeta(run=RUN, model_name="deepseek-v3-shaped", layer_names=[f"layers.{i + 3}.mlp" for i in
                            range(args.layers)], num_experts=args.experts, top_k=8, hidden_size=7168,
                            moe_intermediate_size=2048, dtype_bytes=2, world_size=args.ranks,
                            layout=core.Layout(gpus=args.gpus, nodes=max(1, args.gpus // 8),
                                               physical_to_logical_map=core.contiguous_layout(args.layers, args.experts)))
        client.set(core.meta_key(RUN), core.encode_meta(meta))
        client.set(core.aggregator_key(RUN), "bench", px=3_600_000)
        traffic = Traffic(args.layers, args.experts, args.ranks)
        entry_bytes = []
        for first in range(0, args.steps, 50):
            fields = [core.encode_aggregate(traffic.aggregate(traffic.step_counts()))
                      for _ in range(min(50, args.steps - first))]
            entry_bytes += [len(f["counts"]) for f in fields]
            write(client, core.aggregate_key(RUN), fields)
        watched = WatchedRun(AggregateSource(client, RUN, args.steps), args.steps)
        cold = tick(watched, args.figures)["total"]
        while watched.last_tick is not None and watched.last_tick.more:
            cold += tick(watched, args.figures)["total"]
        assert watched.window is not None and watched.window.size == args.steps
        parts: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            write(client, core.aggregate_key(RUN),
                  [core.encode_aggregate(traffic.aggregate(traffic.step_counts())) for _ in range(NEW_STEPS_PER_TICK)])
            for name, ms in tick(watched, args.figures).items():
                parts.setdefault(name, []).append(ms)
        assert watched.window.size == args.steps and watched.bad_records == 0
        print(f"window {args.steps} steps x {args.layers} layers x {args.experts} experts, {args.ranks} ranks, "
              f"{args.gpus} GPUs; aggregate entry counts payload median {statistics.median(entry_bytes):,.0f} B; "
              f"{NEW_STEPS_PER_TICK} new steps per tick, {args.repeats} ticks")
        for name, values in parts.items():
            p90 = sorted(values)[int(0.9 * (len(values) - 1))]
            print(f"  {name:15s} median {statistics.median(values):7.1f} ms   p90 {p90:7.1f} ms")
        print(f"  cold first tick (the {args.steps}-step backlog, {len(entry_bytes)} entries): {cold:.0f} ms")
        # side by side: the same 5 steps as per-rank records, polled and summed by the dashboard itself
        run = f"{RUN}-ranks"
        client.set(core.meta_key(run), core.encode_meta(meta.__class__(**{**meta.__dict__, "run": run})))
        per_rank = WatchedRun(RedisSource(client, server.url, run, args.steps), args.steps,
                              max_entries_per_tick=NEW_STEPS_PER_TICK * args.ranks)
        steps_rank, steps_agg = [], []
        for repeat in range(max(3, args.repeats // 5)):
            counts = [traffic.step_counts() for _ in range(NEW_STEPS_PER_TICK)]
            write(client, core.steps_key(run), [core.encode_step(r) for i, c in enumerate(counts)
                                                 for r in traffic.rank_records(c, repeat * NEW_STEPS_PER_TICK + i, run)])
            started = time.perf_counter()
            per_rank.tick()
            steps_rank.append((time.perf_counter() - started) * 1e3)
            write(client, core.aggregate_key(RUN), [core.encode_aggregate(traffic.aggregate(c)) for c in counts])
            started = time.perf_counter()
            watched.tick()
            steps_agg.append((time.perf_counter() - started) * 1e3)
        rank_ms, agg_ms = statistics.median(steps_rank), statistics.median(steps_agg)
        print(f"side by side, poll + ingest of {NEW_STEPS_PER_TICK} steps: {NEW_STEPS_PER_TICK * args.ranks} per-rank "
              f"records summed here {rank_ms:.1f} ms, {NEW_STEPS_PER_TICK} aggregated entries {agg_ms:.1f} ms "
              f"(ratio {rank_ms / agg_ms:.0f}x)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
