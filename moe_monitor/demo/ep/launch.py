"""Spawning the ranks of an EP run: N processes (multiprocessing "spawn"), torch.distributed over gloo on a
free loopback port, each running worker.run_rank; their result files are read back when all have ended.
A rank that fails takes the others down (terminate, by their own process handles) and raises here with its
traceback; the ranks die with the launcher, SIGKILL included (demo.children.die_with)."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

from moe_monitor.demo.localredis import free_port

from .config import EPConfig
from .worker import run_rank


def launch(cfg: EPConfig, result_dir: str | Path | None = None, timeout_s: float | None = None) -> list[dict]:
    """Run cfg on cfg.ranks processes; returns each rank's summary (worker.serve), rank order. result_dir keeps
    the result files (rank{r}.json, rank{r}.pt with save_outputs); default: a temporary folder. RuntimeError
    when a rank fails or the run outlasts timeout_s."""
    cfg.check()
    holder = None
    if result_dir is None:
        holder = tempfile.TemporaryDirectory(prefix="moe-ep-")
        result_dir = holder.name
    out = Path(result_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=run_rank, args=(rank, cfg, port, str(out), os.getpid()), name=f"ep-rank{rank}",
                         daemon=False) for rank in range(cfg.ranks)]
    for proc in procs:
        proc.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while any(proc.is_alive() for proc in procs):
            failed = [proc for proc in procs if proc.exitcode not in (None, 0)]
            if failed or (deadline is not None and time.monotonic() > deadline):
                break
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(10)
    try:
        errors = [(rank, out / f"rank{rank}.error") for rank in range(cfg.ranks)]
        for rank, path in errors:
            if path.exists():
                raise RuntimeError(f"EP rank {rank} failed:\n{path.read_text()}")
        codes = [proc.exitcode for proc in procs]
        if any(code != 0 for code in codes):
            raise RuntimeError(f"EP ranks ended with exit codes {codes}")
        return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(cfg.ranks)]
    finally:
        if holder is not None:
            holder.cleanup()
