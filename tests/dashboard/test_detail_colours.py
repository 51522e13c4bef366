"""The detail figures of the Overview and the Devices page coloured by their rule (dashboard.analytics.levels) in
Streamlit's AppTest against a real redis-server: a run whose every token goes to one GPU reads red, its clean
collector counters green, and an evenly routed run's per-step imbalance green."""
import time

import numpy as np
import pytest
from streamlit.proto.Metric_pb2 import Metric as MetricProto

from moe_monitor import core
from tests.support import synthfill
from tests.support.apptest import open_page, run_app

pytestmark = pytest.mark.app
RED, GREEN = MetricProto.MetricColor.RED, MetricProto.MetricColor.GREEN


def _metric(at, label: str):
    return next(m for m in at.metric if m.label == label)


def test_a_lopsided_run_reads_red_and_its_clean_counters_green(redis_url, monkeypatch):
    synthfill.fill_skewed(core.connect(redis_url, timeout_s=2.0), "skew")  # balancedness 1/4
    at = run_app(redis_url, monkeypatch, phase="auto")
    bad = _metric(at, "balancedness, window per-step mean (p50)")
    assert float(bad.value) == 0.25 and bad.proto.color == RED and bad.proto.delta == "bad"
    assert "Good at 0.90 or above, bad at 0.80 or below" in bad.help
    idle = _metric(at, "idle share (1 - eta, window mean)")
    assert idle.value.startswith("75") and idle.proto.color == RED
    dropped = _metric(at, "dropped steps (collectors)")
    assert dropped.value == "0" and dropped.proto.color == GREEN and dropped.proto.delta == "good"
    assert _metric(at, "step imbalance p99").proto.color == RED
    assert not _metric(at, "steps/s").proto.delta  # no rule, no colour

    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    assert _metric(at, "step imbalance p50").proto.color == RED
    line = next(md.value for md in at.markdown if "Per-step vs window-sum imbalance" in md.value)
    assert ":red[**4" in line and ":green[" not in line


def test_an_even_run_reads_green_on_devices(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    run, rng, now = "even", np.random.default_rng(0), time.time()
    client.set(core.meta_key(run), core.encode_meta(synthfill.make_meta(run, 2, 16, gpus=4)))
    for step in range(40):
        counts = rng.multinomial(40_000, np.full(16, 1 / 16), size=2).astype(np.int32)
        client.xadd(core.steps_key(run), core.encode_step(core.StepRecord(
            run=run, rank=0, world_size=1, step=step, time_s=now - 40 + step, phase="decode",
            tokens=int(counts.sum()), counts_LE=counts)))
    client.zadd(core.RUNS_KEY, {run: now})
    at = run_app(redis_url, monkeypatch, phase="auto")
    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    good = _metric(at, "step imbalance p99")
    assert float(good.value) < 1.1 and good.proto.color == GREEN and good.proto.delta == "good"
    assert _metric(at, "share of the ideal").proto.color == GREEN
