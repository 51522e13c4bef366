"""The previous main beside this tree in one benchmark run: `moe_monitor` as it was at a git revision, exported
(git archive) into a temporary folder that a child process runs in (so that folder's moe_monitor is the one it
imports, checked before each child), so the same benchmark code measures the old package and the new one in turns
(bench.collector --baseline REV)."""
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


def trees(baseline: str) -> dict[str, Path | None]:
    """{"this tree": None} and, when baseline names a revision that exports, {baseline: its package root}; a
    baseline that does not export is said in one line and left out."""
    found: dict[str, Path | None] = {"this tree": None}
    if baseline:
        root, why = export_package(baseline)
        if root is None:
            print(f"  baseline {baseline}: {why}; this tree only")
        else:
            found[baseline] = root
    return found


def child_env() -> dict[str, str]:
    """The environment of a child that takes the benchmarks and test helpers from this tree. Its moe_monitor
    comes from its working directory (child_cwd): PYTHONPATH comes after the script's folder on sys.path, so
    a package_root on PYTHONPATH alone would lose to this tree whenever the child runs in it."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


def child_cwd(package_root: Path | None) -> Path:
    """Where a child runs so that `python -m ...` imports moe_monitor from package_root (None: this tree)."""
    return REPO if package_root is None else package_root


def imported_from(package_root: Path | None) -> Path:
    """The moe_monitor a child started as child_json starts it imports (its folder). SystemExit when that is
    not package_root's (None: this tree's): a baseline measured from this tree's code would compare a tree with
    itself."""
    want = (REPO if package_root is None else package_root) / "moe_monitor"
    done = subprocess.run([sys.executable, "-c", "import moe_monitor; print(moe_monitor.__file__)"],
                          env=child_env(), cwd=child_cwd(package_root), capture_output=True, text=True,
                          timeout=120)
    got = Path(done.stdout.strip()).resolve().parent if done.returncode == 0 else None
    if got != want.resolve():
        raise SystemExit(f"a child meant to import {want} imports {got}: {done.stderr[-500:]}")
    return got


def child_json(module: str, args: list[str], package_root: Path | None, timeout_s: float = 3600) -> dict:
    """Run `python -m module --child *args` with moe_monitor from package_root (None: this tree; checked with
    imported_from); the JSON object its last line of stdout prints. SystemExit with the end of its stderr when
    it fails."""
    imported_from(package_root)
    done = subprocess.run([sys.executable, "-m", module, "--child", *args], env=child_env(),
                          cwd=child_cwd(package_root), capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{module} child failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
