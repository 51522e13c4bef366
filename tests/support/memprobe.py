"""The memory findings as a child process: a run of all-zero compact step records that are tiny on the wire and
huge once read (L=800 x E=1000: about 150 bytes each in Redis, 3.2 MB each decoded), and a reader that reads
them in a process of its own and prints its peak resident memory (VmHWM, peak_rss_bytes) with what it made of them.

    python -m tests.support.memprobe exporter|dashboard|dashboard-unsized REDIS_URL RUN WINDOW_STEPS

exporter: a RunExporter polls once (its own budget: $MOE_MONITOR_MEMORY_BUDGET, else its 1 GiB default);
dashboard: one session's data layer (a WatchedRun on a RedisSource sized with dashboard.live.sizing, then the
Overview's analyse() of each phase) under the process budget ($MOE_MONITOR_MEMORY_BUDGET); dashboard-unsized:
the same with the source and window at WINDOW_STEPS whatever the budget (what views/session.py does today).
Prints one JSON object. The child's address space is capped (budget + 3 GiB) so a regression fails, not the
machine.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time

import numpy as np

from moe_monitor import core

ZERO_LAYERS, ZERO_EXPERTS, ZERO_GPUS = 800, 1000, 8


def fill_zero_records(client, run: str, steps: int = 600, num_layers: int = ZERO_LAYERS,
                      num_experts: int = ZERO_EXPERTS, gpus: int = ZERO_GPUS) -> int:
    """Write the run's metadata and `steps` all-zero compact step records (rank 0 of 1); returns the bytes of
    one record's fields."""
    from tests.support.synthfill import make_meta

    client.set(core.meta_key(run), core.encode_meta(make_meta(run, num_layers, num_experts, gpus)))
    zeros_LE = np.zeros((num_layers, num_experts), dtype=np.int32)
    t0 = time.time() - steps
    pipe = client.pipeline(transaction=False)
    record_bytes = 0
    for step in range(steps):
        fields = core.encode_step(core.StepRecord(run=run, rank=0, world_size=1, step=step, time_s=t0 + step,
                                                  phase="decode" if step % 2 else "prefill", tokens=0,
                                                  counts_LE=zeros_LE))
        record_bytes = sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in fields.values())
        pipe.xadd(core.steps_key(run), fields)
    pipe.zadd(core.RUNS_KEY, {run: time.time()})
    pipe.execute()
    return record_bytes


def run_child(mode: str, url: str, run: str, window_steps: int, budget_bytes: int, timeout_s: float = 300.0) -> dict:
    """Run this module as a child with the budget in its environment; its JSON report."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MOE_MONITOR_MEMORY_BUDGET": str(budget_bytes), "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "tests.support.memprobe", mode, url, run, str(window_steps)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(f"memprobe {mode} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def peak_rss_bytes() -> int:
    """This process's own peak resident memory: VmHWM of /proc/self/status where there is one (on Linux
    ru_maxrss carries the parent's peak across fork and exec: a child of a 2 GB pytest reads 2 GB), else
    ru_maxrss."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) * 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _exporter(url: str, run: str, window_steps: int, budget_bytes: int) -> dict:
    from moe_monitor.exporter.metrics import series_count
    from moe_monitor.exporter.server import RunExporter

    exporter = RunExporter(core.connect(url, timeout_s=10.0), url, None, window_steps, memory_budget=budget_bytes)
    exporter.poll()
    window = exporter._watched[run].window
    steps = {s.labels["run"]: s.value for f in exporter.collect() if f.name == "moe_exporter_window_steps"
             for s in f.samples}
    return {"window_steps": None if window is None else window.capacity, "note": exporter.notes.get(run, ""),
            "exported_window_steps": steps.get(run), "series": series_count(exporter.collect()),
            "reserved_bytes": exporter.budget.reserved_bytes}


def _dashboard(url: str, run: str, window_steps: int, sized: bool) -> dict:
    from moe_monitor.core import membudget
    from moe_monitor.dashboard.live import sizing
    from moe_monitor.dashboard.live.layout import resolve_layout
    from moe_monitor.dashboard.live.snapshot import analyse
    from moe_monitor.dashboard.live.watched import WatchedRun
    from moe_monitor.dashboard.sources.redis import RedisSource

    client = core.connect(url, timeout_s=10.0)
    steps, note = window_steps, ""
    if sized:
        steps, note = sizing.budgeted_steps(window_steps, ZERO_LAYERS, ZERO_EXPERTS)
    watched = WatchedRun(RedisSource(client, url, run, steps), steps,
                         max_entries_per_tick=sizing.entries_per_tick(ZERO_LAYERS, ZERO_EXPERTS))
    with sizing.first_poll(steps, ZERO_LAYERS, ZERO_EXPERTS) if sized else contextlib.nullcontext():
        while watched.tick().more:
            pass
    window = watched.window
    if window is None:
        raise AssertionError(f"no window: {watched.last_error}")
    layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size)
    shown = {phase: analyse(window, layout, phase) is not None for phase in ("both", "prefill", "decode")}
    return {"window_steps": window.capacity, "note": note or window.budget_note, "phases": shown,
            "reserved_bytes": membudget.current().reserved_bytes}


def main(argv: list[str]) -> int:
    mode, url, run, window_steps = argv[0], argv[1], argv[2], int(argv[3])
    budget_bytes = int(os.environ["MOE_MONITOR_MEMORY_BUDGET"])
    cap = budget_bytes + (3 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    started = time.perf_counter()
    if mode == "exporter":
        out = _exporter(url, run, window_steps, budget_bytes)
    elif mode in ("dashboard", "dashboard-unsized"):
        out = _dashboard(url, run, window_steps, sized=mode == "dashboard")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    out.update(peak_rss_bytes=peak_rss_bytes(), budget_bytes=budget_bytes, wall_s=time.perf_counter() - started)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
