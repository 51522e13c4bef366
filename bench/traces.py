"""Trace benchmark: a synthetic 10k-step DeepSeek-V3-sized trace (58 layers x 256 experts, 1 rank), written as
Parquet (zstd) and as an Arrow IPC stream; per container, the time to open it, build the timeline and read the
first page (the first 600 steps' records), printed beside a raw read of the same file (all of its bytes), and
the file sizes against the JSON-lines size of the same records. Goal: open + timeline + first page <= 1 s.

Run: .venv/bin/python -m bench.traces
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from moe_monitor import core
from moe_monitor.core import tracefile

STEPS, L, E, G, PAGE = 10_000, 58, 256, 32, 600


def meta() -> core.RunMeta:
    return core.RunMeta(run="bench", model_name="synthetic DeepSeek-V3 shape", layer_names=[f"layer{i}" for i in range(L)],
                        num_experts=E, top_k=8, hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=2,
                        layout=core.Layout(G, 4, core.contiguous_layout(L, E)), world_size=1, started_s=1.7e9)


def chunks(rng: np.random.Generator, size: int = 500):
    popularity = rng.dirichlet(np.full(E, 0.3), size=L)
    for a in range(0, STEPS, size):
        yield [core.StepRecord(run="bench", rank=0, world_size=1, step=s, time_s=1.7e9 + 0.05 * s,
                               phase="decode" if s % 8 else "prefill", tokens=2048,
                               counts_LE=np.stack([rng.multinomial(2048 * 8, popularity[l]) for l in range(L)]).astype(np.int32))
               for s in range(a, min(STEPS, a + size))]


def jsonl_bytes(records) -> int:
    return sum(len(core.trace_line("step", core.encode_step(r))) + 1 for r in records)


def first_page(path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    reader = tracefile.open_trace(path)
    tl = reader.timeline()
    page = reader.read_steps(int(tl.step_T[0]), int(tl.step_T[min(PAGE, tl.num_steps) - 1]))
    took = time.perf_counter() - t0
    reader.close()
    return took, len(page)


def raw_read(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as handle:
        while handle.read(1 << 24):
            pass
    return time.perf_counter() - t0


def main() -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        paths = {name: Path(folder) / f"bench.{name}" for name in ("parquet", "arrows")}
        writers = {name: tracefile.open_writer(path, meta()) for name, path in paths.items()}
        json_size = 0
        t_write = dict.fromkeys(paths, 0.0)
        for records in chunks(rng):
            json_size += jsonl_bytes(records)
            for name, writer in writers.items():
                t0 = time.perf_counter()
                writer.write(records)
                t_write[name] += time.perf_counter() - t0
        for name, writer in writers.items():
            t0 = time.perf_counter()
            writer.close()
            t_write[name] += time.perf_counter() - t0
        print(f"synthetic trace: {STEPS} steps x {L} layers x {E} experts, 1 rank; JSON lines would be "
              f"{json_size / 2**20:.1f} MiB")
        for name, path in paths.items():
            size = os.path.getsize(path)
            raw_read(path)  # page cache warm for both measurements
            took, rows = first_page(path)
            raw = raw_read(path)
            verdict = "ok" if took <= 1.0 else "OVER the 1 s goal"
            print(f"{name:8s} size {size / 2**20:7.1f} MiB ({size / json_size:5.3f} x JSON lines), write "
                  f"{t_write[name]:5.2f} s | open + timeline + first page ({rows} records) {took * 1000:7.1f} ms "
                  f"vs raw read of the file {raw * 1000:7.1f} ms (x{took / raw:.2f}) [{verdict}]")


if __name__ == "__main__":
    main()
