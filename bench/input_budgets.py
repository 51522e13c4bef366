"""Peak memory of small inputs that declare far more than their bytes (one per importer), each run as `moe-monitor`
in a child process (ru_maxrss of the child, resource.getrusage), at the default decoded-bytes budget (1 GiB).
Generated here, never stored.

    .venv/bin/python -m bench.input_budgets [--small]

--small: a tenth of the sizes (a quick check). Figures: docs/traces.md, "What a file may decode to".
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.traces import hostile_inputs as hostile


def peak(args: list[str]) -> tuple[float, float, str]:
    """(peak RSS MiB of the child, seconds, its last stderr line) of `moe-monitor *args`."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-m", "moe_monitor", *args], stdout=subprocess.DEVNULL, stderr=err)
        _, _, usage = os.wait4(child.pid, 0)  # this child's own rusage: its peak RSS
        child.returncode = 0
        seconds = time.perf_counter() - t0
        err.seek(0)
        lines = err.read().strip().splitlines() or ["(no error: accepted)"]
    return usage.ru_maxrss / 1024, seconds, lines[-1][:110]


def generate(d: Path, scale: int) -> None:
    """Write the inputs of _names() under d (a tenth of their sizes with scale 10)."""
    hostile.ultraep_uint8(d / "u", records=10_000_000 // scale)
    hostile.megatron_wide_then_short(d / "m", 65536, 100)
    hostile.trtllm_shared_buffer(d / "t", 1600, 65536)
    hostile.trtllm_empty_lists_header(d / "h", (60 << 20) // scale)
    hostile.logical_count_of_empty_lists(d / "lc.json", (100 << 20) // scale)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)  # the child that writes the inputs
    args = parser.parse_args()
    scale = 10 if args.small else 1
    if args.generate:
        generate(Path(args.generate), scale)
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        # written by a child: a forked child's peak RSS starts at its parent's, so the parent stays small
        subprocess.run([sys.executable, "-m", "bench.input_budgets", "--generate", tmp,
                        *(["--small"] if args.small else [])], check=True)
        cases = _names(d)
        print(f"{'input':<48}{'issue':>16}{'peak MiB':>10}{'s':>7}  message")
        for name, figure, path in cases:
            mib, seconds, last = peak(["convert", str(path), str(d / "out.parquet")])
            print(f"{name:<48}{figure:>16}{mib:>10.0f}{seconds:>7.1f}  {last}")
        mib, seconds, last = peak(["score", "--load", str(d / "lc.json"), "--gpus", "8"])
        print(f"{'score --load the same JSON':<48}{'8.0 GB, 136 s':>16}{mib:>10.0f}{seconds:>7.1f}  {last}")
        mib, seconds, last = peak(["info", str(d / "lc.json")])
        print(f"{'info on the same JSON':<48}{'(refused)':>16}{mib:>10.0f}{seconds:>7.1f}  {last}")
        mib, seconds, last = peak(["--help"])
        print(f"{'moe-monitor --help (the process alone)':<48}{'':>16}{mib:>10.0f}{seconds:>7.1f}")


def _names(d: Path) -> list[tuple[str, str, Path]]:
    """The cases generate() writes, by name (without writing them again)."""
    return [("UltraEP, 10M uint8 records, deflated", "7.3 GB (100M)", d / "u" / "hostile.manifest.json"),
            ("Megatron, a 65,536-wide line + 100 short", "3.2 GB", d / "m"),
            ("TensorRT-LLM, 1,600 [65536] int8 on one buffer", "3.9 GB", d / "t"),
            ("safetensors header of [], 60 MiB", "1.7 GB", d / "h"),
            ("logical_count JSON of [], 100 MiB", "8.0 GB", d / "lc.json")]


if __name__ == "__main__":
    main()
