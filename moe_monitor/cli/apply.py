"""`moe-monitor apply`: ask a running engine to switch to a layout, signed with the apply secret and an expiry,
as the dashboard's What-if page does. Docs: docs/ep-runtime.md, "Layouts applied live"."""
from __future__ import annotations

import argparse
import time

from moe_monitor import core

from .common import add_redis, add_run, guarded

DESCRIPTION = "ask a running engine to switch to a layout."
EPILOG = (  # argparse reflows it
    'Reads a layout JSON as the planner writes it ({"physical_to_logical_map": [[...]]}; vLLM\'s -1 for an unused '
    "slot and a list per GPU are read too), checks it against the run's metadata (layers, experts, P a multiple of its GPUs), signs it (HMAC-SHA256 with the apply secret: "
    "--secret-file, else $MOE_APPLY_SECRET_FILE, else $MOE_APPLY_SECRET; the engine checks it with the same secret) "
    "with an expiry (--ttl-s, default 120 s) and XADDs it at the run's next step (the newest step in its steps "
    "stream + 1) to the run's layout requests stream (a request, which no dashboard takes for a change). An engine "
    "that watches requests (the EP runtime of `moe-monitor demo --engine ep`) checks run, signature, expiry and "
    "size, moves the expert weights, switches all ranks at one step and publishes the change to the layouts "
    "stream, from the step the layout is really in force; either way it files its verdict on the run's request "
    "status stream, signed with the same secret. --wait-s waits that long for a verdict signed with the secret "
    "and prints it (exit 0 applied, 1 refused or no signed answer; an unsigned or forged verdict is ignored). The "
    "dashboard's What-if page sends the same request.")


def register(sub) -> None:
    p = sub.add_parser("apply", help="ask a running engine to switch to a layout JSON",
                       description=DESCRIPTION, epilog=EPILOG)
    add_redis(p)
    add_run(p)
    p.add_argument("--layout", required=True, metavar="FILE",
                   help='layout JSON ({"physical_to_logical_map": [[...]]}, as `moe-monitor plan` writes it)')
    p.add_argument("--secret-file", metavar="FILE", default=None,
                   help="file holding the apply secret (default: $MOE_APPLY_SECRET_FILE, else $MOE_APPLY_SECRET)")
    p.add_argument("--ttl-s", type=float, default=None, metavar="S",
                   help="seconds the request stays valid (default 120, at most 3600)")
    p.add_argument("--wait-s", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for the engine's verdict and print it (default: do not wait)")
    p.set_defaults(handler=lambda args: guarded(apply, args))


def apply(args: argparse.Namespace) -> int:
    from moe_monitor.core.apply_secret import SECRET_ENV, SECRET_FILE_ENV, load_secret
    from moe_monitor.core.layout_requests import DEFAULT_TTL_S
    from moe_monitor.dashboard.sources.layout_request import request_layout
    from moe_monitor.dashboard.sources.request_status import find_status, outcome
    from moe_monitor.planner.io import load_engine_layout
    core.check_run_name(args.run)
    if args.wait_s < 0:
        raise ValueError("--wait-s must be >= 0")
    secret = load_secret(args.secret_file)
    if secret is None:
        raise ValueError(f"no apply secret: give --secret-file FILE, or set ${SECRET_FILE_ENV} or ${SECRET_ENV} "
                         "(the engine must have the same)")
    layout_LP, listed_gpus = load_engine_layout(args.layout)  # -1: an unused slot, as vLLM writes it
    client = core.connect(args.redis, timeout_s=2.0)
    try:
        raw = client.get(core.meta_key(args.run)) if listed_gpus is not None else None
        if raw is not None and core.decode_meta(raw).layout.gpus != listed_gpus:
            raise ValueError(f"{args.layout}: lists {listed_gpus} GPUs, run {args.run!r} has "
                             f"{core.decode_meta(raw).layout.gpus}")
        sent = request_layout(client, args.run, layout_LP, instance=f"apply-cli-{core.new_instance_id()}",
                              secret=secret, ttl_s=DEFAULT_TTL_S if args.ttl_s is None else args.ttl_s)
        record = sent.record
        print(f"apply: layout [{record.num_layers} x {record.num_slots}] requested for run {args.run!r} "
              f"at step {record.step} (request {sent.request_id}, expires in "
              f"{sent.request.expires_s - record.time_s:.0f} s)", flush=True)
        if not args.wait_s:
            return 0
        deadline = time.monotonic() + args.wait_s
        while True:
            status = find_status(client, args.run, sent.request.nonce, secret)  # signed with it, or ignored
            result = outcome(status, record.step, sent.request.expires_s)
            if result.final or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    finally:
        client.close()
    print(f"apply: {result.text}")
    return 0 if result.status is not None and result.status.applied else 1
