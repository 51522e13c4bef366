"""Child processes that die with the process that started them, SIGKILL included: the demo's private
redis-server, engine, aggregator and dashboard must not outlive a `make demo` killed with SIGKILL.

Linux only (prctl PR_SET_PDEATHSIG); elsewhere the children are ordinary ones and the demo's own cleanup on
Ctrl-C / SIGTERM still stops them. The death signal follows the thread that started the child: start them from
the main thread. die_with() is the same request made from inside a child (the EP runtime's spawned ranks)."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once in the parent (nothing is loaded in the forked child)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec_fn that asks the kernel to SIGTERM the child when this process dies (None off Linux)."""
    prctl, parent = _PRCTL, os.getpid()
    if prctl is None:
        return None

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return hook


def die_with(parent_pid: int) -> None:
    """In a child started another way (multiprocessing "spawn"): ask the kernel to SIGTERM this process when
    the thread that started it dies; exit at once when parent_pid is already gone (no-op off Linux)."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent_pid:
        os._exit(1)


def start_child(args: Sequence[str], **popen: Any) -> subprocess.Popen:
    """subprocess.Popen(args, **popen) for a child that dies with this process."""
    return subprocess.Popen(list(args), preexec_fn=die_with_parent_hook(), **popen)  # noqa: PLW1509
