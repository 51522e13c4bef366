"""A Source that hands over prepared batches, for records no decoder would let through (tests of the
watched run's own defences)."""
from __future__ import annotations

from moe_monitor import core
from moe_monitor.core.tracefile import Timeline
from moe_monitor.dashboard.sources.base import Batch, Health


class ListSource:
    """poll() returns the next prepared Batch (an empty one when they run out); meta() returns `meta`."""

    def __init__(self, batches: list[Batch], meta: core.RunMeta | None = None):
        self.batches = list(batches)
        self._meta = meta

    def poll(self, max_entries: int) -> Batch:
        return self.batches.pop(0) if self.batches else Batch()

    def meta(self) -> core.RunMeta | None:
        return self._meta

    def health(self) -> Health:
        return Health(reachable=True, where="list")


class SeekableListSource(ListSource):
    """A recording held in memory: step records (any ranks) and layout changes, seekable like a trace file.
    timeline() sums the ranks of each step; its balancedness is the mean over layers of mean/max GPU load
    under the layout in force (the metadata's before the first change). seek() counts its calls."""

    def __init__(self, steps: list[core.StepRecord], meta: core.RunMeta, layouts: list[core.LayoutRecord] = ()):
        super().__init__([], meta)
        self.records = sorted(steps, key=lambda r: (r.step, r.rank))
        self.layout_records = sorted(layouts, key=lambda r: r.step)
        self.seeks: list[tuple[int, int]] = []

    def timeline(self):
        import numpy as np

        from moe_monitor.core.loadmodel import gpu_loads

        by_step: dict[int, list[core.StepRecord]] = {}
        for rec in self.records:
            by_step.setdefault(rec.step, []).append(rec)
        steps = sorted(by_step)
        eta = []
        for step in steps:
            layout, gpus = self._layout_at(step)
            counts_LE = sum(r.counts_LE.astype(np.int64) for r in by_step[step])
            loads_LG = gpu_loads(counts_LE[None], np.asarray(layout), gpus)[0]
            ok = loads_LG.max(axis=1) > 0
            eta.append(float((loads_LG.mean(axis=1)[ok] / loads_LG.max(axis=1)[ok]).mean()) if ok.any()
                       else float("nan"))
        return Timeline(step_T=np.array(steps, dtype=np.int64),
                        time_s_T=np.array([max(r.time_s for r in by_step[s]) for s in steps], dtype=np.float64),
                        phase_T=np.array([by_step[s][0].phase for s in steps], dtype=object),
                        tokens_T=np.array([sum(r.tokens for r in by_step[s]) for s in steps], dtype=np.int64),
                        balancedness_T=np.array(eta, dtype=np.float64),
                        rebalance_steps=tuple(int(r.step) for r in self.layout_records))

    def _layout_at(self, step: int):
        layout, gpus = self._meta.layout.physical_to_logical_map, self._meta.layout.gpus
        for rec in self.layout_records:
            if rec.step <= step:
                layout, gpus = rec.layout_LP, rec.gpus
        return layout, gpus

    def seek(self, first_step: int, last_step: int) -> Batch:
        if first_step > last_step:
            raise ValueError(f"first step {first_step} is after last step {last_step}")
        self.seeks.append((first_step, last_step))
        steps = [r for r in self.records if first_step <= r.step <= last_step]
        before = [r for r in self.layout_records if r.step <= first_step][-1:]
        within = [r for r in self.layout_records if first_step < r.step <= last_step]
        return Batch(steps=steps, layouts=before + within)


def recording(steps: int = 120, num_layers: int = 4, num_experts: int = 16, gpus: int = 4, world_size: int = 2,
              worst_step: int | None = 70, rebalance_at: int | None = 90, seed: int = 0, step_s: float = 0.1,
              time0_s: float = 1_700_000_000.0) -> SeekableListSource:
    """A recording of `steps` steps x `world_size` ranks (even steps prefill, odd decode), mildly skewed, with
    one decode step (`worst_step`, odd) far more skewed than any other (every token to expert 0) and an engine
    rebalance in force from `rebalance_at` (the contiguous layout rotated by one expert)."""
    import numpy as np

    from tests.support.synthfill import make_meta, skewed_counts

    rng = np.random.default_rng(seed)
    meta = make_meta("rec", num_layers, num_experts, gpus, world_size=world_size, instance="i0")
    records = []
    for step in range(steps):
        for rank in range(world_size):
            counts = skewed_counts(rng, num_layers, num_experts, 256, hot_expert=(step // 10) % num_experts,
                                   hot_share=0.1)
            if step == worst_step:
                counts = np.zeros_like(counts)
                counts[:, 0] = 256
            records.append(core.StepRecord(run="rec", rank=rank, world_size=world_size, step=step,
                                           time_s=time0_s + step * step_s,
                                           phase="prefill" if step % 2 == 0 else "decode", tokens=256,
                                           counts_LE=counts, instance="i0"))
    layouts = []
    if rebalance_at is not None:
        base = np.asarray(core.contiguous_layout(num_layers, num_experts), dtype=np.int32)
        layouts.append(core.LayoutRecord(run="rec", step=rebalance_at, time_s=time0_s + rebalance_at * step_s,
                                         layout_LP=np.roll(base, 1, axis=1), gpus=gpus,
                                         instance="i0"))
    return SeekableListSource(records, meta, layouts)


def write_jsonl(source: SeekableListSource, path) -> None:
    """The recording as a JSON-lines trace file (what collectors write): metadata, then steps and layout
    changes in step order (a change before the first step it is in force at)."""
    lines = [core.trace_line("meta", {"meta": core.encode_meta(source.meta())})]
    layouts = list(source.layout_records)
    for rec in source.records:
        while layouts and layouts[0].step <= rec.step:
            lines.append(core.trace_line("layout", core.encode_layout_record(layouts.pop(0))))
        lines.append(core.trace_line("step", core.encode_step(rec)))
    path.write_text("\n".join(lines) + "\n")
