"""moe-monitor sglang --dump-dir DIR --redis URL --run NAME [--server URL --every SECONDS] [--once]: the SGLang
dump bridge (collectors/sglang/bridge.py does the work).

Exit codes: 0 done (or stopped by Ctrl-C / SIGTERM), 1 (--once) the server or Redis failed, 2 bad settings.
"""
from __future__ import annotations

import argparse
import os
import signal
import threading

from moe_monitor import core

from .common import add_redis, add_run, fail, guarded


def register(sub) -> None:
    parser = sub.add_parser(
        "sglang", help="publish SGLang's expert-distribution dumps to the monitor's Redis",
        description="Publish SGLang's expert-distribution dumps (--expert-distribution-recorder-mode stat, stat_approx, "
                    "per_pass or per_token; files in SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR) to the monitor's Redis "
                    "streams. SGLang's --expert-balancedness-report-mode (which replaced "
                    "--enable-expert-distribution-metrics) is not needed.")
    parser.add_argument("--dump-dir", required=True, help="the folder SGLang writes its dumps into "
                        "(SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR)")
    add_redis(parser, required=True)
    add_run(parser)
    parser.add_argument("--server", help="SGLang server URL, e.g. http://127.0.0.1:30000: start recording, dump "
                        "every --every seconds, and stop recording on exit")
    parser.add_argument("--every", type=_positive_float, default=10.0, metavar="SECONDS",
                        help="dump period with --server (default 10)")
    parser.add_argument("--poll", type=_positive_float, default=1.0, metavar="SECONDS",
                        help="folder listing period; a file is complete once two listings agree (default 1)")
    parser.add_argument("--once", action="store_true", help="(with --server: ask for one dump,) publish every "
                        "complete dump once and exit")
    parser.add_argument("--top-k", type=_positive_int, help="the model's top-k; needed for stat and per_pass "
                        "dumps (per_token dumps show it)")
    parser.add_argument("--gpus", type=_positive_int, help="GPUs of the layout (default: the ranks that write "
                        "dumps, for stat dumps a divisor of E)")
    parser.add_argument("--nodes", type=_positive_int, default=1, help="nodes the GPUs sit in (default 1)")
    parser.add_argument("--model", default="", help="model name for the run's metadata")
    parser.add_argument("--max-file-mib", type=_positive_float, default=1024.0,
                        help="refuse dump files larger than this (default 1024)")
    parser.add_argument("--redis-timeout-s", type=_positive_float, default=2.0)
    parser.add_argument("--server-timeout-s", type=_positive_float, default=30.0)
    parser.add_argument("--api-key-env", metavar="VAR",
                        help="environment variable holding the server's admin API key (sent as a Bearer token)")
    parser.add_argument("--sample-tokens", type=int, default=16, choices=range(0, 257), metavar="N",
                        help="routing rows sampled per pass from per_token dumps (0: none; default 16)")
    parser.add_argument("--ep-dispatch-algorithm", choices=("static", "dynamic", "fake", "lp"),
                        help="the server's --ep-dispatch-algorithm, for the run's dispatch policy (static: round_robin, "
                             "dynamic and fake: even, lp: lp; default: SGLang's static)")
    parser.add_argument("--same-batch-ranks", type=_positive_int, default=1, metavar="G",
                        help="SGLang without DP attention: its G ranks route the same batch, so only rank 0's "
                             "per_pass / per_token files are read and stat counts are divided by G (default 1: "
                             "each rank routes its own tokens, as with DP attention)")
    parser.set_defaults(handler=lambda args: guarded(bridge, args))


def bridge(args: argparse.Namespace) -> int:
    from moe_monitor.collectors.sglang.bridge import Bridge, BridgeOptions
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            return fail(f"--api-key-env {args.api_key_env}: that variable is not set")
    try:
        core.check_run_name(args.run)
        opts = BridgeOptions(
            dump_dir=args.dump_dir, redis_url=args.redis, run=args.run, server_url=args.server,
            every_s=args.every, poll_s=args.poll, top_k=args.top_k, gpus=args.gpus, nodes=args.nodes,
            model_name=args.model, max_file_bytes=int(args.max_file_mib * (1 << 20)),
            redis_timeout_s=args.redis_timeout_s, server_timeout_s=args.server_timeout_s,
            sample_tokens=args.sample_tokens, api_key=api_key, dispatch_algorithm=args.ep_dispatch_algorithm,
            same_batch_ranks=args.same_batch_ranks)
        running = Bridge(opts)
    except ValueError as exc:
        return fail(str(exc))
    if args.once:
        return running.run_once()
    stop = threading.Event()

    def on_signal(signum, frame):  # first signal: finish (last dump, stop recording); second: give up
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return running.run(stop)
    except KeyboardInterrupt:
        return 130


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 < value <= core.MAX_EXPERTS:
        raise argparse.ArgumentTypeError(f"{text} must be an integer 1..{core.MAX_EXPERTS}")
    return value
