"""moe-monitor demo [--engine transformers|vllm|ep|fleet]: the embedded default, with nothing to set up: a
private redis-server on loopback (unless --redis or $REDIS_URL names one), a tiny DeepSeek-V3-shaped MoE model
with random weights on the CPU driven by drifting traffic, the collector attached, and the dashboard on
http://127.0.0.1:8501."""
from __future__ import annotations

import argparse
import os

from .common import guarded


def register(sub) -> None:
    p = sub.add_parser("demo", help="the live demo: a private Redis, a tiny MoE model on the CPU, the dashboard",
                       description=(__doc__ or "").split(":", 1)[1].strip())
    p.add_argument("--redis", default=os.environ.get("REDIS_URL"), metavar="URL",
                   help="Redis URL to publish to (default: $REDIS_URL, else a private redis-server on loopback)")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8501)), help="dashboard port")
    p.add_argument("--run", default=os.environ.get("RUN", "demo-deepseek-v3"), metavar="NAME",
                   help="run name in Redis")
    p.add_argument("--no-dashboard", action="store_true", help="only drive the model")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until Ctrl-C)")
    p.add_argument("--engine", choices=("transformers", "vllm", "ep", "fleet"), default="transformers",
                   help="what serves the model: transformers in this process, vLLM (.venv-engines, or "
                        "$MOE_ENGINE_PYTHON), the expert-parallel runtime on CPU ranks, or a 32-rank deployment")
    p.add_argument("--ranks", type=int, default=None, help="--engine ep: ranks (2..8, default 4); "
                                                           "--engine fleet: ranks (default 32)")
    p.set_defaults(handler=lambda args: guarded(demo, args))


def demo(args: argparse.Namespace) -> int:
    from moe_monitor.demo.embedded import run_demo
    return run_demo(args)
