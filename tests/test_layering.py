"""The dashboard runs on a laptop without a GPU: importing it (and running the app once) must load
neither torch nor pynvml. Checked in a fresh interpreter through sys.modules."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import importlib, pkgutil, sys
import dashboard
names = []
for info in pkgutil.walk_packages(dashboard.__path__, "dashboard."):
    if info.name.startswith("dashboard.pages"):
        continue  # page entry files run a page when imported; the app run below covers them
    importlib.import_module(info.name)
    names.append(info.name)
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=30).run()
assert not at.exception, at.exception
for page in ("devices", "experts", "gpus"):
    at.switch_page(f"dashboard/pages/{page}.py").run()
    assert not at.exception, at.exception
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "pynvml"))
print("IMPORTED", len(names), "HEAVY", heavy)
"""


def test_dashboard_never_imports_torch_or_pynvml():
    env = dict(os.environ, REDIS_URL="redis://127.0.0.1:1/0")
    result = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "app.py")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("IMPORTED"))
    assert int(line.split()[1]) >= 15, line  # the walk really imported the package
    assert line.endswith("HEAVY []"), line


def test_probe_detects_a_heavy_import():
    """The same sys.modules check sees torch when something does import it (so the test above can fail)."""
    probe = "import sys, collectors; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:1])"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=dict(os.environ),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "torch" in result.stdout
