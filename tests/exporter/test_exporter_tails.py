"""The exporter's per-step gauges against a run in the tests' own redis-server: moe_step_imbalance_ratio and
moe_expert_skew_ratio (p99) under the run's dispatch policy are core.steptails on the same steps, per phase, and
a poll solves only the steps that arrived since the last."""
from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from moe_monitor import core
from moe_monitor.core.steptails import step_tails
from moe_monitor.exporter.server import RunExporter
from tests.support import synthfill
from tests.support.solvecount import count_solved_steps

L, E, G = 4, 16, 4
LAYOUT = [[*range(E), 0, 1, 2, 3] for _ in range(L)]  # experts 0-3 twice: P = 20, 5 slots per GPU


def _scrape(exporter: RunExporter) -> dict[tuple, float]:
    registry = CollectorRegistry()
    registry.register(exporter)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def _fill(client, run: str, steps: int, policy: str | None, first_step: int = 0, seed: int = 0) -> np.ndarray:
    totals = synthfill.fill(client, run, steps=steps, num_layers=L, num_experts=E, gpus=G, meta=False,
                            first_step=first_step, seed=seed)
    if policy is not None:
        meta = synthfill.make_meta(run, L, E, G, layout=LAYOUT)
        meta.dispatch = policy
        client.set(core.meta_key(run), core.encode_meta(meta))
    return np.stack(totals)


@pytest.mark.parametrize("policy", ["lp", "round_robin"])
def test_per_step_gauges_are_core_steptails_under_the_runs_policy(redis_url, policy):
    client = core.connect(redis_url, timeout_s=2.0)
    run = f"tails-{policy.replace('_', '-')}"
    counts_TLE = _fill(client, run, 24, policy)
    exporter = RunExporter(client, redis_url, [run], window_steps=100)
    exporter.poll()
    samples = _scrape(exporter)
    for phase, keep in (("both", slice(None)), ("prefill", slice(0, None, 2)), ("decode", slice(1, None, 2))):
        want = step_tails(counts_TLE[keep], np.asarray(LAYOUT), G, policy)
        labels = dict(run=run, phase=phase, dispatch=policy, stat="p99")
        assert _value(samples, "moe_step_imbalance_ratio", **labels) == pytest.approx(want.imbalance_summary()["p99"])
        assert _value(samples, "moe_expert_skew_ratio", **labels) == pytest.approx(want.skew_summary()["p99"])
    assert sum(1 for name, _ in samples if name in ("moe_step_imbalance_ratio", "moe_expert_skew_ratio")) == 6


def test_a_poll_solves_only_the_new_steps(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    first = _fill(client, "tails-new", 10, "lp")
    exporter = RunExporter(client, redis_url, ["tails-new"], window_steps=100)
    solved = count_solved_steps(monkeypatch)
    exporter.poll()
    assert sum(solved) == 10  # three phases, each step solved once
    later = _fill(client, "tails-new", 4, None, first_step=10, seed=1)
    exporter.poll()
    assert sum(solved) == 14
    want = step_tails(np.concatenate([first, later]), np.asarray(LAYOUT), G, "lp")
    assert _value(_scrape(exporter), "moe_step_imbalance_ratio", run="tails-new", phase="both", dispatch="lp",
                  stat="p99") == pytest.approx(want.imbalance_summary()["p99"])


def test_a_run_without_metadata_is_even(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "tails-plain", steps=8, num_layers=2, num_experts=8, gpus=2)  # the default policy: even
    exporter = RunExporter(client, redis_url, ["tails-plain"])
    exporter.poll()
    samples = _scrape(exporter)
    assert ("moe_step_imbalance_ratio", (("dispatch", "even"), ("phase", "both"), ("run", "tails-plain"),
                                         ("stat", "p99"))) in samples
