"""Opening an untrusted trace in a child process under an address-space limit, before a server keeps it (the
dashboard's trace upload): whatever the file makes a reader allocate, the server process never pays for it.

check_in_child(path) runs `python -m moe_monitor.core.tracefile.sandbox PATH` with a timeout, an environment
holding nothing secret (child_env) and an address-space limit; the child reads what a session's first view reads
(read_view) and prints one JSON line, {"steps": T} or {"error": why, "kind": ...}. What it checks and why:
docs/traces.md, "Uploads".
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

DEFAULT_ADDRESS_BYTES = 2 << 30
# allocators that map what they allocate (pyarrow's default, mimalloc, reserves a large region up front, inside
# which an address-space limit never bites; glibc's per-thread arenas reserve 64 MiB each)
CHILD_ALLOCATOR = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}
# the only variables of the server's environment a child sees: where programs and text settings are, the
# decoded-bytes budget; nothing else (the Redis URL, the apply secret, credentials stay in the server)
CHILD_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHOME", "MOE_TRACE_MAX_DECODED_MIB")
CHILD_ENV_KEEP_PREFIX = "LC_"
DEFAULT_TIMEOUT_S = 60.0
VIEW_STEPS = 600  # steps a session's first view reads (the dashboard's default window)
MIB = 1 << 20
_TRACE_KINDS = ("meta", "step", "gpu")  # what a trace's first line may be


def child_env() -> dict[str, str]:
    """The environment a check runs in: CHILD_ENV_KEEP (and LC_*) of this one, this package first on
    PYTHONPATH, CHILD_ALLOCATOR."""
    keep = {k: v for k, v in os.environ.items() if k in CHILD_ENV_KEEP or k.startswith(CHILD_ENV_KEEP_PREFIX)}
    package_root = str(Path(__file__).resolve().parents[3])
    keep["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, keep.get("PYTHONPATH")) if p)
    return {**keep, **CHILD_ALLOCATOR}


def check_in_child(path: str | os.PathLike[str], address_bytes: int = DEFAULT_ADDRESS_BYTES,
                   timeout_s: float = DEFAULT_TIMEOUT_S, view_steps: int = VIEW_STEPS) -> str:
    """'' when the trace at path opens, and its first view (view_steps steps) reads, in a child limited to
    address_bytes of address space beyond its own start within timeout_s seconds; else why not (one line)."""
    command = [sys.executable, "-m", __name__, "--address-bytes", str(int(address_bytes)),
               "--view-steps", str(int(view_steps)), os.fspath(path)]
    limit = f"{address_bytes / MIB:,.0f} MiB"
    try:
        done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"opening it took longer than {timeout_s:.0f} s"
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else {}
    except ValueError:
        verdict = {}
    if not isinstance(verdict, dict) or ("steps" not in verdict and "error" not in verdict):
        return f"opening it stopped the reader (exit status {done.returncode}; the limit is {limit} of memory)"
    if verdict.get("kind") == "memory":
        return f"opening it needs more than {limit} of memory"
    return str(verdict.get("error", ""))


def first_line_error(data: bytes, look_bytes: int) -> str | None:
    """'' when data's first non-blank line is a trace line (a JSON object with a trace kind), else why not;
    None when that line runs past look_bytes (undecided: at most look_bytes of it are looked at, parsed only
    when it ends within them)."""
    first = re.search(rb"\S", data)  # in C: a file of blank lines costs no Python loop
    if first is None:
        return "it is empty"
    start = first.start()
    end = data.find(b"\n", start, start + look_bytes + 1)
    if end < 0 and len(data) - start > look_bytes:
        return None
    try:
        obj = json.loads(data[start:end if end >= 0 else len(data)])
    except (ValueError, RecursionError):
        return "its first line is not JSON"
    if not isinstance(obj, dict) or obj.get("kind") not in _TRACE_KINDS:
        return "its first line is not a trace line (a JSON object with kind meta, step or gpu)"
    return ""


def _first_line_of(path: str, max_bytes: int) -> bytes:
    """The file's bytes from its first non-blank byte on, at most max_bytes + 1 of them."""
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(MIB)
            if not chunk:
                return b""
            blank = len(chunk) - len(chunk.lstrip())
            if blank < len(chunk):
                handle.seek(handle.tell() - len(chunk) + blank)
                return handle.read(max_bytes + 1)


def read_view(reader, view_steps: int) -> None:
    """Read what a session's first view of the trace reads: the steps, layer timings, layouts in force and
    NVML samples of its first and of its newest view_steps timeline entries."""
    tl = reader.timeline()
    if not tl.num_steps:
        return
    for first, last in {(0, min(view_steps, tl.num_steps) - 1), (max(0, tl.num_steps - view_steps), tl.num_steps - 1)}:
        first_step, last_step = int(tl.step_T[first]), int(tl.step_T[last])
        steps = reader.read_steps(first_step, last_step)
        reader.read_timings(first_step, last_step)
        reader.layouts_in_force(first_step, last_step)
        if steps:
            reader.gpu_samples(steps[0].time_s, steps[-1].time_s)
        del steps


def _mapped_bytes() -> int:
    """This process's address space now (VmSize), 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    except (OSError, StopIteration, ValueError):
        return 0


def _limit_address_space(extra_bytes: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = _mapped_bytes() + extra_bytes
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft == resource.RLIM_INFINITY or want < soft:
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def _verdict(path: str, view_steps: int) -> dict:
    from moe_monitor import core
    from moe_monitor.core.tracefile import container_of, open_trace

    if container_of(path) == "jsonl":
        cap = core.MAX_TRACE_LINE_BYTES
        why = first_line_error(_first_line_of(path, cap), cap)
        if why is None:
            why = f"its first line is longer than {cap >> 20} MiB, the longest a trace line may be"
        if why:
            return {"error": f"not a trace: {why}", "kind": "bad input"}
    with open_trace(path) as reader:
        steps = reader.info().steps
        read_view(reader, view_steps)
    return {"steps": steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_monitor.core.tracefile.sandbox")
    parser.add_argument("path")
    parser.add_argument("--address-bytes", type=int, default=DEFAULT_ADDRESS_BYTES)
    parser.add_argument("--view-steps", type=int, default=VIEW_STEPS)
    args = parser.parse_args(argv)
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from moe_monitor.core.tracefile import open_trace  # noqa: F401  (imported before the limit)

    pc.fill_null(pa.chunked_array([pa.array([1, None])]), 0)  # what the first read imports, imported now
    np.zeros(1)
    _limit_address_space(args.address_bytes)
    try:
        out = _verdict(args.path, max(1, args.view_steps))
    except MemoryError:
        out = {"error": "out of memory", "kind": "memory"}
    except ValueError as exc:  # open_trace's one line; a MemoryError it met is kept as the context
        memory = isinstance(exc.__context__, MemoryError)
        out = {"error": " ".join(str(exc).split())[:400], "kind": "memory" if memory else "bad input"}
    except Exception as exc:  # anything else a reader raised on this file: not a trace it reads
        out = {"error": f"cannot be read as a trace ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})",
               "kind": "bad input"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
