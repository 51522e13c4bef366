"""A Streamlit script drawing the line charts of the live pages on steps with holes (views.draw, the product's
own drawing), rendered as SVG so a browser test can count each line's paths; each in a container keyed
"gapped_<key>". The steps: 0-99, a lone 150, then 200-299; a trace sampled every 10th step has no hole."""
from __future__ import annotations

import numpy as np
import streamlit as st

from moe_monitor.dashboard.analytics.measured import MeasuredVsEstimated
from moe_monitor.dashboard.figures import load as load_figures
from moe_monitor.dashboard.figures import measured as measured_figures
from moe_monitor.dashboard.figures import time as time_figures
from moe_monitor.dashboard.figures.common import Chart
from moe_monitor.dashboard.views.draw import draw

HOLED_T = np.concatenate([np.arange(100), [150], np.arange(200, 300)])
SAMPLED_T = np.arange(0, 3000, 10)


def as_svg(chart: Chart) -> Chart:
    return Chart({**chart.spec, "usermeta": {"embedOptions": {"renderer": "svg"}}}, chart.data)


def charts() -> dict[str, Chart]:
    """key -> chart: the holed steps on the step charts, and the sampled ones on the load bands."""
    rng = np.random.default_rng(0)
    holed, sampled = HOLED_T.size, SAMPLED_T.size
    measured = MeasuredVsEstimated(HOLED_T, rng.random(holed) + 1, rng.random(holed) + 1, rng.random(holed),
                                   np.ones(holed))
    return {"bands": load_figures.load_bands(HOLED_T, rng.random((holed, 4)) * 100, "tokens/step"),
            "phases": time_figures.phases_over_steps(HOLED_T, *rng.random((4, holed)), "mean over layers"),
            "measured": measured_figures.measured_figure(measured),
            "sampled": load_figures.load_bands(SAMPLED_T, rng.random((sampled, 4)) * 100, "tokens/step")}


if __name__ == "__main__":
    for key, chart in charts().items():
        with st.container(key=f"gapped_{key}"):  # its element carries the class st-key-gapped_<key>
            draw(as_svg(chart), key)
