"""The What-if page's "Apply to the running engine" section (live Redis runs only): off unless the server enables
it for this run (dashboard.sources.apply_gate; the page then says how to turn it on); the button and its
confirmation, which names the run and the Redis (controls.apply_buttons); what became of the request this page
sent last ("applied at step S", "refused: expired (...)", or waiting: polled every second until the engine answers
or the request expires); the engine's latest answers to anyone's requests (a refused unsigned or other-run request
written by someone else shows there); and, once the run's layouts stream shows an applied change, the measured layer time and
balancedness before vs after it beside the What-if's prediction.

Shape legend (README, Conventions): T steps, L layers, P slots."""
from __future__ import annotations

import numpy as np
import streamlit as st

from moe_monitor import core
from moe_monitor.dashboard.analytics import timing
from moe_monitor.dashboard.figures.units import format_number
from moe_monitor.dashboard.live.layout import ResolvedLayout
from moe_monitor.dashboard.sources.apply_gate import gate_from_env
from moe_monitor.dashboard.sources.base import is_seekable
from moe_monitor.dashboard.sources.request_status import find_status, outcome, recent_statuses
from moe_monitor.dashboard.views.common import PageData
from moe_monitor.dashboard.views.session import shown_url
from moe_monitor.dashboard.views.whatif import controls
from moe_monitor.dashboard.views.whatif.controls import Requested, WhatIfState
from moe_monitor.dashboard.whatif import edits
from moe_monitor.dashboard.whatif import repair as whatif_repair
from moe_monitor.dashboard.whatif import score as whatif_score

APPLY_COMPARE_STEPS = 64  # steps before and after an applied change that the comparison averages (at most)
STATUS_POLL_S = 1.0      # how often the page looks for the engine's answer while a request waits
ANSWERS_POLL_S = 2.0     # how often the list of the engine's latest answers is read again


def apply_section(current: PageData, layout: ResolvedLayout, session: edits.EditSession, before: whatif_score.Score,
                  after: whatif_score.Score, data: whatif_score.WhatIfData, state: WhatIfState) -> None:
    """The whole section (module docstring); nothing for a trace or a source without a Redis client."""
    client = getattr(current.watched.source, "client", None)
    cfg = current.settings
    if cfg.source != "redis" or client is None or is_seekable(current.watched.source):
        return
    st.subheader("Apply to the running engine")
    gate = gate_from_env()
    if not gate.allows(cfg.redis_url, cfg.run):
        state.apply_target = None
        st.info(gate.why_off(cfg.redis_url, cfg.run))
    else:
        layout_LP = session.current.copy()
        state.apply_target = controls.ApplyTarget(
            client, cfg.redis_url, str(cfg.run), layout_LP, hash(np.asarray(layout_LP, dtype=np.int64).tobytes()),
            controls.confirm_key(cfg.redis_url, str(cfg.run), layout_LP),
            whatif_repair.moves_between(layout.layout_LP, layout_LP, layout.gpus), after.step_balancedness,
            before.step_balancedness)
        controls.apply_buttons(st.container(), state.apply_target, shown_url(cfg.redis_url))
        _recent_answers(client, str(cfg.run))
    if state.apply_note:
        (st.success if state.apply_note[0] == "ok" else st.error)(state.apply_note[1])
    sent = next((r for r in reversed(state.requests) if (r.redis_url, r.run) == (cfg.redis_url, cfg.run)), None)
    if sent is not None and sent.nonce:
        if sent.nonce in state.outcomes:
            _show_outcome(*state.outcomes[sent.nonce])
        else:
            _poll_status(client, sent)
    _applied_panel(current, layout, before, data, state)


@st.fragment(run_every=ANSWERS_POLL_S)
def _recent_answers(client, run: str) -> None:
    """The engine's latest answers for the run, whoever asked: a refused request from elsewhere (unsigned, for
    another run, too large, expired) shows here too."""
    try:
        answers = recent_statuses(client, run)
    except core.REDIS_ERRORS as exc:
        st.caption(f"The engine's latest answers: cannot be read (Redis: {type(exc).__name__})")
        return
    if not answers:
        st.caption("The engine's latest answers for this run: none yet (no layout request was judged).")
        return
    lines = [f"- step {a.step}: {a.describe()} (request {a.request_id})" for a in answers]
    st.markdown("**The engine's latest answers for this run** (any sender, newest first):\n" + "\n".join(lines))


def _show_outcome(kind: str, text: str) -> None:
    {"ok": st.success, "error": st.error}.get(kind, st.info)(f"Last request from this page: {text}")


@st.fragment(run_every=STATUS_POLL_S)
def _poll_status(client, sent: Requested) -> None:
    """The engine's answer to the request, looked for every STATUS_POLL_S while it waits; once it is final (an
    answer, or expired unanswered) it is kept in the page state and the page redraws without polling."""
    try:
        status = find_status(client, sent.run, sent.nonce)
    except core.REDIS_ERRORS as exc:
        st.warning(f"Last request from this page: cannot read the engine's answer (Redis: {type(exc).__name__})")
        return
    result = outcome(status, sent.step, sent.expires_s)
    kind = "info" if not result.final else "ok" if status is not None and status.applied else "error"
    _show_outcome(kind, result.text)
    if result.final:
        controls.page_state().outcomes[sent.nonce] = (kind, result.text)
        st.rerun(scope="app")


def _applied_panel(current: PageData, layout: ResolvedLayout, before: whatif_score.Score,
                   data: whatif_score.WhatIfData, state: WhatIfState) -> None:
    """Once the run's layouts stream shows an "apply" change: the measured MoE time per step and per-step
    balancedness before vs after it, beside the What-if's prediction for it."""
    applied = [c for c in current.watched.layouts.changes if c.source == "apply"]
    snap = current.snapshot
    if not applied or snap is None:
        return
    change = applied[-1]
    request = next((r for r in reversed(state.requests) if r.key == change.key), None)
    if request is not None:
        predicted, current_eta, basis = request.predicted_eta, request.current_eta, "the window it was planned on"
    else:
        scored = whatif_score.score(change.layout_LP, data.score_TLE, layout.gpus)
        predicted, current_eta = scored.step_balancedness, before.step_balancedness
        basis = "the current score window (not requested from this page)"
    step_T = snap.view.step_T
    eta_T = timing.mean_over(snap.eta_TL, 1)
    moe_s_T = timing.step_moe_time(current.watched.timings.aligned(step_T).layer_TRL)
    result = timing.before_after(step_T, moe_s_T, eta_T, change.step, APPLY_COMPARE_STEPS)
    st.markdown(f"**Layout applied at step {change.step}** (the run's layouts stream): mean over the "
                f"{result.steps_before} steps before and the {result.steps_after} steps after it.")
    st.caption(change_line(result))
    cols = st.columns(3)
    cols[0].metric("MoE time per step, after", _ms(result.layer_s_after),
                   delta=None if not np.isfinite(result.layer_change_ratio) else f"{result.layer_change_ratio:+.1%}",
                   delta_color="inverse", help=f"before: {_ms(result.layer_s_before)}; slowest rank per layer, "
                                               "summed over layers (measured layer timings)")
    cols[1].metric("balancedness per step, after", format_number(result.eta_after),
                   delta=None if not np.isfinite(result.eta_after - result.eta_before)
                   else f"{result.eta_after - result.eta_before:+.3f}",
                   help=f"before: {format_number(result.eta_before)}; mean over layers of each step's mean/max GPU load")
    cols[2].metric("predicted balancedness", format_number(predicted),
                   delta=f"{predicted - current_eta:+.3f}" if np.isfinite(predicted - current_eta) else None,
                   help=f"the What-if's per-step balancedness of this layout on {basis} (current layout: "
                        f"{format_number(current_eta)})")


def change_line(result: timing.BeforeAfter) -> str:
    """The measured change as a difference with its 95% interval, and whether it is more than noise."""
    lo, hi = result.layer_change_interval
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return ("MoE time per step: too few timed steps on a side for an interval (two or more each); the "
                "figures below are single means.")
    verdict = ("within noise: the interval holds no change" if lo <= 0 <= hi else
               "faster, beyond noise" if hi < 0 else "slower, beyond noise")
    eta = (f"; balancedness {result.eta_after - result.eta_before:+.3f} (95%: ±{result.eta_halfwidth:.3f})"
           if np.isfinite(result.eta_halfwidth) else "")
    return (f"MoE time per step {result.layer_change_ratio:+.1%} (95% interval {lo:+.1%} to {hi:+.1%}): "
            f"{verdict}{eta}. More steps after the change narrow it.")


def _ms(seconds: float) -> str:
    return "n/a" if not np.isfinite(seconds) else f"{seconds * 1e3:.3f} ms"
