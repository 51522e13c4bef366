"""moe-monitor info FILE and moe-monitor convert IN OUT: describe a trace; convert JSON-lines traces, SGLang
dumps (.pt), logical_count JSON, TensorRT-LLM expert statistics and UltraEP load traces into columnar traces
(.parquet archive, .arrows recording). Both refuse an
input that decodes to more than the decoded-bytes budget (--max-decoded-mib, core/budget.py) before decoding it."""
from __future__ import annotations

import argparse
import dataclasses

from moe_monitor.core.budget import DEFAULT_DECODED_MIB, ENV_VAR, decoded_budget_bytes

from .common import add_json, guarded, print_json


def register(sub) -> None:
    inf = sub.add_parser("info", help="a trace's run, steps, ranks, time span, layouts and size; what convert "
                                      "would make of any other input",
                         description="Describe a trace (.parquet, .arrows or JSON lines), or any input convert reads "
                                     "(SGLang dumps and logical_count JSON, TensorRT-LLM, UltraEP, Megatron, vLLM "
                                     "EPLB load windows): its kind, shape, steps and what it would become.")
    inf.add_argument("path", metavar="FILE")
    add_max_decoded(inf)
    add_json(inf)
    inf.set_defaults(handler=lambda args: guarded(info, args))
    con = sub.add_parser("convert", help="JSON lines, SGLang dumps (.pt), logical_count JSON, a TensorRT-LLM "
                                         "EXPERT_STATISTIC_PATH folder, an UltraEP trace or Megatron's "
                                         "tokens_per_expert logging -> .parquet/.arrows",
                         description="Convert a trace, an SGLang dump, a TensorRT-LLM expert-statistic folder "
                                     "(meta_info.json + rank<r>.safetensors), an UltraEP ultra_ep_trace_v1 trace "
                                     "(its folder or *.manifest.json; post_physical_loads go into the "
                                     "<stem>.physical.parquet sidecar) or Megatron-LM's tokens_per_expert logging "
                                     "(its folder or one rank<r>.jsonl; train steps) into a columnar trace.")
    con.add_argument("src", metavar="IN", help="a trace, an SGLang .pt or logical_count JSON, a TensorRT-LLM "
                                               "EXPERT_STATISTIC_PATH folder, an UltraEP trace folder or manifest, "
                                               "a Megatron tokens_per_expert folder or rank<r>.jsonl")
    con.add_argument("dst", metavar="OUT", help="output trace: .parquet (archive) or .arrows (recording)")
    con.add_argument("--run", default=None, metavar="NAME", help="run name of the output (default: the input's)")
    con.add_argument("--gpus", type=int, default=None,
                     help="GPUs of the layout (SGLang and TensorRT-LLM inputs; an UltraEP trace's is its ep_size)")
    con.add_argument("--phase", default="unknown", help="phase of logical_count JSON steps")
    con.add_argument("--top-k", type=int, default=8, help="k of the model (SGLang inputs without ids, UltraEP traces)")
    add_max_decoded(con)
    add_json(con)
    con.set_defaults(handler=lambda args: guarded(convert, args))


def add_max_decoded(p: argparse.ArgumentParser) -> None:
    """--max-decoded-mib: the decoded-bytes budget of one input file (core/budget.py)."""
    p.add_argument("--max-decoded-mib", type=float, default=None, metavar="MIB",
                   help=f"refuse an input that decodes to more than MIB mebibytes, all of it together (default: "
                        f"${ENV_VAR} or {DEFAULT_DECODED_MIB})")


def info(args: argparse.Namespace) -> int:
    from moe_monitor.core.tracefile import open_trace
    from moe_monitor.traces.convert import describe
    found = describe(args.path, max_decoded_bytes=decoded_budget_bytes(args.max_decoded_mib))
    if found is not None:
        if args.json:
            print_json(found)
            return 0
        print(f"{found['path']}: {found['kind']}")
        print(f"run {found['run']}: {found['model_name']}, {found['layers']} layers x {found['experts']} experts, "
              f"{found['slots']} slots, top-{found['top_k']}, {found['gpus']} GPUs, {found['ranks']} rank(s)")
        print(f"steps {found['steps']} ({found['first_step']}..{found['last_step']}), {found['records']} step "
              f"records, {found['physical_records']} physical records")
        print(f"convert makes {found['becomes']}")
        return 0
    with open_trace(args.path, decoded_budget_bytes(args.max_decoded_mib)) as reader:
        found = reader.info()
        meta = reader.meta
    if args.json:
        print_json({**dataclasses.asdict(found), "run": meta.run, "model_name": meta.model_name,
                    "layers": len(meta.layer_names), "experts": meta.num_experts, "top_k": meta.top_k,
                    "gpus": meta.layout.gpus})
        return 0
    print(f"{found.path}: {found.container}")
    print(f"run {meta.run}: {meta.model_name}, {len(meta.layer_names)} layers x {meta.num_experts} experts, "
          f"top-{meta.top_k}, {meta.layout.gpus} GPUs")
    print(f"steps {found.steps} ({found.first_step}..{found.last_step}), ranks {found.ranks}, "
          f"time span {found.span_s:.1f} s")
    print(f"layout records {found.layouts}, NVML samples {found.gpu_samples}, layer timing rows {found.timings}, "
          f"size {found.size_bytes} bytes")
    if found.bad_records or found.truncated:
        print(f"bad records {found.bad_records}{', truncated (a recording cut short)' if found.truncated else ''}")
    return 0


def convert(args: argparse.Namespace) -> int:
    from moe_monitor.traces.convert import convert as convert_file
    steps = convert_file(args.src, args.dst, run=args.run, gpus=args.gpus, phase=args.phase, top_k=args.top_k,
                         max_decoded_bytes=decoded_budget_bytes(args.max_decoded_mib))
    if args.json:
        print_json({"out": args.dst, "steps": steps})
    else:
        print(f"wrote {args.dst}: {steps} steps")
    return 0
