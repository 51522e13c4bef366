"""moe-monitor apply --redis URL --run NAME --layout FILE: ask a running engine to switch to a layout.

Reads a layout JSON as the planner writes it ({"physical_to_logical_map": [[...]]}), checks it against the run's
metadata (layers, experts, P a multiple of its GPUs) and XADDs a LayoutRecord with source "apply" at the run's
next step (the newest step in its steps stream + 1) to the run's layout requests stream (a request, which no
dashboard takes for a change). An engine that watches requests (the EP runtime of `moe-monitor demo --engine ep`)
moves the expert weights, switches all ranks at one step and publishes the change to the layouts stream, from
the step the layout is really in force. The dashboard's What-if page sends the same request."""
from __future__ import annotations

import argparse

from moe_monitor import core

from .common import add_redis, add_run, guarded


def register(sub) -> None:
    p = sub.add_parser("apply", help="ask a running engine to switch to a layout JSON",
                       description=(__doc__ or "").split("\n\n")[0].split(":", 1)[1].strip(),
                       epilog=(__doc__ or "").split("\n\n")[1])
    add_redis(p)
    add_run(p)
    p.add_argument("--layout", required=True, metavar="FILE",
                   help='layout JSON ({"physical_to_logical_map": [[...]]}, as `moe-monitor plan` writes it)')
    p.set_defaults(handler=lambda args: guarded(apply, args))


def apply(args: argparse.Namespace) -> int:
    from moe_monitor.dashboard.sources.layout_request import request_layout
    from moe_monitor.planner import load_layout
    core.check_run_name(args.run)
    layout_LP = load_layout(args.layout)
    client = core.connect(args.redis, timeout_s=2.0)
    try:
        record = request_layout(client, args.run, layout_LP, instance=f"apply-cli-{core.new_instance_id()}")
    finally:
        client.close()
    print(f"apply: layout [{record.num_layers} x {record.num_slots}] requested for run {args.run!r} "
          f"at step {record.step}")
    return 0
