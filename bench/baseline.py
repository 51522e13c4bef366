"""The previous main beside this tree in one benchmark run: `moe_monitor` as it was at a git revision, exported
(git archive) into a temporary folder that a child process puts first on its PYTHONPATH, so the same benchmark
code measures the old package and the new one in turns (bench.collector --baseline REV)."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def export_package(rev: str) -> tuple[Path | None, str]:
    """(folder holding moe_monitor/ as of rev, '') or (None, why not: no git, an unknown revision). The folder
    is removed when this process exits."""
    folder = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    archive = folder / "tree.tar"
    try:
        with open(archive, "wb") as out:
            done = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev, "moe_monitor"],
                                  stdout=out, stderr=subprocess.PIPE, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"git archive failed: {exc}"
    if done.returncode != 0:
        return None, f"revision {rev!r}: {done.stderr.decode(errors='replace').strip()[:200]}"
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    archive.unlink()
    return folder, ""


def child_env(package_root: Path | None) -> dict[str, str]:
    """The environment of a child that imports moe_monitor from package_root (None: this tree) and the
    benchmarks and test helpers from this tree."""
    paths = ([str(package_root)] if package_root is not None else []) + [str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def child_json(module: str, args: list[str], package_root: Path | None, timeout_s: float = 3600) -> dict:
    """Run `python -m module --child *args` with moe_monitor from package_root (None: this tree); the JSON object
    its last line of stdout prints. SystemExit with the end of its stderr when it fails."""
    done = subprocess.run([sys.executable, "-m", module, "--child", *args], env=child_env(package_root), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{module} child failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
