"""The Prometheus exporter against a run in the tests' own redis-server: its numbers are the Overview's
(same window, same analytics), its /metrics parses with prometheus_client's parser in both formats, and a
Redis that goes away is exported as such, not as a crash."""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from moe_monitor import core
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.demo.localredis import free_port
from moe_monitor.exporter.metrics import series_count
from moe_monitor.exporter.server import RunExporter
from tests.support import synthfill
from tests.support.cli import in_process

ROOT = Path(__file__).resolve().parents[2]


def _samples(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def test_exported_numbers_are_the_overviews(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "exp", steps=30, num_layers=4, num_experts=16, gpus=4, world_size=2)
    exporter = RunExporter(client, redis_url, ["exp"], window_steps=100)
    exporter.poll()
    registry = CollectorRegistry()
    registry.register(exporter)
    samples = _samples(generate_latest(registry).decode())

    watched = WatchedRun(RedisSource(client, redis_url, "exp", 100), 100)  # what the Overview computes
    watched.tick()
    window = watched.window
    layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size)
    for phase in ("both", "decode", "prefill"):
        snap = analyse(window, layout, phase)
        assert _value(samples, "moe_balancedness_ratio", run="exp", phase=phase, window="window_sum",
                      stat="p50") == pytest.approx(snap.eta_window_sum.p50)
        assert _value(samples, "moe_balancedness_ratio", run="exp", phase=phase, window="step_mean",
                      stat="min") == pytest.approx(snap.eta_step_mean.min)
        assert _value(samples, "moe_idle_share_ratio", run="exp", phase=phase) == pytest.approx(snap.idle_share)
        assert _value(samples, "moe_straggler_gpu", run="exp", phase=phase) == snap.straggler.gpu
        for gpu in range(4):
            assert _value(samples, "moe_gpu_load_tokens_per_step", run="exp", phase=phase, gpu=str(gpu),
                          stat="p99") == pytest.approx(float(snap.stats.p99_G[gpu]), rel=1e-6)
    assert _value(samples, "moe_steps_total", run="exp") == 60  # 30 steps x 2 ranks
    assert _value(samples, "moe_collector_up", run="exp") == 1
    assert _value(samples, "moe_exporter_redis_up") == 1
    # bounded cardinality: no per-layer or per-expert series; 4 GPUs x 4 statistics per phase
    assert len([k for k in samples if k[0] == "moe_gpu_load_tokens_per_step"]) == 3 * 4 * 4
    assert series_count(exporter.collect()) == len(samples)
    # a run without layer timings has no timing series at all
    assert not [k for k in samples if k[0] in ("moe_alltoall_share_ratio", "moe_overlap_ratio", "moe_layer_seconds")]


def test_timing_series_are_the_time_pages(redis_url):
    """With layer timings: all-to-all share (dispatch, combine), overlap and layer seconds (mean, p99) per phase,
    from dashboard.analytics.timing on the same window, 3 phases x 5 series more than without."""
    import numpy as np

    from moe_monitor.dashboard.analytics import timing

    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "tim", steps=20, num_layers=2, num_experts=8, gpus=2, world_size=2)
    untimed = RunExporter(client, redis_url, ["tim"], window_steps=100)
    untimed.poll()
    without = series_count(untimed.collect())
    for step in range(20):
        for rank in range(2):
            lay = np.array([1e-3 * (1 + step % 4), 2e-3], np.float32)
            client.xadd(core.timings_key("tim"), core.encode_timing(core.TimingRecord(
                run="tim", rank=rank, world_size=2, step=step, time_s=1.7e9, dispatch_s_L=lay * 0.25,
                compute_s_L=lay * 0.5, combine_s_L=lay * 0.125, layer_s_L=lay)))
    exporter = RunExporter(client, redis_url, ["tim"], window_steps=100)
    exporter.poll()
    registry = CollectorRegistry()
    registry.register(exporter)
    samples = _samples(generate_latest(registry).decode())
    assert series_count(exporter.collect()) == without + 3 * 5 == len(samples)
    for phase in ("both", "prefill", "decode"):
        assert _value(samples, "moe_alltoall_share_ratio", run="tim", phase=phase, kind="dispatch") == pytest.approx(0.25)
        assert _value(samples, "moe_alltoall_share_ratio", run="tim", phase=phase, kind="combine") == pytest.approx(0.125)
        assert _value(samples, "moe_overlap_ratio", run="tim", phase=phase) == 0.0  # 0.875 of the layer: none hidden
    steps = [s for s in range(20) if s % 2 == 1]  # decode steps (synthfill: odd steps)
    per_step_layer = [v for s in steps for v in (1e-3 * (1 + s % 4), 2e-3)]
    assert _value(samples, "moe_layer_seconds", run="tim", phase="decode", stat="mean") == pytest.approx(
        np.mean(per_step_layer), rel=1e-6)
    assert _value(samples, "moe_layer_seconds", run="tim", phase="both", stat="p99") == pytest.approx(
        timing.layer_seconds(np.array([[[1e-3 * (1 + s % 4), 2e-3]] * 2 for s in range(20)], np.float32))[1], rel=1e-6)


def test_a_redis_that_goes_away_is_exported_not_raised(redis_server):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    exporter = RunExporter(core.connect(url, timeout_s=0.3, retries=0), url, None)
    exporter.poll()
    registry = CollectorRegistry()
    registry.register(exporter)
    samples = _samples(generate_latest(registry).decode())
    assert _value(samples, "moe_exporter_redis_up") == 0 and "Error" in exporter.error


def test_the_cli_serves_both_formats_on_loopback(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "cli", steps=12, num_layers=2, num_experts=8, gpus=2)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moe_monitor", "export", "--redis", redis_url, "--port", str(port),
                             "--interval-s", "0.5"], cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()
        assert f"serving http://127.0.0.1:{port}/metrics" in first and "series" in first, first
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert _value(_samples(text), "moe_steps_total", run="cli") == 12
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        families = {f.name for f in parse_openmetrics(urllib.request.urlopen(request, timeout=5).read().decode())}
        assert {"moe_balancedness_ratio", "moe_steps", "moe_collector_up"} <= families
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_grafana_dashboard_and_the_alerts_use_only_exported_metrics(redis_url):
    """Every moe_* metric the Grafana dashboard or an alerting rule queries is one the exporter serves (a
    renamed metric would leave a blank panel or a rule that never fires)."""
    import json
    import re

    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "names", steps=10, num_layers=2, num_experts=8, gpus=2)
    swapped = np.array([[4, 5, 6, 7, 0, 1, 2, 3]] * 2, dtype=np.int32)
    for step, time_s, layout_LP in ((3, 1000.0, swapped), (6, 1600.0, swapped[:, ::-1].copy())):
        client.xadd(core.layouts_key("names"), core.encode_layout_record(core.LayoutRecord(
            run="names", step=step, time_s=time_s, layout_LP=layout_LP, gpus=2, source="engine")))
    exporter = RunExporter(client, redis_url, ["names"])
    exporter.poll()
    registry = CollectorRegistry()
    registry.register(exporter)
    served = {name for name, _ in _samples(generate_latest(registry).decode())}
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "moe-load.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    used = set(re.findall(r"\bmoe_[a-z_]+", " ".join(exprs) + rules))
    assert used and used <= served, sorted(used - served)
    assert len(dashboard["panels"]) >= 8 and dashboard["uid"] == "moe-load"


def test_per_layer_and_top_expert_series_only_on_request_and_capped(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "card", steps=20, num_layers=4, num_experts=16, gpus=4)
    counts = {}
    for options in ({}, {"per_layer": True}, {"top_experts": 5}):
        exporter = RunExporter(client, redis_url, ["card"], **options)
        exporter.poll()
        families = {f.name: f for f in exporter.collect()}
        counts[tuple(options)] = series_count(families.values())
        if options.get("per_layer"):
            layers = {s.labels["layer"] for s in families["moe_layer_balancedness_ratio"].samples}
            assert layers == {"0", "1", "2", "3"}
        if options.get("top_experts"):
            both = [s for s in families["moe_expert_tokens_per_step"].samples if s.labels["phase"] == "both"]
            values = [s.value for s in both]
            assert len(both) == 5 and values == sorted(values, reverse=True)
    assert counts[("per_layer",)] - counts[()] == 3 * 4       # 4 layers x 3 phases
    assert counts[("top_experts",)] - counts[()] == 3 * 5     # 5 experts x 3 phases
    with pytest.raises(ValueError, match="top-experts"):
        RunExporter(client, redis_url, ["card"], top_experts=10_000)


def test_rebalance_advisor_gauges_are_the_advisors_and_computed_at_most_every_interval(redis_url):
    from moe_monitor.dashboard.whatif.advice import advice_on_window

    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "adv", steps=40, num_layers=4, num_experts=16, gpus=4)
    exporter = RunExporter(client, redis_url, ["adv"], window_steps=100, advise_every_s=3600)
    exporter.poll()
    registry = CollectorRegistry()
    registry.register(exporter)
    samples = _samples(generate_latest(registry).decode())

    watched = WatchedRun(RedisSource(client, redis_url, "adv", 100), 100)
    watched.tick()
    window = watched.window
    layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size)
    for phase in ("both", "decode", "prefill"):
        snap = analyse(window, layout, phase)
        want = advice_on_window(window.counts_CLE[snap.view.slots_T], layout.layout_LP, layout.gpus,
                                watched.source.meta())
        assert _value(samples, "moe_rebalance_predicted_gain_ratio", run="adv", phase=phase) == \
            pytest.approx(want.gain_ratio)
        assert _value(samples, "moe_rebalance_moves", run="adv", phase=phase) == want.moves
        assert _value(samples, "moe_rebalance_migration_cost_ratio", run="adv", phase=phase) == \
            pytest.approx(want.migration_ratio)
    decided_at = exporter._advice["adv"][0]
    synthfill.fill(client, "adv", steps=10, num_layers=4, num_experts=16, gpus=4, first_step=40, seed=3)
    exporter.poll()  # within the interval: the steps are read, the advisor is not asked again
    assert exporter._advice["adv"][0] == decided_at
    assert _value(_samples(generate_latest(registry).decode()), "moe_steps_total", run="adv") == 50
    with pytest.raises(ValueError, match="advise-every-s"):
        RunExporter(client, redis_url, ["adv"], advise_every_s=0)


def test_the_help_text_documents_the_rebalance_gauges():
    out = in_process("export", "--help").stdout
    for name in ("moe_rebalance_predicted_gain_ratio", "moe_rebalance_moves", "--advise-every-s"):
        assert name in out


def test_a_poll_publishes_after_its_catch_up_time_and_the_next_polls_read_the_rest(redis_url, monkeypatch):
    from moe_monitor.exporter import server

    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "late", steps=10, num_layers=4, num_experts=16, gpus=4, world_size=1)
    exporter = RunExporter(client, redis_url, ["late"], window_steps=100)
    exporter.poll()
    synthfill.fill(client, "late", steps=50, first_step=10, num_layers=4, num_experts=16, gpus=4, meta=False)
    monkeypatch.setattr(server, "CATCH_UP_S", 0.0)  # one tick a poll: after an outage, publish at once
    exporter._watched["late"].max_entries_per_tick = 20
    seen = []
    for _ in range(4):
        exporter.poll()
        registry = CollectorRegistry()
        registry.register(exporter)
        seen.append(_value(_samples(generate_latest(registry).decode()), "moe_steps_total", run="late"))
    assert seen[0] == 30 and seen[-1] == 60 and seen == sorted(seen)  # one tick published, the rest later
