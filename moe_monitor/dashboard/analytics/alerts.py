"""The alerting rules of deploy/prometheus/alerts.yml, evaluated on the window a page shows, so a user without
Prometheus sees the same status (a test keeps the thresholds here equal to the YAML's).

Prometheus judges over time (`for: 5m`, a rise within 5 min, the same GPU for 15 min); a page judges its
window: the numbers below say which."""
from __future__ import annotations

import math
from dataclasses import dataclass

BALANCEDNESS_LOW = 0.5        # MoEBalancednessLow: median layer's mean per-step eta below this
COLLECTOR_SILENT_S = 60.0     # MoECollectorSilent: no collector wrote for longer than this
STRAGGLER_RATIO = 1.5         # MoEStragglerStuck: the straggler's load over the mean GPU load above this
STRAGGLER_SHARE = 0.5         # ... and busiest in at least this share of the window (a page's "stuck")


@dataclass(frozen=True)
class AlertStatus:
    """One rule on one window: firing or not, and the number it judged."""

    name: str
    firing: bool
    detail: str


def evaluate(eta_step_mean_p50: float, last_write_age_s: float | None, dropped_steps: int,
             straggler_ratio: float | None, straggler_share: float | None, recorded: bool = False) -> list[AlertStatus]:
    """The four rules on a window's numbers: balancedness (p50 over layers of the per-step mean), seconds since
    a collector last wrote (None: unknown), the collectors' dropped-step count, the straggler's load ratio to
    the mean and the share of the window it was the busiest GPU (None: no straggler). recorded: a replayed
    recording, whose collectors are not live: the silence rule does not apply."""
    low = math.isfinite(eta_step_mean_p50) and eta_step_mean_p50 < BALANCEDNESS_LOW
    silent = not recorded and last_write_age_s is not None and last_write_age_s > COLLECTOR_SILENT_S
    stuck = (straggler_ratio is not None and straggler_share is not None and straggler_ratio > STRAGGLER_RATIO
             and straggler_share >= STRAGGLER_SHARE)
    return [
        AlertStatus("MoEBalancednessLow", low, f"balancedness {eta_step_mean_p50:.3f}, threshold {BALANCEDNESS_LOW}"),
        AlertStatus("MoECollectorSilent", silent, "a recording: no live collector" if recorded
                    else "last write unknown" if last_write_age_s is None
                    else f"last write {last_write_age_s:.0f} s ago, threshold {COLLECTOR_SILENT_S:.0f} s"),
        AlertStatus("MoEStepsDropped", dropped_steps > 0, f"{dropped_steps} steps dropped by the collectors"),
        AlertStatus("MoEStragglerStuck", stuck, "no straggler" if straggler_ratio is None else
                    f"straggler at {straggler_ratio:.2f}x the mean, busiest in {straggler_share:.0%} of the window"),
    ]
