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
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if _ppid(int(entry)) == pid and b"spawn_main" in cmdline:
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_the_ep_demo_prints_the_apply_command_and_leaves_nothing_behind(tmp_path):
    """`moe-monitor demo --engine ep` stopped by SIGTERM: its engine's ranks end, and its private Redis folder and
    apply secret are removed; while it ran it printed the CLI command that applies a layout with that secret."""
    demo = subprocess.Popen([sys.executable, "-m", "moe_monitor", "demo", "--engine", "ep", "--no-dashboard"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        lines: list[str] = []
        assert demo.stdout is not None
        while not any("--secret-file" in line for line in lines):
            line = demo.stdout.readline()
            assert line, "the demo ended before printing the apply command:\n" + "".join(lines)
            lines.append(line)
        command = next(line for line in lines if "--secret-file" in line).split()
        assert command[:2] == ["moe-monitor", "apply"] and "--run" in command
        secret = Path(command[command.index("--secret-file") + 1])
        assert secret.is_file() and secret.is_relative_to(tmp_path)
        engine: list[int] = []

        def ranks_started() -> bool:
            children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == demo.pid]
            engine[:] = [r for child in children for r in _ranks_of(child)]
            return len(engine) == 4

        _until(ranks_started, "the demo's 4 EP ranks")
        demo.send_signal(signal.SIGTERM)
        demo.communicate(timeout=WAIT_S)
        assert demo.returncode == 0
        _until(lambda: not any(_running(pid) for pid in engine), "the ranks to end")
        assert not secret.exists() and not list(tmp_path.glob("moe-demo-*"))
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1
