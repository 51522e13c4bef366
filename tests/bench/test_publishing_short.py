"""bench.publishing on a short cut (200 steps a shape, this tree only, one process): it publishes every step and
prints the CPU of the collector's threads and of redis-server for both shapes. The figures are the full run's."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_publishing_short():
    r = subprocess.run([sys.executable, "-m", "bench.publishing", "--steps", "200", "--turns", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"this tree  background threads +([\d.]+) us  redis-server +([\d.]+) us", r.stdout)
    assert len(rows) == 2, r.stdout  # both shapes
    assert all(float(threads) > 0 and float(server) > 0 for threads, server in rows), r.stdout
