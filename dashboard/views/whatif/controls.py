"""The What-if page's Streamlit controls and callbacks: planning inputs, click handlers (a GPU bar, an
expert bar) and the edit buttons. Callbacks run before the rerun, so an edit shows at once. The pure
logic they call lives in dashboard.whatif.edits."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from dashboard.whatif import edits as whatif_state
from planner.api import POLICIES
from planner.budget import feasible_redundant

K = "whatif_"  # prefix of every session-state key this page owns


@dataclass(frozen=True)
class Inputs:
    """What the user picked: R redundant slots, nodes, expert groups (0 = none), policy, the fit window
    (`fit` in `unit` 'steps' | 'minutes'), the score window (newest steps), hold-out, node cap (0 = none),
    move budget (0 = full re-plan; else repair the current layout with at most that many expert moves)."""

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


def inputs(num_experts: int, gpus: int, current_slots: int, current_nodes: int, steps: int) -> Inputs:
    """Draw the planning controls; returns the picks."""
    top = st.columns(4)
    repairing = bool(st.session_state.get(K + "moves"))  # a move budget keeps the current slots: no R/policy
    r_options = feasible_redundant(num_experts, gpus, 2 * gpus) or [0]
    current_r = current_slots - num_experts
    default_r = current_r if current_r > 0 and current_r in r_options else next((r for r in r_options if r > 0), 0)
    redundant = top[0].selectbox("redundant slots R", r_options, index=r_options.index(default_r), key=K + "r", disabled=repairing,
                                 help=f"(E + R) must split evenly over {gpus} GPUs; current layout: R = {current_r}")
    node_options = _divisors(gpus)
    nodes = top[1].selectbox("nodes", node_options, key=K + "nodes",
                             index=node_options.index(current_nodes) if current_nodes in node_options else 0)
    group_options = [0] + [k for k in _divisors(num_experts) if k > 1 and k % nodes == 0]
    groups = top[2].selectbox("expert groups (hierarchical)", group_options, key=K + "groups", disabled=repairing,
                              format_func=lambda k: "none (global)" if k == 0 else str(k),
                              help="K groups of consecutive expert ids, pinned to nodes (DeepSeek n_group)")
    policy = top[3].selectbox("policy", POLICIES, key=K + "policy", disabled=repairing,
                              help="auto: hierarchical with groups, else robust over the fit windows")
    row = st.columns([1, 1, 1, 1, 1, 1])
    fit = row[0].number_input("fit window", min_value=1, value=512, step=1, key=K + "fit")
    unit = row[1].radio("fit window in", ("steps", "minutes"), horizontal=True, key=K + "unit")
    score_steps = row[2].number_input("score window (newest steps)", min_value=1,
                                      value=max(1, min(64, steps // 4)), step=1, key=K + "score")
    hold_out = row[3].checkbox("fit ends where the score window starts", value=True, key=K + "hold_out",
                               help="score on steps the plan never saw (held out)")
    node_cap = row[4].number_input("node cap per token (0 = none)", min_value=0, max_value=gpus, value=0,
                                   step=1, key=K + "node_cap", disabled=nodes == 1,
                                   help="node-limited routing what-if: each token may reach at most this many nodes")
    moves = row[5].number_input("move budget (0 = full re-plan)", min_value=0, value=0, step=1, key=K + "moves",
                                help="repair the current layout with at most this many expert moves (one move = "
                                     "one expert's weights copied into one slot) instead of planning from scratch")
    return Inputs(int(redundant), int(nodes), int(groups), policy, float(fit), unit, int(score_steps),
                  bool(hold_out), min(int(node_cap), nodes), int(moves))


# ------------------------------------------------------------------------------------------ callbacks
def on_gpu_click() -> None:
    """A click on the before/after bars selects that GPU (its experts get listed)."""
    gpus = st.session_state.get(K + "ctx", {}).get("gpus", 0)
    gpu = whatif_state.clicked_gpu(st.session_state.get(K + "bars"), gpus)
    if gpu is not None:
        st.session_state[K + "gpu"] = gpu
        st.session_state[K + "expert"] = None


def on_expert_click() -> None:
    """A click on the GPU's expert bars selects that expert for an edit."""
    experts = st.session_state.get(K + "ctx", {}).get("experts", 0)
    expert = whatif_state.clicked_expert(st.session_state.get(K + "expert_bars"), experts)
    if expert is not None:
        st.session_state[K + "expert"] = expert


def _session() -> tuple[dict, whatif_state.EditSession]:
    ctx = st.session_state[K + "ctx"]
    return ctx, st.session_state[K + "edits"][ctx["plan_key"]]


def _store(ctx: dict, session: whatif_state.EditSession, message: tuple[str, str]) -> None:
    st.session_state[K + "edits"][ctx["plan_key"]] = session
    st.session_state[K + "message"] = message


def on_edit(kind: str) -> None:
    """Apply 'add' (a replica of the selected expert on the target GPU) or 'move' (the selected expert's
    replica from the selected GPU to the target GPU) to the current layout."""
    ctx, session = _session()
    expert, gpu, target = (st.session_state.get(K + name) for name in ("expert", "gpu", "target"))
    if expert is None or target is None or (kind == "move" and gpu is None):
        st.session_state[K + "message"] = ("error", "Pick an expert (click its bar), a GPU and a target GPU first.")
        return
    action = whatif_state.Action(kind, ctx["layer"], int(expert), int(target) if kind == "add" else int(gpu),
                                 None if kind == "add" else int(target))
    try:
        _store(ctx, whatif_state.apply(session, action, ctx["counts_LE"]), ("ok", action.describe()))
    except ValueError as exc:
        st.session_state[K + "message"] = ("error", f"Cannot {kind}: {exc}")


def on_undo() -> None:
    ctx, session = _session()
    try:
        _store(ctx, whatif_state.undo(session), ("ok", f"undid: {session.log[-1]}"))
    except ValueError as exc:
        st.session_state[K + "message"] = ("error", str(exc))


def on_reset() -> None:
    ctx, session = _session()
    _store(ctx, whatif_state.start(session.key, session.planned, session.gpus), ("ok", "back to the plan"))


def on_refresh() -> None:
    st.session_state[K + "refresh"] = st.session_state.get(K + "refresh", 0) + 1
