"""`moe-monitor SUBCOMMAND ...` run two ways that answer alike, a subprocess.CompletedProcess (returncode, stdout,
stderr): in_process calls moe_monitor.cli.main in this interpreter (the fast tier), child starts the real
`python -m moe_monitor` (marked `subprocess`). BOTH parametrizes a test over the two."""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def in_process(*args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """moe_monitor.cli.main(args) run in the repo root, stdout and stderr captured, an argparse exit taken as the
    exit status; env replaces os.environ for the call. The SIGINT / SIGTERM handlers record and replay install
    are put back."""
    from moe_monitor.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    saved_env = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse: --help (0) or a bad flag (2)
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(["moe-monitor", *argv], status, out.getvalue(), err.getvalue())


def child(*args, env: dict[str, str] | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m moe_monitor args` in the repo root (env: its environment, default this one's)."""
    return subprocess.run([sys.executable, "-m", "moe_monitor", *map(str, args)], cwd=ROOT,
                          env=dict(os.environ) if env is None else env, capture_output=True, text=True,
                          timeout=timeout_s)


BOTH = [pytest.param(in_process, id="in-process"), pytest.param(child, id="child", marks=pytest.mark.subprocess)]
