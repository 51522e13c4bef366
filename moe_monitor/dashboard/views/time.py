"""Time: where each MoE layer's time goes, from the engine's measured layer timings (dispatch, expert compute,
combine, the whole layer per step and rank): per rank and over steps, all-to-all share and achieved overlap per
layer, each rank's straggler wait, and the step's MoE time against its max GPU load (the straggler bound
checked on measurements). The numbers are dashboard.analytics.timing's; the figures dashboard.figures.time's."""
from __future__ import annotations

import numpy as np
import streamlit as st

from moe_monitor.dashboard.analytics import timing
from moe_monitor.dashboard.figures import time as time_figures
from moe_monitor.dashboard.figures.units import format_number
from moe_monitor.dashboard.views import timeline
from moe_monitor.dashboard.views.common import PageData, caption, named_or_busiest, opening_tick, poll_and_analyse
from moe_monitor.dashboard.views.draw import draw
from moe_monitor.dashboard.views.session import REFRESH_S

MIN_FIT_R2 = 0.3  # a line of MoE time on the busiest GPU's tokens is reported only when it explains this much

NO_TIMINGS = ("no layer timings: this run has no all-to-all (one process) or its engine does not time its "
              "layers")
MEAN = "mean over layers"


def page() -> None:
    st.title("Time: where the layer time goes")
    live()


@st.fragment(run_every=REFRESH_S)
def live() -> None:
    current = poll_and_analyse(full_resolution=True)  # layer timings are per step
    if current is not None:
        render(current, whole=not opening_tick("time"))
    timeline.keep_playing()


def _ms(seconds: float) -> str:
    return "n/a" if not np.isfinite(seconds) else f"{seconds * 1e3:.3f} ms"


def straggler_line(wait_R: np.ndarray, named: int, gpus: int, in_time: bool) -> str:
    """The measured straggler beside the GPU the Overview names, by the same rule (the one the others wait
    for): whether they agree, where ranks are GPUs."""
    rank = timing.measured_straggler(wait_R)
    if rank is None:
        return "No rank's wait was measured: no straggler by measurement."
    others = np.delete(wait_R, rank)
    less = float(np.nanmean(others) - wait_R[rank]) if np.isfinite(others).any() else float("nan")
    line = (f"**Measured straggler: rank {rank}**, waiting {_ms(less)} less per step than the other ranks' mean. "
            f"The Overview names GPU {named} ({'predicted by the cost model' if in_time else 'by tokens'})")
    if wait_R.size != gpus:
        return line + f"; ranks ({wait_R.size}) are not GPUs ({gpus}) here, so the two are not compared."
    return line + ("; they agree." if rank == named else "; they differ: the measurement holds what the "
                   "prediction leaves out (`moe-monitor calibrate` fits the profile to these timings).")


def _share(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.1%}"


def render(current: PageData, whole: bool = True) -> None:
    """whole=False: down to the first chart (dashboard.views.common.opening_tick)."""
    snap, ring = current.snapshot, current.watched.timings
    if snap is None:
        return
    if not ring.records:
        st.info(NO_TIMINGS)
        return
    caption(current)
    view = ring.aligned(snap.view.step_T)
    if not view.any:
        st.info(f"No layer timings for the {snap.view.num_steps} steps in view ({ring.size} timed steps kept): "
                "another phase, or the timings have not arrived yet.")
        return
    choice = st.selectbox("layer", [MEAN, *range(view.num_layers)], key="time_layer",
                          format_func=lambda c: c if c == MEAN else f"layer {c}")
    layer = None if choice == MEAN else int(choice)
    what = MEAN if layer is None else f"layer {layer}"
    d_TR, c_TR, b_TR, l_TR = (timing.select_layer(a, layer) for a in (
        view.dispatch_TRL, view.compute_TRL, view.combine_TRL, view.layer_TRL))
    summary = timing.summarise(view.dispatch_TRL, view.compute_TRL, view.combine_TRL, view.layer_TRL)
    cols = st.columns(5)
    cols[0].metric("dispatch / layer time", _share(summary.dispatch_share),
                   help="all-to-all that sends tokens to their experts' ranks, over the whole MoE layer time "
                        "(sums over the measured steps, ranks and layers)")
    cols[1].metric("combine / layer time", _share(summary.combine_share),
                   help="all-to-all back and the weighted sum, over the whole MoE layer time")
    cols[2].metric("achieved overlap", format_number(summary.overlap),
                   help="(compute + comm - layer) / min(compute, comm), comm = dispatch + combine, clipped to [0, 1]")
    cols[3].metric("layer time, mean", _ms(summary.layer_mean_s), help="per (step, layer), its slowest rank")
    cols[4].metric("layer time, p99", _ms(summary.layer_p99_s), help="per (step, layer), its slowest rank")
    draw(time_figures.rank_breakdown(timing.mean_over(d_TR, 0), timing.mean_over(c_TR, 0), timing.mean_over(b_TR, 0),
                                     timing.mean_over(l_TR, 0), what), "time_ranks")
    if not whole:
        return
    draw(time_figures.phases_over_steps(view.step_T, timing.mean_over(d_TR, 1), timing.mean_over(c_TR, 1),
                                        timing.mean_over(b_TR, 1), timing.max_over(l_TR, 1), what, snap.step_marks()),
         "time_steps")
    share = timing.alltoall_share(view.dispatch_TRL, view.combine_TRL, view.layer_TRL)
    overlap_L, _ = timing.overlap(view.dispatch_TRL, view.compute_TRL, view.combine_TRL, view.layer_TRL)
    draw(time_figures.share_by_layer(share, overlap_L), "time_share")
    st.caption("Achieved overlap of a (step, rank, layer) = (compute + comm − layer) / min(compute, comm), comm = "
               "dispatch + combine, **clipped to [0, 1]**: 0 when the layer took compute + comm (nothing hidden), "
               "1 when it took only max(compute, comm). Shares are sums of the measured cells over the window.")
    wait_R = timing.wait_per_rank(view.compute_TRL, view.layer_TRL)
    draw(time_figures.wait_bars(wait_R), "time_wait")
    st.caption("Straggler wait = the layer's time (its slowest rank) minus the rank's own expert compute: its "
               "all-to-alls and the time it waits for the others. The rank that waits least is the straggler.")
    st.markdown(straggler_line(wait_R, named_or_busiest(snap), snap.layout.gpus, snap.time is not None))
    load_T = timing.max_gpu_load_per_step(snap.view.loads_TLG)
    moe_s_T = timing.step_moe_time(view.layer_TRL)
    fit = timing.fit_line(load_T, moe_s_T)
    draw(time_figures.time_vs_load(load_T, moe_s_T, fit, view.step_T), "time_vs_load")
    if np.isfinite(fit.slope) and fit.r2 >= MIN_FIT_R2:
        st.markdown(f"**Straggler bound on measurements:** MoE time ≈ {fit.slope * 1e6:.3f} µs per token of max GPU "
                    f"load + {fit.intercept * 1e3:.3f} ms, R² = {format_number(fit.r2)} over {fit.n} steps. GPU "
                    "load under the layout in force at each step, replicas sharing an expert's tokens evenly.")
    elif np.isfinite(fit.slope):
        st.caption(f"The busiest GPU's tokens do not explain the MoE time here (R² = {format_number(fit.r2)} over "
                   f"{fit.n} steps, below {MIN_FIT_R2}): no line is given. Where weight reads bound the experts, "
                   "time follows active experts more than tokens (the Overview's time figures).")
    else:
        st.caption(f"Too few timed steps with different loads for a line ({fit.n}).")
