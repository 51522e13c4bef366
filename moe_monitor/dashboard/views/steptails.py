"""The per-step figures on the Overview and Devices pages (thin: dashboard.live.steptails computes, once per step;
dashboard.analytics.tails shapes the rows): under the run's dispatch policy by default, another picked to compare."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from moe_monitor.core.dispatch import DISPATCH_POLICIES
from moe_monitor.dashboard.analytics import levels
from moe_monitor.dashboard.analytics import tails as tails_rows
from moe_monitor.dashboard.figures.units import format_number
from moe_monitor.dashboard.live.steptails import LP_ROWS_PER_CALL, LiveTails, live_tails
from moe_monitor.dashboard.views.badges import ruled_metric
from moe_monitor.dashboard.views.common import PageData


def run_policy(current: PageData) -> str:
    """The run's dispatch policy (its metadata's; 'even' for a run without metadata)."""
    meta = current.watched.source.meta()
    return getattr(meta, "dispatch", "even") if meta is not None else "even"


def policy_picker(current: PageData, page: str) -> str:
    """A 'Dispatch policy' selector, the run's policy first picked; returns the policy chosen."""
    own = run_policy(current)
    return st.selectbox("Dispatch policy (per-step figures)", DISPATCH_POLICIES, index=DISPATCH_POLICIES.index(own),
                        key=f"{page}_dispatch_policy", format_func=lambda p: tails_rows.POLICY_LABELS[p] +
                        (" — this run's" if p == own else ""),
                        help="How the engine shares an expert's tokens among its replicas (docs: Definitions, "
                             "Dispatch policy). The run's metadata says which one its engine uses; pick another "
                             "to compare.")


def tails_now(current: PageData, policy: str) -> LiveTails | None:
    """The view's per-step figures under policy (None, after saying why, at a rollup resolution or when the
    memory budget cannot hold them)."""
    snap = current.snapshot
    if snap is None or current.layout is None or current.watched.window is None:
        return None
    if snap.resolution_s:
        st.caption("Per-step imbalance and expert skew need single steps: switch Resolution to full resolution "
                   "(the per-step balancedness of the buckets is shown below).")
        return None
    try:
        return live_tails(current.watched.window, snap.view.slots_T, current.layout, policy)
    except ValueError as exc:
        st.warning(f"Per-step figures unavailable: {exc}.")
        return None


def _n(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def summary_metrics(live: LiveTails, policy: str, run_policy_name: str) -> None:
    """One row of metrics: per-step imbalance p50 / p99 / max, ideal fraction, expert skew p99, window imbalance,
    and a caption saying under which policy and over which steps."""
    figures = tails_rows.summary(live.tails)
    cols = st.columns(6)
    pairs = "max/mean GPU load of each (step, layer) pair with tokens"
    ruled_metric(cols[0], "step imbalance p50", figures["p50"], format_number(_n(figures["p50"])), levels.IMBALANCE,
                 f"{pairs}, median over the window's pairs; 1 is perfect.")
    ruled_metric(cols[1], "step imbalance p99", figures["p99"], format_number(_n(figures["p99"])), levels.IMBALANCE,
                 f"{pairs}: the tail a window sum averages away, 1% of the pairs are worse.")
    ruled_metric(cols[2], "step imbalance max", figures["max"], format_number(_n(figures["max"])), levels.IMBALANCE,
                 f"{pairs}: the worst one.")
    ruled_metric(cols[3], "share of the ideal", figures["ideal_fraction"],
                 format_number(_n(figures["ideal_fraction"]), ".1%"), levels.SHARE_OF_IDEAL,
                 "mean/max GPU load averaged over the pairs: the share of the force-balanced ideal reached.")
    cols[4].metric("expert skew p99", format_number(_n(figures["skew_p99"])),
                   help="per (step, layer): on the worst GPU, its busiest expert slot over its mean slot (what a "
                        "grouped GEMM padding every expert to the largest pays); p99 over the pairs")
    ruled_metric(cols[5], "window imbalance", figures["window_imbalance"],
                 format_number(_n(figures["window_imbalance"])), levels.IMBALANCE,
                 "max/mean of the loads summed over the window, mean over layers (at most the worst step's).")
    whose = "the run's" if policy == run_policy_name else f"compared; the run's is {run_policy_name}"
    catching_up = (f" — **{live.pending:,} older steps still being solved** (lp: at most {LP_ROWS_PER_CALL} steps "
                   "a refresh, the newest first)" if live.pending else "")
    st.caption(f"Per-step figures under dispatch policy **{policy}** ({whose}), over {live.tails.steps:,} of "
               f"{live.rows_in_view:,} steps, each under the layout in force at its step; each step is computed "
               f"once{catching_up}.")


def overview_section(current: PageData) -> None:
    """The Overview's per-step figures: picker, one row of metrics."""
    st.markdown("**Per-step tails** (each step's busiest GPU, under a dispatch policy)")
    policy = policy_picker(current, "overview")
    live = tails_now(current, policy)
    if live is not None:
        summary_metrics(live, policy, run_policy(current))


def devices_section(current: PageData) -> None:
    """The Devices page's per-step figures: picker, the metrics row and the per-layer table."""
    st.markdown("**Per-step imbalance per layer** (each step's busiest GPU, under a dispatch policy)")
    policy = policy_picker(current, "devices")
    live = tails_now(current, policy)
    if live is None:
        return
    summary_metrics(live, policy, run_policy(current))
    st.dataframe(pd.DataFrame(tails_rows.layer_rows(live.tails)), hide_index=True)
