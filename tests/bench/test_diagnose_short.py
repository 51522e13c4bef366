"""bench.diagnose on a short cut (5 layers, 60 steps): it runs, judges both goals under one shared link and prints
every candidate under both pricings. The goals themselves are the full run's (docs/diagnose.md)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from moe_monitor.planner.diagnose import CANDIDATES

ROOT = Path(__file__).resolve().parents[2]


def test_bench_diagnose_short():
    r = subprocess.run([sys.executable, "-m", "bench.diagnose", "--layers", "5", "--steps", "60", "--every", "20",
                        "--move-every", "5", "--max-moves", "16"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.splitlines()
    verdicts = [line for line in lines if line.startswith(("PASS ", "FAIL "))]
    assert [v.split()[1] for v in verdicts] == ["persistent", "fast-moving"]
    assert all("(one shared link)" in v for v in verdicts)
    assert "one shared 400 Gb/s link; --max-moves 16" in r.stdout
    for name in CANDIDATES:
        rows = [line for line in lines if line.startswith(f"  {name} ")]
        assert len(rows) == 2 and all("| " in row for row in rows)
    assert r.stdout.count("(per-GPU links instead: re-planning ") == 2
    assert (r.returncode == 1) == any(v.startswith("FAIL") for v in verdicts)
