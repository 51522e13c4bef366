"""Every page rendered by streamlit.testing.v1.AppTest against a real redis-server filled by the real
collector (tests/support/realfill.py: a tiny transformers MoE model with collectors.attach). The expected numbers
are recomputed here from the raw stream entries with plain loops, independent of dashboard.analytics."""

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from moe_monitor import core
from tests.support.apptest import app_test, open_page, whole

RUN = "pages-run"


@pytest.fixture(scope="module")
def filled(redis_server):
    from tests.support.realfill import fill_with_collector

    redis_server.client().flushdb()
    fill_with_collector(redis_server.url, RUN, steps=30)
    return redis_server.url


def expected(url: str, run: str, phase: str = "both") -> dict:
    """Per-step counts (ranks summed) straight from the stream, and the numbers the pages must show."""
    client = core.connect(url, timeout_s=2.0)
    meta = core.decode_meta(client.get(core.meta_key(run)))
    steps: dict[int, list] = {}
    for _, fields in client.xrange(core.steps_key(run)):
        rec = core.decode_step(fields)
        entry = steps.setdefault(rec.step, [np.zeros_like(rec.counts_LE, dtype=np.int64), set()])
        entry[0] += rec.counts_LE
        entry[1].add(rec.phase)
    keep = [s for s in sorted(steps) if phase == "both" or steps[s][1] == {phase}]
    p2l, gpus = meta.layout.physical_to_logical_map, meta.layout.gpus
    slots_per_gpu = len(p2l[0]) // gpus

    def loads(counts_LE):  # even split over replicas, one slot at a time
        out = np.zeros((len(p2l), gpus))
        for layer, row in enumerate(p2l):
            for slot, expert in enumerate(row):
                out[layer, slot // slots_per_gpu] += counts_LE[layer, expert] / row.count(expert)
        return out

    per_step = [loads(steps[s][0]) for s in keep]
    latest = per_step[-1]
    eta_now = [l.mean() / l.max() for l in latest if l.max() > 0]
    mean_load_G = np.mean([l.sum(axis=0) for l in per_step], axis=0)
    wins = np.zeros(gpus)  # per (step, layer): which GPU the layer waits for
    for l_G in (row for step_loads in per_step for row in step_loads):
        if l_G.max() > 0:
            wins[int(np.argmax(l_G))] += 1
    window_LE = sum(steps[s][0] for s in keep)
    hot = np.unravel_index(np.argmax(window_LE), window_LE.shape)
    return {"steps": len(keep), "eta_now_p50": float(np.percentile(eta_now, 50)),
            "straggler": int(np.argmax(wins)), "straggler_sum": int(np.argmax(mean_load_G)), "hot": (int(hot[0]), int(hot[1])), "meta": meta}


def app(url, monkeypatch) -> AppTest:
    monkeypatch.setenv("REDIS_URL", url)
    at = app_test().run()
    assert not at.exception, at.exception
    return whole(at)


def metric(at, label_start: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label_start))


def test_overview(filled, monkeypatch):
    at = app(filled, monkeypatch)
    want = expected(filled, RUN)
    assert metric(at, "balancedness now") == f"{want['eta_now_p50']:.3f}"
    assert metric(at, "bad records") == "0"
    assert metric(at, "source") == "ok" and metric(at, "collector errors") == "0"
    assert metric(at, "collector last wrote").endswith("s ago")
    assert any(f"Busiest GPU over the window: GPU {want['straggler']} " in md.value and "(step, layer) pairs" in md.value
               for md in at.markdown)
    assert len(at.get("vega_lite_chart")) == 2 and not at.get("plotly_chart")  # the answer; the latest step
    at.sidebar.selectbox(key="layer_choice").set_value("all layers (sum)").run()
    assert any(f"Busiest GPU over the window: GPU {want['straggler_sum']} " in md.value and "GPU load of all layers summed" in md.value
               for md in at.markdown)
    assert any(f"{want['steps']} steps in window" in c.value for c in at.caption)
    assert not at.error


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_phase_filter_applies(filled, monkeypatch, phase):
    at = app(filled, monkeypatch)
    at.sidebar.radio(key="phase").set_value(phase).run()
    assert not at.exception, at.exception
    want, both = expected(filled, RUN, phase), expected(filled, RUN)
    assert 0 < want["steps"] < both["steps"]  # the real run has both phases
    assert any(f"phase: {phase} · {want['steps']} steps in window" in c.value for c in at.caption)
    assert metric(at, "balancedness now") == f"{want['eta_now_p50']:.3f}"
    open_page(at, "page_files/experts.py")
    assert not at.exception and any(f"phase: {phase}" in c.value for c in at.caption)


def test_devices(filled, monkeypatch):
    at = app(filled, monkeypatch)
    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    assert len(at.get("vega_lite_chart")) == 5 and not at.get("plotly_chart")
    assert any("Per-step vs window-sum imbalance" in md.value for md in at.markdown)


def test_experts(filled, monkeypatch):
    at = app(filled, monkeypatch)
    open_page(at, "page_files/experts.py")
    assert not at.exception, at.exception
    assert len(at.get("vega_lite_chart")) == 3  # layer x expert, expert x time, drift (staleness: on request)
    want = expected(filled, RUN)
    assert any(h.value.startswith(f"The experts of GPU {want['straggler']} (node ") for h in at.subheader)
    mine, top = at.dataframe[0].value, at.dataframe[1].value
    assert 0 < mine["share of the GPU's tokens"].sum() <= 1.0 + 1e-9
    layer, expert = want["hot"]
    assert (int(top.iloc[0]["layer"]), int(top.iloc[0]["expert"])) == (layer, expert)
    row = want["meta"].layout.physical_to_logical_map[layer]
    per_gpu = len(row) // want["meta"].layout.gpus
    assert top.iloc[0]["GPUs"] == ", ".join(str(g) for g in sorted({p // per_gpu for p, e in enumerate(row)
                                                                     if e == expert}))


def test_gpu_panel_without_nvidia_gpu(filled, monkeypatch):
    at = app(filled, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    nvml = [w.value for w in at.warning if "No NVIDIA GPU / NVML not available" in w.value]
    assert len(nvml) == 1 and "(rank 0)" in nvml[0], nvml  # once for the run
    straggler = expected(filled, RUN)["straggler"]
    loads = [m for m in at.metric if m.label.endswith("expert load, latest step")]
    assert len(loads) == 1 and loads[0].label.startswith(f"GPU {straggler} (") and loads[0].value.endswith("tokens")
    assert len(at.get("vega_lite_chart")) == 1  # the expert load alone: no NVML readings
    at.query_params["gpu"] = "1"  # the Overview's drill-down link
    open_page(at, "page_files/gpus.py")
    assert [m.label for m in at.metric if m.label.endswith("expert load, latest step")] == \
        ["GPU 1 (node 0) expert load, latest step"]
    assert at.number_input(key="gpu_panel_gpu").value == 1 and "gpu" not in at.query_params
