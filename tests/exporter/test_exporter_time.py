"""The exporter's time gauges: the Overview's verdict in time (same window, same cost model) where the run declares
its dimensions and a GPU profile (or --gpu-profile gives one), and a series saying why not otherwise."""
from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from moe_monitor import core
from moe_monitor.core.costmodel import ModelDims, TimeModel
from moe_monitor.core.hardware import GPU_PROFILES
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.exporter.metrics import series_count
from moe_monitor.exporter.server import RunExporter
from tests.exporter.test_exporter import _samples, _value
from tests.support import synthfill
from tests.support.cli import in_process

TIME_GAUGES = ("moe_predicted_moe_seconds", "moe_predicted_lost_seconds", "moe_predicted_lost_ratio",
               "moe_predicted_straggler_gpu", "moe_predicted_speedup_ratio", "moe_predicted_memory_bound_ratio")


def _fill(client, run: str, **declared) -> None:
    synthfill.fill(client, run, steps=30, num_layers=4, num_experts=16, gpus=4, world_size=2)
    meta = dataclasses.replace(synthfill.make_meta(run, 4, 16, 4, world_size=2), **declared)
    client.set(core.meta_key(run), core.encode_meta(meta))


def _scrape(exporter: RunExporter) -> dict:
    exporter.poll()
    registry = CollectorRegistry()
    registry.register(exporter)
    return _samples(generate_latest(registry).decode())


def test_time_gauges_are_the_overviews_verdict(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    _fill(client, "timed", hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=1, act_dtype_bytes=2,
          gpu_profile="H100 SXM")
    exporter = RunExporter(client, redis_url, ["timed"], window_steps=100)
    samples = _scrape(exporter)
    watched = WatchedRun(RedisSource(client, redis_url, "timed", 100), 100)  # what the Overview computes
    watched.tick()
    window = watched.window
    layout = resolve_layout(watched.source.meta(), window.num_layers, window.num_experts, watched.world_size)
    model = TimeModel(ModelDims(7168, 2048, 3, 1.0, 2.0), GPU_PROFILES["H100 SXM"], 4, 1)
    for phase in ("both", "decode", "prefill"):
        want = analyse(window, layout, phase, time_model=model).time.headline.verdict
        assert _value(samples, "moe_predicted_moe_seconds", run="timed", phase=phase) == pytest.approx(want.moe_s)
        assert _value(samples, "moe_predicted_lost_seconds", run="timed", phase=phase) == pytest.approx(want.lost_s)
        assert _value(samples, "moe_predicted_lost_ratio", run="timed", phase=phase) == pytest.approx(want.lost_share)
        assert _value(samples, "moe_predicted_straggler_gpu", run="timed", phase=phase) == want.gpu
        assert _value(samples, "moe_predicted_straggler_cause", run="timed", phase=phase, cause=want.cause) == 1
        assert _value(samples, "moe_predicted_speedup_ratio", run="timed", phase=phase) == pytest.approx(want.speedup)
        assert 0 < want.lost_s < want.moe_s
    assert _value(samples, "moe_time_model_available", run="timed", gpu_profile="H100 SXM",
                  model=model.dims.label(), reason="") == 1
    timed = [k for k in samples if k[0].startswith("moe_predicted_") or k[0] == "moe_time_model_available"]
    assert len(timed) <= 3 * 8 + 1                                           # bounded: a few per phase
    assert series_count(exporter.collect()) == len(samples)


def test_without_a_profile_the_run_says_why_and_keeps_its_tokens(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    _fill(client, "untimed")                                       # dimensions (64 x 32), no profile, no NVML
    samples = _scrape(RunExporter(client, redis_url, ["untimed"], window_steps=100))
    assert _value(samples, "moe_time_model_available", run="untimed", gpu_profile="", model="",
                  reason="no GPU profile") == 0
    assert not [k for k in samples if k[0].startswith("moe_predicted_")]
    assert _value(samples, "moe_idle_share_ratio", run="untimed", phase="both") > 0
    _fill(client, "nodims", hidden_size=0, gpu_profile="H200")
    samples = _scrape(RunExporter(client, redis_url, ["nodims"], window_steps=100))
    assert _value(samples, "moe_time_model_available", run="nodims", gpu_profile="", model="",
                  reason="no model dimensions") == 0


def test_the_gpu_profile_flag_prices_every_run(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    _fill(client, "flagged")
    samples = _scrape(RunExporter(client, redis_url, ["flagged"], window_steps=100, gpu_profile=GPU_PROFILES["H200"]))
    key = ("moe_time_model_available", (("gpu_profile", "H200"), ("model", ModelDims(64, 32).label()),
                                        ("reason", ""), ("run", "flagged")))
    assert samples[key] == 1
    assert _value(samples, "moe_predicted_moe_seconds", run="flagged", phase="decode") > 0
    r = in_process("export", "--redis", redis_url, "--run", "flagged", "--gpu-profile", "TPU v5")
    assert r.returncode == 2 and r.stderr.startswith("error: no GPU profile 'TPU v5'") and r.stdout == ""
