"""Good, watch or bad for a figure a page shows: one Rule per kind of figure, its thresholds kept here only.

Pure. The Overview's details and the Devices page colour their figures by these rules (green, amber, red) and
their tooltips say them (Rule.says); the Overview's answer judges its tone by the same thresholds. Balancedness
eta = mean/max, its idle share 1 - eta and its imbalance max/mean = 1/eta share one pair of thresholds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GOOD, WATCH, BAD, NONE = "good", "watch", "bad", ""  # NONE: no rule, or no finite value to judge
AT_THRESHOLD = 1e-9  # relative: a value this close to a threshold is at it (rounding of 1 - eta, 1 / eta)


@dataclass(frozen=True)
class Rule:
    """good: at or better than this is good; bad: at or worse than this is bad; between them: watch.
    higher_is_better says which way is better; fmt formats the thresholds in says()."""

    good: float
    bad: float
    higher_is_better: bool
    fmt: str = ".2f"

    def level(self, value: float | int | None) -> str:
        """GOOD, WATCH or BAD for value; NONE when value is None or not finite."""
        if value is None:
            return NONE
        value = float(value)
        if not math.isfinite(value):
            return NONE
        near = AT_THRESHOLD * max(1.0, abs(value))  # 1 - 0.8 is 0.19999999999999996: at the threshold all the same
        if self.higher_is_better:
            return GOOD if value >= self.good - near else BAD if value <= self.bad + near else WATCH
        return GOOD if value <= self.good + near else BAD if value >= self.bad - near else WATCH

    def says(self) -> str:
        """The rule in words, for a tooltip: 'good at 0.90 or above, bad at 0.80 or below'."""
        better, worse = ("above", "below") if self.higher_is_better else ("below", "above")
        good, bad = format(self.good, self.fmt), format(self.bad, self.fmt)
        good = f"{good}" if self.good == 0 and not self.higher_is_better else f"{good} or {better}"
        if self.good == 0 and self.bad == 1 and not self.higher_is_better:  # a count: any is bad
            return "good at 0, bad above it"
        if math.isinf(self.bad):
            return f"good at {good}, worth a look {worse} it" if self.good == 0 else f"good at {good}, else watch"
        return f"good at {good}, bad at {bad} or {worse}, watch between"


IDLE_GOOD, IDLE_BAD = 0.1, 0.2  # share of MoE time the average GPU waits: at 0.2, a fifth of it
IDLE_SHARE = Rule(IDLE_GOOD, IDLE_BAD, higher_is_better=False, fmt=".0%")
ETA_GOOD, ETA_BAD = 1 - IDLE_GOOD, 1 - IDLE_BAD  # balancedness 0.9 and 0.8
BALANCEDNESS = Rule(ETA_GOOD, ETA_BAD, higher_is_better=True)
SHARE_OF_IDEAL = Rule(ETA_GOOD, ETA_BAD, higher_is_better=True, fmt=".0%")  # mean of per-step eta, as a share
IMBALANCE = Rule(1 / ETA_GOOD, 1 / ETA_BAD, higher_is_better=False)  # max/mean: 1.11 and 1.25
LOST_SHARE = Rule(0.02, 0.1, higher_is_better=False, fmt=".0%")  # share of MoE time waiting (the answer in time)
DROPPED_STEPS = Rule(0, 1, higher_is_better=False, fmt=".0f")  # any step the collectors dropped is lost
SKIPPED_RECORDS = Rule(0, math.inf, higher_is_better=False, fmt=".0f")  # bad records: worth a look
COLLECTOR_ERRORS = Rule(0, 1, higher_is_better=False, fmt=".0f")
POLL_MS = Rule(10.0, 100.0, higher_is_better=False, fmt=".0f")  # one host: under 10 ms is usual
SILENT_S = Rule(5.0, 15.0, higher_is_better=False, fmt=".0f")  # since the collector last wrote: 15 s is stopped
