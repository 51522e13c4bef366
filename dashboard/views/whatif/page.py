"""What-if: plan a layout on a fit window, score it against the current layout on the score window,
edit it by clicking (a GPU bar lists its experts; an expert gets a replica or moves), undo, export it
as SGLang JSON, and see the replica-budget curve and the traffic model. No auto-refresh: the inputs are
frozen until "Re-read the window", and plans are cached per input, so clicks never re-plan."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dashboard.figures import whatif as whatif_figures
from dashboard.figures.units import format_bytes
from dashboard.whatif import edits as whatif_state, repair as whatif_repair, score as whatif_score, traffic as whatif_traffic
from planner.api import plan
from planner.bounds import best_bound
from planner.budget import bytes_per_expert, replica_budget_curve
from dashboard.views.common import Frame, caption, fmt, frame
from dashboard.whatif.cache import cached
from dashboard.views.whatif.controls import (K, Inputs, inputs, on_edit, on_expert_click, on_gpu_click, on_refresh,
                                       on_reset, on_undo)

UNIT = "tokens/step"


def page() -> None:
    st.title("What-if: plan, edit and export a layout")
    current = frame()
    if current is None:
        return
    caption(current)
    try:
        render(current)
    except ValueError as exc:
        st.error(f"Cannot plan with these inputs: {exc}")


def _data(current: Frame, picks: Inputs) -> tuple[tuple, whatif_score.WhatIfData]:
    """The frozen fit/score inputs; re-taken only when settings, windows or the refresh counter change."""
    cfg, layout, watched = current.settings, current.layout, current.watched
    key = (cfg.monitor_key(), cfg.phase, layout.gpus, hash(layout.p2l_LP.tobytes()), picks.fit, picks.unit,
           picks.score_steps, picks.hold_out, st.session_state.get(K + "refresh", 0))
    held = st.session_state.get(K + "data")
    if held is None or held[0] != key:
        view = current.snapshot.view
        data = whatif_score.take(watched.window.counts_CLE[view.slots_T], view.step_T, view.time_s_T,
                                 view.tokens_T, watched.samples.sampled, picks.score_steps, picks.fit, picks.unit,
                                 picks.hold_out)
        held = st.session_state[K + "data"] = (key, data)
    return held


def render(current: Frame) -> None:
    window, layout, view = current.watched.window, current.layout, current.snapshot.view
    E, G = window.num_experts, layout.gpus
    picks = inputs(E, G, layout.p2l_LP.shape[1], layout.nodes, view.num_steps)
    data_key, data = _data(current, picks)
    newer = int(view.step_T[-1]) - data.as_of_step
    left, right = st.columns([4, 1])
    left.caption(f"Fit on {data.fit_steps} steps ({data.fit_span_s:.0f} s, {data.fit_TLE.shape[0]} windows), "
                 f"scored on the newest {data.score_SLE.shape[0]} steps up to step {data.as_of_step}"
                 + (" — **fit and score windows overlap** (too few steps to hold out)" if data.overlap else "")
                 + (f" · {newer} newer steps arrived since" if newer > 0 else ""))
    right.button("Re-read the window", on_click=on_refresh, key=K + "refresh_button")
    groups = picks.groups or None
    plan_nodes = picks.nodes if groups else None
    plans = st.session_state.setdefault(K + "plans", {})
    if picks.move_budget > 0:
        plan_key = (data_key, "repair", picks.move_budget)
        with st.spinner("repairing the current layout ..."):
            result = cached(plans, plan_key, lambda: whatif_repair.repair(data.fit_TLE, layout.p2l_LP, G,
                                                                          picks.move_budget))
    else:
        plan_key = (data_key, picks.redundant, plan_nodes, groups, picks.policy)
        with st.spinner("planning ..."):
            result = cached(plans, plan_key, lambda: plan(
                data.fit_TLE, G, picks.redundant, nodes=plan_nodes, groups=groups, policy=picks.policy))
    sessions = st.session_state.setdefault(K + "edits", {})
    session = sessions.setdefault(plan_key, whatif_state.start(plan_key, result.layout_LP, G))
    meta = current.watched.source.meta()
    sizes, sizes_note = whatif_traffic.run_sizes(meta)
    if sizes_note:
        st.info(f"Bytes and memory below use {sizes_note}.")
    before = whatif_score.score(layout.p2l_LP, data.score_SLE, G)
    after = whatif_score.score(session.current, data.score_SLE, G)
    layer = _layer_picker(before, after)
    st.session_state[K + "ctx"] = {"plan_key": plan_key, "layer": layer, "counts_LE": data.score_sum_LE,
                                   "gpus": G, "experts": E}
    _metrics(layout.p2l_LP, session, before, after, data, sizes, sizes_note)
    st.caption(f"Policy {result.policy} · {session.edits} manual edit(s). GPU load = tokens of each expert "
               "split evenly over its replicas (the EPLB assumption).")
    if picks.move_budget > 0:
        _moves(layout, data, data_key, result)
    _bars_and_edits(layout, session, before, after, data, layer)
    _traffic(layout, session, data, data_key, picks, sizes)
    _budget(data, data_key, G, picks, plan_nodes, groups, sizes)


def _layer_picker(before: whatif_score.Score, after: whatif_score.Score) -> int:
    layers = list(np.flatnonzero(before.active_L)) or list(range(before.active_L.size))
    worst = int(max(layers, key=lambda l: before.imbalance_sum_L[l]))
    return int(st.selectbox("layer to show and edit", layers, index=layers.index(worst), key=K + "layer",
                            format_func=lambda l: f"layer {l} (current layout: imbalance "
                                                  f"{before.imbalance_sum_L[l]:.3f})"))


def _metrics(before_LP, session, before, after, data, sizes, sizes_note: str | None) -> None:
    G = session.gpus
    active = before.active_L
    redundant = session.current.shape[1] - data.num_experts  # the what-if layout's R (a repair keeps the current R)
    bound = best_bound(data.score_sum_LE.astype(np.float64), G, redundant)
    moe_layers = max(1, int(active.sum()))
    bpe = bytes_per_expert(*sizes)
    mem = [lay.shape[1] // G * moe_layers * bpe for lay in (before_LP, session.current)]
    cols = st.columns(6)
    cols[0].metric("balancedness (score window)", fmt(after.balancedness),
                   delta=f"{after.balancedness - before.balancedness:+.3f} vs current {fmt(before.balancedness)}",
                   help="mean over layers with tokens of mean/max GPU load, loads summed over the score window "
                        f"(current layout: p50 over layers {fmt(before.sum_spread.p50)}, as the Overview's window sum)")
    cols[1].metric("per-step balancedness", fmt(after.step_balancedness),
                   delta=f"{after.step_balancedness - before.step_balancedness:+.3f}",
                   help="mean of each step's mean/max over the (step, layer) pairs with tokens, as the Overview "
                        "(idle pairs left out; current layout: 1 - this = the Overview's idle share; p50 over "
                        f"layers {fmt(before.step_spread.p50)})")
    cols[2].metric("best possible with R (lower bound)", fmt(before.mean(1.0 / bound)),
                   help=f"mean over layers of 1 / (lower bound on imbalance) for R = {redundant}: the same "
                        "average as the balancedness beside it, so no layout can score above it")
    cols[3].metric("worst layer imbalance", fmt(after.worst_imbalance),
                   delta=f"{after.worst_imbalance - before.worst_imbalance:+.3f}", delta_color="inverse")
    cols[4].metric("moves needed", f"{whatif_state.moves_needed(before_LP, session.current, G):,}",
                   help=f"expert weights to copy onto GPUs (x {format_bytes(bpe)} each)")
    cols[5].metric("expert memory per GPU", format_bytes(mem[1]), delta=format_bytes(mem[1] - mem[0], sign=True),
                   delta_color="inverse", help=f"slots per GPU x {moe_layers} MoE layers x {bpe:,} bytes per "
                   "expert (3 x hidden x moe_intermediate x dtype bytes)"
                   + (f" — {sizes_note}" if sizes_note else ""))


def _moves(layout, data, data_key, result: whatif_repair.Repaired) -> None:
    """The moves-vs-imbalance curve of the repair (computed once per window up to a horizon, cached)."""
    horizon = whatif_repair.curve_horizon(data.num_layers, result.budget)
    with st.spinner("moves-vs-imbalance curve ..."):
        curve = cached(st.session_state.setdefault(K + "plans", {}), (data_key, "repair", horizon),
                       lambda: whatif_repair.repair(data.fit_TLE, layout.p2l_LP, layout.gpus, horizon))
    st.plotly_chart(whatif_figures.moves_curve(curve.curve, result.curve[-1]), key=K + "moves_fig")
    st.caption(f"Move budget {result.budget}: {result.moves_used} moves used, imbalance "
               f"{result.curve[0]['mean_imbalance']:.3f} -> {result.curve[-1]['mean_imbalance']:.3f} (fit window, "
               f"mean over layers with tokens). The repair keeps the current {layout.p2l_LP.shape[1]} slots per "
               "layer: R, groups and policy do not apply; set the budget to 0 for a full re-plan.")


def _bars_and_edits(layout, session, before, after, data, layer: int) -> None:
    for name, limit in (("gpu", session.gpus), ("target", session.gpus), ("expert", data.num_experts)):
        held = st.session_state.get(K + name)
        if held is not None and not 0 <= held < limit:  # another run or GPU count: forget the old pick
            st.session_state[K + name] = None
    gpu = st.session_state.get(K + "gpu")
    fig = whatif_figures.before_after_bars(before.mean_load_LG[layer], after.mean_load_LG[layer], gpu,
                                           f"Layer {layer}: mean GPU load per step, current vs what-if", UNIT)
    st.plotly_chart(fig, key=K + "bars", on_select=on_gpu_click, selection_mode="points")
    message = st.session_state.pop(K + "message", None)
    if message:
        (st.success if message[0] == "ok" else st.error)(message[1])
    G, E = session.gpus, data.num_experts
    c = st.columns([1, 1, 1, 1, 1, 1, 1])
    c[0].number_input("GPU", min_value=0, max_value=G - 1, value=None, step=1, key=K + "gpu",
                      placeholder="click a bar")
    c[1].number_input("expert", min_value=0, max_value=E - 1, value=None, step=1, key=K + "expert",
                      placeholder="click an expert")
    lightest = int(np.argmin(after.mean_load_LG[layer]))
    c[2].number_input("target GPU", min_value=0, max_value=G - 1, value=None, step=1, key=K + "target",
                      placeholder=f"e.g. {lightest} (lightest)")
    c[3].button("Add replica on target", on_click=on_edit, args=("add",), key=K + "add")
    c[4].button("Move to target", on_click=on_edit, args=("move",), key=K + "move")
    c[5].button("Undo", on_click=on_undo, disabled=session.edits == 0, key=K + "undo")
    c[6].button("Reset to plan", on_click=on_reset, disabled=session.edits == 0, key=K + "reset")
    if gpu is None:
        st.info("Click a GPU bar (or type a GPU above) to list its experts.")
    else:
        rows = whatif_state.gpu_experts(session.current, data.score_sum_LE / data.score_SLE.shape[0], layer,
                                        int(gpu), G)
        st.subheader(f"Experts on GPU {gpu} (layer {layer}, what-if layout)")
        left, right = st.columns([3, 2])
        left.plotly_chart(whatif_figures.gpu_expert_bars(rows, int(gpu), st.session_state.get(K + "expert"), UNIT),
                          key=K + "expert_bars", on_select=on_expert_click, selection_mode="points")
        right.dataframe(pd.DataFrame(rows).rename(columns={"tokens": "tokens/step", "load": f"load here ({UNIT})"}),
                        hide_index=True)
    if session.log:
        st.caption("Edits: " + " · ".join(session.log))
    st.download_button("Download layout (SGLang JSON)", whatif_state.layout_json(session.current),
                       file_name="expert_layout.json", mime="application/json", key=K + "download",
                       help="{\"physical_to_logical_map\": [[E + R ints] x L]} for sglang --init-expert-location")


def _traffic(layout, session, data, data_key, picks: Inputs, sizes) -> None:
    st.subheader("Traffic under the layout (from sampled routing rows)")
    if data.samples_LNK is None:
        st.info("No sampled routing rows in the score window: the collector samples one step in "
                "sample_every (4 by default), or none with sample_tokens=0. Widen the score window.")
        return
    if layout.gpus % picks.nodes:
        st.warning(f"{layout.gpus} GPUs do not split over {picks.nodes} nodes.")
        return
    hidden, _, dtype_bytes = sizes
    cap = picks.node_cap or None
    tokens = float(data.score_tokens_S.mean())
    source_gpu_N, source_note = whatif_traffic.source_gpus(data.samples.rank_N, data.samples.world_size, layout.gpus)
    store = st.session_state.setdefault(K + "traffic", {})
    summaries = [cached(store, (data_key, hash(lay.tobytes()), lay.shape, picks.nodes, cap, sizes), lambda lay=lay:
                        whatif_traffic.traffic_summary(data.samples_LNK, lay, data.num_experts, layout.gpus,
                                                       picks.nodes, hidden, dtype_bytes, tokens, cap, source_gpu_N))
                 for lay in (layout.p2l_LP, session.current)]
    st.dataframe(pd.DataFrame(whatif_traffic.traffic_table(*summaries)), hide_index=True)
    st.caption(f"{summaries[0]['sampled_tokens']} sampled tokens per layer, {summaries[0]['layers']} layers; "
               f"bytes scaled to {tokens:,.0f} tokens/step; {picks.nodes} node(s) of "
               f"{layout.gpus // picks.nodes} GPUs; {source_note}.")


def _budget(data, data_key, G: int, picks: Inputs, nodes, groups, sizes) -> None:
    """Budget curve on the fit window's sum. The robust policy (several plans, seconds each at DeepSeek
    size) is replaced by 'refined', its single-window core, so the curve costs well under a second."""
    st.subheader("Replica budget")
    hidden, inter, dtype_bytes = sizes
    policy = "refined" if picks.policy in ("auto", "robust") and not groups else picks.policy
    key = (data_key, nodes, groups, policy, sizes)
    with st.spinner("budget curve ..."):
        curve = cached(st.session_state.setdefault(K + "budget", {}), key, lambda: replica_budget_curve(
            data.fit_TLE.sum(0), G, 2 * G, hidden, inter, dtype_bytes, policy, nodes, groups))
    knee = curve["rows"][curve["knee"]]
    st.plotly_chart(whatif_figures.budget_curve(curve["rows"], curve["knee"], picks.redundant), key=K + "budget_fig")
    st.caption(f"Planned on the fit window (summed) with policy {policy}. Knee at R = {knee['redundant']}: imbalance "
               f"{knee['mean_imbalance']:.3f} for {format_bytes(knee['extra_bytes_per_gpu'], sign=True)} per GPU "
               f"({curve['bytes_per_expert']:,} bytes per expert, {curve['moe_layers']} MoE layers).")
