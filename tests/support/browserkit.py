"""What the browser tests share: a server process (the demo or the app) on a port of its own, started and
stopped with its log, waiting for it to answer, and Debian chromium's path and flags."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"  # Debian's chromium; never a browser downloaded by playwright
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
# the sidebar's widgets on screen: a new session draws them on its second run (views.sidebar.sidebar)
SIDEBAR_WIDGETS = '[data-testid="stSidebar"] [data-testid="stRadio"]'
ROOT = Path(__file__).resolve().parents[2]
PORT = "{port}"  # in serving()'s arguments: the free port of that try


def listening_inodes(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on port (IPv4 and IPv6), from /proc/net."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(fields[9])
    return inodes


def group_listens_on(pgid: int, port: int) -> bool:
    """Whether a process of process group pgid holds a socket listening on port."""
    held = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:  # after the name: state, ppid, pgrp
                continue
            if any(os.readlink(fd) in held for fd in (stat.parent / "fd").iterdir()):
                return True
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return False


def wait_own_http(url: str, port: int, timeout_s: float, proc: subprocess.Popen) -> bool:
    """True once url answers 200 from proc's process group; False when another process holds the port (it
    answers there, or proc exited while it listens); RuntimeError when proc exits with the port free,
    TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if listening_inodes(port):
                return False
            raise RuntimeError(f"the server process exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return group_listens_on(proc.pid, port)
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM proc's process group, SIGKILL after 20 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def serving(args: list[str], log_path: Path, env: dict[str, str], ready_s: float = 60,
            program: str | None = None, cwd: Path = ROOT):
    """`program <args>` (python by default) started in cwd in its own process group, its output in log_path,
    with PORT in args replaced by a free port; yields http://127.0.0.1:<port> once /_stcore/health answers
    from that group, and stops the whole group afterwards. Another process may take the free port first: the
    server then exits or another one answers, and the next try takes another port (localredis.PORT_TRIES in
    all)."""
    from moe_monitor.demo import localredis  # looked up at each call: a test may replace its free_port

    for _ in range(localredis.PORT_TRIES):
        port = localredis.free_port()
        with open(log_path, "w") as log:
            argv = [program or sys.executable, *(arg.replace(PORT, str(port)) for arg in args)]
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            if wait_own_http(f"http://127.0.0.1:{port}/_stcore/health", port, ready_s, proc):
                break
        except BaseException:
            _stop_group(proc)
            raise
        _stop_group(proc)
    else:
        raise RuntimeError(f"another process took each of {localredis.PORT_TRIES} free ports first: {log_path}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop_group(proc)


STREAMLIT_APP = ["-m", "streamlit", "run", "moe_monitor/dashboard/app.py", "--server.headless", "true",
                 "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]


@contextlib.contextmanager
def serving_app(log_path: Path, env: dict[str, str]):
    """serving() of the dashboard app (`streamlit run app.py`, headless, no file watcher) on a free port."""
    with serving([*STREAMLIT_APP, "--server.port", PORT], log_path, env) as url:
        yield url


@contextlib.contextmanager
def app_on_private_redis(tmp_path: Path, fill):
    """The dashboard app serving a private redis-server (demo.localredis.RedisServer) that fill(server) filled
    first; yields the app's URL."""
    from moe_monitor.demo.localredis import RedisServer

    server = RedisServer(tmp_path)
    try:
        fill(server)
        with serving_app(tmp_path / "streamlit.log", dict(os.environ, REDIS_URL=server.url)) as url:
            yield url
    finally:
        server.stop()


@contextlib.contextmanager
def chromium_page(width: int, height: int):
    """A page in headless Debian chromium (playwright's Python package, never its own browser download)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()
