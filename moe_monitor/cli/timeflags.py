"""The flags that price steps in time, shared by score, diagnose, advise, simulate and export: the model's
dimensions (--hidden, --moe-intermediate, --expert-matrices, --weight-bytes, --act-bytes: each overrides the
run's metadata) and the GPU (--gpu-profile NAME or a profile JSON from `moe-monitor calibrate`, --nodes); and
the one line a report gives the time verdict (planner.timecost). docs/costmodel.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from moe_monitor import core
from moe_monitor.core import costmodel
from moe_monitor.core.costmodel import ModelDims
from moe_monitor.core.hardware import (
    GPU_PROFILES,
    MAX_PROFILE_BYTES,
    GpuProfile,
    find_profile,
    parse_profile,
)

DIMS_HINT = "give --hidden H --moe-intermediate I (or counts whose run metadata has them)"
PROFILE_HINT = f"give --gpu-profile NAME ({', '.join(GPU_PROFILES)}) or a profile JSON"


def add_dims_flags(p: argparse.ArgumentParser, default: str = "the run's metadata; unknown without it",
                   time: bool = True) -> None:
    """--hidden, --moe-intermediate, --weight-bytes (alias --dtype-bytes) and (time) --expert-matrices,
    --act-bytes; all None when not given (model_dims, or the caller, fills them in)."""
    p.add_argument("--hidden", type=int, help=f"hidden size (default: {default})")
    p.add_argument("--moe-intermediate", type=int, help=f"expert FFN width (default: {default})")
    p.add_argument("--weight-bytes", "--dtype-bytes", dest="weight_bytes", type=float,
                   help="bytes per expert weight (fp8 1, bf16 2; default: " + ("the run's, else 2)" if time else
                                                                               f"{default}'s, 2)"))
    if time:
        p.add_argument("--expert-matrices", type=int,
                       help="weight matrices per expert (3 for a gated FFN: gate, up, down; default: the run's or 3)")
        p.add_argument("--act-bytes", type=float,
                       help="bytes per activation element in dispatch and combine (default: the run's, else "
                            "--weight-bytes)")


def add_profile_flags(p: argparse.ArgumentParser, nodes: bool = True, default: str = "the run's metadata") -> None:
    """--gpu-profile NAME|FILE and (nodes) --nodes M."""
    p.add_argument("--gpu-profile", metavar="NAME|FILE",
                   help=f"the GPU the time figures are predicted for: {', '.join(GPU_PROFILES)}, an NVML device "
                        f"name, or a profile JSON from `moe-monitor calibrate` (default: {default})")
    if nodes:
        p.add_argument("--nodes", type=int, help="nodes the GPUs span (the all-to-all crosses the NIC between "
                                                 "them; default: the run's layout, else G / the profile's GPUs "
                                                 "per node)")


def load_profile(spec: str) -> GpuProfile:
    """A profile by table or NVML name, or from a profile JSON file (a path ending .json, or an existing file)."""
    path = Path(spec)
    if spec.lower().endswith(".json") or path.is_file():
        with path.open("rb") as handle:
            return parse_profile(handle.read(MAX_PROFILE_BYTES + 1))
    return find_profile(spec)


def run_profile(args: argparse.Namespace, meta: core.RunMeta | None, device_names=()) -> GpuProfile | None:
    """--gpu-profile, else the run metadata's gpu_profile, else the first NVML device name of the table (as the
    Overview finds it), else None."""
    if getattr(args, "gpu_profile", None):
        return load_profile(args.gpu_profile)
    return costmodel.run_profile(meta, device_names)


def model_dims(args: argparse.Namespace, meta: core.RunMeta | None) -> ModelDims | None:
    """The dimensions the flags give, each missing one from the run's metadata; None while hidden size or
    expert width is unknown. ValueError for a flag that is not positive."""
    def pick(flag: str, field: str):
        given = getattr(args, flag, None)
        if given is not None:
            if not given > 0:
                raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {given}")
            return given
        return getattr(meta, field, 0) or None if meta is not None else None

    hidden, inter = pick("hidden", "hidden_size"), pick("moe_intermediate", "moe_intermediate_size")
    if not (hidden and inter):
        return None
    weight = pick("weight_bytes", "dtype_bytes") or 2.0
    act = pick("act_bytes", "act_dtype_bytes") or weight
    return ModelDims(int(hidden), int(inter), int(pick("expert_matrices", "expert_matrices") or 3), float(weight),
                     float(act))


def args_time_model(args: argparse.Namespace, meta: core.RunMeta | None, gpus: int,
                    device_names=()) -> costmodel.TimeModel | list[str]:
    """The TimeModel the flags and the run's metadata give (core.costmodel.time_model: dimensions from
    model_dims, the profile from run_profile; nodes: --nodes, else the run's layout's when it is for these GPUs,
    else the profile's default), or the reasons there is none."""
    nodes = getattr(args, "nodes", None)
    return costmodel.time_model(model_dims(args, meta), run_profile(args, meta, device_names), gpus,
                                costmodel.run_nodes(meta, gpus) if nodes is None else nodes)


def hint(missing: list[str]) -> str:
    return "; ".join(DIMS_HINT if reason == costmodel.NO_DIMS else PROFILE_HINT for reason in missing)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def time_lines(payload: dict) -> list[str]:
    """The report's lines of a `time` object (planner.timecost): the verdict, or one line saying why not."""
    if not payload["available"]:
        return [f"time: unavailable ({payload['reason']}): token figures only; {payload['hint']}"]
    cut = f", newest {payload['steps']} steps" if payload["steps_left_out"] else ""
    head = (f"time, predicted for {payload['predicted_for']} ({payload['gpus']} GPUs, {payload['nodes']} "
            f"node{'s' if payload['nodes'] > 1 else ''}{cut}): MoE layers {_ms(payload['moe_s_per_step'])} per step, "
            f"{_ms(payload['lost_s_per_step'])} ({payload['lost_share']:.1%}) lost waiting for the busiest GPU")
    if payload["straggler_gpu"] is None:
        tail = "every GPU finishes together"
    else:
        tail = (f"GPU {payload['straggler_gpu']} ({payload['cause']}): {payload['why']}; "
                f"{payload['speedup']:.2f}x if every GPU finished at the mean")
    bound = payload["memory_bound_share"]
    if bound is not None:
        tail += f"; {bound:.0%} of active experts memory-bound (below {payload['ridge_tokens_per_expert']:.0f} " \
                "tokens each)"
    return [head, "time: " + tail]
