"""Hypothesis settings shared by the property tests.

A plain run (and CI) replays the same derandomized 200 examples, so a run passes or fails for the code, not
for the draw. Set MOE_PROPERTY_SEARCH=N to search N fresh random examples per test instead (a hunt for new
counterexamples; fix what it finds and add the case as a plain test)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def property_settings() -> settings:
    search = int(os.environ.get("MOE_PROPERTY_SEARCH", "0") or 0)
    return settings(max_examples=search or 200, derandomize=not search, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
