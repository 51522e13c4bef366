"""The What-if page's Streamlit controls and callbacks, and the page's state between reruns.

WhatIfState is the page's one state object: it lives under one session-state key (STATE_KEY) and page.py reads
it through page_state() only. It holds the frozen windows, the caches, the edit sessions, what the edit callbacks
act on (EditTarget, set by the page on every run) and the message a callback leaves for the next run.

Every widget whose value the page or a callback reads is drawn here, under its own key (whatif_<name>, the
keys the tests drive): the planning inputs, the layer picker, the clickable Vega-Lite bars (a GPU bar, an expert
bar: a point selection each, read by the on_select callbacks), the GPU / expert / target pickers and the edit
buttons; page.py draws only display elements (and the download). Callbacks run before the rerun, so an edit shows
at once. The pure logic they call lives in dashboard.whatif.edits.
"""
from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from moe_monitor import core
from moe_monitor.dashboard.figures.common import Chart
from moe_monitor.dashboard.whatif import edits
from moe_monitor.dashboard.whatif.score import Score, WhatIfData
from moe_monitor.planner.api import POLICIES
from moe_monitor.planner.budget import feasible_redundant

STATE_KEY = "whatif_state"  # the session-state key of the page's WhatIfState
# widget keys the callbacks read (the other widgets' keys appear once, where they are drawn)
_MOVES, _GPU, _EXPERT, _TARGET = "whatif_moves", "whatif_gpu", "whatif_expert", "whatif_target"
_GPU_BARS, _EXPERT_BARS = "whatif_bars", "whatif_expert_bars"


@dataclass(frozen=True)
class EditTarget:
    """What the edit callbacks act on, set by the page on every run: the plan (its key names the edit session),
    the layer shown, the score window's counts [L, E] (pick the slot an edit replaces), GPUs and experts."""

    plan_key: tuple
    layer: int
    counts_LE: np.ndarray
    gpus: int
    experts: int


@dataclass(frozen=True)
class ApplyTarget:
    """What the apply callbacks send, set by the page on every run of a live Redis run Apply is on for: the
    source's redis client, the Redis URL (the server's own: apply_gate) and run, the What-if layout [L, P], its
    layout key (LayoutChange's: a hash of its int64 bytes, to find the change it becomes), its confirmation key
    (confirm_key: Redis, run, shape and bytes, so a confirmation never carries over to another run or Redis), the
    expert copies it costs, and the What-if's predicted per-step balancedness of it and of the current layout on
    the score window."""

    client: Any
    redis_url: str
    run: str
    layout_LP: np.ndarray
    key: int
    confirm: tuple
    moves: int
    predicted_eta: float
    current_eta: float


def confirm_key(redis_url: str, run: str, layout_LP: np.ndarray) -> tuple:
    """(Redis URL, run, shape, SHA-256 of the int64 bytes): what a confirmation of Apply is for."""
    layout = np.ascontiguousarray(layout_LP, dtype=np.int64)
    return redis_url, run, layout.shape, hashlib.sha256(layout.tobytes()).hexdigest()


@dataclass(frozen=True)
class Requested:
    """A layout requested from this page: the Redis and run it went to, the step it was asked at, its layout key,
    what the What-if predicted for it, and what the runtime's status names it by (request id, nonce) with its
    expiry (unix s)."""

    step: int
    key: int
    predicted_eta: float
    current_eta: float
    redis_url: str = ""
    run: str = ""
    request_id: str = ""
    nonce: str = ""
    expires_s: float = 0.0


MAX_REQUESTS = 32  # requests remembered per browser session


@dataclass
class WhatIfState:
    """The What-if page's state between reruns (one per browser session).

    refresh: "Re-read the window" clicks (part of the frozen windows' key); windows: (key, the frozen fit and
    score windows); plans / traffic / budget: dashboard.whatif.cache stores of plans and repairs, traffic
    summaries and replica-budget curves; sessions: the edit session of each plan key; target: what the edit
    callbacks act on; message: ("ok" | "error", text) a callback leaves for the next run to show once; owner: this
    session's name in dashboard.live.plan_worker (what it asks for is computed there, off the page's thread)."""

    refresh: int = 0
    windows: tuple[tuple, WhatIfData] | None = None
    plans: dict[tuple, Any] = field(default_factory=dict)
    traffic: dict[tuple, Any] = field(default_factory=dict)
    budget: dict[tuple, Any] = field(default_factory=dict)
    sessions: dict[tuple, edits.EditSession] = field(default_factory=dict)
    target: EditTarget | None = None
    message: tuple[str, str] | None = None
    advice: dict[tuple, Any] = field(default_factory=dict)
    show_advice: tuple | None = None  # the frozen windows' key whose advised layout the editor shows
    apply_target: ApplyTarget | None = None  # what "Apply to the running engine" sends (set by the page each run)
    apply_confirm: tuple | None = None  # confirm_key of the layout awaiting the user's confirmation
    requests: list[Requested] = field(default_factory=list)  # layouts requested from this page, oldest first
    apply_note: tuple[str, str] | None = None  # ("ok" | "error", text) of the last request, kept until replaced
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)  # nonce -> final ("ok" | "error", text)
    tails: dict[tuple, Any] = field(default_factory=dict)  # (window, layout, policy) -> core.steptails.StepTails
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)

    def session(self, plan_key: tuple, planned_LP: np.ndarray, gpus: int) -> edits.EditSession:
        """The edit session of a plan, started on its planned layout the first time."""
        if plan_key not in self.sessions:
            self.sessions[plan_key] = edits.new_session(plan_key, planned_LP, gpus)
        return self.sessions[plan_key]

    def pop_message(self) -> tuple[str, str] | None:
        """The message a callback left, once."""
        message, self.message = self.message, None
        return message


def page_state() -> WhatIfState:
    """The page's WhatIfState, created on first use (and again if a code reload left an older one)."""
    held = st.session_state.get(STATE_KEY)
    if not isinstance(held, WhatIfState):
        held = st.session_state[STATE_KEY] = WhatIfState()
    return held


@dataclass(frozen=True)
class Inputs:
    """What the user picked: R redundant slots, nodes, expert groups (0 = none), policy, the fit window
    (`fit` in `unit` 'steps' | 'minutes'), the score window (newest steps), hold-out, node cap (0 = none),
    move budget (0 = full re-plan; else repair the current layout within that many moves, counted as
    planner.repair.experts_copied counts them)."""

    redundant: int
    nodes: int
    groups: int
    policy: str
    fit: float
    unit: str
    score_steps: int
    hold_out: bool
    node_cap: int
    move_budget: int = 0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_inputs(num_experts: int, gpus: int, current_slots: int, current_nodes: int, steps: int) -> Inputs:
    """The picks before the user picks: what planning_inputs() draws first (and the page opens with)."""
    r_options = feasible_redundant(num_experts, gpus, 2 * gpus) or [0]
    current_r = current_slots - num_experts
    redundant = current_r if current_r > 0 and current_r in r_options else next((r for r in r_options if r > 0), 0)
    nodes = current_nodes if current_nodes in _divisors(gpus) else 1
    return Inputs(redundant=redundant, nodes=nodes, groups=0, policy=POLICIES[0], fit=512.0, unit="steps",
                  score_steps=max(1, min(64, steps // 4)), hold_out=True, node_cap=0, move_budget=0)


def planning_inputs(num_experts: int, gpus: int, current_slots: int, current_nodes: int, steps: int) -> Inputs:
    """Draw the planning controls (default_inputs() first); returns the picks."""
    first = default_inputs(num_experts, gpus, current_slots, current_nodes, steps)
    top = st.columns(4)
    repairing = bool(st.session_state.get(_MOVES))  # a move budget keeps the current slots: no R/groups/policy
    r_options = feasible_redundant(num_experts, gpus, 2 * gpus) or [0]
    redundant = top[0].selectbox("redundant slots R", r_options, index=r_options.index(first.redundant),
                                 key="whatif_r", disabled=repairing,
                                 help=f"(E + R) must split evenly over {gpus} GPUs; current layout: R = "
                                      f"{current_slots - num_experts}")
    node_options = _divisors(gpus)
    nodes = top[1].selectbox("nodes", node_options, key="whatif_nodes", index=node_options.index(first.nodes))
    group_options = [0] + [k for k in _divisors(num_experts) if k > 1 and k % nodes == 0]
    groups = top[2].selectbox("expert groups (hierarchical)", group_options, key="whatif_groups", disabled=repairing,
                              format_func=lambda k: "none (global)" if k == 0 else str(k),
                              help="groups of consecutive expert ids, pinned to nodes (DeepSeek n_group)")
    policy = top[3].selectbox("policy", POLICIES, key="whatif_policy", disabled=repairing,
                              help="auto: hierarchical with groups, else robust over the fit windows")
    row = st.columns([1, 1, 1, 1, 1, 1])
    fit = row[0].number_input("fit window", min_value=1, value=int(first.fit), step=1, key="whatif_fit")
    unit = row[1].radio("fit window in", ("steps", "minutes"), horizontal=True, key="whatif_unit")
    score_steps = row[2].number_input("score window (newest steps)", min_value=1, value=first.score_steps, step=1,
                                      key="whatif_score")
    hold_out = row[3].checkbox("fit ends where the score window starts", value=first.hold_out, key="whatif_hold_out",
                               help="score on steps the plan never saw (held out)")
    node_cap = row[4].number_input("node cap per token (0 = none)", min_value=0, max_value=gpus, value=0,
                                   step=1, key="whatif_node_cap", disabled=nodes == 1,
                                   help="node-limited routing what-if: each token may reach at most this many nodes")
    moves = row[5].number_input("move budget (0 = full re-plan)", min_value=0, value=0, step=1, key=_MOVES,
                                help="repair the current layout within this many expert moves instead of planning "
                                     "from scratch; one move = one expert's weights (of one layer) copied onto a "
                                     "GPU that did not hold that expert")
    return Inputs(int(redundant), int(nodes), int(groups), str(policy), float(fit), str(unit), int(score_steps),
                  bool(hold_out), min(int(node_cap), nodes), int(moves))


def refresh_button(container: DeltaGenerator) -> None:
    container.button("Re-read the window", on_click=on_refresh, key="whatif_refresh_button")


def worst_layer(before: Score) -> int:
    """The layer the picker shows first: the current layout's worst of the layers with tokens."""
    return max(_layers(before), key=lambda layer: before.imbalance_sum_L[layer])


def _layers(before: Score) -> list[int]:
    return [int(layer) for layer in np.flatnonzero(before.active_L)] or list(range(before.active_L.size))


def layer_picker(before: Score) -> int:
    """The layer to show and edit (layers with tokens; worst_layer() first)."""
    layers = _layers(before)
    return int(st.selectbox("layer to show and edit", layers, index=layers.index(worst_layer(before)), key="whatif_layer",
                            format_func=lambda layer: f"layer {layer} (current layout: imbalance "
                                                      f"{before.imbalance_sum_L[layer]:.3f})"))


def picked_gpu(gpus: int, experts: int) -> int | None:
    """The GPU picked (by a bar click or typed); picks out of range (another run or GPU count) are forgotten.
    Call before edit_controls draws the pickers."""
    for key, limit in ((_GPU, gpus), (_TARGET, gpus), (_EXPERT, experts)):
        held = st.session_state.get(key)
        if held is not None and not 0 <= held < limit:
            st.session_state[key] = None
    gpu = st.session_state.get(_GPU)
    return None if gpu is None else int(gpu)


def gpu_bars(container: DeltaGenerator, bars: Chart) -> None:
    """The before/after per-GPU bars (Vega-Lite); a click selects that GPU."""
    container.vega_lite_chart(bars.spec_with_data(), key=_GPU_BARS, width="stretch", on_select=on_gpu_click,
                              selection_mode=[edits.GPU_PARAM])


def edit_controls(gpus: int, experts: int, lightest_gpu: int, num_edits: int) -> tuple[int | None, int | None]:
    """GPU, expert and target GPU pickers and the edit buttons; returns (GPU, expert) picked."""
    c = st.columns([1, 1, 1, 1, 1, 1, 1])
    gpu = c[0].number_input("GPU", min_value=0, max_value=gpus - 1, value=None, step=1, key=_GPU,
                            placeholder="click a bar")
    expert = c[1].number_input("expert", min_value=0, max_value=experts - 1, value=None, step=1, key=_EXPERT,
                               placeholder="click an expert")
    c[2].number_input("target GPU", min_value=0, max_value=gpus - 1, value=None, step=1, key=_TARGET,
                      placeholder=f"e.g. {lightest_gpu} (lightest)")
    c[3].button("Add replica on target", on_click=on_edit, args=("add",), key="whatif_add")
    c[4].button("Move to target", on_click=on_edit, args=("move",), key="whatif_move")
    c[5].button("Undo", on_click=on_undo, disabled=num_edits == 0, key="whatif_undo")
    c[6].button("Reset to plan", on_click=on_reset, disabled=num_edits == 0, key="whatif_reset")
    return (None if gpu is None else int(gpu)), (None if expert is None else int(expert))


def expert_bars(container: DeltaGenerator, bars: Chart) -> None:
    """The picked GPU's expert bars (Vega-Lite); a click selects that expert."""
    container.vega_lite_chart(bars.spec_with_data(), key=_EXPERT_BARS, width="stretch", on_select=on_expert_click,
                              selection_mode=[edits.EXPERT_PARAM])


# ------------------------------------------------------------------------------------------ callbacks
def on_gpu_click() -> None:
    """A click on the before/after bars selects that GPU (its experts get listed)."""
    target = page_state().target
    gpu = edits.clicked_gpu(st.session_state.get(_GPU_BARS), target.gpus if target else 0)
    if gpu is not None:
        st.session_state[_GPU] = gpu
        st.session_state[_EXPERT] = None


def on_expert_click() -> None:
    """A click on the GPU's expert bars selects that expert for an edit."""
    target = page_state().target
    expert = edits.clicked_expert(st.session_state.get(_EXPERT_BARS), target.experts if target else 0)
    if expert is not None:
        st.session_state[_EXPERT] = expert


def _current() -> tuple[WhatIfState, EditTarget, edits.EditSession]:
    state = page_state()
    if state.target is None:
        raise RuntimeError("an edit callback ran before the What-if page drew its plan")
    return state, state.target, state.sessions[state.target.plan_key]


def on_edit(kind: str) -> None:
    """Apply 'add' (a replica of the selected expert on the target GPU) or 'move' (the selected expert's
    replica from the selected GPU to the target GPU) to the current layout."""
    state, target, session = _current()
    expert, gpu, dst = (st.session_state.get(key) for key in (_EXPERT, _GPU, _TARGET))
    if kind == "add" and expert is not None and dst is not None:
        action = edits.Action(kind, target.layer, int(expert), int(dst))
    elif expert is not None and gpu is not None and dst is not None:
        action = edits.Action(kind, target.layer, int(expert), int(gpu), int(dst))
    else:
        state.message = ("error", "Pick an expert (click its bar), a GPU and a target GPU first.")
        return
    try:
        state.sessions[target.plan_key] = edits.apply_action(session, action, target.counts_LE)
        state.message = ("ok", action.describe())
    except ValueError as exc:
        state.message = ("error", f"Cannot {kind}: {exc}")


def on_undo() -> None:
    state, target, session = _current()
    try:
        state.sessions[target.plan_key] = edits.undo(session)
        state.message = ("ok", f"undid: {session.log[-1]}")
    except ValueError as exc:
        state.message = ("error", str(exc))


def on_reset() -> None:
    state, target, session = _current()
    state.sessions[target.plan_key] = edits.new_session(session.key, session.planned, session.gpus)
    state.message = ("ok", "back to the plan")


def advice_buttons(container: DeltaGenerator, data_key: tuple, showing: bool, moves: int) -> None:
    """'Show this layout in the editor' (when the advisor moves something), or 'back to the planner' while the
    editor shows it."""
    if showing:
        container.button("Back to the planner", key="whatif_advice_back", on_click=on_show_advice, args=(None,))
    elif moves > 0:
        container.button("Show this layout in the editor", key="whatif_advice_show", on_click=on_show_advice,
                         args=(data_key,), help="The advisor's layout becomes the What-if layout: score it, edit "
                                                "it, export it")


def on_show_advice(data_key: tuple | None) -> None:
    page_state().show_advice = data_key


def on_refresh() -> None:
    page_state().refresh += 1


def apply_buttons(container: DeltaGenerator, target: ApplyTarget, where: str) -> None:
    """"Apply to the running engine", then its confirmation (confirm / cancel), which names the run and the Redis
    (where: its URL redacted) and holds for this run, Redis and layout only."""
    if page_state().apply_confirm != target.confirm:
        container.button("Apply to the running engine", key="whatif_apply", on_click=on_apply_ask,
                         args=(target.confirm,),
                         help="send the What-if layout to the run's engine as a signed layout request; it checks "
                              "it, moves the experts and switches within a few steps, or says why not")
        return
    container.warning(f"Switch the engine of run **{target.run}** (Redis `{where}`) to the What-if layout? It "
                      f"copies {target.moves:,} expert(s) onto other GPUs while it serves.")
    left, right = container.columns(2)
    left.button("Confirm: apply", key="whatif_apply_confirm", on_click=on_apply_confirm, type="primary")
    right.button("Cancel", key="whatif_apply_cancel", on_click=on_apply_cancel)


def on_apply_ask(confirm: tuple) -> None:
    page_state().apply_confirm = confirm


def on_apply_cancel() -> None:
    page_state().apply_confirm = None


def on_apply_confirm() -> None:
    """Sign the What-if layout and XADD it to the run's layout requests stream (dashboard.sources.layout_request),
    if the server's Apply setting still allows this run on this Redis and the confirmation is for this layout."""
    from moe_monitor.dashboard.sources.apply_gate import gate_from_env
    from moe_monitor.dashboard.sources.layout_request import request_layout

    state = page_state()
    confirmed, state.apply_confirm = state.apply_confirm, None
    target = state.apply_target
    if target is None or confirmed != target.confirm:
        state.apply_note = ("error", "Nothing applied: the layout, run or Redis changed since you asked; ask again.")
        return
    gate = gate_from_env()
    if not gate.allows(target.redis_url, target.run) or gate.secret is None:
        state.apply_note = ("error", gate.why_off(target.redis_url, target.run))
        return
    try:
        sent = request_layout(target.client, target.run, target.layout_LP,
                              instance=f"dashboard-whatif-{core.new_instance_id()}", secret=gate.secret,
                              ttl_s=gate.ttl_s)
    except ValueError as exc:
        state.apply_note = ("error", f"Cannot apply: {exc}")
        return
    except core.REDIS_ERRORS as exc:
        state.apply_note = ("error", f"Cannot apply: Redis: {type(exc).__name__}")
        return
    state.requests = [*state.requests, Requested(sent.record.step, target.key, target.predicted_eta,
                                                 target.current_eta, target.redis_url, target.run, sent.request_id,
                                                 sent.request.nonce, sent.request.expires_s)][-MAX_REQUESTS:]
    state.apply_note = None
