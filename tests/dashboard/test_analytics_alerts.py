"""The Overview's alert line: the Prometheus rules (deploy/prometheus/alerts.yml) judged on a window, with the
same thresholds as the YAML, shown on the page for a skewed run and quiet for a balanced one."""
from __future__ import annotations

import re
from pathlib import Path

from moe_monitor import core
from moe_monitor.dashboard.analytics import alerts
from tests.support import synthfill
from tests.support.apptest import run_app

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def test_each_rule_fires_on_its_own_condition():
    quiet = alerts.evaluate(0.8, 2.0, 0, 1.1, 0.3)
    assert [s.name for s in quiet] == ["MoEBalancednessLow", "MoECollectorSilent", "MoEStepsDropped",
                                       "MoEStragglerStuck"]
    assert not any(s.firing for s in quiet)
    loud = alerts.evaluate(0.3, 120.0, 5, 2.0, 0.9)
    assert all(s.firing for s in loud)
    assert "balancedness 0.300" in loud[0].detail and "120 s ago" in loud[1].detail
    unknown = alerts.evaluate(float("nan"), None, 0, None, None)
    assert not any(s.firing for s in unknown)  # no data is not an alert
    replayed = alerts.evaluate(0.8, 454028.0, 0, 1.1, 0.3, recorded=True)
    assert not replayed[1].firing and replayed[1].detail == "a recording: no live collector"


def test_thresholds_are_the_yamls():
    text = RULES.read_text()
    assert re.search(r'stat="p50"\}\s*<\s*([0-9.]+)', text).group(1) == str(alerts.BALANCEDNESS_LOW)
    assert float(re.search(r"moe_collector_last_write_age_seconds\s*>\s*([0-9.]+)", text).group(1)) == \
        alerts.COLLECTOR_SILENT_S
    assert float(re.search(r'moe_straggler_load_to_mean_ratio\{phase="both"\}\s*>\s*([0-9.]+)', text).group(1)) == \
        alerts.STRAGGLER_RATIO


def test_the_overview_shows_the_rules_on_its_window(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill_skewed(client, "skew")
    at = run_app(redis_url, monkeypatch)
    line = next(w.value for w in at.warning if "Alerts on this window" in w.value)
    assert "**MoEBalancednessLow** firing (balancedness 0.250" in line and "MoECollectorSilent ok" in line
    client.flushdb()
    synthfill.fill(client, "even", steps=20, num_layers=4, num_experts=16, gpus=4)
    at = run_app(redis_url, monkeypatch)
    lines = [e.value for e in [*at.warning, *at.caption] if "Alerts on this window" in e.value]
    assert len(lines) == 1 and "MoEBalancednessLow ok (balancedness 0.5" in lines[0], lines
