"""One prepared check of the CUDA path, for a machine with an NVIDIA GPU (run from the repo root: python -m scripts.gpu_check).

1. counts on the GPU equal counts on the CPU for the same model and inputs;
2. no host synchronisation inside a hooked forward (torch.cuda.set_sync_debug_mode("error"));
3. a decode step captured in a CUDA graph with the hooks attached keeps counting on replay;
4. NVML readings of the model's GPU arrive in Redis;
5. ids outside [0, E) are counted as invalid on CUDA too (never clamped onto an expert);
6. a step counted on a side stream (behind a slow kernel) and closed on the default stream publishes its
   own counts: the snapshot waits for the counting stream, the next step's counting for the reset;
7. the cost model against the GPU: one layer's expert GEMMs timed over active experts x tokens per expert,
   predicted vs measured for the device's profile (scripts.gpu_costmodel; JSON lines, in $OUT when set);
8. the overhead ratio (python -m bench.collector --device cuda).
Prints one line per check; a failing or crashing check does not stop the others (device time is scarce); exits
non-zero when any failed. --costmodel-only runs 7 alone. Without CUDA
it says "no CUDA device" and checks nothing (exit status 2).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from moe_monitor import core  # noqa: E402
from moe_monitor.collectors import ExpertLoadMonitor, attach  # noqa: E402
from moe_monitor.demo.localredis import RedisServer  # noqa: E402
from scripts import gpu_costmodel  # noqa: E402
from tests.support.tiny_models import build  # noqa: E402

FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def section(run) -> None:
    """One check's section; an exception is its FAIL line, and the next section still runs."""
    try:
        run()
    except Exception as exc:  # a crash in one section (a version's API, memory) must not hide the rest
        check(run.__name__, False, f"{type(exc).__name__}: {str(exc)[:400]}")


def counts_match() -> None:
    """1. counts on the GPU equal counts on the CPU for the same tiny DeepSeek-V3 and inputs."""
    ids = torch.randint(3, 90, (4, 16), generator=torch.Generator().manual_seed(0))
    cpu_model = build("deepseek_v3")
    cpu_mon = attach(cpu_model, sample_tokens=0)
    with torch.no_grad():
        cpu_model(input_ids=ids)
    gpu_model = build("deepseek_v3").cuda()
    gpu_mon = attach(gpu_model, sample_tokens=8)
    with torch.no_grad():
        gpu_model(input_ids=ids.cuda())
    check("counts on GPU == counts on CPU", np.array_equal(cpu_mon.counts(), gpu_mon.counts()))


def no_host_sync() -> None:
    """2. no host synchronisation in begin_step()/record()/end_step() while publishing."""
    server = RedisServer(tempfile.mkdtemp())
    mon = ExpertLoadMonitor(4, 64, 8, device="cuda", sample_tokens=16, redis_url=server.url, run="sync-check")
    topk = torch.randint(0, 64, (256, 8), device="cuda")
    mask = torch.ones(256, dtype=torch.int64, device="cuda")
    mon.begin_step(token_mask=mask)  # warm-up: first-call allocations happen outside the check
    mon.record(0, topk)
    mon.end_step("decode")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # the publishing path: pinned copy + event, padding mask, sampling
            mon.begin_step(token_mask=mask)
            for layer in range(4):
                mon.record(layer, topk)
                mon.counter.record(layer, topk)  # the hooks' hot path (clamp + put_)
            mon.end_step("decode")
        synced = False
    except RuntimeError as exc:
        synced = str(exc)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    mon.close()
    server.stop()
    check("no host sync in begin_step()/record()/end_step() while publishing", synced is False, synced or "")


def cuda_graph() -> None:
    """3. a step captured in a CUDA graph keeps counting on replay."""
    graph_mon = ExpertLoadMonitor(1, 64, 8, device="cuda", sample_tokens=0)
    static_ids = torch.randint(0, 64, (32, 8), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph_mon.record(0, static_ids)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph_mon.end_step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_mon.counter.record(0, static_ids)
    for _ in range(5):
        graph.replay()
        graph_mon.end_step("decode")
    expected = 6 * np.bincount(static_ids.cpu().reshape(-1).numpy(), minlength=64)
    check("CUDA graph replay keeps counting", np.array_equal(graph_mon.counts()[0], expected))


def invalid_ids() -> None:
    """5. ids outside [0, E) are counted as invalid on CUDA, never clamped onto an expert."""
    invalid_mon = ExpertLoadMonitor(1, 8, 2, device="cuda", sample_tokens=0)
    invalid_mon.counter.record(0, torch.tensor([[0, 9], [-1, 3], [8, 3]], device="cuda"))
    invalid_mon.end_step("decode")
    check("ids outside [0, E) counted as invalid on CUDA",
          invalid_mon.counts()[0].tolist() == [1, 0, 0, 2, 0, 0, 0, 0] and invalid_mon.invalid_counts().tolist() == [3],
          f"{invalid_mon.counts()[0].tolist()} invalid {invalid_mon.invalid_counts().tolist()}")


def side_stream() -> None:
    """6. a step counted on a side stream and closed on the default stream publishes its own counts."""
    trace = tempfile.mkdtemp() + "/streams.jsonl"
    side = torch.cuda.Stream()
    stream_mon = ExpertLoadMonitor(1, 64, 8, device="cuda", sample_tokens=0, trace_path=trace, nvml=False)
    side_ids = torch.randint(0, 64, (4096, 8), device="cuda")
    expected_side = np.bincount(side_ids.cpu().reshape(-1).numpy(), minlength=64)
    torch.cuda.synchronize()
    for _ in range(3):
        with torch.cuda.stream(side):
            stream_mon.begin_step(tokens=4096)
            torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time before the counting, on the side stream
            stream_mon.record(0, side_ids)
            stream_mon.counter.record(0, side_ids)
        stream_mon.end_step("decode")  # on the default stream
    stream_mon.close()
    with open(trace, encoding="utf-8") as lines:
        steps = [rec for kind, rec in (core.decode_trace_line(line) for line in lines) if kind == "step"]
    got = [rec.counts_LE[0].tolist() for rec in steps]
    check("side-stream counting published whole (snapshot waits for the counting stream)",
          len(got) == 3 and all(row == (2 * expected_side).tolist() for row in got),
          f"{len(got)} steps, sums {[sum(row) for row in got]} (want {2 * 4096 * 8} each)")


def nvml_samples() -> None:
    """4. NVML readings of the model's GPU arrive in Redis."""
    server = RedisServer(tempfile.mkdtemp())
    try:
        live = attach(build("qwen3_moe").cuda(), redis_url=server.url, run="gpu-check", nvml_interval_s=0.25)
        time.sleep(1.2)
        live.close()
        samples = [core.decode_gpu_sample(f) for _, f in
                   core.connect(server.url).xrange(core.gpu_key("gpu-check"))]
        ok = bool(samples) and samples[-1].status == "ok" and samples[-1].gpus[0]["memory_total_bytes"]
        check("NVML samples of the model's GPU", bool(ok), str(samples[-1].gpus[0] if ok else samples[:1]))
    finally:
        server.stop()


CHECKS = (counts_match, no_host_sync, cuda_graph, invalid_ids, side_stream, nvml_samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The CUDA path's checks (run from the repo root).")
    parser.add_argument("--costmodel-only", action="store_true",
                        help="only time the expert GEMMs against the cost model (scripts.gpu_costmodel)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here")
        gpu_costmodel.main()
        return 2
    if args.costmodel_only:
        return gpu_costmodel.main()
    for run in CHECKS:
        section(run)
    section(gpu_costmodel.main)
    bench = subprocess.run([sys.executable, "-m", "bench.collector", "--device", "cuda"],
                           capture_output=True, text=True)
    print(bench.stdout + bench.stderr)
    check("bench.collector --device cuda", bench.returncode == 0, f"exit status {bench.returncode}")
    print(f"{len(FAILED)} failed: {FAILED}" if FAILED else "all checks passed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
