"""moe-monitor export --redis URL [--run NAME ... | --all] [--port 9464] [--address 127.0.0.1]: serve /metrics
(Prometheus text format, or OpenMetrics when the scraper asks for it) for the runs in one Redis. Binds loopback
unless told otherwise.

The gauges and bounds: _EPILOG (the --help epilog) and docs/metrics.md.
"""
from __future__ import annotations

import argparse
import os
import threading

from moe_monitor.core import membudget

from .common import add_redis, guarded
from .timeflags import add_profile_flags, load_profile

DEFAULT_BUDGET = membudget.format_bytes(membudget.EXPORTER_DEFAULT_BYTES).replace(" ", "")  # "2.0GiB"
DEFAULT_MAX_GPUS = 64  # exporter.caps.DEFAULT_MAX_GPUS
DEFAULT_MAX_SERIES = 20_000  # exporter.caps.DEFAULT_MAX_SERIES


_EPILOG = """Rebalance advisor gauges (labels run, phase), recomputed at most every --advise-every-s seconds per run (each
decision costs a repair of the layout in force on the window): moe_rebalance_predicted_gain_ratio (straggler
time a repair would save over the next 1,000 steps if the window repeats, as a share of their expert time),
moe_rebalance_migration_cost_ratio (time serving waits for its expert copies, same unit: rebalance when the
gain exceeds it) and moe_rebalance_moves (expert copies it needs).

Time gauges (labels run, phase), the Overview's verdict in time where the run's model dimensions and a GPU
profile are known (its metadata, NVML names, or --gpu-profile): moe_predicted_moe_seconds (MoE time per step,
the slowest GPU of each layer), moe_predicted_lost_seconds (what the other GPUs wait for the busiest, per step),
moe_predicted_lost_ratio, moe_predicted_straggler_gpu, moe_predicted_straggler_cause{cause},
moe_predicted_speedup_ratio, moe_predicted_light_tokens_per_second, moe_predicted_memory_bound_ratio;
moe_time_model_available{run, gpu_profile, model, reason} is 1 with them, 0 and why not.

Per-step tail gauges (labels run, phase, dispatch = the run's dispatch policy, stat = p99), over the window:
moe_step_imbalance_ratio (per-step busiest GPU over the mean, over every (step, layer) with tokens) and
moe_expert_skew_ratio (the busiest expert slot of a GPU over that GPU's mean per slot, on the worst GPU).

Bounds: every run's window shares one --memory-budget (a run whose window does not fit gets fewer steps:
moe_exporter_window_steps); at most --max-gpus GPUs per run and phase get series of their own (the busiest and
the straggler; moe_gpu_load_rest_tokens_per_step sums up the others), at most --max-series series in all;
moe_exporter_truncated{run} is 1 when a run's series were cut, moe_exporter_series_dropped_total counts them. Runs
that leave moe:runs are forgotten at the next poll."""


def register(sub) -> None:
    p = sub.add_parser("export", help="Prometheus /metrics for the runs in one Redis",
                       description=(__doc__ or "").split("\n\n")[0].split(":", 1)[1].strip(),
                       epilog=_EPILOG)
    add_redis(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run", action="append", metavar="NAME", help="a run to export (repeat for several)")
    which.add_argument("--all", action="store_true", help="every run of moe:runs (the default)")
    p.add_argument("--port", type=int, default=9464)
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--window-steps", type=int, default=600)
    p.add_argument("--interval-s", type=float, default=5.0, help="seconds between polls of Redis")
    p.add_argument("--per-layer", action="store_true", help="also each layer's balancedness (L series per phase)")
    p.add_argument("--top-experts", type=int, default=0, help="also the N hottest experts' tokens per step (N <= 64)")
    p.add_argument("--advise-every-s", type=float, default=30.0,
                   help="seconds between rebalance-advisor decisions per run (moe_rebalance_* gauges; each costs a "
                        "repair)")
    p.add_argument("--memory-budget", metavar="SIZE", default=os.environ.get(membudget.ENV_VAR) or DEFAULT_BUDGET,
                   help=f"memory every run's window shares, e.g. 1GiB, 4GiB (default: ${membudget.ENV_VAR} or {DEFAULT_BUDGET})")
    p.add_argument("--max-gpus", type=int, default=DEFAULT_MAX_GPUS,
                   help=f"GPUs with series of their own per run and phase, the busiest (default {DEFAULT_MAX_GPUS}); "
                        "the others are summed up")
    p.add_argument("--max-series", type=int, default=DEFAULT_MAX_SERIES,
                   help=f"series served at most, over every run (default {DEFAULT_MAX_SERIES:,})")
    add_profile_flags(p, nodes=False, default="each run's metadata, else its GPUs' NVML names")
    p.set_defaults(handler=lambda args: guarded(export, args))


def export(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from moe_monitor.exporter.metrics import series_count
    from moe_monitor.exporter.server import RunExporter, connect, poll_forever
    profile = None if args.gpu_profile is None else load_profile(args.gpu_profile)
    exporter = RunExporter(connect(args.redis), args.redis, args.run, args.window_steps, args.per_layer,
                           args.top_experts, args.advise_every_s, max_gpus=args.max_gpus, max_series=args.max_series,
                           memory_budget=membudget.parse_bytes(args.memory_budget, "--memory-budget"),
                           gpu_profile=profile)
    exporter.poll()
    registry = CollectorRegistry()
    registry.register(exporter)
    start_http_server(args.port, addr=args.address, registry=registry)
    print(f"serving http://{args.address}:{args.port}/metrics: {series_count(exporter.collect())} series, "
          f"first poll {exporter.poll_ms:.1f} ms, memory budget {membudget.format_bytes(exporter.budget.total_bytes)}",
          flush=True)
    stop = threading.Event()
    try:
        poll_forever(exporter, args.interval_s, stop)
    except KeyboardInterrupt:
        stop.set()
    return 0
