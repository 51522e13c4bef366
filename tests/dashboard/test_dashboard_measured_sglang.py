"""End to end from SGLang's per_pass dumps to the GPU panel: dumps written the way SGLang's recorder writes them
(the real DeepSeek-V3 counts of tests/data split over 4 ranks and 3 passes, on a layout with 32 redundant slots),
published by the bridge into a real redis-server, shown by the app in Streamlit's AppTest. The section's numbers
equal dashboard.analytics.measured computed here from the dumps' own arrays."""
from __future__ import annotations

import numpy as np

from moe_monitor.core.sglang_records import logical_counts
from moe_monitor.dashboard.analytics.measured import compare, even_estimate
from tests.collectors.test_sglang_bridge import (  # noqa: F401 (real: a fixture)
    GPUS,
    T0,
    K,
    bridge_once,
    real,
)
from tests.collectors.test_sglang_physical import write_dump
from tests.support.apptest import open_page, run_app


def test_the_bridge_s_physical_records_on_the_gpu_panel(tmp_path, redis_server, monkeypatch, real):  # noqa: F811
    redis_server.client().flushdb()
    layout_LP = real["layout_a"]
    written = write_dump(tmp_path, real["decode"], layout_LP, first_pass=40, passes=3, time_s=T0, seed=7)
    rc, lines = bridge_once(tmp_path, redis_server.url, "sgl-measured", top_k=K)
    assert rc == 0, lines
    steps = [40, 41, 42]
    physical_TLP = np.stack([sum(written[(rank, step)] for rank in range(GPUS)) for step in steps])
    measured_TLG = physical_TLP.reshape(len(steps), physical_TLP.shape[1], GPUS, -1).sum(axis=3)
    counts_TLE = logical_counts(physical_TLP, layout_LP, 256)
    want = compare(even_estimate(counts_TLE, layout_LP, 256, GPUS), steps, measured_TLG, steps)
    assert np.isfinite(want.won_T).all()

    at = run_app(redis_server.url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["estimated, step 42"] == f"{want.estimated_T[-1]:.3f}"
    assert metrics["measured, step 42"] == f"{want.measured_T[-1]:.3f}"
    assert metrics["what the balancer won"] == f"{want.won_T[-1]:+.3f}"
    assert any("3 of 3 steps in view have every rank's physical record" in c.value for c in at.caption)
