"""The EP runtime's ranks never outlive their launcher: SIGTERM unwinds it like Ctrl-C (the ranks are terminated),
and after a SIGKILL the kernel ends them (PR_SET_PDEATHSIG), so a stopped `make demo-ep` leaves no rank behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 180.0  # a generous bound on a busy machine: the test waits for conditions, never for a moment


def _ranks_of(pid: int) -> list[int]:
    """Pids of the multiprocessing "spawn" children of pid (the EP ranks), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    """Whether pid is a live process (a zombie waiting to be reaped is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_ranks_end_with_their_launcher(how):
    launcher = subprocess.Popen([sys.executable, "-m", "moe_monitor.demo.ep", "--ranks", "2", "--seconds", "600"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ranks: list[int] = []

        def started() -> bool:
            ranks[:] = _ranks_of(launcher.pid)
            return len(ranks) == 2

        _until(started, "the 2 ranks to start")
        launcher.send_signal(how)
        code = launcher.wait(WAIT_S)
        assert code == (130 if how == signal.SIGTERM else -signal.SIGKILL)
        _until(lambda: not any(_running(pid) for pid in ranks), "the ranks to end")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
