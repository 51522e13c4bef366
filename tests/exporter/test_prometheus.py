"""The exporter in a real monitoring stack: Debian's Prometheus scrapes `moe-monitor export` on
loopback, stores the Overview's balancedness for the same window, loads the alerting rules of
deploy/prometheus, and fires MoEBalancednessLow on a run made imbalanced on purpose. promtool checks the
rules and runs their unit tests (deploy/prometheus/alerts_test.yml)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.demo.localredis import free_port
from tests.support import synthfill

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (scripts/system-deps.sh --with-browser installs Debian's prometheus)"
    return path


def test_rules_check_and_their_unit_tests_pass():
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"], ["check", "config",
                                                                                           "prometheus.yml"]):
        result = subprocess.run([_tool("promtool"), *args], cwd=RULES, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())["data"]["result"]


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return json.loads(resp.read())["data"]


def _wait(what, check, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_prometheus_scrapes_the_exporter_stores_the_overviews_numbers_and_fires_an_alert(redis_url, tmp_path):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "steady", steps=30, num_layers=4, num_experts=16, gpus=4)
    synthfill.fill_skewed(client, "skewed")
    exporter_port, prom_port = free_port(), free_port()
    # the shipped rules, with their `for:` waits removed so that a test can see one fire
    (tmp_path / "alerts.yml").write_text(re.sub(r"\n\s+for: \d+m", "", (RULES / "alerts.yml").read_text()))
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [alerts.yml]\n"
        f"scrape_configs:\n  - job_name: moe-load\n    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n")
    exporter = subprocess.Popen([sys.executable, "-m", "moe_monitor", "export", "--redis", redis_url, "--port",
                                 str(exporter_port), "--interval-s", "0.5"], cwd=ROOT, env=dict(os.environ),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prometheus = subprocess.Popen([_tool("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        selector = 'moe_balancedness_ratio{run="steady",phase="both",window="window_sum",stat="p50"}'
        stored = _wait("a scrape", lambda: _query(prom_port, selector))
        watched = WatchedRun(RedisSource(client, redis_url, "steady", 600), 600)  # the Overview's numbers
        watched.tick()
        window = watched.window
        layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size)
        expected = analyse(window, layout, "both").eta_window_sum.p50
        assert float(stored[0]["value"][1]) == pytest.approx(expected, rel=1e-9)
        groups = _get(prom_port, "/api/v1/rules")["groups"]
        assert {rule["name"] for group in groups for rule in group["rules"]} == {
            "MoEBalancednessLow", "MoECollectorSilent", "MoEStepsDropped", "MoEStragglerStuck", "MoERebalancingStopped"}
        firing = _wait("MoEBalancednessLow to fire", lambda: [
            a for a in _get(prom_port, "/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == "MoEBalancednessLow" and a["state"] == "firing"])
        assert [a["labels"]["run"] for a in firing] == ["skewed"]  # the balanced run does not fire
        assert firing[0]["annotations"]["summary"] == "Run skewed: balancedness 0.250 (below 0.5 for 5 min)"
    finally:
        for proc in (prometheus, exporter):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
