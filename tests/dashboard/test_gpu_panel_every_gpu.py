"""The GPU panel's all-GPU view in AppTest against a real redis-server: every EP GPU is a row of each NVML
heatmap and of the latest-readings table, the GPU the Overview names is marked (outlined, first in the table,
labelled on the clock-against-load chart) and the single-GPU detail opens on it."""
from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa

from moe_monitor import core
from tests.support import synthfill
from tests.support.apptest import open_page, run_app

SLOTS = 2  # experts per GPU (contiguous layout: expert e on GPU e // SLOTS)


def nvml_reading(rank: int, slow_gpu: int, k: int) -> dict:
    """Rank's device at its k-th sample: the slow GPU runs its SM clock at 1410 MHz and hot, the others at 1980."""
    slow = rank == slow_gpu
    return {"index": rank % 8, "name": "H100", "uuid": f"GPU-{rank}", "gpu_utilization_percent": 90 if slow else 70,
            "memory_used_bytes": (60 + rank % 5) << 30, "memory_total_bytes": 80 << 30,
            "power_usage_w": 650.0 if slow else 480.0 + 10 * (k % 4), "power_limit_w": 700.0,
            "sm_clock_mhz": 1410 if slow else 1980, "temperature_c": 83 if slow else 60 + rank % 4}


def fill_gpus(client, run: str, gpus: int, hot_gpu: int, slow_gpu: int, steps: int = 12, samples: int = 20,
              now_s: float | None = None, hot_share: float = 0.5) -> None:
    """A run of `gpus` ranks on `gpus` EP GPUs (8 to a node) whose hot expert sits on hot_gpu (the straggler),
    its steps and `samples` NVML readings per rank, one a second, ending now; slow_gpu reads low clocks."""
    now = time.time() if now_s is None else now_s
    experts = gpus * SLOTS
    client.set(core.meta_key(run), core.encode_meta(synthfill.make_meta(
        run, 2, experts, gpus, nodes=max(1, gpus // 8), world_size=gpus)))
    rng = np.random.default_rng(0)
    pipe = client.pipeline(transaction=False)
    for step in range(steps):
        for rank in range(gpus):
            counts = synthfill.skewed_counts(rng, 2, experts, 64, hot_expert=hot_gpu * SLOTS, hot_share=hot_share)
            pipe.xadd(core.steps_key(run), core.encode_step(core.StepRecord(
                run=run, rank=rank, world_size=gpus, step=step, time_s=now - steps + step, phase="decode",
                tokens=64, counts_LE=counts)))
    for k in range(samples):
        for rank in range(gpus):
            pipe.xadd(core.gpu_key(run), core.encode_gpu_sample(core.GpuSample(
                rank=rank, host=f"node-{rank // 8}", time_s=now - samples + 1 + k, status="ok",
                gpus=[nvml_reading(rank, slow_gpu, k)])))
    pipe.zadd(core.RUNS_KEY, {run: now})
    pipe.execute()


def charts(at) -> list[tuple[dict, dict]]:
    """Each Vega-Lite chart on the page: (spec, name -> rows of each dataset)."""
    out = []
    for element in at.get("vega_lite_chart"):
        data = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pylist() for d in element.proto.datasets}
        out.append((json.loads(element.proto.spec), data))
    return out


def test_every_gpu_is_a_row_and_the_straggler_is_marked(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    fill_gpus(client, "all32", gpus=32, hot_gpu=5, slow_gpu=5)
    at = run_app(redis_url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert [s.value for s in at.subheader][:2] == ["Every GPU", "One GPU"]
    assert any("red outline: GPU 5, the GPU the Overview names" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    table = at.dataframe[0].value
    assert len(table) == 32 and table.iloc[0]["GPU"] == "GPU 5" and bool(table.iloc[0]["named"])
    assert table.iloc[0]["SM clock MHz"] == 1410 and table.iloc[0]["NVML device"] == "node-0 #5"
    assert (table.iloc[1:]["SM clock MHz"] == 1980).all()
    drawn = charts(at)
    heat = [(spec, data) for spec, data in drawn if "cells" in data]
    assert sorted(spec["title"]["text"] for spec, _ in heat) == [  # in two columns: AppTest reads column by column
        "SM clock (MHz, bin mean)", "memory used (GiB, bin mean)", "power (W, bin mean)", "temperature (C, bin mean)",
        "utilisation (time-based) (%, bin mean)"]
    for spec, data in heat:  # rows by index, named in the spec
        assert spec["params"][0] == {"name": "rowNames", "value": [f"GPU {g}" for g in range(32)]}
        assert spec["params"][1]["value"][5] == "node-0 #5"
        assert spec["layer"][0]["encoding"]["y"]["scale"]["domain"] == list(range(32))
        assert data["marked"] == [{"row": 5}]
        assert {c["row"] for c in data["cells"]} == set(range(32))
    clock = next(data for spec, data in heat if spec["title"]["text"].startswith("SM clock"))
    clocks = {(c["row"], c["value"]) for c in clock["cells"]}
    assert {v for r, v in clocks if r == 5} == {1410} and {v for r, v in clocks if r != 5} == {1980}
    scatter = next(data["main"] for spec, data in drawn if "Latest SM clock against expert load" in spec["title"]["text"])
    assert len(scatter) == 32 and [p["name"] for p in scatter if p["series"] != "other GPUs"] == ["GPU 5"]
    # the detail below opens on the named GPU
    assert [m.label for m in at.metric if m.label.endswith("expert load, latest step")] == \
        ["GPU 5 (node 0) expert load, latest step"]
    assert next(m.value for m in at.metric if m.label == "SM clock") == "1410 MHz"


def test_the_number_input_and_the_overview_link_still_pick_the_detail(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    fill_gpus(client, "all8", gpus=8, hot_gpu=2, slow_gpu=6)
    at = run_app(redis_url, monkeypatch)
    at.query_params["gpu"] = "6"
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert at.number_input(key="gpu_panel_gpu").value == 6
    assert next(m.value for m in at.metric if m.label == "SM clock") == "1410 MHz"
    assert at.dataframe[0].value.iloc[0]["GPU"] == "GPU 2"  # the table still puts the named GPU first
    at.number_input(key="gpu_panel_gpu").set_value(-1).run()
    assert [m.label for m in at.metric if m.label.endswith("expert load, latest step")] == \
        ["GPU 2 (node 0) expert load, latest step"]


def test_devices_are_rows_by_host_when_no_pairing_is_claimed(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "unpaired", steps=8, world_size=1, gpus=4, num_experts=16, gpu_status="none")
    now = time.time()
    for k in range(5):  # one collector on one host reports 4 devices
        client.xadd(core.gpu_key("unpaired"), core.encode_gpu_sample(core.GpuSample(
            rank=0, host="box", time_s=now - 5 + k, status="ok", gpus=[nvml_reading(i, 3, k) for i in range(4)])))
    at = run_app(redis_url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert any("Rows: NVML devices by host and index (not paired: 1 rank(s) for 4 EP GPUs" in c.value
               and "none outlined" in c.value for c in at.caption), [c.value for c in at.caption]
    table = at.dataframe[0].value
    assert table["GPU"].tolist() == ["box #0", "box #1", "box #2", "box #3"]
    assert "expert load" not in " ".join(table.columns)
    heat = [data for _, data in charts(at) if "cells" in data]
    assert len(heat) == 5 and all(data["marked"] == [] for data in heat)


def test_a_run_without_nvml_samples_shows_the_expert_load_alone(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "nonvml", steps=8, world_size=2, gpus=2, num_experts=16, gpu_status="none")
    at = run_app(redis_url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert [i.value for i in at.info] == ["The collector has not sent any NVML sample for this run yet."]
    assert not at.subheader and not at.dataframe and len(at.get("vega_lite_chart")) == 1


def test_without_a_straggler_no_gpu_is_marked_as_named(redis_url, monkeypatch):
    """An even run: the Overview names no GPU, so no row is outlined or called named (the busiest GPU was, before);
    the detail still opens on the busiest GPU."""
    client = core.connect(redis_url, timeout_s=2.0)
    fill_gpus(client, "even8", gpus=8, hot_gpu=0, slow_gpu=6, hot_share=0.0, steps=40)
    at = run_app(redis_url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert any("none outlined: the Overview names no persistent straggler" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    assert not at.dataframe[0].value["named"].any()
    heat = [data for _, data in charts(at) if "cells" in data]
    assert heat and all(data["marked"] == [] for data in heat)
    assert len([m for m in at.metric if m.label.endswith("expert load, latest step")]) == 1
