"""The GPU panel's "Measured vs estimated" section in Streamlit's AppTest, against a real redis-server filled by
the real collector (ExpertLoadMonitor.record + record_physical), on a hand-worked case: the section appears only
for a run with physical records, and shows the even-split estimate, the measured ratio and what the balancer won.

Layout: 2 layers, 3 experts, 2 GPUs, 4 slots per layer: GPU 0 = [0, 1], GPU 1 = [0, 2] (expert 0 on both).
Each step routes 8 tokens to expert 0 and 4 to expert 1 in both layers. Even split: GPU 0 = 4 + 4 = 8,
GPU 1 = 4: busiest / mean = 8 / 6 = 1.333. The engine's balancer sent 2 of expert 0's tokens to GPU 0 and 6 to
GPU 1 (slots [2, 4, 6, 0]): 6 and 6, ratio 1.000; it won 0.333.
"""
from __future__ import annotations

import numpy as np
import torch

from moe_monitor.collectors import ExpertLoadMonitor
from tests.support.apptest import open_page, run_app

LAYOUT_LP = [[0, 1, 0, 2], [0, 1, 0, 2]]
IDS = torch.tensor([0] * 8 + [1] * 4).reshape(-1, 1)
PHYSICAL_LP = np.array([[2, 4, 6, 0], [2, 4, 6, 0]])


def _fill(url: str, run: str, steps: int, physical: bool) -> None:
    mon = ExpertLoadMonitor(2, 3, 1, redis_url=url, run=run, gpus=2, nvml=False, physical_to_logical_map=LAYOUT_LP)
    for _ in range(steps):
        for layer in range(2):
            mon.record(layer, IDS)
        mon.end_step("decode")
        if physical:
            mon.record_physical(PHYSICAL_LP)
    mon.close()


def _metric(at, label_start: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label_start))


def test_measured_vs_estimated_on_the_gpu_panel(redis_server, monkeypatch):
    redis_server.client().flushdb()
    _fill(redis_server.url, "measured-run", steps=6, physical=True)
    at = run_app(redis_server.url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert [s.value for s in at.subheader] == ["Measured vs estimated"]
    assert _metric(at, "estimated, step 5") == "1.333"
    assert _metric(at, "measured, step 5") == "1.000"
    assert _metric(at, "what the balancer won") == "+0.333"
    assert any("6 of 6 steps in view have every rank's physical record" in c.value for c in at.caption)
    assert len(at.get("vega_lite_chart")) == 2  # the expert load, measured vs estimated
    at.sidebar.selectbox(key="layer_choice").set_value("all layers (sum)").run()
    assert not at.exception, at.exception
    assert _metric(at, "what the balancer won") == "+0.333" and any("all layers summed" in c.value for c in at.caption)


def test_no_section_without_physical_records(redis_server, monkeypatch):
    redis_server.client().flushdb()
    _fill(redis_server.url, "logical-only", steps=3, physical=False)
    at = run_app(redis_server.url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert not at.subheader and len(at.get("vega_lite_chart")) == 1
