"""bench.costmodel on a short cut (small experts, 1 layer, 3 cycles): it runs the EP runtime, fits, and prints the
table with both regimes, each error beside its goal. The figures themselves are the full run's (make bench)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_costmodel_short():
    r = subprocess.run([sys.executable, "-m", "bench.costmodel", "--hidden", "128", "--ffn", "64", "--layers", "1",
                        "--cycles", "3", "--warmup-cycles", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("cost model vs measured, CPU EP runtime: 2 ranks") and "18 steps" in lines[0]
    rows = {line.split()[0]: line for line in lines if line.startswith(("  decode ", "  prefill "))}
    assert set(rows) == {"decode", "prefill"}
    assert all(row.count("<= 10% ") == 1 and row.count("<= 20% ") == 1 for row in rows.values())
    assert "time > tokens: " in rows["decode"]
    assert sum(line.startswith("  the other form, ") for line in lines) == 2
    assert "reads and FLOPs overlap (max)" in lines[2] or "reads and FLOPs add (sum)" in lines[2]
