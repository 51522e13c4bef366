"""Draw a figures.common.Chart: st.vega_lite_chart at the container's width. A chart without selections keeps
its view between a live page's ticks and swaps its datasets in place while its spec stays the same."""
from __future__ import annotations

import streamlit as st

from moe_monitor.dashboard.figures.common import Chart


def draw(chart: Chart, key: str, container=st) -> None:
    container.vega_lite_chart(chart.spec_with_data(), key=key, width="stretch")
