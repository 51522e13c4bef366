"""What-if: plan a layout on a fit window (or repair the current one within a move budget), score it against
the current layout on the score window, edit it by clicking (a GPU bar lists its experts; an expert gets a
replica or moves), undo, export it as SGLang JSON, apply it to the running engine (views/whatif/apply.py: off
unless the server enables it), and see the replica-budget curve and the traffic model. No auto-refresh (but for
the answer to an Apply): the inputs are frozen until "Re-read the window", and plans are cached per input, so
clicks never re-plan. The page's state (page_state()) and the widgets it reads belong to controls.py; this module
lays the page out.

Shape legend (README, Conventions): T steps, W windows, L layers, E logical experts, P slots, G GPUs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from moe_monitor.core.costmodel import TimeModel
from moe_monitor.dashboard.figures import whatif as whatif_figures
from moe_monitor.dashboard.figures.units import format_bytes, format_number
from moe_monitor.dashboard.live.layout import ResolvedLayout
from moe_monitor.dashboard.live.window import StepWindow, WindowView
from moe_monitor.dashboard.views.common import PageData, caption, poll_and_analyse
from moe_monitor.dashboard.views.staleness import moving_span, staleness_section
from moe_monitor.dashboard.views.whatif import controls
from moe_monitor.dashboard.views.whatif.apply import apply_section
from moe_monitor.dashboard.views.whatif.controls import EditTarget, Inputs, WhatIfState
from moe_monitor.dashboard.views.whatif.policies import policies_section
from moe_monitor.dashboard.whatif import advice as whatif_advice
from moe_monitor.dashboard.whatif import edits
from moe_monitor.dashboard.whatif import repair as whatif_repair
from moe_monitor.dashboard.whatif import score as whatif_score
from moe_monitor.dashboard.whatif import traffic as whatif_traffic
from moe_monitor.dashboard.whatif.cache import cached
from moe_monitor.planner.advisor import DEFAULT_MAX_MOVES, DEFAULT_WINDOW, Advice
from moe_monitor.planner.api import PlanResult, plan
from moe_monitor.planner.bounds import best_bound
from moe_monitor.planner.budget import bytes_per_expert, replica_budget_curve

UNIT = "tokens/step"
MOVES_LABEL = "moves (expert copies onto GPUs)"  # what planner.repair.experts_copied counts


def page() -> None:
    st.title("What-if: plan, edit and export a layout")
    current = poll_and_analyse(full_resolution=True)  # plans and scores single steps
    if current is None:
        return
    caption(current)
    try:
        render(current)
    except ValueError as exc:
        st.error(f"Cannot plan with these inputs: {exc}")


def _frozen_windows(current: PageData, layout: ResolvedLayout, window: StepWindow, view: WindowView, picks: Inputs,
                    state: WhatIfState) -> tuple[tuple, whatif_score.WhatIfData]:
    """(key, the frozen fit and score windows); re-read only when settings, windows or the refresh count
    change."""
    cfg, watched = current.settings, current.watched
    key = (cfg.monitor_key(), current.phase, layout.gpus, hash(layout.layout_LP.tobytes()), picks.fit, picks.unit,
           picks.score_steps, picks.hold_out, state.refresh, *moving_span(current))
    if state.windows is None or state.windows[0] != key:
        data = whatif_score.fit_and_score_windows(
            window.counts_CLE[view.slots_T], view.step_T, view.time_s_T, view.tokens_T,
            watched.samples.sampled, picks.score_steps, picks.fit, picks.unit, picks.hold_out)
        state.windows = (key, data)
    return state.windows


def render(current: PageData) -> None:
    layout, snapshot, window = current.layout, current.snapshot, current.watched.window
    if layout is None or snapshot is None or window is None:  # poll_and_analyse() gives all three when there are steps
        return
    view, state = snapshot.view, controls.page_state()
    E, G = window.num_experts, layout.gpus
    picks = controls.planning_inputs(E, G, layout.layout_LP.shape[1], layout.nodes, view.num_steps)
    data_key, data = _frozen_windows(current, layout, window, view, picks, state)
    newer = int(view.step_T[-1]) - data.as_of_step
    left, right = st.columns([4, 1])
    left.caption(f"Fit on {data.fit_steps} steps ({data.fit_span_s:.0f} s, {data.fit_WLE.shape[0]} windows), "
                 f"scored on the newest {data.score_TLE.shape[0]} steps up to step {data.as_of_step}"
                 + ((" — **fit and score windows overlap** (" + ("too few steps to hold out)" if picks.hold_out
                                                                   else "hold-out is off)")) if data.overlap else "")
                 + (f" · {newer} newer steps arrived since" if newer > 0 else ""))
    controls.refresh_button(right)
    advice = _advisor(current, layout, window, view, data_key, state)
    groups = picks.groups or None
    plan_nodes = picks.nodes if groups else None
    result: whatif_repair.Repaired | PlanResult | whatif_advice.AdvisedLayout
    if advice is not None and advice.moves > 0 and state.show_advice == data_key:
        plan_key: tuple = (data_key, "advisor", advice.moves)
        result = whatif_advice.AdvisedLayout(advice.layout_LP, advice.moves)
    elif picks.move_budget > 0:
        plan_key = (data_key, "repair", picks.move_budget)
        with st.spinner("repairing the current layout ..."):
            result = cached(state.plans, plan_key, lambda: whatif_repair.repair(data.fit_WLE, layout.layout_LP, G,
                                                                                picks.move_budget))
    else:
        plan_key = (data_key, picks.redundant, plan_nodes, groups, picks.policy)
        with st.spinner("planning ..."):
            result = cached(state.plans, plan_key, lambda: plan(
                data.fit_WLE, G, picks.redundant, nodes=plan_nodes, groups=groups, policy=picks.policy))
    session = state.session(plan_key, result.layout_LP, G)
    copied = whatif_repair.moves_between(layout.layout_LP, result.layout_LP, G)
    if advice is not None and not isinstance(result, whatif_advice.AdvisedLayout) and copied > advice.moves:
        st.caption(f"The layout scored below is the planner's ({result.policy}: {copied:,} expert copies from the "
                   f"layout in force), not the advisor's: the advisor above weighs what moves gain against the time "
                   "serving waits for the copies, as `moe-monitor advise` does.")
    meta = current.watched.source.meta()
    sizes, sizes_note = whatif_traffic.run_sizes(meta)
    if sizes_note:
        st.info(f"Bytes and memory below use {sizes_note}.")
    before = whatif_score.score(layout.layout_LP, data.score_TLE, G)
    after = whatif_score.score(session.current, data.score_TLE, G)
    layer = controls.layer_picker(before)
    state.target = EditTarget(plan_key=plan_key, layer=layer, counts_LE=data.score_sum_LE, gpus=G, experts=E)
    _metrics(layout.layout_LP, session, before, after, data, sizes, sizes_note)
    _time(current, layout, session, data)
    st.caption(f"Policy {result.policy} · {session.num_edits} manual edit(s). GPU load = tokens of each expert "
               "split evenly over its replicas (the EPLB assumption).")
    if isinstance(result, whatif_repair.Repaired):
        _moves(layout, data, data_key, result, state)
    _bars_and_edits(session, before, after, data, layer, state)
    policies_section(layout.layout_LP, session.current, data.score_TLE, G, data_key, state.tails,
                     getattr(meta, "dispatch", "even") if meta is not None else "even")
    apply_section(current, layout, session, before, after, data, state)
    _traffic(layout, session, data, data_key, picks, sizes, state)
    _budget(data, data_key, G, picks, plan_nodes, groups, sizes, state)
    st.subheader("Placement staleness")
    staleness_section(current)


def _advisor(current: PageData, layout: ResolvedLayout, window: StepWindow, view: WindowView, data_key: tuple,
             state: WhatIfState) -> Advice | None:
    """The rebalance advisor's decision on the window in view (planner.advisor.advise_now: computed once per
    frozen window, cached), in one line, with the button that shows its layout in the editor."""
    meta = current.watched.source.meta()
    with st.spinner("rebalance advisor ..."):
        try:
            advice = cached(state.advice, data_key, lambda: whatif_advice.advice_on_window(
                window.counts_CLE[view.slots_T], layout.layout_LP, layout.gpus, meta, _time_model(current)),
                max_entries=4)
        except ValueError as exc:
            st.caption(f"Rebalance advisor: no decision on this window ({exc}).")
            return None
    left, right = st.columns([4, 1])
    line = whatif_advice.advice_line(advice)
    text = (f"**Rebalance advisor: {line}.** On the newest {min(view.num_steps, DEFAULT_WINDOW):,} steps of the "
            f"window, repair within {DEFAULT_MAX_MOVES} moves, as `moe-monitor advise` decides (straggler "
            "time saved if the window repeats, against the time serving waits for the copies).")
    (left.success if advice.rebalance else left.info)(text)
    controls.advice_buttons(right, data_key, state.show_advice == data_key, advice.moves)
    return advice


def _metrics(before_LP: np.ndarray, session: edits.EditSession, before: whatif_score.Score,
             after: whatif_score.Score, data: whatif_score.WhatIfData, sizes: tuple[int, int, int],
             sizes_note: str | None) -> None:
    G = session.gpus
    active = before.active_L
    # the what-if layout's R (a repair keeps the current R); an unused slot (-1) counts as one: a looser true bound
    redundant = session.current.shape[1] - data.num_experts
    bound = best_bound(data.score_sum_LE.astype(np.float64), G, redundant)
    moe_layers = max(1, int(active.sum()))
    bpe = bytes_per_expert(*sizes)
    mem = [lay.shape[1] // G * moe_layers * bpe for lay in (before_LP, session.current)]
    moves = whatif_repair.moves_between(before_LP, session.current, G)
    cols = st.columns(6)
    cols[0].metric("balancedness (score window)", format_number(after.balancedness),
                   delta=f"{after.balancedness - before.balancedness:+.3f} vs current {format_number(before.balancedness)}",
                   help="mean over layers with tokens of mean/max GPU load, loads summed over the score window "
                        f"(current layout: p50 over layers {format_number(before.sum_spread.p50)}, as the Overview's window sum)")
    cols[1].metric("per-step balancedness", format_number(after.step_balancedness),
                   delta=f"{after.step_balancedness - before.step_balancedness:+.3f}",
                   help="mean of each step's mean/max over the (step, layer) pairs with tokens, as the Overview "
                        "(idle pairs left out; current layout: 1 - this = the Overview's idle share; p50 over "
                        f"layers {format_number(before.step_spread.p50)})")
    cols[2].metric("best possible with R (lower bound)", format_number(before.mean_over_active_layers(1.0 / bound)),
                   help=f"mean over layers of 1 / (lower bound on imbalance) for R = {redundant}: the same "
                        "average as the balancedness beside it, so no layout can score above it")
    cols[3].metric("worst layer imbalance", format_number(after.worst_imbalance),
                   delta=f"{after.worst_imbalance - before.worst_imbalance:+.3f}", delta_color="inverse")
    cols[4].metric(MOVES_LABEL, f"{moves:,}",
                   help="one move = one expert's weights (of one layer) copied onto a GPU that did not hold that "
                        "expert in the current layout; replicas dropped cost nothing. The move budget and the "
                        f"moves-vs-imbalance curve count the same way. {format_bytes(bpe)} per move, "
                        f"{format_bytes(moves * bpe)} in all.")
    cols[5].metric("expert memory per GPU", format_bytes(mem[1]), delta=format_bytes(mem[1] - mem[0], sign=True),
                   delta_color="inverse", help=f"slots per GPU x {moe_layers} MoE layers x {bpe:,} bytes per "
                   "expert (3 x hidden x moe_intermediate x dtype bytes)"
                   + (f" — {sizes_note}" if sizes_note else ""))


def _time_model(current: PageData) -> TimeModel | None:
    """The run's cost model as this tick's snapshot found it (None: figures in tokens)."""
    snap = current.snapshot
    return None if snap is None or snap.time is None else snap.time.model


def _time(current: PageData, layout: ResolvedLayout, session: edits.EditSession,
          data: whatif_score.WhatIfData) -> None:
    """The what-if in time (core.costmodel), when the run's cost model is known; else why not, in one line."""
    model = _time_model(current)
    if model is None:
        note = current.snapshot.time_note if current.snapshot is not None else ""
        st.caption(f"In time: {note or 'no time model'} (the figures above are in tokens).")
        return
    meta = current.watched.source.meta()
    dispatch = getattr(meta, "dispatch", "even") if meta is not None else "even"
    before, after = whatif_score.in_time(layout.layout_LP, session.current, data.score_TLE, layout.gpus, model,
                                         dispatch)
    st.markdown(whatif_score.time_line(before, after, model.label()))


def _moves(layout: ResolvedLayout, data: whatif_score.WhatIfData, data_key: tuple, result: whatif_repair.Repaired,
           state: WhatIfState) -> None:
    """The moves-vs-imbalance curve of the repair (computed once per window up to a horizon, cached)."""
    horizon = whatif_repair.curve_horizon(data.num_layers, result.budget)
    with st.spinner("moves-vs-imbalance curve ..."):
        curve = cached(state.plans, (data_key, "repair", horizon),
                       lambda: whatif_repair.repair(data.fit_WLE, layout.layout_LP, layout.gpus, horizon))
    st.plotly_chart(whatif_figures.moves_curve(curve.curve, result.curve[-1]), key="whatif_moves_fig")
    st.caption(f"Move budget {result.budget}: {result.moves_used} moves used, imbalance "
               f"{result.curve[0]['mean_imbalance']:.3f} -> {result.curve[-1]['mean_imbalance']:.3f} (fit window, "
               f"mean over layers with tokens). The repair keeps the current {layout.layout_LP.shape[1]} slots per "
               "layer: R, groups and policy do not apply; set the budget to 0 for a full re-plan.")


def _bars_and_edits(session: edits.EditSession, before: whatif_score.Score, after: whatif_score.Score,
                    data: whatif_score.WhatIfData, layer: int, state: WhatIfState) -> None:
    G, E = session.gpus, data.num_experts
    gpu = controls.picked_gpu(G, E)
    fig = whatif_figures.before_after_bars(before.mean_load_LG[layer], after.mean_load_LG[layer], gpu,
                                           f"Layer {layer}: mean GPU load per step, current vs what-if", UNIT)
    controls.gpu_bars(fig)
    message = state.pop_message()
    if message:
        (st.success if message[0] == "ok" else st.error)(message[1])
    lightest = int(np.argmin(after.mean_load_LG[layer]))
    gpu, expert = controls.edit_controls(G, E, lightest, session.num_edits)
    if gpu is None:
        st.info("Click a GPU bar (or type a GPU above) to list its experts.")
    else:
        rows = edits.gpu_experts(session.current, data.score_sum_LE / data.score_TLE.shape[0], layer, gpu, G)
        st.subheader(f"Experts on GPU {gpu} (layer {layer}, what-if layout)")
        left, right = st.columns([3, 2])
        controls.expert_bars(left, whatif_figures.gpu_expert_bars(rows, gpu, expert, UNIT))
        right.dataframe(pd.DataFrame(rows).rename(columns={"tokens": "tokens/step", "load": f"load here ({UNIT})"}),
                        hide_index=True)
    if session.log:
        st.caption("Edits: " + " · ".join(session.log))
    st.download_button("Download layout (SGLang JSON)", edits.layout_json(session.current),
                       file_name="expert_layout.json", mime="application/json", key="whatif_download",
                       help="{\"physical_to_logical_map\": [[E + R ints] x L]} for sglang --init-expert-location "
                            "(-1: an unused slot, as vLLM writes it)")


def _traffic(layout: ResolvedLayout, session: edits.EditSession, data: whatif_score.WhatIfData, data_key: tuple,
             picks: Inputs, sizes: tuple[int, int, int], state: WhatIfState) -> None:
    st.subheader("Traffic under the layout (from sampled routing rows)")
    if data.samples is None:
        st.info("No sampled routing rows in the score window: the collector samples one step in "
                "sample_every (4 by default), or none with sample_tokens=0. Widen the score window.")
        return
    if layout.gpus % picks.nodes:
        st.warning(f"{layout.gpus} GPUs do not split over {picks.nodes} nodes.")
        return
    samples = data.samples
    hidden, _, dtype_bytes = sizes
    cap = picks.node_cap or None
    tokens = float(data.score_tokens_T.mean())
    source_gpu_N, source_note = whatif_traffic.source_gpus(samples.rank_N, samples.world_size, layout.gpus)

    def summary(lay: np.ndarray) -> dict:
        return cached(state.traffic, (data_key, hash(lay.tobytes()), lay.shape, picks.nodes, cap, sizes),
                      lambda: whatif_traffic.traffic_summary(samples.ids_LNK, lay, data.num_experts, layout.gpus,
                                                             picks.nodes, hidden, dtype_bytes, tokens, cap,
                                                             source_gpu_N))

    summaries = [summary(layout.layout_LP), summary(session.current)]
    st.dataframe(pd.DataFrame(whatif_traffic.traffic_table(*summaries)), hide_index=True)
    st.caption(f"{summaries[0]['sampled_tokens']} sampled tokens per layer, {summaries[0]['layers']} layers; "
               f"bytes scaled to {tokens:,.0f} tokens/step; {picks.nodes} node(s) of "
               f"{layout.gpus // picks.nodes} GPUs; {source_note}.")


FLAT_IMBALANCE = 0.005  # a replica-budget curve whose imbalance spans less than this is said, not drawn


def _budget(data: whatif_score.WhatIfData, data_key: tuple, G: int, picks: Inputs, nodes: int | None,
            groups: int | None, sizes: tuple[int, int, int], state: WhatIfState) -> None:
    """Budget curve on the fit window's sum. The robust policy (several plans, seconds each at DeepSeek
    size) is replaced by 'refined', its single-window core, so the curve costs well under a second."""
    st.subheader("Replica budget")
    hidden, inter, dtype_bytes = sizes
    policy = "refined" if picks.policy in ("auto", "robust") and not groups else picks.policy
    key = (data_key, nodes, groups, policy, sizes)
    with st.spinner("budget curve ..."):
        curve = cached(state.budget, key, lambda: replica_budget_curve(
            data.fit_WLE.sum(0), G, 2 * G, hidden, inter, dtype_bytes, policy, nodes, groups))
    knee = curve["rows"][curve["knee"]]
    imbalance = [row["mean_imbalance"] for row in curve["rows"]]
    if max(imbalance) - min(imbalance) < FLAT_IMBALANCE:
        st.caption(f"Flat: every R from {curve['rows'][0]['redundant']} to {curve['rows'][-1]['redundant']} plans "
                   f"to a mean imbalance of {min(imbalance):.3f}-{max(imbalance):.3f} on the fit window; redundant "
                   "experts buy nothing here (no curve drawn).")
        return
    st.plotly_chart(whatif_figures.budget_curve(curve["rows"], curve["knee"], picks.redundant), key="whatif_budget_fig")
    st.caption(f"Planned on the fit window (summed) with policy {policy}. Knee at R = {knee['redundant']}: imbalance "
               f"{knee['mean_imbalance']:.3f} for {format_bytes(knee['extra_bytes_per_gpu'], sign=True)} per GPU "
               f"({curve['bytes_per_expert']:,} bytes per expert, {curve['moe_layers']} MoE layers).")
