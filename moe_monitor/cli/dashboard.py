"""moe-monitor dashboard [--redis URL] [--port 8501] [--address 127.0.0.1] [--trace-dir DIR]: serve the
Streamlit dashboard (Overview, Devices, Experts, GPU panel, Time, What-if) of the runs in one Redis, and of the
trace files in --trace-dir. Binds loopback unless told otherwise; anyone who reaches the port sees the runs and
may ask an engine to move experts."""
from __future__ import annotations

import argparse
import os
import subprocess

from .common import add_redis, guarded


def register(sub) -> None:
    p = sub.add_parser("dashboard", help="serve the dashboard in a browser (loopback by default)",
                       description=(__doc__ or "").split(":", 1)[1].strip())
    add_redis(p)
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8501)), help="port (default 8501)")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to bind (default: loopback only; 0.0.0.0 exposes the dashboard to the network)")
    p.add_argument("--trace-dir", metavar="DIR", default=os.environ.get("MOE_TRACE_DIR"),
                   help="folder the sidebar replays trace files from (default: $MOE_TRACE_DIR or ./recordings)")
    p.set_defaults(handler=lambda args: guarded(dashboard, args))


def dashboard(args: argparse.Namespace) -> int:
    from moe_monitor import core
    from moe_monitor.dashboard.serve import streamlit_command
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: must be 1..65535")
    core.connect(args.redis).close()  # the URL's form, before the server starts (connecting is lazy)
    env = {**os.environ, "REDIS_URL": args.redis, **({"MOE_TRACE_DIR": args.trace_dir} if args.trace_dir else {})}
    print(f"dashboard: http://{args.address}:{args.port} watching {core.redact(args.redis)}", flush=True)
    try:
        return subprocess.run(streamlit_command(args.port, args.address), env=env).returncode
    except KeyboardInterrupt:
        return 0
