"""What-if: plan a layout on a fit window (or repair the current one within a move budget), score it against
the current layout on the score window, edit it by clicking (a GPU bar lists its experts; an expert gets a
replica or moves), undo, export it as SGLang JSON, apply it to the running engine (views/whatif/apply.py: off
unless the server enables it), and see the replica-budget curve and the traffic model. No auto-refresh (but for
the answer to an Apply): the inputs are frozen until "Re-read the window", and plans are cached per input, so
clicks never re-plan. The current layout's figures come first; the advisor's decision and the plan (or repair) are
computed on dashboard.live.plan_worker's thread while this run waits, interruptibly, and their parts fill in when
ready. The page's state (page_state()) and the widgets it reads belong to controls.py; this module lays it out.

Shape legend (README, Conventions): T steps, W windows, L layers, E logical experts, P slots, G GPUs."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from moe_monitor.core.costmodel import TimeModel
from moe_monitor.dashboard.figures import whatif as whatif_figures
from moe_monitor.dashboard.figures.units import format_bytes, format_number
from moe_monitor.dashboard.live import plan_worker
from moe_monitor.dashboard.live.layout import ResolvedLayout
from moe_monitor.dashboard.live.window import StepWindow, WindowView
from moe_monitor.dashboard.views.common import PageData, caption, opening_tick, poll_and_analyse, whole_app_next_tick
from moe_monitor.dashboard.views.draw import draw
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
from moe_monitor.dashboard.whatif.cache import Refused, cached
from moe_monitor.planner.advisor import DEFAULT_MAX_MOVES, DEFAULT_WINDOW, Advice
from moe_monitor.planner.api import PlanResult, plan
from moe_monitor.planner.bounds import best_bound
from moe_monitor.planner.budget import bytes_per_expert, replica_budget_curve

UNIT = "tokens/step"
PICKS_PX, LAYER_PX = 172, 68  # the planning inputs' and the layer picker's heights at 1600 px wide (held on opening)
MOVES_LABEL = "moves (expert copies onto GPUs)"  # what planner.repair.experts_copied counts


def page() -> None:
    st.title("What-if: plan, edit and export a layout")
    current = poll_and_analyse(full_resolution=True)  # plans and scores single steps
    if current is None:
        return
    caption(current)
    try:
        render(current, opening=opening_tick("whatif"))
    except ValueError as exc:
        st.error(f"Cannot plan with these inputs: {exc}")
    except plan_worker.Failed as exc:
        st.error(f"Planning failed ({exc}); the page asks for it again on its next run.")


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


def render(current: PageData, opening: bool = False) -> None:
    """opening (the page's first run since it opened: views.common.opening_tick): the current layout's figures
    on the default picks, the widgets' places held empty; the widgets, the plan and the rest on the next run."""
    layout, snapshot, window = current.layout, current.snapshot, current.watched.window
    if layout is None or snapshot is None or window is None:  # poll_and_analyse() gives all three when there are steps
        return
    view, state = snapshot.view, controls.page_state()
    E, G = window.num_experts, layout.gpus
    shape = (E, G, layout.layout_LP.shape[1], layout.nodes, view.num_steps)
    picks_box = st.container()
    if opening:
        picks = controls.default_inputs(*shape)
    else:
        with picks_box:
            picks = controls.planning_inputs(*shape)
    data_key, data = _frozen_windows(current, layout, window, view, picks, state)
    newer = int(view.step_T[-1]) - data.as_of_step
    left, right = st.columns([4, 1])
    left.caption(f"Fit on {data.fit_steps} steps ({data.fit_span_s:.0f} s, {data.fit_WLE.shape[0]} windows), "
                 f"scored on the newest {data.score_TLE.shape[0]} steps up to step {data.as_of_step}"
                 + ((" — **fit and score windows overlap** (" + ("too few steps to hold out)" if picks.hold_out
                                                                   else "hold-out is off)")) if data.overlap else "")
                 + (f" · {newer} newer steps arrived since" if newer > 0 else ""))
    controls.refresh_button(right)
    advisor_box = st.empty()
    meta = current.watched.source.meta()
    sizes, sizes_note = whatif_traffic.run_sizes(meta)
    if sizes_note:
        st.info(f"Bytes and memory below use {sizes_note}.")
    before = whatif_score.score(layout.layout_LP, data.score_TLE, G)
    layer_box = st.container()
    if opening:
        layer = controls.worst_layer(before)
    else:
        with layer_box:
            layer = controls.layer_picker(before)
    metrics_box, notes_box, bars_box, plan_box = st.empty(), st.container(), st.empty(), st.container()
    jobs = _Jobs(current, layout, window, view, data, data_key, picks, state)
    if opening or jobs.look(ask=False).waiting:  # what needs no plan first (the current layout's figures)
        draw(whatif_figures.before_after_bars(
            before.mean_load_LG[layer], None, None, f"Layer {layer}: mean GPU load per step, current layout "
            "(the what-if layout's beside it once planned)", UNIT), "whatif_bars_current", bars_box)
        _metrics(metrics_box, layout.layout_LP, None, before, None, data, sizes, sizes_note, jobs.redundant)
    # then ask for what needs the plan; the opening only looks (planning beside it would slow its first chart)
    looked = jobs.look(ask=not opening)
    if opening:  # the widgets hold their places (their picks are the defaults); they, the plan and the rest next run
        picks_box.container(height=PICKS_PX, border=False).caption(f"Planning inputs: {_picks_line(picks)}")
        layer_box.container(height=LAYER_PX, border=False)
        if looked.waiting:
            notes_box.caption(_waiting_line(looked))
        if looked.advice is not None or looked.advice_error:  # decided before (cached), or refused: said now
            _advisor_line(advisor_box, looked, data_key, state, view.num_steps)
        with notes_box:
            whole_app_next_tick()
        return
    _budget(data, data_key, G, picks, jobs.plan_nodes, jobs.groups, sizes, state)
    st.subheader("Placement staleness")
    staleness_section(current)
    settled, advisor_drawn = _settle(jobs, looked, advisor_box, notes_box)
    if settled is None or settled.result is None:  # still planning: _poll_plan reruns the page once it is done
        return
    if not advisor_drawn:
        _advisor_line(advisor_box, settled, data_key, state, view.num_steps)
    looked, result = settled, settled.result
    plan_key = jobs.plan_key(result)
    session = state.session(plan_key, result.layout_LP, G)
    after = whatif_score.score(session.current, data.score_TLE, G)
    state.target = EditTarget(plan_key=plan_key, layer=layer, counts_LE=data.score_sum_LE, gpus=G, experts=E)
    _metrics(metrics_box, layout.layout_LP, session, before, after, data, sizes, sizes_note, jobs.redundant)
    with notes_box:
        copied = whatif_repair.moves_between(layout.layout_LP, result.layout_LP, G)
        advice = looked.advice
        if advice is not None and not isinstance(result, whatif_advice.AdvisedLayout) and copied > advice.moves:
            st.caption(f"The layout scored below is the planner's ({result.policy}: {copied:,} expert copies from "
                       f"the layout in force), not the advisor's: the advisor above weighs what moves gain against "
                       "the time serving waits for the copies, as `moe-monitor advise` does.")
        _time(current, layout, session, data)
        st.caption(f"Policy {result.policy} · {session.num_edits} manual edit(s). GPU load = tokens of each expert "
                   "split evenly over its replicas (the EPLB assumption).")
        if isinstance(result, whatif_repair.Repaired) and looked.curve is not None:
            _moves(layout, looked.curve, result)
    with plan_box:
        _bars_and_edits(bars_box, session, before, after, data, layer, state)
        policies_section(layout.layout_LP, session.current, data.score_TLE, G, data_key, state.tails,
                         getattr(meta, "dispatch", "even") if meta is not None else "even")
        apply_section(current, layout, session, before, after, data, state)
        _traffic(layout, session, data, data_key, picks, sizes, state)


# ------------------------------------------------------------------------------ the plan, off the page's thread
POLL_S = 0.25      # how often the page looks at the planner's progress while it waits
MAX_WAIT_S = 30.0  # then this run ends and _poll_plan looks every FRAGMENT_POLL_S, rerunning the page once ready
FRAGMENT_POLL_S = 1.0

Result = whatif_repair.Repaired | PlanResult | whatif_advice.AdvisedLayout


@dataclass(frozen=True)
class Looked:
    """What the page has so far: the advisor's decision (None: none on this window, or not yet), its refusal, the
    layout to score (None: not yet), the repair's moves curve, and the computations it still waits for."""

    advice: Advice | None
    advice_error: str
    advice_done: bool
    result: Result | None
    curve: whatif_repair.Repaired | None
    waiting: tuple[tuple[tuple, plan_worker.Answer], ...]


def _digest(array: np.ndarray) -> str:
    """An identity of an array's values: shape, dtype and a hash of its bytes."""
    a = np.ascontiguousarray(array)
    return f"{a.shape}{a.dtype}" + hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()


class _Jobs:
    """The advisor's decision and the layout to score on the frozen windows: from the page's caches when computed
    before, else asked of dashboard.live.plan_worker (keyed on what each depends on, so any session asking the
    same gets the same computation; this session's owner names, so a key it left is dropped)."""

    def __init__(self, current: PageData, layout: ResolvedLayout, window: StepWindow, view: WindowView,
                 data: whatif_score.WhatIfData, data_key: tuple, picks: Inputs, state: WhatIfState):
        self.current, self.layout, self.window, self.view = current, layout, window, view
        self.data, self.data_key, self.picks, self.state = data, data_key, picks, state
        self.groups = picks.groups or None
        self.plan_nodes = picks.nodes if self.groups else None
        self.repairing = picks.move_budget > 0
        slots = layout.layout_LP.shape[1]
        # the what-if layout's R: a repair and the advisor keep the current slots
        self.redundant = slots - data.num_experts if self.repairing or state.show_advice == data_key else \
            picks.redundant
        fit, lay = _digest(data.fit_WLE), _digest(layout.layout_LP)
        meta, model = current.watched.source.meta(), _time_model(current)
        self.meta, self.model = meta, model  # what the advisor prices with, read here: prepare only copies
        prices = (model.label(), model.gpus, model.nodes) if model is not None else whatif_traffic.run_sizes(meta)[0]
        # the advisor reads the window in view up to the frozen newest step: a run's steps never change, and a
        # recording's range (moving_span) says where it starts
        self.advice_key = ("advice", current.settings.monitor_key(), current.phase, data.as_of_step,
                           *moving_span(current), lay, layout.gpus, prices)
        self.plan_worker_key = ("plan", fit, layout.gpus, picks.redundant, self.plan_nodes, self.groups, picks.policy)
        self.horizon = whatif_repair.curve_horizon(data.num_layers, picks.move_budget)
        self.repair_worker_key = ("repair", fit, lay, layout.gpus, picks.move_budget)
        self.curve_worker_key = ("repair", fit, lay, layout.gpus, self.horizon)
        self.failed: dict[tuple, plan_worker.Failure] = {}  # failed on this run: asked again on the next only
        self.owners: dict[tuple, tuple] = {}  # worker key -> the owner name this session asks it as

    def owner(self, what: str) -> tuple[str, str]:
        return self.state.owner, what

    def plan_key(self, result: Result | None = None) -> tuple:
        """The page's key of the layout scored: its edit session's name and its place in the page's cache."""
        if isinstance(result, whatif_advice.AdvisedLayout):
            return self.data_key, "advisor", result.moves
        if self.repairing:
            return self.data_key, "repair", self.picks.move_budget
        return self.data_key, self.picks.redundant, self.plan_nodes, self.groups, self.picks.policy

    def _from(self, store: dict, key: tuple, worker_key: tuple, owner: tuple, prepare, max_entries: int = 8,
              ask: bool = True):
        """(value, None) from store[key], kept there once the worker answered (a refusal too, raised here afresh
        as cached() does), or (None, the worker's answer) while it computes (ask False: look without asking). A
        failure (not a refusal) raises plan_worker.Failed afresh; the key is let go, and asked again next run."""
        if worker_key in self.failed:
            raise self.failed[worker_key].exception()
        self.owners[worker_key] = owner
        if key not in store:
            answer = plan_worker.ask(worker_key, prepare, owner) if ask else \
                plan_worker.peek(worker_key, owner) or plan_worker.Answer(False, time.monotonic())
            if not answer.done:
                return None, answer
            failure = answer.error
            if failure is not None and not failure.refused:
                plan_worker.release(owner)
                self.failed[worker_key] = failure
                raise failure.exception()
            cached(store, key, lambda: Refused(failure.message) if failure else answer.value, max_entries=max_entries)
        plan_worker.release(owner)  # the page's cache holds it now
        value = store[key]
        if isinstance(value, Refused):
            raise ValueError(value.message)
        return value, None

    def look(self, ask: bool = True) -> Looked:
        """What the page has so far; ask False: only look (the caches and the worker), starting nothing."""
        waiting: list[tuple[tuple, plan_worker.Answer]] = []
        advice, advice_error, advice_done = None, "", True
        try:
            advice, answer = self._from(self.state.advice, self.data_key, self.advice_key, self.owner("advice"),
                                        self._prepare_advice, max_entries=4, ask=ask)
            if answer is not None:
                waiting.append((self.advice_key, answer))
                advice_done = False
        except ValueError as exc:
            advice_error = str(exc)
        except plan_worker.Failed as exc:
            advice_error = f"it failed: {exc}; asked again on the page's next run"
        result: Result | None = None
        curve = None
        if self.state.show_advice == self.data_key and (not advice_done or advice is not None and advice.moves > 0):
            if advice is not None:
                result = whatif_advice.AdvisedLayout(advice.layout_LP, advice.moves)
            return Looked(advice, advice_error, advice_done, result, None, tuple(waiting))
        fit, lay, G = self.data.fit_WLE, self.layout.layout_LP, self.layout.gpus
        if self.repairing:
            budget, horizon = self.picks.move_budget, self.horizon
            result, answer = self._from(self.state.plans, (self.data_key, "repair", budget), self.repair_worker_key,
                                        self.owner("plan"), lambda: lambda: whatif_repair.repair(fit, lay, G, budget),
                                        ask=ask)
            curve, curve_answer = self._from(self.state.plans, (self.data_key, "repair", horizon),
                                             self.curve_worker_key, self.owner("curve"),
                                             lambda: lambda: whatif_repair.repair(fit, lay, G, horizon), ask=ask)
            waiting += [(k, a) for k, a in ((self.repair_worker_key, answer), (self.curve_worker_key, curve_answer))
                        if a is not None]
        else:
            picks, nodes, groups = self.picks, self.plan_nodes, self.groups
            result, answer = self._from(self.state.plans, self.plan_key(),
                                        self.plan_worker_key, self.owner("plan"),
                                        lambda: lambda: plan(fit, G, picks.redundant, nodes=nodes, groups=groups,
                                                             policy=picks.policy), ask=ask)
            if ask:
                plan_worker.release(self.owner("curve"))
            if answer is not None:
                waiting.append((self.plan_worker_key, answer))
        return Looked(advice, advice_error, advice_done, result, curve, tuple(waiting))

    def _prepare_advice(self):
        """The advisor's inputs, copied when first asked: the window's steps up to the frozen windows' newest (the
        newest DEFAULT_WINDOW of them), the layout in force, the run's metadata and cost model."""
        view, data = self.view, self.data
        slots = view.slots_T[view.step_T <= data.as_of_step][-DEFAULT_WINDOW:]
        counts_TLE = self.window.counts_CLE[slots]
        layout_LP, gpus, meta, model = self.layout.layout_LP.copy(), self.layout.gpus, self.meta, self.model
        return lambda: whatif_advice.advice_on_window(counts_TLE, layout_LP, gpus, meta, model)


def _settle(jobs: _Jobs, looked: Looked, advisor_box: DeltaGenerator, notes_box: DeltaGenerator
            ) -> tuple[Looked | None, bool]:
    """(what the page has once nothing is waited for, whether the advisor's line is drawn): waits on this run while
    plan_worker's thread computes; a line says how long and on what, and every look draws, so a click stops this
    run at once. The advisor's line is drawn as soon as it is decided. After MAX_WAIT_S the run ends (None) and
    _poll_plan reruns the page when the answers are in."""
    line = notes_box.empty()
    advisor_drawn = False
    deadline = time.monotonic() + MAX_WAIT_S
    while looked.waiting:
        if looked.advice_done and not advisor_drawn:
            _advisor_line(advisor_box, looked, jobs.data_key, jobs.state, jobs.view.num_steps)
            advisor_drawn = True
        elif not looked.advice_done:
            advisor_box.caption("Rebalance advisor: deciding … (" + _since(looked.waiting[0][1]) + ")")
        line.caption(_waiting_line(looked))
        if time.monotonic() >= deadline:
            with notes_box:
                _poll_plan(tuple((key, jobs.owners[key]) for key, _ in looked.waiting))
            return None, advisor_drawn
        time.sleep(POLL_S)
        looked = jobs.look()
    line.empty()
    return looked, advisor_drawn


def _since(answer: plan_worker.Answer) -> str:
    waited = f"{time.monotonic() - answer.asked_s:.1f} s"
    if answer.busy:
        return f"{waited}; the planner is busy ({answer.ahead} computations queued), this one waits for room"
    return waited + (f", {answer.ahead} computation(s) ahead of it" if answer.ahead else "")


def _waiting_line(looked: Looked) -> str:
    what = {"advice": "the rebalance advisor", "plan": "planning", "repair": "repairing the current layout"}
    keys = [key for key, _ in looked.waiting]
    names = [what[key[0]] for key in keys]
    if "repair" in names:
        names = [what["repair"] + (" and its moves curve" if names.count("repair") > 1 else "")]
    oldest = min((answer for _, answer in looked.waiting), key=lambda a: a.asked_s)
    busy = [answer for _, answer in looked.waiting if answer.busy]
    if busy:  # not queued yet: say so, whichever waited longest
        oldest = replace(oldest, busy=True, ahead=busy[0].ahead)
    return f"{' · '.join(dict.fromkeys(names))} … {_since(oldest)} (the current layout's figures are shown meanwhile)"


def _picks_line(picks: Inputs) -> str:
    return (f"R = {picks.redundant} redundant slots · {picks.nodes} node(s) · policy {picks.policy} · fit on "
            f"{picks.fit:g} {picks.unit} · scored on the newest {picks.score_steps} steps")


@st.fragment(run_every=FRAGMENT_POLL_S)
def _poll_plan(asked: tuple) -> None:
    """After MAX_WAIT_S: a line with the time waited, every FRAGMENT_POLL_S, until every (key, owner) asked is
    answered (or not kept: busy, the page asks again), then the page again. Each look keeps the owner's hold."""
    answers = [plan_worker.peek(key, owner) for key, owner in asked]
    waited = [a for a in answers if a is not None and not a.done]
    if len(waited) < len(answers):
        st.rerun(scope="app")
    st.caption("still computing … " + _since(min(waited, key=lambda a: a.asked_s)) + "; the page shows the plan "
               "when it is ready")


def _advisor_line(box: DeltaGenerator, looked: Looked, data_key: tuple, state: WhatIfState, steps: int) -> None:
    """The rebalance advisor's decision on the window in view (planner.advisor.advise_now: computed once per frozen
    window), in one line, with the button that shows its layout in the editor."""
    with box.container():
        if looked.advice is None:
            st.caption(f"Rebalance advisor: no decision on this window ({looked.advice_error}).")
            return
        left, right = st.columns([4, 1])
        line = whatif_advice.advice_line(looked.advice)
        text = (f"**Rebalance advisor: {line}.** On the newest {min(steps, DEFAULT_WINDOW):,} steps of the "
                f"window, repair within {DEFAULT_MAX_MOVES} moves, as `moe-monitor advise` decides (straggler "
                "time saved if the window repeats, against the time serving waits for the copies).")
        (left.success if looked.advice.rebalance else left.info)(text)
        controls.advice_buttons(right, data_key, state.show_advice == data_key, looked.advice.moves)


def _metrics(box: DeltaGenerator, before_LP: np.ndarray, session: edits.EditSession | None,
             before: whatif_score.Score, after: whatif_score.Score | None, data: whatif_score.WhatIfData,
             sizes: tuple[int, int, int], sizes_note: str | None, pending_redundant: int) -> None:
    """The metrics row of the what-if layout against the current one; before the plan (session None) the current
    layout's figures, the what-if's R (pending_redundant) for the bound."""
    G = before.mean_load_LG.shape[1]
    active = before.active_L
    # the what-if layout's R (a repair keeps the current R); an unused slot (-1) counts as one: a looser true bound
    redundant = session.current.shape[1] - data.num_experts if session is not None else pending_redundant
    bound = best_bound(data.score_sum_LE.astype(np.float64), G, redundant)
    moe_layers = max(1, int(active.sum()))
    bpe = bytes_per_expert(*sizes)
    mem = [lay.shape[1] // G * moe_layers * bpe for lay in (before_LP, session.current if session else before_LP)]
    cols = box.container().columns(6)
    bound_value = format_number(before.mean_over_active_layers(1.0 / bound))
    bound_help = (f"mean over layers of 1 / (lower bound on imbalance) for R = {redundant}: the same average as the "
                  "balancedness beside it, so no layout can score above it")
    memory_help = (f"slots per GPU x {moe_layers} MoE layers x {bpe:,} bytes per expert (3 x hidden x "
                   "moe_intermediate x dtype bytes)" + (f" — {sizes_note}" if sizes_note else ""))
    if session is None or after is None:
        current = "current layout (the what-if layout's once planned)"
        cols[0].metric("balancedness (score window), current", format_number(before.balancedness),
                       help=f"{current}: mean over layers with tokens of mean/max GPU load, loads summed over the "
                            f"score window (p50 over layers {format_number(before.sum_spread.p50)})")
        cols[1].metric("per-step balancedness, current", format_number(before.step_balancedness),
                       help=f"{current}: mean of each step's mean/max over the (step, layer) pairs with tokens = 1 - "
                            "the Overview's idle share")
        cols[2].metric("best possible with R (lower bound)", bound_value, help=bound_help)
        cols[3].metric("worst layer imbalance, current", format_number(before.worst_imbalance), help=current)
        cols[4].metric(MOVES_LABEL, "…", help="once planned")
        cols[5].metric("expert memory per GPU, current", format_bytes(mem[0]), help=memory_help)
        return
    moves = whatif_repair.moves_between(before_LP, session.current, G)
    cols[0].metric("balancedness (score window)", format_number(after.balancedness),
                   delta=f"{after.balancedness - before.balancedness:+.3f} vs current {format_number(before.balancedness)}",
                   help="mean over layers with tokens of mean/max GPU load, loads summed over the score window "
                        f"(current layout: p50 over layers {format_number(before.sum_spread.p50)}, as the Overview's window sum)")
    cols[1].metric("per-step balancedness", format_number(after.step_balancedness),
                   delta=f"{after.step_balancedness - before.step_balancedness:+.3f}",
                   help="mean of each step's mean/max over the (step, layer) pairs with tokens, as the Overview "
                        "(idle pairs left out; current layout: 1 - this = the Overview's idle share; p50 over "
                        f"layers {format_number(before.step_spread.p50)})")
    cols[2].metric("best possible with R (lower bound)", bound_value, help=bound_help)
    cols[3].metric("worst layer imbalance", format_number(after.worst_imbalance),
                   delta=f"{after.worst_imbalance - before.worst_imbalance:+.3f}", delta_color="inverse")
    cols[4].metric(MOVES_LABEL, f"{moves:,}",
                   help="one move = one expert's weights (of one layer) copied onto a GPU that did not hold that "
                        "expert in the current layout; replicas dropped cost nothing. The move budget and the "
                        f"moves-vs-imbalance curve count the same way. {format_bytes(bpe)} per move, "
                        f"{format_bytes(moves * bpe)} in all.")
    cols[5].metric("expert memory per GPU", format_bytes(mem[1]), delta=format_bytes(mem[1] - mem[0], sign=True),
                   delta_color="inverse", help=memory_help)


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


def _moves(layout: ResolvedLayout, curve: whatif_repair.Repaired, result: whatif_repair.Repaired) -> None:
    """The moves-vs-imbalance curve of the repair (computed once per window up to a horizon)."""
    draw(whatif_figures.moves_curve(curve.curve, result.curve[-1]), "whatif_moves_fig")
    st.caption(f"Move budget {result.budget}: {result.moves_used} moves used, imbalance "
               f"{result.curve[0]['mean_imbalance']:.3f} -> {result.curve[-1]['mean_imbalance']:.3f} (fit window, "
               f"mean over layers with tokens). The repair keeps the current {layout.layout_LP.shape[1]} slots per "
               "layer: R, groups and policy do not apply; set the budget to 0 for a full re-plan.")


def _bars_and_edits(bars_box: DeltaGenerator, session: edits.EditSession, before: whatif_score.Score,
                    after: whatif_score.Score, data: whatif_score.WhatIfData, layer: int, state: WhatIfState) -> None:
    """The before/after bars (into bars_box: where the current layout's stood while planning), then the edit
    controls, the picked GPU's experts and the download."""
    G, E = session.gpus, data.num_experts
    gpu = controls.picked_gpu(G, E)
    controls.gpu_bars(bars_box, whatif_figures.before_after_bars(
        before.mean_load_LG[layer], after.mean_load_LG[layer], gpu,
        f"Layer {layer}: mean GPU load per step, current vs what-if", UNIT))
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
    draw(whatif_figures.budget_curve(curve["rows"], curve["knee"], picks.redundant), "whatif_budget_fig")
    st.caption(f"Planned on the fit window (summed) with policy {policy}. Knee at R = {knee['redundant']}: imbalance "
               f"{knee['mean_imbalance']:.3f} for {format_bytes(knee['extra_bytes_per_gpu'], sign=True)} per GPU "
               f"({curve['bytes_per_expert']:,} bytes per expert, {curve['moe_layers']} MoE layers).")
