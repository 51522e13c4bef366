"""Figures coloured by their rule (dashboard.analytics.levels): a metric whose value carries a coloured word
under it (green good, amber watch, red bad), and coloured markdown for a figure inside a sentence. Used by the
Overview's details, the per-step tails and the Devices page."""
from __future__ import annotations

from moe_monitor.dashboard.analytics.levels import BAD, GOOD, NONE, WATCH, Rule

COLOURS = {GOOD: "green", WATCH: "orange", BAD: "red"}


def judged_metric(container, label: str, shown: str, level: str, help: str = "") -> None:
    """st.metric with the level under the value, in its colour (no arrow); a plain metric for NONE."""
    if level == NONE:
        container.metric(label, shown, help=help or None)
        return
    container.metric(label, shown, delta=level, delta_color=COLOURS[level], delta_arrow="off", help=help or None)


def ruled_metric(container, label: str, value: float | int | None, shown: str, rule: Rule, help: str = "") -> None:
    """A metric judged by rule, its tooltip ending with the rule in words."""
    judged_metric(container, label, shown, rule.level(value), f"{help} {rule.says().capitalize()}.".strip())


def coloured(shown: str, level: str) -> str:
    """Markdown of shown in the level's colour (bold); shown as is for NONE."""
    return shown if level == NONE else f":{COLOURS[level]}[**{shown}**]"

