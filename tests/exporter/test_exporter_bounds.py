"""The exporter is bounded, against the tests' own redis-server: one memory budget for every run it watches (600
tiny all-zero records of L=800 x E=1000 stay within it, measured in a child process), at most --max-gpus GPUs
with series of their own per run and phase and --max-series series in all (a run declaring 65,536 GPUs is a few
hundred series, not half a million, and says it was truncated), and runs that left moe:runs are forgotten."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.exporter.caps import DEFAULT_MAX_GPUS, DEFAULT_MAX_SERIES, ESSENTIAL, cap_series, top_gpus
from moe_monitor.exporter.metrics import series_count
from moe_monitor.exporter.server import RunExporter
from tests.support import memprobe, synthfill
from tests.support.cli import in_process

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def _scrape(exporter: RunExporter) -> tuple[dict[tuple, float], int]:
    registry = CollectorRegistry()
    registry.register(exporter)
    body = generate_latest(registry)
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, len(body)


def _named(samples, name):
    return {labels: value for (n, labels), value in samples.items() if n == name}


def _wide_run(client, run: str, gpus: int = 65536, experts: int = 256, steps: int = 6) -> None:
    """A run of 1 layer whose metadata declares `gpus` GPUs (one slot each, experts replicated over them)."""
    layout = core.contiguous_layout(1, experts, gpus)
    client.set(core.meta_key(run), core.encode_meta(synthfill.make_meta(run, 1, experts, gpus, layout=layout)))
    rng = np.random.default_rng(0)
    t0 = time.time() - steps
    pipe = client.pipeline(transaction=False)
    for step in range(steps):
        counts = rng.integers(0, 50, size=(1, experts), dtype=np.int32)
        counts[0, 3] = 5000  # expert 3 is hot: its replicas' GPUs lead
        pipe.xadd(core.steps_key(run), core.encode_step(core.StepRecord(
            run=run, rank=0, world_size=1, step=step, time_s=t0 + step, phase="decode", tokens=int(counts.sum()),
            counts_LE=counts)))
    pipe.zadd(core.RUNS_KEY, {run: time.time()})
    pipe.execute()


# ------------------------------------------------------------------------------------------ per-GPU and global caps
def test_a_run_declaring_65536_gpus_is_capped_and_says_so(redis_url):
    client = core.connect(redis_url, timeout_s=5.0)
    _wide_run(client, "wide")
    # a small budget: the advisor's tables for 65,536 GPUs do not fit it, so it is skipped (its time is the planner's)
    exporter = RunExporter(client, redis_url, None, window_steps=50, memory_budget=64 * MIB)
    exporter.poll()
    samples, page_bytes = _scrape(exporter)
    load = _named(samples, "moe_gpu_load_tokens_per_step")
    phases = {"both", "decode"}  # every step is a decode step
    assert len(load) == len(phases) * 4 * DEFAULT_MAX_GPUS
    assert series_count(exporter.collect()) <= DEFAULT_MAX_SERIES and series_count(exporter.collect()) < 1000
    assert page_bytes < 200_000
    assert _named(samples, "moe_exporter_truncated") == {(("run", "wide"),): 1.0}
    dropped = len(phases) * 4 * (65536 - DEFAULT_MAX_GPUS)
    assert _named(samples, "moe_exporter_series_dropped_total") == {(("run", "wide"),): float(dropped)}
    # the GPUs listed are the busiest: the straggler among them; the rest summed up, counted
    straggler = int(samples[("moe_straggler_gpu", (("phase", "both"), ("run", "wide")))])
    listed = {dict(labels)["gpu"] for labels in load if dict(labels)["phase"] == "both"}
    assert str(straggler) in listed
    assert samples[("moe_gpu_rest_gpus", (("phase", "both"), ("run", "wide")))] == 65536 - DEFAULT_MAX_GPUS
    rest_mean = samples[("moe_gpu_load_rest_tokens_per_step", (("phase", "both"), ("run", "wide"), ("stat", "mean")))]
    listed_mean = [v for labels, v in load.items() if dict(labels)["phase"] == "both" and dict(labels)["stat"] == "mean"]
    assert rest_mean <= min(listed_mean)  # the busiest have series of their own
    exporter.poll()  # the counter sums over polls
    samples, _ = _scrape(exporter)
    assert _named(samples, "moe_exporter_series_dropped_total") == {(("run", "wide"),): float(2 * dropped)}


def test_a_small_run_is_not_truncated_and_lists_every_gpu(redis_url):
    client = core.connect(redis_url, timeout_s=5.0)
    synthfill.fill(client, "small", steps=12, num_layers=2, num_experts=8, gpus=4)
    exporter = RunExporter(client, redis_url, ["small"], window_steps=50)
    exporter.poll()
    samples, _ = _scrape(exporter)
    assert _named(samples, "moe_exporter_truncated") == {(("run", "small"),): 0.0}
    assert _named(samples, "moe_exporter_series_dropped_total") == {(("run", "small"),): 0.0}
    assert len(_named(samples, "moe_gpu_load_tokens_per_step")) == 3 * 4 * 4
    assert not _named(samples, "moe_gpu_rest_gpus")
    assert samples[("moe_exporter_window_steps", (("run", "small"),))] == 50


def test_max_gpus_is_a_setting(redis_url):
    client = core.connect(redis_url, timeout_s=5.0)
    synthfill.fill(client, "eight", steps=12, num_layers=2, num_experts=16, gpus=8)
    exporter = RunExporter(client, redis_url, ["eight"], window_steps=50, max_gpus=3)
    exporter.poll()
    samples, _ = _scrape(exporter)
    both = {dict(labels)["gpu"] for labels in _named(samples, "moe_gpu_load_tokens_per_step")
            if dict(labels)["phase"] == "both"}
    assert len(both) == 3
    assert samples[("moe_gpu_rest_gpus", (("phase", "both"), ("run", "eight")))] == 5
    assert samples[("moe_exporter_truncated", (("run", "eight"),))] == 1
    with pytest.raises(ValueError, match="--max-gpus"):
        RunExporter(client, redis_url, ["eight"], max_gpus=0)


def test_the_global_series_cap_keeps_every_runs_essentials_first(redis_url):
    client = core.connect(redis_url, timeout_s=5.0)
    for index in range(4):
        synthfill.fill(client, f"run{index}", steps=12, num_layers=2, num_experts=32, gpus=16, seed=index)
    exporter = RunExporter(client, redis_url, None, window_steps=50, max_series=300)
    exporter.poll()
    assert series_count(exporter.collect()) <= 300
    samples, _ = _scrape(exporter)
    truncated = _named(samples, "moe_exporter_truncated")
    assert len(truncated) == 4 and sum(truncated.values()) >= 1
    for index in range(4):  # every run keeps its balancedness and collector health
        assert samples[("moe_collector_up", (("run", f"run{index}"),))] == 1
        assert ("moe_balancedness_ratio", (("phase", "both"), ("run", f"run{index}"), ("stat", "p50"),
                                           ("window", "window_sum"))) in samples
    dropped = _named(samples, "moe_exporter_series_dropped_total")
    assert sum(dropped.values()) > 0
    with pytest.raises(ValueError, match="--max-series"):
        RunExporter(client, redis_url, None, max_series=5)


def test_top_gpus_keeps_the_busiest_and_the_straggler():
    mean_G = np.array([1.0, 9.0, 3.0, np.nan, 9.0, 0.5])
    assert top_gpus(mean_G, 10).tolist() == [0, 1, 2, 3, 4, 5]
    assert top_gpus(mean_G, 2).tolist() == [1, 4]  # ties: the lower id first
    assert top_gpus(mean_G, 2, keep=5).tolist() == [1, 5]
    assert top_gpus(mean_G, 3).tolist() == [1, 2, 4]  # NaN counts lowest


def test_cap_series_fills_the_essentials_of_every_run_before_the_rest():
    def families(run: str) -> list:
        essential = GaugeMetricFamily(sorted(ESSENTIAL)[0], "e", labels=["run", "i"])
        extra = GaugeMetricFamily("moe_gpu_load_tokens_per_step", "x", labels=["run", "i"])
        for i in range(5):
            essential.add_metric([run, str(i)], 1.0)
            extra.add_metric([run, str(i)], 2.0)
        return [extra, essential]

    runs = [("a", families("a")), ("b", families("b"))]
    kept, dropped = cap_series(runs, 12)
    assert sum(len(f.samples) for f in kept) == 12 and dropped == {"a": 3, "b": 5}
    essential = [f for f in kept if f.name in ESSENTIAL]
    assert sum(len(f.samples) for f in essential) == 10
    assert len(runs[0][1][0].samples) == 5  # the input is left as it was


# ------------------------------------------------------------------------------------------ forgetting runs
def test_a_run_that_left_moe_runs_is_forgotten_at_the_next_poll(redis_url):
    client = core.connect(redis_url, timeout_s=5.0)
    for index in range(3):
        synthfill.fill(client, f"r{index}", steps=8, num_layers=2, num_experts=8, gpus=2, seed=index)
    budget = membudget.MemoryBudget(256 * MIB, label="the exporter's memory budget")
    exporter = RunExporter(client, redis_url, None, window_steps=50, memory_budget=budget)
    exporter.poll()
    assert sorted(exporter.watched_runs) == ["r0", "r1", "r2"]
    held = budget.reserved_bytes
    assert held > 0
    client.zrem(core.RUNS_KEY, "r1")
    exporter.poll()
    assert sorted(exporter.watched_runs) == ["r0", "r2"]
    assert budget.reserved_bytes < held  # r1's window went back to the budget
    samples, _ = _scrape(exporter)
    assert not [key for key in samples if ("run", "r1") in key[1]]
    for rounds in range(3):  # runs coming and going: the exporter holds only the listed ones
        name = f"new{rounds}"
        synthfill.fill(client, name, steps=4, num_layers=2, num_experts=8, gpus=2)
        exporter.poll()
        client.zrem(core.RUNS_KEY, name)
    exporter.poll()
    assert sorted(exporter.watched_runs) == ["r0", "r2"]


def test_named_runs_and_an_unreachable_listing_forget_nothing(redis_url):
    client = core.connect(redis_url, timeout_s=5.0)
    synthfill.fill(client, "kept", steps=8, num_layers=2, num_experts=8, gpus=2)
    exporter = RunExporter(client, redis_url, ["kept"], window_steps=50)
    exporter.poll()
    client.zrem(core.RUNS_KEY, "kept")
    exporter.poll()
    assert exporter.watched_runs == ["kept"]  # asked for by name: watched whatever moe:runs says


# ------------------------------------------------------------------------------------------ the memory finding
def test_600_tiny_records_of_800_by_1000_stay_within_the_exporters_budget(redis_url):
    """The finding: one poll of 600 all-zero records (~150 B each in Redis) took 54 s and 14 GB. Now the run's
    window holds what fits the exporter's 1 GiB default, says so, and the process stays within the budget plus the
    interpreter and one poll's temporaries."""
    client = core.connect(redis_url, timeout_s=5.0)
    memprobe.fill_zero_records(client, "zeros")
    budget = membudget.EXPORTER_DEFAULT_BYTES
    out = memprobe.run_child("exporter", redis_url, "zeros", 600, budget)
    assert 1 <= out["window_steps"] < 600 and out["exported_window_steps"] == out["window_steps"]
    assert out["note"].startswith(f"window narrowed to {out['window_steps']} of 600 steps: the exporter's memory "
                                  "budget (1.0 GiB, set --memory-budget to raise it) is shared by every exported run")
    assert out["reserved_bytes"] <= budget
    assert out["peak_rss_bytes"] < budget + 256 * MIB, out


# ------------------------------------------------------------------------------------------ the command line
def test_the_cli_takes_the_bounds_and_refuses_a_budget_that_is_not_a_size():
    help_text = in_process("export", "--help").stdout
    for flag in ("--memory-budget", "--max-gpus", "--max-series", "moe_exporter_truncated"):
        assert flag in help_text
    bad = in_process("export", "--memory-budget", "lots", "--port", "1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --memory-budget 'lots'")
    from moe_monitor.cli import export as export_cli
    assert (export_cli.DEFAULT_MAX_GPUS, export_cli.DEFAULT_MAX_SERIES) == (DEFAULT_MAX_GPUS, DEFAULT_MAX_SERIES)


def test_runs_beyond_the_listing_cap_are_counted_not_silently_dropped(redis_url, monkeypatch):
    from moe_monitor.dashboard.sources import redis as redis_source

    monkeypatch.setattr(redis_source, "MAX_RUNS", 2)
    client = core.connect(redis_url, timeout_s=5.0)
    for index in range(3):
        synthfill.fill(client, f"r{index}", steps=4, num_layers=2, num_experts=8, gpus=2, seed=index)
    client.zadd(core.RUNS_KEY, {"r0": 1.0e9, "r1": 1.1e9, "r2": 1.2e9})  # r0 oldest
    exporter = RunExporter(client, redis_url, None, window_steps=20)
    exporter.poll()
    assert sorted(exporter.watched_runs) == ["r1", "r2"]
    samples, _ = _scrape(exporter)
    assert samples[("moe_exporter_runs_left_out", ())] == 1.0
    client.zrem(core.RUNS_KEY, "r2")
    exporter.poll()
    samples, _ = _scrape(exporter)
    assert samples[("moe_exporter_runs_left_out", ())] == 0.0 and sorted(exporter.watched_runs) == ["r0", "r1"]
