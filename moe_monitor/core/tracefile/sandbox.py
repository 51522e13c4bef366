"""Opening an untrusted trace in a child process under an address-space limit, before a server keeps it (the
dashboard's trace upload): whatever the file makes a reader allocate, the server process never pays for it.

check_in_child(path) runs `python -m moe_monitor.core.tracefile.sandbox PATH` with a timeout and allocators
that map what they allocate (CHILD_ALLOCATOR). The child imports what a read needs, limits its address space
(RLIMIT_AS) to what it has mapped so far plus address_bytes, then opens the trace as a replay would
(open_trace, with the decoded-bytes budget of core/budget.py from the same environment; TraceReader.info) and
prints one JSON line: {"steps": T} or {"error": why, "kind": ...}. A file is refused when it is not a trace
(the reader's ValueError), opening it needs more than the limit (a MemoryError, or the child killed), or it
takes longer than the timeout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_ADDRESS_BYTES = 2 << 30
# allocators that map what they allocate (pyarrow's default, mimalloc, reserves a large region up front, inside
# which an address-space limit never bites; glibc's per-thread arenas reserve 64 MiB each)
CHILD_ALLOCATOR = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}
DEFAULT_TIMEOUT_S = 60.0
MIB = 1 << 20


def check_in_child(path: str | os.PathLike[str], address_bytes: int = DEFAULT_ADDRESS_BYTES,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """'' when the trace at path opens in a child limited to address_bytes of address space beyond its own
    start within timeout_s seconds, else why not (one line)."""
    package_root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
               **CHILD_ALLOCATOR)
    command = [sys.executable, "-m", __name__, "--address-bytes", str(int(address_bytes)), os.fspath(path)]
    limit = f"{address_bytes / MIB:,.0f} MiB"
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_monitor.core.tracefile.sandbox")
    parser.add_argument("path")
    parser.add_argument("--address-bytes", type=int, default=DEFAULT_ADDRESS_BYTES)
    args = parser.parse_args(argv)
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from moe_monitor.core.tracefile import open_trace

    pc.fill_null(pa.chunked_array([pa.array([1, None])]), 0)  # what the first read imports, imported now
    np.zeros(1)
    _limit_address_space(args.address_bytes)
    try:
        with open_trace(args.path) as reader:
            steps = reader.info().steps
        out: dict = {"steps": steps}
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
