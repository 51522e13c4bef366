"""CLI: plan an expert layout and export it for SGLang's --init-expert-location.

python -m planner --load FILE --gpus G --redundant R [--nodes M --groups Q] [--policy NAME]
                         [--decay D] [--current LAYOUT.json --moves K] --out OUT.json

FILE: SGLang logical_count JSON or .pt, shape [L, E] or [W, L, E] (windows oldest..newest), or one of
the project's traces (JSON lines, .jsonl): its steps split into up to 16 windows.
Bad input prints one line "error: ..." on stderr and exits with code 2 (never a traceback); the layout JSON is
strict (no NaN / Infinity). Input limits (planner.loads): counts are ints or floats (strings, bools and nulls
are refused, not converted), finite and >= 0, at most 1e30 in all, each layer of each window 0 or >= 1e-30;
.pt tensors dense, with data, not quantized, not bool or complex; P = E + R <= 65536 slots and
L x (windows x S x P + G x E) <= 2**25 cells (the planner's working tables, about 1.5 GiB at most), where the
windows are min(W, --recent) + 1 for [W, L, E] input, 1 for [L, E] (2 with --policy robust); --recent >= 1;
--decay in (0, 1].
"""
from __future__ import annotations

import argparse
import sys
import warnings

from planner.api import POLICIES, plan
from planner.io import load_counts, load_layout, write_json


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m planner", description=__doc__.split("\n\n")[0])
    p.add_argument("--load", required=True, help="logical_count JSON or .pt, [L,E] or [W,L,E], or a trace (.jsonl)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the EP group (G)")
    p.add_argument("--redundant", type=int, required=True, help="redundant expert slots in total (R)")
    p.add_argument("--nodes", type=int, help="nodes (M blocks of consecutive GPUs); needs --groups")
    p.add_argument("--groups", type=int, help="expert groups (Q blocks of consecutive ids); needs --nodes")
    p.add_argument("--policy", default="auto", choices=POLICIES)
    p.add_argument("--decay", type=float, default=1.0,
                   help="weight of each older window relative to the next newer one (1 = equal)")
    p.add_argument("--recent", type=int, default=16, help="newest windows balanced at once")
    p.add_argument("--current", help="current layout JSON: repair it within --moves expert moves")
    p.add_argument("--moves", type=int, help="move budget for --current, total over layers: one move = one "
                   "expert's weights (of one layer) copied onto a GPU that did not hold that expert")
    p.add_argument("--out", required=True, help="output JSON with physical_to_logical_map")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():  # stderr carries one line: no numpy / torch warnings beside it
            warnings.simplefilter("ignore")
            payload = _run(args)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    except RecursionError:
        return _fail(f"{args.load}: input nested too deeply")
    except MemoryError:
        return _fail("out of memory: plan fewer layers, windows (--recent) or slots")
    except Exception as exc:  # a bug, not bad input: still one line, never a traceback
        return _fail(f"internal error ({type(exc).__name__}: {exc}); please report it with the input file")
    s = payload.get("summary", {})
    print(f"wrote {args.out}: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in s.items()))
    return 0


def _run(args) -> dict:
    counts = load_counts(args.load)
    if args.current is not None:
        from planner.repair import repair_plan
        if args.moves is None:
            raise ValueError("--current needs --moves K (expert moves allowed)")
        payload = repair_plan(counts, load_layout(args.current), args.gpus, args.moves)
    else:
        res = plan(counts, args.gpus, args.redundant, nodes=args.nodes, groups=args.groups,
                   policy=args.policy, decay=args.decay, recent=args.recent)
        payload = res.to_json()
    write_json(args.out, payload)
    return payload


def _fail(message: str) -> int:
    print("error: " + " ".join(message.split()), file=sys.stderr)  # one line, whatever the message holds
    return 2
