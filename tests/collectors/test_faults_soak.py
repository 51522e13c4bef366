"""Soak (MOE_SOAK=1 to run; 60 s of steps after the 8 start-ups: 2-3 minutes on 2 cores): 8 collector processes (ranks 0-7 of one run) at 50 steps/s each
into one private redis-server for 60 s. After warm-up the memory of Redis (its streams are trimmed to the
memory budget) and of every collector stays flat, and no step is lost: every rank publishes every step,
drops none, and the stream holds a gap-free tail of each rank's steps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_monitor import core
from moe_monitor.demo.localredis import RedisServer

pytestmark = pytest.mark.skipif(os.environ.get("MOE_SOAK") != "1", reason="soak test: set MOE_SOAK=1")

RANKS, RATE_HZ, SECONDS = 8, 50, 60
L, E, K = 8, 64, 8

COLLECTOR = """
import json, os, sys, time
import torch
from moe_monitor.collectors import ExpertLoadMonitor

def rss_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

url, steps, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
L, E, K = (int(v) for v in sys.argv[4:7])
torch.set_num_threads(1)
mon = ExpertLoadMonitor(L, E, K, redis_url=url, run="soak", gpus=8, nvml=False, memory_budget_bytes=4 << 20)
gen = torch.Generator().manual_seed(int(os.environ["RANK"]))
ids = [torch.randint(0, E, (64, K), generator=gen) for _ in range(16)]
due, start = time.monotonic(), time.monotonic()
for step in range(steps):
    for layer in range(L):
        mon.record(layer, ids[(step + layer) % 16])
    mon.end_step("decode")
    if step % (int(rate) * 5) == 0:
        print(json.dumps({"t": time.monotonic() - start, "rss": rss_bytes()}), flush=True)
    due += 1.0 / rate
    time.sleep(max(0.0, due - time.monotonic()))
mon.close(timeout_s=30)
print(json.dumps({"stats": mon.stats(), "rss": rss_bytes()}), flush=True)
"""


def _redis_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def test_eight_collectors_for_a_minute(tmp_path):
    server = RedisServer(tmp_path)
    root = Path(__file__).resolve().parents[2]
    procs = []
    try:
        for rank in range(RANKS):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(RANKS), "PYTHONPATH": str(root)}
            args = [server.url, str(RATE_HZ * SECONDS), str(RATE_HZ), str(L), str(E), str(K)]
            procs.append(subprocess.Popen([sys.executable, "-c", COLLECTOR, *args], stdout=subprocess.PIPE,
                                          text=True, env=env, cwd=root))
        client = server.client()
        redis_samples = []  # (seconds since every rank wrote, used_memory, rss) every 2.5 s while they all run
        start = time.monotonic()
        while client.hlen(core.health_key("soak")) < RANKS and time.monotonic() - start < 120:
            time.sleep(0.2)
        start = time.monotonic()
        while all(p.poll() is None for p in procs) and time.monotonic() - start < SECONDS + 60:
            info = client.info("memory")
            redis_samples.append((time.monotonic() - start, int(info["used_memory"]), _redis_rss(server.proc.pid)))
            time.sleep(2.5)
        outputs = [p.communicate(timeout=60)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outputs
        for rank, out in enumerate(outputs):
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            final = lines[-1]["stats"]
            assert final["steps"] == RATE_HZ * SECONDS and final["published_steps"] == RATE_HZ * SECONDS, (rank, final)
            assert final["dropped_steps"] == 0 and final["last_error"] == "", (rank, final)
            rss = [line["rss"] for line in lines[:-1] if line["t"] >= 15]  # after warm-up
            grew = max(rss) - rss[0], rss[-1] - min(rss)  # above the first sample; the end above the lowest
            assert grew[0] < 32 << 20 and grew[1] < 16 << 20, f"rank {rank} collector memory grew: {rss}"
        used = [u for t, u, _ in redis_samples if t >= 20]  # the stream trimmed to its budget by then
        assert len(used) >= 8 and max(used) < 1.25 * min(used), f"Redis memory grew: {redis_samples}"
        records = [core.decode_step(f) for _, f in client.xrange(core.steps_key("soak"))]
        for rank in range(RANKS):
            steps = [r.step for r in records if r.rank == rank]
            assert steps and steps == list(range(steps[0], RATE_HZ * SECONDS)), f"rank {rank}: a gap in the stream"
            health = json.loads(client.hget(core.health_key("soak"), str(rank)))
            assert health["dropped_steps"] == 0 and health["published_steps"] == RATE_HZ * SECONDS
        print("redis (s, used_memory, rss):", redis_samples)
        print("collector rss after warm-up:", [[line["rss"] >> 20 for line in (json.loads(x) for x in out.splitlines()
                                                 if x.startswith('{"t"'))] for out in outputs])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()
