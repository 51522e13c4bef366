"""`moe-monitor demo` (`make demo`): a private redis-server (unless REDIS_URL is set), the tiny DeepSeek-V3
driven by drifting traffic with the real collector attached, and the dashboard on 127.0.0.1:$PORT (default 8501).
`--engine vllm` (`make demo-vllm`) serves a tiny Qwen3-MoE in a real vLLM instead (demo/vllm.py, run with
.venv-engines' Python), watched through the vLLM plugin; `--engine ep` (`make demo-ep`) runs the tiny
DeepSeek-V3 over 4 expert-parallel CPU ranks with real all-to-all (demo/ep), timed and open to live layout
changes; `--engine fleet` (`make demo-fleet`) runs a 32-rank data-parallel-attention deployment of it
(demo/fleet.py, 32 sequences per rank) with the aggregator summing its ranks. The engines other than
transformers run in processes of their own (python -m moe_monitor.demo.ep | .fleet | .vllm: the demo starts them)."""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from moe_monitor.dashboard.serve import streamlit_command
from moe_monitor.demo.children import start_child


def start_dashboard(port: int, redis_url: str, apply: dict[str, str] | None = None) -> subprocess.Popen:
    """The dashboard child; apply: the Apply setting's environment (apply_setting), None: Apply off."""
    # one BLAS thread: the window's small matmuls gain nothing from more, and a busy host's pool stalls a tick
    env = {"OPENBLAS_NUM_THREADS": "1", **os.environ, "REDIS_URL": redis_url, **(apply or {})}
    return start_child(streamlit_command(port), env=env)


def apply_setting(run: str) -> tuple[str, dict[str, str]]:
    """A fresh apply secret for the demo's own EP runtime and dashboard: (its file, the dashboard's environment
    turning Apply on for `run` only). The file (mode 600, in a private temporary folder) is read by both; the
    secret is never on a command line."""
    from moe_monitor.core.apply_secret import SECRET_FILE_ENV
    from moe_monitor.dashboard.sources.apply_gate import RUNS_ENV

    folder = tempfile.mkdtemp(prefix="moe-demo-apply-")
    path = os.path.join(folder, "apply.key")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return path, {RUNS_ENV: run, SECRET_FILE_ENV: path}


def engine_command(args, redis_url: str, apply_secret_file: str | None = None) -> list[str] | None:
    """The engine process of `--engine vllm|ep`, or None (with the reason printed) when it cannot run here."""
    if args.engine == "ep":   # several CPU ranks with all-to-all, timings and live layout apply (demo/ep)
        cmd = [sys.executable, "-m", "moe_monitor.demo.ep", "--ranks", str(args.ranks or 4), "--redis", redis_url,
               "--run", args.run, "--seconds", str(args.seconds if args.seconds > 0 else 7 * 24 * 3600)]
        return cmd + (["--apply-secret-file", apply_secret_file] if apply_secret_file else [])
    if args.engine == "fleet":  # a whole DP-attention deployment of the tiny model, ranks summed by the aggregator
        return [sys.executable, "-m", "moe_monitor.demo.fleet", "--ranks", str(args.ranks or 32), "--redis", redis_url, "--run",
                args.run, "--seconds", str(args.seconds if args.seconds > 0 else 7 * 24 * 3600)]
    engine_python = Path(os.environ.get("MOE_ENGINE_PYTHON") or Path(".venv-engines") / "bin" / "python")
    if not engine_python.exists():
        print(f"demo: vLLM lives in its own environment ({engine_python} not found): run `make demo-vllm` in a "
              "checkout (it builds .venv-engines), or set MOE_ENGINE_PYTHON to a Python with vLLM and this "
              "package", file=sys.stderr)
        return None
    cmd = [str(engine_python), "-m", "moe_monitor.demo.vllm", "--redis", redis_url, "--run", args.run]
    return cmd + (["--seconds", str(args.seconds)] if args.seconds > 0 else [])


def serve_engine(args, redis_url: str, stop: threading.Event) -> int:
    """The dashboard here, the engine (a real vLLM in .venv-engines, or the EP runtime's ranks) in its own
    processes, publishing to the same Redis."""
    secret_file, apply = apply_setting(args.run) if args.engine == "ep" else (None, None)  # Apply: its own run
    try:
        return _serve(args, redis_url, stop, secret_file, apply)
    finally:
        if secret_file is not None:  # the secret and its folder do not outlive the demo
            shutil.rmtree(os.path.dirname(secret_file), ignore_errors=True)


def _serve(args, redis_url: str, stop: threading.Event, secret_file: str | None, apply: dict | None) -> int:
    cmd = engine_command(args, redis_url, secret_file)
    if cmd is None:
        return 2
    engine = start_child(cmd)
    helpers = [engine]
    if args.engine == "fleet":  # ranks summed once, by the aggregator, for every dashboard
        helpers.append(start_child([sys.executable, "-m", "moe_monitor", "aggregate", "--redis", redis_url,
                                    "--run", args.run]))
    dashboard = None if args.no_dashboard else start_dashboard(args.port, redis_url, apply)
    if dashboard is not None:
        print(f"demo: dashboard on http://127.0.0.1:{args.port} (run {args.run!r} appears once the engine is up)",
              flush=True)
    if secret_file is not None:
        print(f"demo: apply a layout from the command line (the secret lasts as long as the demo):\n"
              f"  moe-monitor apply --redis {redis_url} --run {args.run} --layout planned.json "
              f"--secret-file {secret_file} --wait-s 60", flush=True)
    try:
        while engine.poll() is None and not stop.is_set() and (dashboard is None or dashboard.poll() is None):
            time.sleep(0.5)
    finally:
        for proc in (*helpers, dashboard):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """The demo until Ctrl-C, SIGTERM or --seconds; args as `moe-monitor demo` parses them."""
    warnings.filterwarnings("ignore", category=UserWarning)
    from moe_monitor.collectors import attach
    from moe_monitor.demo.model import GPU_PROFILE, IMITATED_SIZES, build_model
    from moe_monitor.demo.traffic import DriftingTraffic, steps_forever

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    redis = dashboard = monitor = None
    redis_dir = ""
    try:
        redis_url = args.redis
        if not redis_url:
            from moe_monitor.demo.localredis import RedisServer
            redis_dir = tempfile.mkdtemp(prefix="moe-demo-redis-")
            redis = RedisServer(redis_dir, own_session=True)
            redis_url = redis.url
            print(f"demo: private redis-server on {redis_url}", flush=True)
        if args.engine != "transformers":
            return serve_engine(args, redis_url, stop)
        model = build_model()
        traffic = DriftingTraffic(model)
        monitor = attach(model, redis_url=redis_url, run=args.run, gpus=32, nodes=4, gpu_profile=GPU_PROFILE,
                         **IMITATED_SIZES)
        print(f"demo: run {args.run!r}: {len(monitor.layer_names)} MoE layers x {monitor.num_experts} experts, "
              f"top-{monitor.top_k}, 32 GPUs in 4 nodes (contiguous layout), times predicted for DeepSeek-V3's "
              f"experts on {GPU_PROFILE}", flush=True)
        if not args.no_dashboard:
            dashboard = start_dashboard(args.port, redis_url)
            print(f"demo: dashboard on http://127.0.0.1:{args.port}", flush=True)
        start = time.monotonic()
        deadline = start + args.seconds if args.seconds > 0 else float("inf")
        steps_forever(model, traffic, clock=lambda: time.monotonic() - start,
                      stop=lambda: stop.is_set() or time.monotonic() > deadline
                      or (dashboard is not None and dashboard.poll() is not None))
    except KeyboardInterrupt:
        pass
    finally:
        if monitor is not None:
            monitor.close()
            print(f"demo: {monitor.stats()}", flush=True)
        if dashboard is not None and dashboard.poll() is None:
            dashboard.terminate()
            dashboard.wait(10)
        if redis is not None:
            redis.stop()
            shutil.rmtree(redis_dir, ignore_errors=True)
    return 0

