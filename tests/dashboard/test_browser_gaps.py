"""Lines over steps with a hole, drawn by Streamlit's own Vega-Lite in headless Debian chromium (SVG, so each line's
paths can be counted): every series breaks at the hole, the lone step between the holes is a point, and a series
sampled every 10th step stays one line."""
from __future__ import annotations

import os

import pytest

from tests.support.browserkit import PORT, STREAMLIT_APP, chromium_page, serving

SCRIPT = "tests/support/gapped_charts.py"
COUNTS = """keys => Object.fromEntries(keys.map(key => {
  const chart = document.querySelector(`.st-key-gapped_${key} [data-testid="stVegaLiteChart"]`);
  const count = what => chart.querySelectorAll(`g.mark-${what}.role-mark path`).length;
  return [key, {lines: count('line'), areas: count('area'), points: count('symbol')}];
}))"""
DRAWN = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
  .filter(c => c.querySelector('svg.marks g.mark-line.role-mark path')).length >= 4"""


@pytest.mark.browser
def test_a_hole_splits_every_line_and_a_lone_step_is_a_point(tmp_path):
    app = [*STREAMLIT_APP[:3], SCRIPT, *STREAMLIT_APP[4:], "--server.port", PORT]
    with serving(app, tmp_path / "streamlit.log", dict(os.environ)) as url, chromium_page(1400, 2400) as page:
        problems: list[str] = []
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.goto(url)
        page.wait_for_function(DRAWN, timeout=120_000)
        counts = page.evaluate(COUNTS, ["bands", "phases", "measured", "sampled"])
        page.screenshot(path=str(tmp_path / "gaps.png"), full_page=True)
    # steps 0-99, 150, 200-299: three segments a series (the lone step's path is one point long)
    assert counts["bands"] == {"lines": 3 * 3, "areas": 3, "points": 3}, counts  # max, p99, mean; the band
    assert counts["phases"] == {"lines": 3, "areas": 3 * 3, "points": 3 + 1}, counts  # 3 stacked phases, the layer
    assert counts["measured"]["lines"] == 2 * 3 and counts["measured"]["points"] == 2, counts
    assert counts["sampled"] == {"lines": 3, "areas": 1, "points": 0}, counts  # every 10th step: no hole
    assert not problems, problems
