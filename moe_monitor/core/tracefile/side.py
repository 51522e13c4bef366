"""Layout records, NVML samples and layer timings kept beside a trace: an .arrows file's <path>.side.jsonl
(core/tracefile/recorder.py) and the Parquet GPU sidecar <stem>.gpu.parquet (core/tracefile/writers.py; the timings sidecar
<stem>.timings.parquet is core/tracefile/timings.py's)."""
from __future__ import annotations

import os

import pyarrow.parquet as pq

from moe_monitor import core

from .gpu import MAX_GPU_ROWS, check_gpu_schema, gpu_samples_of
from .lines import decode_line, iter_lines
from .timing_lines import TimingLines


class SideRecords:
    """Layouts and NVML samples read from a side file, its timing lines indexed (timings: read on demand,
    core/tracefile/timings.py); bad lines counted."""

    def __init__(self, path: str = "") -> None:
        self.layouts: list[core.LayoutRecord] = []
        self.samples: list[core.GpuSample] = []
        self.timings = TimingLines(path)
        self.bad_records = 0
        self.last_error = ""

    def bad(self, why: str) -> None:
        self.bad_records += 1
        self.last_error = why

    def samples_between(self, t0_s: float, t1_s: float) -> list[core.GpuSample]:
        picked = [s for s in self.samples if t0_s <= s.time_s <= t1_s]
        return sorted(picked, key=lambda s: s.time_s)


def read_side_jsonl(path: str, meta: core.RunMeta) -> SideRecords:
    """The layout and gpu lines of an .arrows side file (absent: none), its timing lines indexed by step (at
    most traces.timing_lines.MAX_TIMING_LINES; decoded when read)."""
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
                    out.layouts.append(item.validate(meta.num_experts, num_layers=len(meta.layer_names)))
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


def read_gpu_parquet(path: str) -> SideRecords:
    """The NVML samples of a <stem>.gpu.parquet sidecar (absent: none)."""
    out = SideRecords()
    if not os.path.isfile(path):
        return out
    try:
        pf = pq.ParquetFile(path, memory_map=True)
        check_gpu_schema(pf.schema_arrow)
        if pf.metadata.num_rows > MAX_GPU_ROWS:
            raise ValueError(f"{pf.metadata.num_rows} NVML samples, at most {MAX_GPU_ROWS} are read")
        out.samples, out.bad_records, out.last_error = gpu_samples_of(
            pf.read(columns=["time_s", "rank", "host", "status", "reason", "gpus"]))
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
        out.bad(f"{os.path.basename(path)}: {str(exc)[:200]}")
    return out
