"""Fault suite at deployment shape, with nothing lost: 32 simulated DeepSeek-V3 ranks at 20 steps/s publishing
through the collectors' own Publisher and RedisSink, the aggregator, a dashboard reader and the exporter, while
these faults happen one after another, each once the previous one has recovered: 1 SIGKILL a rank and restart it,
2 SIGKILL the aggregator mid-commit, 3 steal the aggregator lease then DEL it, 4 a cluster master failover, 5
SIGSTOP Redis for --stall-s, 6 a full trace disk, 7 a rolling restart of more than half the ranks, 8 another run
whose ranks stall with a wide [L, E] for --stall-s beside it, one `--all` aggregator with a memory budget for both
(docs/scaling.md, "Faults": what each row counts).

    python -m bench.faults [--faults 1,2,3,4,5,6,7,8] [--ranks 32] [--steps-per-s 20] [--processes 2]
                           [--stall-s 10] [--disk-full-s 5] [--lease-s 5] [--no-exporter]

About 3.5-4 minutes on 2 cores. The load average before the start is printed: anything else running shares the CPUs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from bench.harness.faults import print_table, run_suite
from bench.harness.scale import BLAS_THREADS
from bench.malloc_env import STEADY, pin_malloc


def main(argv: list[str] | None = None) -> int:
    loads = os.getloadavg()
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--faults", default="1,2,3,4,5,6,7,8", help="which faults, by number")
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--steps-per-s", type=float, default=20.0)
    parser.add_argument("--processes", type=int, default=2, help="processes for all ranks but the solo one")
    parser.add_argument("--stall-s", type=float, default=10.0,
                        help="fault 5: seconds Redis stays SIGSTOPped; fault 8: seconds the wide run stalls")
    parser.add_argument("--disk-full-s", type=float, default=5.0, help="fault 6: seconds the trace disk is full")
    parser.add_argument("--lease-s", type=float, default=5.0, help="the aggregators' --lease-s")
    parser.add_argument("--no-exporter", action="store_true")
    args = parser.parse_args(argv)
    pin_malloc({**STEADY, **{name: "1" for name in BLAS_THREADS}})
    with contextlib.suppress(Exception):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    faults = [int(f) for f in args.faults.split(",") if f.strip()]
    print(f"load average before this benchmark (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in loads)} on "
          f"{os.cpu_count()} CPUs (anything else running shares them with the figures below)")
    suite = run_suite(faults, args.ranks, args.steps_per_s, args.processes, args.stall_s, args.disk_full_s,
                      args.lease_s, not args.no_exporter)
    print_table(suite)
    print(f"\n{len(suite.rows)} faults in {suite.seconds:.0f} s: " + ("every one recovered, nothing lost but the "
                                                                   "deliberate losses explained above"
                                                                   if suite.ok else "SOME FAULTS DID NOT RECOVER OR "
                                                                   "LOST STEPS (see above)"))
    return 0 if suite.ok else 1


if __name__ == "__main__":
    sys.exit(main())
