"""The JSON-lines files of traces, read bounded: a .jsonl trace (core/trace.py: what TraceFileSink and
collectors.record_trace write) as a TraceReader, and the side file <path>.side.jsonl of an .arrows recording
(columnar.py). Lines of at most core.MAX_TRACE_LINE_BYTES (a longer one is one bad record). A .jsonl trace is
indexed once at open (per step and rank its byte offset and timeline fields; the counts of at most
PENDING_STEPS steps held while their ranks are summed for the balancedness), then read_steps seeks to the lines
of the steps in view; "timing" lines are indexed by step only (TimingLines) and decoded when their steps are
read. A trace without a metadata line gets a stand-in (stand_in_meta; meta_synthesized = True).
"""
from __future__ import annotations

import os
import re
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from moe_monitor import core

from .reader import MAX_READ_BYTES, TraceReader, dedupe, out_of_memory
from .schema import LayoutSchedule, check_rows_per_step, step_balancedness
from .side import MAX_GPU_ROWS, GpuSamples, TimingRead, check_read_size
from .timeline import Timeline, timeline_of_rows

# ------------------------------------------------------------------ lines, bounded
CHUNK_BYTES = 1 << 20


def iter_lines(handle: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(byte offset, line without its newline) for each non-blank line; (offset, None) for a line over the cap."""
    cap = core.MAX_TRACE_LINE_BYTES
    offset = handle.tell()
    while True:
        raw = handle.readline(cap + 1)
        if not raw:
            return
        if len(raw) > cap and not raw.endswith(b"\n"):
            length = len(raw)
            del raw
            while True:
                chunk = handle.readline(CHUNK_BYTES)
                length += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield offset, None
            offset += length
            continue
        if raw.strip():
            yield offset, raw.rstrip(b"\r\n")
        offset += len(raw)


# what parsing one line may build, counted from its bytes (in C) before it is parsed: JSON lists and objects
# (about 64 B each) and values (commas, about 40 B each); a trace line's largest, a layout of core.MAX_CELLS
# expert ids, holds about MAX_CELLS values in MAX_LAYERS lists. A line of `[[],[],...]` built 24x its bytes.
MAX_LINE_CONTAINERS = 1 << 16
MAX_LINE_VALUES = 2 * core.MAX_CELLS + MAX_LINE_CONTAINERS


def check_line_cost(raw: bytes) -> None:
    """ValueError when parsing the line could build more than a trace line does: more than MAX_LINE_CONTAINERS
    lists and objects or MAX_LINE_VALUES values (brackets and commas, strings' included: an upper bound)."""
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > MAX_LINE_CONTAINERS:
        raise ValueError(f"{containers} JSON lists and objects, more than the {MAX_LINE_CONTAINERS} a trace line holds")
    values = raw.count(b",") + containers + 1
    if values > MAX_LINE_VALUES:
        raise ValueError(f"{values} JSON values, more than the {MAX_LINE_VALUES} a trace line holds")


def decode_line(raw: bytes):
    """core.decode_trace_line of a raw line; ValueError for anything malformed (not UTF-8 included) or that
    would build more than a trace line does (check_line_cost)."""
    check_line_cost(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    return core.decode_trace_line(text)


# ------------------------------------------------------------------ timing lines, indexed by step
MAX_TIMING_LINES = 1 << 23      # timing lines indexed in one JSON-lines file (1M steps x 8 ranks)

_TIMING_HEAD = b'{"kind":"timing",'
_STEP_FIELD = re.compile(rb'"step":([0-9]{1,19})[,}]')


def timing_line_step(raw: bytes) -> int | None:
    """The step id of a canonical timing line (core.trace_line("timing", ...): it starts with
    '{"kind":"timing",') read without decoding it; None for any other line (decode it to know)."""
    if not raw.startswith(_TIMING_HEAD):
        return None
    found = _STEP_FIELD.search(raw)
    return int(found.group(1)) if found is not None else None


class TimingLines:
    """The timing lines of a JSON-lines file (a .jsonl trace or an .arrows side file): (step id, byte offset)
    per line, noted while the file is indexed (at most MAX_TIMING_LINES), decoded when read()."""

    def __init__(self, path: str):
        self.path = path
        self._step = array("q")
        self._offset = array("q")
        self._index: tuple[np.ndarray, np.ndarray] | None = None
        self._dead: set[int] = set()  # offsets of lines found bad (counted once)

    @property
    def rows(self) -> int:
        """Timing lines indexed (less those found bad when read)."""
        return len(self._step) - len(self._dead)

    def take(self, offset: int, raw: bytes) -> bool:
        """Index the line at offset when it is a canonical timing line (True); False for any other line.
        ValueError when MAX_TIMING_LINES are already indexed (the caller counts a bad record)."""
        step = timing_line_step(raw)
        if step is None:
            return False
        self.add(offset, step)
        return True

    def add(self, offset: int, step: int) -> None:
        """Index a timing line of step `step` at byte `offset`."""
        if len(self._step) >= MAX_TIMING_LINES:
            raise ValueError(f"more than {MAX_TIMING_LINES} timing lines")
        self._step.append(int(step))
        self._offset.append(int(offset))
        self._index = None

    def read(self, first_step: int, last_step: int, meta: core.RunMeta) -> TimingRead:
        """The timing records of steps first_step..last_step (file order), each decoded by
        core.decode_trace_line and checked against the run's layer count; a bad line is counted in the result
        the first time it is read."""
        out = TimingRead()
        if not len(self._step):
            return out
        if self._index is None:
            self._index = (np.frombuffer(self._step, dtype=np.int64).copy(),
                           np.frombuffer(self._offset, dtype=np.int64).copy())
        step_R, offset_R = self._index
        picked = np.flatnonzero((step_R >= first_step) & (step_R <= last_step))
        num_layers = len(meta.layer_names)
        check_read_size(len(picked), num_layers, first_step, last_step)
        if not len(picked):
            return out
        with open(self.path, "rb") as handle:
            for offset in sorted(int(o) for o in offset_R[picked]):
                if offset in self._dead:
                    continue
                handle.seek(offset)
                raw = next((line for _, line in iter_lines(handle)), None)
                try:
                    if raw is None:
                        raise ValueError(f"longer than {core.MAX_TRACE_LINE_BYTES} bytes, or gone")
                    _, item = decode_line(raw)
                    if not isinstance(item, core.TimingRecord):
                        raise ValueError("not a timing line (the file changed since it was indexed)")
                    if item.layer_s_L.shape[0] != num_layers:
                        raise ValueError(f"timings of {item.layer_s_L.shape[0]} layers, the run has {num_layers}")
                    if not first_step <= item.step <= last_step:
                        raise ValueError(f"its step {item.step} is not the one it was indexed under")
                except ValueError as exc:
                    self._dead.add(offset)
                    out.bad(f"timing line at byte {offset}: {exc}")
                    continue
                out.records.append(item)
        return out


# ------------------------------------------------------------------ the side file of an .arrows recording
class SideRecords(GpuSamples):
    """Layouts and NVML samples read from an .arrows side file, its timing lines indexed (decoded when read);
    bad lines counted."""

    def __init__(self, path: str = "") -> None:
        super().__init__()
        self.layouts: list[core.LayoutRecord] = []
        self.timings = TimingLines(path)


def read_side_jsonl(path: str, meta: core.RunMeta) -> SideRecords:
    """The layout and gpu lines of an .arrows side file (absent: none), its timing lines indexed by step (at
    most MAX_TIMING_LINES; decoded when read)."""
    out = SideRecords(path)
    if not os.path.isfile(path):
        return out
    with open(path, "rb") as handle:
        for offset, raw in iter_lines(handle):
            if raw is None:
                out.bad(f"side file line at byte {offset}: longer than {core.MAX_TRACE_LINE_BYTES} bytes")
                continue
            try:
                if out.timings.take(offset, raw):
                    continue  # a timing line: indexed, decoded when its steps are read
                _, item = decode_line(raw)
                if isinstance(item, core.LayoutRecord):
                    out.layouts.append(item.validate(meta.num_experts, num_layers=len(meta.layer_names), unused=True))
                elif isinstance(item, core.GpuSample):
                    if len(out.samples) >= MAX_GPU_ROWS:
                        raise ValueError(f"more than {MAX_GPU_ROWS} NVML samples")
                    out.samples.append(item)
                elif isinstance(item, core.TimingRecord):
                    out.timings.add(offset, item.step)  # written by hand (not core.trace_line's form)
                else:
                    raise ValueError("only layout, gpu and timing lines belong in a side file")
            except ValueError as exc:
                out.bad(f"side file line at byte {offset}: {exc}")
    return out


# ------------------------------------------------------------------ a .jsonl trace
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
            rec = rec.validate(self._meta.num_experts, num_layers=len(self._meta.layer_names), unused=True)
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
        try:
            return dedupe(self._read_lines(picked))
        except MemoryError:
            raise out_of_memory(self.path, first_step, last_step) from None

    def _read_lines(self, picked: np.ndarray) -> list[core.StepRecord]:
        """The step records of the indexed rows picked (file order; a line that no longer decodes counted)."""
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
        return out

    def gpu_samples(self, t0_s: float = -np.inf, t1_s: float = np.inf) -> list[core.GpuSample]:
        return sorted((s for s in self._samples if t0_s <= s.time_s <= t1_s), key=lambda s: s.time_s)

    def read_timings(self, first_step: int, last_step: int) -> list[core.TimingRecord]:
        return self._timings_of(self._timings.read(int(first_step), int(last_step), self.meta))

    def timing_rows(self) -> int:
        return self._timings.rows

    def size_bytes(self) -> int:
        return os.path.getsize(self.path)
