"""What the browser tests share: a server process (the demo or the app) started and stopped with its log,
waiting for it to answer, and Debian chromium's path and flags."""
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


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    """Return once url answers 200; RuntimeError if proc exits first, TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server process exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def serving(python_args: list[str], port: int, log_path: Path, env: dict[str, str], ready_s: float = 60):
    """`python <python_args>` started in the repo root in its own process group, its output in log_path;
    yields http://127.0.0.1:<port> once /_stcore/health answers, and stops the whole group afterwards
    (SIGTERM, then SIGKILL after 20 s)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, *python_args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(f"http://127.0.0.1:{port}/_stcore/health", ready_s, proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


STREAMLIT_APP = ["-m", "streamlit", "run", "moe_monitor/dashboard/app.py", "--server.headless", "true",
                 "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]


@contextlib.contextmanager
def serving_app(port: int, log_path: Path, env: dict[str, str]):
    """serving() of the dashboard app (`streamlit run app.py`, headless, no file watcher) on `port`."""
    with serving([*STREAMLIT_APP, "--server.port", str(port)], port, log_path, env) as url:
        yield url


@contextlib.contextmanager
def app_on_private_redis(tmp_path: Path, fill):
    """The dashboard app serving a private redis-server (demo.localredis.RedisServer) that fill(server) filled
    first; yields the app's URL."""
    from moe_monitor.demo.localredis import RedisServer, free_port

    server = RedisServer(tmp_path)
    try:
        fill(server)
        port = free_port()
        with serving_app(port, tmp_path / "streamlit.log", dict(os.environ, REDIS_URL=server.url)) as url:
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
