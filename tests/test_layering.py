"""The layers stay one-way, checked in fresh interpreters through sys.modules after importing every module
of a package:
- dashboard (and one run of the app over every page) loads neither torch nor pynvml: it runs on a laptop;
- planner loads neither torch nor streamlit nor plotly: a pure numpy library with its own CLI;
- collectors and wire load neither streamlit nor plotly: the model side never pulls in the UI.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WALK = r"""
import importlib, pkgutil, sys
names = []
for package in sys.argv[1].split(","):
    module = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if (info.name.startswith("moe_monitor.dashboard.page_files") or info.name == "moe_monitor.dashboard.app"
                or info.name.endswith("__main__")):
            continue  # the app and its page files run when imported, __main__ runs a CLI; the app run covers them
        importlib.import_module(info.name)
        names.append(info.name)
if len(sys.argv) > 2:
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(sys.argv[2], default_timeout=30).run()
    assert not at.exception, at.exception
    for page in ("devices", "experts", "gpus", "time", "whatif"):
        at.switch_page(f"page_files/{page}.py").run().run()  # live pages open with one chart, then whole
        assert not at.exception, at.exception
loaded = sorted({m.split(".")[0] for m in sys.modules})
print("IMPORTED", len(names), "LOADED", " ".join(loaded))
"""


def _walk(packages: str, *extra: str) -> tuple[int, set[str]]:
    env = dict(os.environ, REDIS_URL="redis://127.0.0.1:1/0")
    result = subprocess.run([sys.executable, "-c", WALK, packages, *extra], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("IMPORTED"))
    head, loaded = line.split(" LOADED ")
    return int(head.split()[1]), set(loaded.split())


def test_dashboard_never_imports_torch_or_pynvml():
    imported, loaded = _walk("moe_monitor.dashboard,moe_monitor.exporter", str(ROOT / "moe_monitor" / "dashboard" / "app.py"))
    assert imported >= 30, imported  # the walk really imported the package
    assert not loaded & {"torch", "pynvml"}, sorted(loaded & {"torch", "pynvml"})


def test_planner_never_imports_torch_or_the_ui():
    imported, loaded = _walk("moe_monitor.planner")
    assert imported >= 15, imported
    assert not loaded & {"torch", "streamlit", "plotly"}, sorted(loaded & {"torch", "streamlit", "plotly"})


@pytest.mark.parametrize("package", ["moe_monitor.collectors", "moe_monitor.core", "moe_monitor.aggregator"])
def test_model_side_never_imports_the_ui(package):
    imported, loaded = _walk(package)
    assert imported >= 5, imported
    assert not loaded & {"streamlit", "plotly", "pandas"}, sorted(loaded & {"streamlit", "plotly", "pandas"})


def test_the_walk_sees_a_heavy_import():
    """The same sys.modules check sees torch when something does import it (so the tests above can fail)."""
    _, loaded = _walk("moe_monitor.collectors")
    assert "torch" in loaded


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_hold_and_can_break(tmp_path):
    """pyproject.toml's import-linter contracts (make lint) hold on this tree, and a copy of it with one import
    that runs back up (core importing the dashboard, inside a function) breaks them: the contracts are checked,
    imports inside functions included."""
    import shutil

    shutil.copytree(ROOT / "moe_monitor", tmp_path / "moe_monitor", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0 and "BROKEN" not in kept.stdout, kept.stdout[-3000:] + kept.stderr[-2000:]
    errors = tmp_path / "moe_monitor" / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _upward():\n    from moe_monitor.dashboard import serve\n"
                      "    return serve\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0 and "moe_monitor's layers BROKEN" in broken.stdout, broken.stdout[-3000:]
    assert "moe_monitor.core.errors -> moe_monitor.dashboard.serve" in broken.stdout
