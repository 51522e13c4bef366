"""`python -m demo.ep.apply --redis URL --run NAME --layout FILE`: ask a running EP runtime (python -m demo.ep)
to switch to a layout. Reads a layout JSON as the planner writes it ({"physical_to_logical_map": [[...]]},
planner.load_layout), checks it against the run's metadata (layers, experts, P a multiple of its GPUs) and
XADDs a core.LayoutRecord with source "apply" at the run's next step (the newest step in its steps stream + 1)
to the run's layout requests stream (core.layout_requests_key: a request, which no dashboard takes for a change).
The runtime's rank 0 sees it within a few steps, moves the expert weights, switches all ranks at one step and
publishes the change to the layouts stream, from the step the layout is really in force. Bad input: one `error: ...` line and exit code 2.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import redis

from moe_monitor import core
from moe_monitor.dashboard.sources.layout_request import next_step, request_layout

__all__ = ["apply_layout", "main", "next_step"]


def apply_layout(redis_url: str, run: str, layout_LP: np.ndarray) -> core.LayoutRecord:
    """XADD layout_LP (int [L, P]) as an "apply" record at the run's next step; returns the record.
    ValueError when the run has no metadata or the layout does not fit it. (The request itself is
    dashboard.sources.layout_request's, which the dashboard's What-if page uses too.)"""
    client = core.connect(redis_url, timeout_s=2.0)
    try:
        return request_layout(client, run, layout_LP, instance=f"apply-cli-{core.new_instance_id()}")
    finally:
        client.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.ep.apply", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", required=True, help="Redis URL of the run")
    parser.add_argument("--run", required=True, help="run name")
    parser.add_argument("--layout", required=True, help="layout JSON ({\"physical_to_logical_map\": [[...]]})")
    args = parser.parse_args(argv)
    from moe_monitor.planner import load_layout

    try:
        core.check_run_name(args.run)
        record = apply_layout(args.redis, args.run, load_layout(args.layout))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, redis.RedisError) as exc:  # Redis down, refusing, a wrong password
        print(f"error: Redis: {core.redact(str(exc))}", file=sys.stderr)
        return 2
    print(f"apply: layout [{record.num_layers} x {record.num_slots}] requested for run {args.run!r} "
          f"at step {record.step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
