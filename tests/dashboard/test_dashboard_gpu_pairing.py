"""The GPU panel pairs EP GPU g with the NVML device that rank g reported, never by sort order, and says
so when no pairing can be claimed. Real redis-server, AppTest."""
import time

from moe_monitor import core
from tests.support import synthfill
from tests.support.apptest import open_page, run_app


def nvml(client, run, rank, host, index, util):
    gpu = {"index": index, "name": "H200", "uuid": f"GPU-{host}-{index}", "gpu_utilization_percent": util,
           "memory_used_bytes": 1 << 30, "memory_total_bytes": 8 << 30, "power_usage_w": 300.0,
           "power_limit_w": 700.0, "sm_clock_mhz": 1980, "temperature_c": 50}
    sample = core.GpuSample(rank=rank, host=host, time_s=time.time(), status="ok", gpus=[gpu])
    client.xadd(core.gpu_key(run), core.encode_gpu_sample(sample))


def test_ep_gpu_is_paired_with_its_ranks_device(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "pair", steps=8, world_size=2, gpus=2, num_experts=16, gpu_status="none",
                   time0_s=time.time() - 60)
    nvml(client, "pair", rank=0, host="node-b", index=3, util=11)  # sorted by host it would come second
    nvml(client, "pair", rank=1, host="node-a", index=0, util=77)
    at = run_app(redis_url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert any("NVML device 3 on `node-b`" in c.value and "beside EP GPU 0 (rank 0)" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    assert next(m.value for m in at.metric if m.label.startswith("utilisation")) == "11 %"


def test_no_pairing_is_claimed_when_ranks_do_not_match_gpus(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "nopair", steps=8, world_size=1, gpus=4, num_experts=16, gpu_status="none")
    nvml(client, "nopair", rank=0, host="node-a", index=0, util=40)
    at = run_app(redis_url, monkeypatch)
    open_page(at, "page_files/gpus.py")
    assert not at.exception, at.exception
    assert any("not paired: 1 rank(s) for 4 EP GPUs" in c.value for c in at.caption), [c.value for c in at.caption]
    assert any("(not paired with an EP GPU)" in c.value for c in at.caption)
