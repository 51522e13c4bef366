"""The What-if's dispatch-policy table (thin: dashboard.whatif.policies computes, once per (frozen window,
layout, policy), cached in the page's state)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from moe_monitor.core.dispatch import DISPATCH_POLICIES
from moe_monitor.dashboard.whatif import policies
from moe_monitor.dashboard.whatif.cache import cached

MAX_ENTRIES = 2 * len(DISPATCH_POLICIES) * 2  # both layouts x every policy, for this window and the one before


def policies_section(current_LP: np.ndarray, whatif_LP: np.ndarray, score_TLE: np.ndarray, gpus: int,
                     data_key: tuple, store: dict, run_policy: str) -> None:
    """The current layout and the what-if layout under each dispatch policy, side by side."""
    st.subheader("Dispatch policies: per-step tails")
    tails_by = {}
    with st.spinner("per-step figures under each dispatch policy ..."):
        for name, lay in (("current", current_LP), ("what-if", whatif_LP)):
            lay_key = (hash(lay.tobytes()), lay.shape)
            for policy in DISPATCH_POLICIES:
                tails_by[(name, policy)] = cached(
                    store, (data_key, lay_key, policy),
                    lambda lay=lay, policy=policy: policies.policy_tails(lay, score_TLE, gpus, policy),
                    max_entries=MAX_ENTRIES)
    table = pd.DataFrame(policies.policy_table(tails_by))
    table["dispatch"] = [p + (" (this run's)" if p == run_policy else "") for p in table["dispatch"]]
    figures = {name: st.column_config.NumberColumn(format="%.3f") for name in table.columns[3:]}
    st.dataframe(table, hide_index=True, column_config={"dispatch": st.column_config.TextColumn(width="medium"),
                                                        **figures})
    steps = score_TLE.shape[0]
    st.caption(f"On the score window ({steps:,} steps; lp on the newest {policies.scored_steps('lp', steps):,}, "
               "since it solves each step). Per-step imbalance = max/mean GPU load per (step, layer) with tokens; "
               "ideal fraction = mean/max averaged over them; expert skew = the worst GPU's busiest slot over its "
               "mean slot; window imbalance = max/mean of the summed loads, mean over layers. ideal is the "
               "force-balanced bound of any policy.")
