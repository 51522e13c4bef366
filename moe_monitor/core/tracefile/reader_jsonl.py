"""Reading a JSON-lines trace (core/trace.py, what TraceFileSink and collectors.record_trace write) as a
TraceReader: the file is indexed once at open, line by line (bounded: lines of at most
core.MAX_TRACE_LINE_BYTES; per step and rank only its byte offset and the timeline fields are kept; the
counts of at most PENDING_STEPS steps are held while their ranks are summed for the balancedness), then
read_steps seeks to the lines of the steps in view.

A trace without a metadata line (an older or hand-made one) gets a stand-in: layers "layer <i>", the step
records' E, a contiguous layout over core.default_gpus (meta_synthesized = True). Lines that do not decode,
counts of another shape than the metadata's and repeated (instance, rank, step) records are skipped; the
first two are counted as bad records. Timing lines are indexed by step only (core/tracefile/timing_lines.py: TimingLines)
and decoded when read_timings asks for their steps. A step with more records than a trace holds (at most its
world size per collector instance, core/tracefile/rows.py) refuses the file, as in the columnar containers;
without compression, what the file decodes to is bounded by its size.
"""
from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import pyarrow as pa

from moe_monitor import core

from .balance import LayoutSchedule, step_balancedness
from .base import MAX_READ_BYTES, TraceReader, dedupe
from .gpu import MAX_GPU_ROWS
from .lines import decode_line, iter_lines
from .rows import check_rows_per_step
from .timeline import Timeline, timeline_of_rows
from .timing_lines import TimingLines

PENDING_STEPS = 64


def stand_in_meta(rec: core.StepRecord) -> core.RunMeta:
    """Run metadata for a trace that has none, from its first step record."""
    num_layers, num_experts = rec.counts_LE.shape
    gpus = core.default_gpus(num_experts, rec.world_size)
    return core.RunMeta(run=rec.run, model_name="unknown (trace without metadata)",
                        layer_names=[f"layer {i}" for i in range(num_layers)], num_experts=num_experts, top_k=0,
                        hidden_size=0, moe_intermediate_size=0, dtype_bytes=0,
                        layout=core.Layout(gpus=gpus, nodes=1,
                                           physical_to_logical_map=core.contiguous_layout(num_layers, num_experts)),
                        world_size=rec.world_size, started_s=rec.time_s)


class JsonlTraceReader(TraceReader):
    container = "jsonl (JSON lines)"

    def __init__(self, path: str):
        super().__init__(path)
        self.meta_synthesized = False
        self._meta: core.RunMeta | None = None
        self._schedule: LayoutSchedule | None = None
        self._samples: list[core.GpuSample] = []
        self._timings = TimingLines(path)
        rows: dict[str, list] = {name: [] for name in ("step", "rank", "time_s", "phase", "tokens", "offset")}
        worlds: list[int] = []
        instances: list[str] = []
        self._eta: dict[int, float] = {}
        self._pending: OrderedDict[int, tuple[np.ndarray, set[int], int]] = OrderedDict()
        seen: set[tuple[str, int, int]] = set()
        with open(path, "rb") as handle:
            for offset, raw in iter_lines(handle):
                if raw is None:
                    self._bad(f"line at byte {offset}: longer than {core.MAX_TRACE_LINE_BYTES} bytes")
                    continue
                try:
                    if self._timings.take(offset, raw):
                        continue  # a timing line: indexed, decoded when its steps are read
                    _, item = decode_line(raw)
                    if isinstance(item, core.RunMeta):
                        if self._meta is None or self.meta_synthesized:
                            self._set_meta(item, synthesized=False)
                    elif isinstance(item, core.StepRecord):
                        if self._meta is None:
                            self._set_meta(stand_in_meta(item), synthesized=True)
                        self._check_shape(item)
                        key = (item.instance, item.rank, item.step)
                        if key in seen:
                            continue
                        seen.add(key)
                        for name, value in (("step", item.step), ("rank", item.rank), ("time_s", item.time_s),
                                            ("phase", item.phase), ("tokens", item.tokens), ("offset", offset)):
                            rows[name].append(value)
                        worlds.append(item.world_size)
                        instances.append(item.instance)
                        self._add_counts(item)
                    elif isinstance(item, core.LayoutRecord):
                        self._add_layout(item)
                    elif isinstance(item, core.GpuSample) and len(self._samples) < MAX_GPU_ROWS:
                        self._samples.append(item)
                    elif isinstance(item, core.TimingRecord):
                        self._timings.add(offset, item.step)  # written by hand (not core.trace_line's form)
                except ValueError as exc:
                    self._bad(f"line at byte {offset}: {exc}")
        if self._meta is None:
            raise ValueError(f"{path}: holds no metadata and no step line: not a trace")
        self.meta = self._meta
        check_rows_per_step(pa.table({"step": pa.array(rows["step"], pa.int64()),
                                      "world": pa.array(worlds, pa.int64()),
                                      "instance": pa.array(instances, pa.string()).dictionary_encode()}))
        del worlds, instances
        while self._pending:
            self._finish(next(iter(self._pending)))
        self._rows: dict[str, np.ndarray] = {name: np.asarray(values, dtype=object if name == "phase" else None)
                      for name, values in rows.items()}
        self._rows["step"] = self._rows["step"].astype(np.int64)

    def _bad(self, why: str) -> None:
        self.bad_records += 1
        self.last_error = why

    def _set_meta(self, meta: core.RunMeta, synthesized: bool) -> None:
        self._meta, self.meta_synthesized = meta, synthesized
        self._schedule = LayoutSchedule(meta, self.layouts)

    def _check_shape(self, rec: core.StepRecord) -> None:
        assert self._meta is not None
        want = (len(self._meta.layer_names), self._meta.num_experts)
        if rec.counts_LE.shape != want:
            raise ValueError(f"step {rec.step}: counts are {list(rec.counts_LE.shape)}, the run has {list(want)}")

    def _add_layout(self, rec: core.LayoutRecord) -> None:
        if self._meta is not None:
            rec = rec.validate(self._meta.num_experts, num_layers=len(self._meta.layer_names))
        self.layouts.append(rec)
        self.layouts.sort(key=lambda r: r.step)
        if self._schedule is not None:
            self._schedule.add(rec)

    def _add_counts(self, rec: core.StepRecord) -> None:
        held = self._pending.get(rec.step)
        if held is None:
            if rec.step in self._eta:  # a rank arriving after its step was closed: unknown
                self._eta[rec.step] = np.nan
                return
            held = self._pending[rec.step] = (rec.counts_LE.astype(np.int64), {rec.rank}, rec.world_size)
        else:
            held[0][...] += rec.counts_LE
            held[1].add(rec.rank)
        if len(held[1]) >= held[2]:
            self._finish(rec.step)
        while len(self._pending) > PENDING_STEPS:
            self._finish(next(iter(self._pending)))

    def _finish(self, step: int) -> None:
        counts_LE, ranks, world = self._pending.pop(step)
        assert self._schedule is not None
        eta = step_balancedness(np.array([step]), counts_LE[None], self._schedule)[0]
        self._eta[step] = float(eta) if len(ranks) >= world else np.nan

    def timeline(self) -> Timeline:
        r = self._rows
        eta = np.array([self._eta.get(int(s), np.nan) for s in r["step"]], dtype=np.float64)
        return timeline_of_rows(r["step"], r["rank"], r["time_s"], r["phase"], r["tokens"], eta, self.layouts)

    def read_steps(self, first_step: int, last_step: int) -> list[core.StepRecord]:
        step = self._rows["step"]
        picked = np.flatnonzero((step >= int(first_step)) & (step <= int(last_step)))
        width = len(self.meta.layer_names) * self.meta.num_experts * 4
        if len(picked) * width > MAX_READ_BYTES:
            raise ValueError(f"steps {first_step}..{last_step} hold more than {MAX_READ_BYTES >> 30} GiB of counts")
        out = []
        with open(self.path, "rb") as handle:
            for offset in sorted(int(o) for o in self._rows["offset"][picked]):
                handle.seek(offset)
                for _, raw in iter_lines(handle):
                    try:
                        _, item = decode_line(raw) if raw is not None else ("", None)
                    except ValueError as exc:  # the file changed since it was indexed
                        self._bad(f"line at byte {offset}: {exc}")
                        item = None
                    if isinstance(item, core.StepRecord):
                        out.append(item)
                    break
        return dedupe(out)

    def gpu_samples(self, t0_s: float = -np.inf, t1_s: float = np.inf) -> list[core.GpuSample]:
        return sorted((s for s in self._samples if t0_s <= s.time_s <= t1_s), key=lambda s: s.time_s)

    def read_timings(self, first_step: int, last_step: int) -> list[core.TimingRecord]:
        return self._timings_of(self._timings.read(int(first_step), int(last_step), self.meta))

    def timing_rows(self) -> int:
        return self._timings.rows

    def size_bytes(self) -> int:
        return os.path.getsize(self.path)
