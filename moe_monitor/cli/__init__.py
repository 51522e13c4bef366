"""`moe-monitor`: the one command of the MoE load monitor (also `python -m moe_monitor`).

Every subcommand takes the same flags for the same things (--redis URL, --run NAME, --trace FILE, --json) and
fails the same way: one `error: ...` line on stderr and exit status 2. `moe-monitor SUBCOMMAND --help` says
the rest. This layer sits on top of every other: it imports them all, nothing imports it.
"""
from __future__ import annotations

import sys

from . import (
    aggregate,
    apply,
    calibrate,
    dashboard,
    demo,
    diagnose,
    export,
    planner,
    record,
    replay,
    routed,
    score,
    sglang,
    traces,
)
from .common import Parser

# (module, its subcommands) in --help order: watch, record and replay, plan, score and diagnose, run the services
COMMANDS = (dashboard, demo, record, replay, traces, planner, score, diagnose, calibrate, apply, aggregate, export,
            sglang, routed)

DESCRIPTION = """Live per-GPU load, drift and replica-layout planning for mixture-of-experts models served with
expert parallelism. Collectors inside the model (transformers, vLLM plugin, SGLang bridge) write per-step expert
counts to Redis; these commands watch, record, replay, plan and export them."""


def build_parser() -> Parser:
    parser = Parser(prog="moe-monitor", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.handler(args) or 0)
