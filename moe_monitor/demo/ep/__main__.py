"""`python -m moe_monitor.demo.ep --ranks N [--redis URL] [--run NAME] [--seconds S] [--layout FILE]`: the EP runtime on
the CPU (demo/ep/__init__.py), N = 2..8 processes, publishing one run of world size N (scope "rank": each rank
its own tokens). Without --redis the collectors count in memory only. Bad input: one `error: ...` line, exit 2."""
from __future__ import annotations

import argparse
import signal
import sys
import warnings


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m moe_monitor.demo.ep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="processes (expert-parallel ranks), 2..8")
    parser.add_argument("--redis", default=None, help="Redis URL to publish to (default: no publishing)")
    parser.add_argument("--run", default="ep-demo", help="run name")
    parser.add_argument("--seconds", type=float, default=60.0, help="run this long (0: use --steps)")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: use --seconds)")
    parser.add_argument("--layout", default=None, help="initial layout JSON (default: contiguous)")
    parser.add_argument("--apply-secret-file", default=None, metavar="FILE",
                        help="file holding the secret layout requests must be signed with (default: "
                             "$MOE_APPLY_SECRET_FILE, else $MOE_APPLY_SECRET; none: every request is refused)")
    parser.add_argument("--max-slots-per-rank", type=int, default=512,
                        help="refuse layout requests that put more slots on one rank (default 512)")
    parser.add_argument("--max-replicas-per-expert", type=int, default=0,
                        help="refuse layout requests with more replicas of one expert in a layer (0: the ranks)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--no-timing", action="store_true", help="do not time the MoE layers")
    parser.add_argument("--eager-experts", action="store_true",
                        help="one GEMM per (source rank, expert), bit for bit transformers' eager loop, instead of "
                             "grouped GEMMs (whose time follows the tokens, as in a real engine)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    from moe_monitor import core
    from moe_monitor.demo.ep import EPConfig, launch

    try:
        layout = None
        if args.layout:
            from moe_monitor.planner import load_layout

            layout = load_layout(args.layout).tolist()
        core.check_run_name(args.run)
        cfg = EPConfig(ranks=args.ranks, layout=layout, steps=args.steps, seconds=args.seconds,
                       batch=args.batch, seq_len=args.seq_len, redis_url=args.redis, run=args.run,
                       timing=not args.no_timing, grouped_experts=not args.eager_experts,
                       apply_secret_file=args.apply_secret_file, max_slots_per_rank=args.max_slots_per_rank,
                       max_replicas_per_expert=args.max_replicas_per_expert).check()
        if args.redis:
            core.connect(args.redis)  # a malformed URL fails here, not in N processes
            from moe_monitor.core.apply_secret import load_secret

            secret = load_secret(cfg.apply_secret_file)  # a bad secret file fails here too
            print("ep: layout requests " + ("are checked against the apply secret" if secret else
                                            "are all refused (no apply secret)"), flush=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"ep: {cfg.ranks} ranks, run {cfg.run!r}" + (f" -> {core.redact(cfg.redis_url)}" if cfg.redis_url else
                                                        " (in memory)"), flush=True)
    # SIGTERM (the demo stopping, or dying) unwinds like Ctrl-C: launch() terminates the ranks on its way out
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = launch(cfg)
    except KeyboardInterrupt:
        return 130
    for res in results:
        steps = res["steps"]
        mean_ms = 1000 * sum(res["step_s"]) / max(1, steps)
        print(f"ep: rank {res['rank']}: {steps} steps, {mean_ms:.1f} ms/step, layouts applied live: "
              f"{[(a['from_step'], a['moves']) for a in res['applied']]}", flush=True)
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
