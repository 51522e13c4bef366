"""Runs the real app.py in Streamlit's AppTest against a Redis URL (the tests' own redis-server, or an
unreachable one), failing on any page exception."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "moe_monitor" / "dashboard" / "app.py")


def app_test(phase: str = "both", timeout_s: float = 60) -> AppTest:
    """app.py in AppTest, not yet run, with the sidebar's phase set (tests of other things fill runs that mix
    prefill and decode and read every step: "both"; the app's own default is "auto")."""
    at = AppTest.from_file(APP, default_timeout=timeout_s)
    at.session_state["phase"] = phase
    return at


def run_app(url: str, monkeypatch, timeout_s: float = 60, phase: str = "both") -> AppTest:
    """app.py with REDIS_URL=url, run until the Overview is drawn whole (twice: views.common.opening_tick);
    asserts no run raised."""
    monkeypatch.setenv("REDIS_URL", url)
    at = app_test(phase, timeout_s).run()
    assert not at.exception, at.exception
    return whole(at)


def whole(at: AppTest) -> AppTest:
    """The page on screen run again: a live page's first run after it opens draws it down to its first chart
    (views.common.opening_tick), the next one whole. Asserts the run raised nothing."""
    at.run()
    assert not at.exception, at.exception
    return at


def open_page(at: AppTest, page_file: str) -> AppTest:
    """Switch to page_file ("page_files/devices.py") and run until it is drawn whole."""
    at.switch_page(page_file).run()
    assert not at.exception, at.exception
    return whole(at)
