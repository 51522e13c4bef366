"""The app in a real browser (headless Debian chromium through playwright, `moe-monitor dashboard`): the Overview
answers at /overview itself (no "Page not found" first), and a recorded trace plays: the replay window's step
label moves on its own."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from moe_monitor.demo.localredis import free_port
from tests.support.browserkit import PORT, chromium_page, serving
from tests.support.listsource import recording, write_jsonl

STREAMLIT = ["-m", "streamlit", "run", "moe_monitor/dashboard/app.py", "--server.headless", "true", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none"]


@pytest.fixture
def app_url(tmp_path):
    folder = tmp_path / "recordings"  # the server's log stays out of the trace picker
    folder.mkdir()
    write_jsonl(recording(steps=400, step_s=0.1), folder / "rec.jsonl")
    env = dict(os.environ, MOE_TRACE_DIR=str(folder), REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    with serving([*STREAMLIT, "--server.port", PORT], tmp_path / "streamlit.log", env) as url:
        yield url


@pytest.mark.browser
def test_overview_answers_at_its_own_path(app_url):
    with chromium_page(1400, 1000) as page:
        seen: list[str] = []
        page.on("console", lambda msg: seen.append(msg.text))
        page.goto(f"{app_url}/overview")
        page.get_by_role("heading", name="Overview").wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        assert page.get_by_text("Page not found").count() == 0
        assert page.url.rstrip("/").endswith("/overview")
        assert page.locator('[data-testid="stException"]').count() == 0


def _press(page, name: str, says: str, tries: int = 3) -> None:
    """Click button `name` until the replay line says `says` ("playing" or "paused"). A click that lands while
    the page reruns can be lost on a loaded machine: it is repeated once the app is idle (no running indicator)
    and the line still does not say it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    running = page.locator('[data-testid="stStatusWidget"]')
    line = _line(page, f"· {says}")
    for _ in range(tries):
        if line.count():
            return
        page.get_by_role("button", name=name, exact=True).click()
        try:
            line.first.wait_for(timeout=60_000)
            return
        except PlaywrightTimeout:
            running.first.wait_for(state="hidden", timeout=120_000)  # the rerun ended; was the click lost?
            continue
    raise AssertionError(f"the replay line never said {says!r} after {tries} clicks on {name!r}")


def _line(page, says: str = ""):
    """The replay line ("Replay window: steps A–B ... · playing" or "· paused"), the one that says `says`."""
    return page.locator('[data-testid="stMarkdown"]', has_text=re.compile(rf"Replay window: .*{says}"))


def _set_width(page, steps: int, shows, tries: int = 3) -> None:
    """Type the replay window's width until the label `shows` it: an entry made while the page reruns can be
    lost on a loaded machine, so it is made again only once the app is idle and the label still does not show."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    running = page.locator('[data-testid="stStatusWidget"]')
    for _ in range(tries):
        running.first.wait_for(state="hidden", timeout=120_000)
        width = page.get_by_label("Window (steps)")
        width.fill(str(steps))
        width.press("Enter")
        try:
            page.get_by_text(shows).first.wait_for(timeout=60_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"the window width {steps} never showed after {tries} entries")


def _label(page) -> tuple[int, int]:
    first, last = re.search(r"steps (\d+)–(\d+)", _label_text(page)).groups()
    return int(first), int(last)


def _label_text(page) -> str:
    return page.get_by_text(re.compile(r"Replay window: steps \d+–\d+")).first.inner_text()


def _wait_label(page, ok, what: str, timeout_s: float = 90.0, log: Path | None = None) -> tuple[int, int]:
    """The replay label once ok(label) holds (read every 0.25 s): a condition, never a fixed wait, so a slow
    machine only makes it take longer. On failure it says what the page showed and ends with the server's log."""
    import time

    deadline, seen = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            seen = _label(page)
        except Exception:  # the label is being redrawn (not there, or not yet the text): read it again
            seen = None
        if seen is not None and ok(seen):
            return seen
        page.wait_for_timeout(250)
    try:  # "· playing" or "· paused", how many labels, whether a run is under way: what stopped it
        running = page.locator('[data-testid="stStatusWidget"]').count() > 0
        labels = page.get_by_text(re.compile(r"Replay window: steps")).count()
        line = _line(page).first.inner_text()
        said = f"{line!r}; {labels} label(s); a run under way: {running}"
    except Exception as exc:
        said = f"no label ({exc})"
    tail = "" if log is None else "\nthe server's log, its end:\n" + "\n".join(log.read_text().splitlines()[-60:])
    raise AssertionError(f"{what}: the label read {seen} ({said}){tail}")


@pytest.mark.browser
def test_a_trace_plays_and_the_step_label_advances(app_url, tmp_path):
    with chromium_page(1400, 1400) as page:
        page.goto(f"{app_url}/overview")
        page.get_by_text("Trace file").first.click()
        page.get_by_text(re.compile(r"Replay window: steps")).first.wait_for(timeout=60_000)
        _set_width(page, 50, re.compile(r"Replay window: steps 350–399"))
        _press(page, "▶ play", "playing")  # at the end: starts again from the beginning, at 1x
        log = tmp_path / "streamlit.log"
        first = _wait_label(page, lambda s: s[0] < 300, "play did not start again from the beginning", log=log)
        assert first[1] - first[0] == 49, first
        later = _wait_label(page, lambda s: s[0] > first[0], "the label did not advance while playing", log=log)
        assert later[1] - later[0] == 49, (first, later)
        _press(page, "⏸ pause", "paused")
        # paused: a tick already under way may still land once; then the label holds
        recent: list[tuple[int, int]] = []

        def settled(label: tuple[int, int]) -> bool:  # the same for 8 reads in a row (2 s)
            recent.append(label)
            return len(recent) >= 8 and len(set(recent[-8:])) == 1

        held = _wait_label(page, settled, "the label did not settle after pause", log=log)
        page.wait_for_timeout(2500)  # nothing may move it now: a longer wait on a slower machine changes nothing
        assert _label(page) == held
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
