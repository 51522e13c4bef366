"""The product as a user installs it: a wheel built from this repository, installed into a fresh virtual
environment, outside any checkout. It holds one import package (moe_monitor, with the app and the sample traces),
its `moe-monitor` command lists the subcommands, and `moe-monitor dashboard` from that install serves the
Overview in headless chromium.

The fresh environment gets the wheel alone (--no-deps); the third-party packages it needs come from this test
run's environment through PYTHONPATH (which, unlike a .pth file, does not bring this checkout's editable install
along), so the test takes seconds, not a download of torch."""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from moe_monitor.demo.localredis import free_port
from tests.support.browserkit import PORT, chromium_page, serving

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel's path, the fresh venv's bin folder, the environment to run it with)."""
    work = tmp_path_factory.mktemp("wheel")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REDIS_URL", "VIRTUAL_ENV")}
    source = work / "source"  # a copy: the build leaves build/ and *.egg-info beside the sources it reads
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "moe_monitor", source / "moe_monitor", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(work / "dist"), str(source)], check=True, capture_output=True, timeout=300, env=clean)
    (wheel,) = (work / "dist").glob("moe_load_monitor-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, timeout=120, env=clean)
    bin_dir = work / "venv" / "bin"
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", str(wheel)], check=True, capture_output=True, timeout=300,
                   env=clean, cwd=work)
    env = dict(clean, PYTHONPATH=os.pathsep.join(site.getsitepackages()))
    return wheel, bin_dir, env, work


def test_the_wheel_holds_one_import_package(installed):
    wheel, bin_dir, env, work = installed
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"moe_monitor"}, sorted(top)
    assert "moe_monitor/dashboard/app.py" in names
    assert any(name.startswith("moe_monitor/traces/samples/") and name.endswith(".parquet") for name in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "moe-monitor = moe_monitor.cli:main" in text
    assert "moe_monitor = moe_monitor.collectors.vllm:register" in text
    where = subprocess.run([str(bin_dir / "python"), "-c", "import moe_monitor; print(moe_monitor.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert Path(where.strip()).is_relative_to(work / "venv"), where  # the installed copy, not this checkout


def test_the_installed_command_lists_its_subcommands(installed):
    _, bin_dir, env, work = installed
    out = subprocess.run([str(bin_dir / "moe-monitor"), "--help"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for sub in ("dashboard", "demo", "record", "replay", "convert", "info", "plan", "advise", "simulate",
                "staleness", "aggregate", "export", "sglang", "apply"):
        assert sub in out.stdout, sub
    bad = subprocess.run([str(bin_dir / "moe-monitor"), "info", str(work / "missing.parquet")], cwd=work, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and len(bad.stderr.splitlines()) == 1, bad.stderr


@pytest.mark.browser
def test_the_installed_dashboard_serves_the_overview(installed, tmp_path):
    _, bin_dir, env, _ = installed
    args = ["dashboard", "--port", PORT, "--redis", f"redis://127.0.0.1:{free_port()}/0"]
    with serving(args, tmp_path / "dashboard.log", env, ready_s=120, program=str(bin_dir / "moe-monitor"),
                 cwd=tmp_path) as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/")
        page.get_by_role("heading", name="Overview").wait_for(timeout=60_000)
        page.get_by_text("No Redis reachable").first.wait_for(timeout=60_000)  # the page ran, in its own words
        assert page.locator('[data-testid="stException"]').count() == 0
    assert "127.0.0.1" in (tmp_path / "dashboard.log").read_text()
