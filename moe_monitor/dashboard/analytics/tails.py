"""The per-step figures of core.steptails as the pages' rows (pure: no Streamlit): one summary of a window, the
per-layer table, and the What-if's (layout, policy) rows. Values are floats, None where nothing had tokens.

Shape legend: T steps, L layers.
"""
from __future__ import annotations

from moe_monitor.core.steptails import StepTails

POLICY_LABELS = {"even": "even (tokens split evenly over replicas)",
                 "round_robin": "round_robin (token index mod replicas)",
                 "lp": "lp (busiest GPU minimised per step)",
                 "ideal": "ideal (force-balanced bound)"}


def summary(tails: StepTails) -> dict[str, float | None]:
    """The window's figures: per-step imbalance p50 / p99 / max over every (step, layer) pair with tokens, ideal
    fraction (mean / max averaged over the pairs), expert skew p99 and the window-sum imbalance."""
    imbalance = tails.imbalance_summary()
    return {"p50": imbalance["p50"], "p99": imbalance["p99"], "max": imbalance["max"],
            "ideal_fraction": tails.ideal_fraction, "skew_p99": tails.skew_summary()["p99"],
            "window_imbalance": tails.window_imbalance}


def layer_rows(tails: StepTails) -> list[dict[str, float | int | None]]:
    """One row per layer [L]: per-step imbalance p50 / p99 / max over the layer's steps, expert skew p99 (None for
    a layer without tokens)."""
    per_layer = tails.layer_summary()
    return [{"layer": layer, "per-step imbalance p50": per_layer["p50"][layer],
             "p99": per_layer["p99"][layer], "max": per_layer["max"][layer],
             "expert skew p99": per_layer["skew_p99"][layer]} for layer in range(len(per_layer["p50"]))]


def policy_row(layout: str, tails: StepTails) -> dict[str, str | float | int | None]:
    """The What-if table's row of one (layout, policy): steps scored and the summary's figures."""
    figures = summary(tails)
    return {"layout": layout, "dispatch": tails.policy, "steps": tails.steps,
            "per-step imbalance p99": figures["p99"], "p50": figures["p50"],
            "ideal fraction": figures["ideal_fraction"], "expert skew p99": figures["skew_p99"],
            "window imbalance": figures["window_imbalance"]}
