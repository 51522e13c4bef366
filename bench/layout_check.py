"""The layout check at the metadata door, on the largest layout a run may declare (MAX_CELLS: 1024 layers x 1024
slots): the JSON parse of its map beside core.meta.check_layout_map on the parsed rows, both for a valid map and
for one whose layer 700 is wrong. Medians of interleaved runs; the ratio check / parse. No timed assertion.

    python -m bench.layout_check [--layers 1024] [--slots 1024] [--gpus 8] [--repeats 9]
"""
from __future__ import annotations

from bench.malloc_env import pin_malloc

pin_malloc()

import argparse
import json
import statistics
import time

import numpy as np

from moe_monitor.core.keys import MAX_CELLS
from moe_monitor.core.meta import check_layout_map


def _check(rows, gpus: int, layers: int, experts: int, valid: bool) -> None:
    """check_layout_map on rows, which must pass when valid and be refused otherwise."""
    try:
        check_layout_map(rows, gpus, 1, layers, experts)
    except ValueError:
        if valid:
            raise
        return
    if not valid:
        raise AssertionError("the broken map was accepted")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1024)
    parser.add_argument("--slots", type=int, default=1024, help="slots per layer (= experts: no replicas)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    if args.layers * args.slots > MAX_CELLS:
        parser.error(f"{args.layers} x {args.slots} is over the door's {MAX_CELLS} cells")
    rng = np.random.default_rng(0)
    good = [rng.permutation(args.slots).tolist() for _ in range(args.layers)]
    bad = [row[:] for row in good]
    broken = min(700, args.layers - 1)
    bad[broken][5] = bad[broken][6]  # an expert twice, another none
    texts = {"valid": json.dumps(good), "broken": json.dumps(bad)}
    parse_s: dict[str, list[float]] = {name: [] for name in texts}
    check_s: dict[str, list[float]] = {name: [] for name in texts}
    for _ in range(args.repeats):
        for name, text in texts.items():
            began = time.perf_counter()
            rows = json.loads(text)
            parsed = time.perf_counter()
            _check(rows, args.gpus, args.layers, args.slots, valid=name == "valid")
            parse_s[name].append(parsed - began)
            check_s[name].append(time.perf_counter() - parsed)
    print(f"a layout of {args.layers} layers x {args.slots} slots on {args.gpus} GPUs, median of {args.repeats}:")
    for name in texts:
        parse, check = statistics.median(parse_s[name]), statistics.median(check_s[name])
        print(f"  {name:6s}: JSON parse {parse * 1e3:7.1f} ms · layout check {check * 1e3:7.1f} ms  "
              f"ratio check / parse {check / parse:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
