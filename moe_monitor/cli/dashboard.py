"""moe-monitor dashboard [--redis URL] [--port 8501] [--address 127.0.0.1] [--trace-dir DIR] [--apply-run RUN ...
--apply-secret-file FILE]: serve the Streamlit dashboard (Overview, Devices, Experts, GPU panel, Time, What-if) of
the runs in one Redis, and of the trace files in --trace-dir. Binds loopback unless told otherwise; anyone who
reaches the port sees the runs. Apply (the What-if page asking an engine to move experts) is off unless
--apply-run names the runs it is for; its requests are signed with the secret in --apply-secret-file (or
$MOE_APPLY_SECRET_FILE / $MOE_APPLY_SECRET), which the engine must share. Every session's window shares one
memory budget (--memory-budget, passed to the server as $MOE_MONITOR_MEMORY_BUDGET): a window that does not fit
holds fewer steps and says so."""
from __future__ import annotations

import argparse
import os
import subprocess

from moe_monitor.core import membudget

from .common import add_redis, guarded

DEFAULT_BUDGET = membudget.format_bytes(membudget.DASHBOARD_DEFAULT_BYTES).replace(" ", "")  # "2.0GiB"


def register(sub) -> None:
    p = sub.add_parser("dashboard", help="serve the dashboard in a browser (loopback by default)",
                       description=(__doc__ or "").split(":", 1)[1].strip())
    add_redis(p)
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8501)), help="port (default 8501)")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to bind (default: loopback only; 0.0.0.0 exposes the dashboard to the network)")
    p.add_argument("--trace-dir", metavar="DIR", default=os.environ.get("MOE_TRACE_DIR"),
                   help="folder the sidebar replays trace files from (default: $MOE_TRACE_DIR or ./recordings)")
    p.add_argument("--apply-run", action="append", default=[], metavar="RUN",
                   help="turn Apply on for this run of --redis (repeat for more runs; default: Apply is off)")
    p.add_argument("--apply-secret-file", metavar="FILE", default=None,
                   help="file holding the secret Apply signs requests with (default: $MOE_APPLY_SECRET_FILE, "
                        "else $MOE_APPLY_SECRET); the engine checks them with the same secret")
    p.add_argument("--apply-ttl-s", type=float, default=None, metavar="S",
                   help="seconds a request stays valid (default 120, at most 3600)")
    p.add_argument("--memory-budget", metavar="SIZE", default=os.environ.get(membudget.ENV_VAR) or DEFAULT_BUDGET,
                   help=f"memory every session's window shares, e.g. 2GiB, 8GiB (default: ${membudget.ENV_VAR} or "
                        f"{DEFAULT_BUDGET})")
    p.set_defaults(handler=lambda args: guarded(dashboard, args))


def apply_env(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """The Streamlit process's environment for the Apply setting (dashboard.sources.apply_gate reads it): the
    runs, the secret's file (never the secret itself on a command line) and the lifetime when Apply is on; with
    Apply off, none of them (nor an inherited secret). ValueError for a bad run name, a missing or short
    secret, or a lifetime out of range."""
    from moe_monitor import core
    from moe_monitor.core.apply_secret import SECRET_ENV, SECRET_FILE_ENV, load_secret
    from moe_monitor.core.layout_requests import MAX_TTL_S
    from moe_monitor.dashboard.sources.apply_gate import RUNS_ENV, TTL_ENV

    env = {k: v for k, v in environ.items() if k not in (RUNS_ENV, TTL_ENV, SECRET_ENV, SECRET_FILE_ENV)}
    if not args.apply_run:
        return env
    runs = [core.check_run_name(run) for run in args.apply_run]
    if load_secret(args.apply_secret_file, environ) is None:
        raise ValueError(f"--apply-run needs the secret the engine checks requests with: --apply-secret-file "
                         f"FILE, ${SECRET_FILE_ENV} or ${SECRET_ENV}")
    if args.apply_ttl_s is not None and not 0 < args.apply_ttl_s <= MAX_TTL_S:
        raise ValueError(f"--apply-ttl-s must be in (0, {MAX_TTL_S:g}]")
    env[RUNS_ENV] = ",".join(runs)
    if args.apply_secret_file or environ.get(SECRET_FILE_ENV):
        env[SECRET_FILE_ENV] = os.path.abspath(args.apply_secret_file or environ[SECRET_FILE_ENV])
    else:
        env[SECRET_ENV] = environ[SECRET_ENV]
    if args.apply_ttl_s is not None:
        env[TTL_ENV] = repr(float(args.apply_ttl_s))
    return env


def dashboard(args: argparse.Namespace) -> int:
    from moe_monitor import core
    from moe_monitor.dashboard.serve import streamlit_command
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: must be 1..65535")
    budget_bytes = membudget.parse_bytes(args.memory_budget, "--memory-budget")
    core.connect(args.redis).close()  # the URL's form, before the server starts (connecting is lazy)
    env = {**apply_env(args, dict(os.environ)), "REDIS_URL": args.redis, membudget.ENV_VAR: str(budget_bytes),
           **({"MOE_TRACE_DIR": args.trace_dir} if args.trace_dir else {})}
    applies = f"; Apply on for {', '.join(args.apply_run)}" if args.apply_run else "; Apply off"
    print(f"dashboard: http://{args.address}:{args.port} watching {core.redact(args.redis)}{applies}", flush=True)
    try:
        return subprocess.run(streamlit_command(args.port, args.address), env=env).returncode
    except KeyboardInterrupt:
        return 0
