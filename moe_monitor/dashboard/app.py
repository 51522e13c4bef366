"""MoE expert-load monitor: the Streamlit entry point. It only wires the sidebar and the navigation;
pages live in dashboard/views (one function each), analytics in dashboard/analytics.

Run: moe-monitor dashboard   (REDIS_URL=redis://host:port/db to choose the Redis the collectors write to)
"""
import os

import streamlit as st

from moe_monitor.dashboard.sources.apply_gate import gate_from_env
from moe_monitor.dashboard.views.sidebar import sidebar

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")

st.set_page_config(page_title="MoE load monitor", layout="wide")
# `moe-monitor dashboard` binds loopback unless told otherwise (a bare `streamlit run` may not): say so otherwise,
# and that visitors could apply layouts when Apply is on (said even when exposing the dashboard is intended).
REMOTE = st.config.get_option("server.address") not in LOOPBACK
APPLY = gate_from_env()
APPLY_NOTE = (f" **Apply is on** for run(s) {', '.join(APPLY.runs)}: visitors could also ask those runs' engines to "
              "move expert weights (What-if, \"Apply to the running engine\").") if APPLY.enabled else ""
if REMOTE and os.environ.get("MOE_DASHBOARD_ALLOW_REMOTE") != "1":
    st.warning(f"**This dashboard is reachable from the network** (server.address = "
               f"`{st.config.get_option('server.address') or 'all interfaces'}`): anyone who reaches this port "
               "sees your runs and the Redis they come from." + APPLY_NOTE + " Bind it to loopback with "
               "`moe-monitor dashboard --address 127.0.0.1` (its default), or set MOE_DASHBOARD_ALLOW_REMOTE=1 if "
               "exposing it is intended.")
elif REMOTE and APPLY.enabled:
    st.warning("**This dashboard is reachable from the network.**" + APPLY_NOTE)
sidebar()

# The app's root shows the Overview (a hidden default page: Streamlit serves the default page at "/" only), and
# the Overview answers at /overview too, as every other page does at its own path.
ROOT_PAGE = st.Page("page_files/overview.py", title="Overview", url_path="home", default=True,
                    visibility="hidden")
LIVE_PAGES = [
    st.Page("page_files/overview.py", title="Overview", url_path="overview"),
    st.Page("page_files/devices.py", title="Devices", url_path="devices"),
    st.Page("page_files/experts.py", title="Experts", url_path="experts"),
    st.Page("page_files/gpus.py", title="GPU panel", url_path="gpus"),
    st.Page("page_files/time.py", title="Time", url_path="time"),
]
# Planning pages: the What-if layout preview built on planner (no auto-refresh).
PLAN_PAGES = [st.Page("page_files/whatif.py", title="What-if", url_path="what-if")]
st.navigation({"Live": [ROOT_PAGE, *LIVE_PAGES], "Plan": PLAN_PAGES}).run()
