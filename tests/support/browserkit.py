"""What the browser tests share: Debian chromium's path and flags, and waiting for a server to answer."""
from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request

CHROMIUM = "/usr/bin/chromium"  # Debian's chromium; never a browser downloaded by playwright
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


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
