"""The cost model against a real GPU (scripts.gpu_check's last section; alone: python -m scripts.gpu_costmodel).

Times one MoE layer's expert GEMMs (gate+up, then down: DeepSeek-V3's hidden 7168, expert width 2048) for a grid
of active experts x tokens per expert, bf16 and fp8 where the device has it, with torch._grouped_mm (fp8:
torch._scaled_grouped_mm) where it runs, else a loop of matmuls (the output says which); L2 flushed before each
timed call. Predicted: core.costmodel.TimeModel.slot_seconds summed over the active experts plus the per-layer
overhead, for the device's profile (core.hardware.profile_for_device). Reports median and p90 |predicted - measured| / measured, and a
profile fitted to the cells (core.calibration.fit_profile). JSON lines on stdout and
in $OUT/gpu_costmodel.jsonl when OUT is set. Without CUDA it says "no CUDA device" and skips.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from moe_monitor.core import calibration
from moe_monitor.core.costmodel import ModelDims, TimeModel
from moe_monitor.core.hardware import GpuProfile, profile_for_device

EXPERTS = (1, 4, 16, 64)
TOKENS_PER_EXPERT = (1, 8, 64, 256, 1024)
DSV3_HIDDEN, DSV3_EXPERT = 7168, 2048
REPS = 10
FLUSH_BYTES = 256 << 20  # written between timed calls: more than any GPU's L2
OUT_NAME = "gpu_costmodel.jsonl"


def quantiles(rel_errors: list[float]) -> dict:
    """median and p90 of |relative errors|, and the median signed error (bias: > 0 over-predicts)."""
    values = np.asarray(rel_errors, dtype=np.float64)
    if not values.size:
        return {"cells": 0, "median_rel_error": None, "p90_rel_error": None, "median_signed_error": None}
    return {"cells": int(values.size), "median_rel_error": float(np.median(np.abs(values))),
            "p90_rel_error": float(np.percentile(np.abs(values), 90)), "median_signed_error": float(np.median(values))}


def predicted_s(model: TimeModel, experts: int, tokens: int) -> float:
    """The cost model's seconds of one GPU's layer holding `experts` active experts with `tokens` each and no
    all-to-all: their slots plus the profile's fixed per-layer overhead (launches are part of what it covers)."""
    seconds, _ = model.slot_seconds(np.full((1, 1, experts), float(tokens)))
    return float(seconds.sum()) + model.profile.overhead_s


class ExpertGemms:
    """Weights of `max_experts` experts (gate+up [E, 2I, H], down [E, H, I]) and the inputs of the largest grid
    cell, in one dtype ("bf16" or "fp8") on one device; run(experts, tokens) is one layer's two grouped GEMMs."""

    def __init__(self, dims: ModelDims, max_experts: int, max_tokens: int, dtype: str, device: str, align: int = 16):
        self.dims, self.dtype, self.device, self.align = dims, dtype, device, align
        H, inter = dims.hidden_size, dims.moe_intermediate_size
        rows = max_experts * _ceil(max_tokens, align)
        make = torch.bfloat16
        self.w13 = (torch.randn(max_experts, 2 * inter, H, device=device, dtype=make) * 0.02)
        self.w2 = (torch.randn(max_experts, H, inter, device=device, dtype=make) * 0.02)
        self.x = torch.randn(rows, H, device=device, dtype=make)
        self.h = torch.randn(rows, inter, device=device, dtype=make)
        if dtype == "fp8":
            f8 = torch.float8_e4m3fn
            self.w13, self.w2, self.x, self.h = (t.to(f8) for t in (self.w13, self.w2, self.x, self.h))
            self.scale_rows = torch.ones(rows, device=device, dtype=torch.float32)
            self.scale_13 = torch.ones(max_experts, 2 * inter, device=device, dtype=torch.float32)
            self.scale_2 = torch.ones(max_experts, H, device=device, dtype=torch.float32)
            self.one = torch.ones((), device=device, dtype=torch.float32)
        self.method = ""

    def offsets(self, experts: int, tokens: int) -> tuple[torch.Tensor, int]:
        rows = _ceil(tokens, self.align)
        return torch.arange(1, experts + 1, device=self.device, dtype=torch.int32) * rows, rows

    def grouped(self, experts: int, tokens: int) -> None:
        offs, rows = self.offsets(experts, tokens)
        m = experts * rows
        x, h = self.x[:m], self.h[:m]
        w13, w2 = self.w13[:experts].transpose(-2, -1), self.w2[:experts].transpose(-2, -1)
        if self.dtype == "bf16":
            torch._grouped_mm(x, w13, offs=offs)
            torch._grouped_mm(h, w2, offs=offs)
        else:
            out = torch.bfloat16
            torch._scaled_grouped_mm(x, w13, self.scale_rows[:m], self.scale_13[:experts], offs=offs, out_dtype=out)
            torch._scaled_grouped_mm(h, w2, self.scale_rows[:m], self.scale_2[:experts], offs=offs, out_dtype=out)

    def loop(self, experts: int, tokens: int) -> None:
        rows = _ceil(tokens, self.align)
        for e in range(experts):
            x, h = self.x[e * rows:(e + 1) * rows], self.h[e * rows:(e + 1) * rows]
            if self.dtype == "bf16":
                torch.matmul(x, self.w13[e].t())
                torch.matmul(h, self.w2[e].t())
            else:
                torch._scaled_mm(x, self.w13[e].t(), self.one, self.one, out_dtype=torch.bfloat16)
                torch._scaled_mm(h, self.w2[e].t(), self.one, self.one, out_dtype=torch.bfloat16)

    def choose(self) -> str:
        """The grouped kernel when it runs on this device and dtype, else the loop (the method's name says which,
        and why not the grouped one)."""
        name = "torch._grouped_mm" if self.dtype == "bf16" else "torch._scaled_grouped_mm"
        try:
            self.grouped(2, 3)
            if str(self.device).startswith("cuda"):
                torch.cuda.synchronize()  # a kernel's launch error surfaces here, not inside a timed call
            self.method = name
        except Exception as exc:  # not built for this device / dtype / version
            self.loop(1, 1)
            self.method = f"loop of {'torch.matmul' if self.dtype == 'bf16' else 'torch._scaled_mm'} " \
                          f"({name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
        return self.method

    def run(self, experts: int, tokens: int) -> None:
        (self.grouped if self.method.startswith("torch.") else self.loop)(experts, tokens)


def _ceil(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def time_cell(gemms: ExpertGemms, experts: int, tokens: int, reps: int = REPS) -> float:
    """Median seconds of gemms.run(experts, tokens) over reps calls: CUDA events (L2 flushed before each) on a
    CUDA device, perf_counter elsewhere."""
    cuda = str(gemms.device).startswith("cuda")
    flush = torch.empty(FLUSH_BYTES // 4 if cuda else 1, device=gemms.device, dtype=torch.float32)
    for _ in range(2):
        gemms.run(experts, tokens)
    seconds = []
    for _ in range(reps):
        flush.zero_()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            gemms.run(experts, tokens)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            gemms.run(experts, tokens)
            seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def fit_cells(dims: ModelDims, cells: list[dict], tile_tokens: int, name: str) -> dict:
    """A profile fitted to the measured cells by core.calibration.fit_profile (its errors on those cells, and on
    the odd cells when fitted on the even ones); {"fit": None, "why": ...} when the cells do not fit."""
    width = max(c["experts"] for c in cells)

    def arrays(chosen: list[dict]):
        tokens = np.zeros((len(chosen), 1, width))
        for i, c in enumerate(chosen):
            tokens[i, 0, :c["experts"]] = c["tokens_per_expert"]
        return tokens, np.array([[[c["measured_s"]]] for c in chosen])

    try:
        whole = calibration.fit_profile(dims, *arrays(cells), 1, name=name, tile_tokens=tile_tokens)
        out: dict = {"fit": json.loads(whole.profile.to_json()), "fitted_errors": whole.errors.to_json()}
        if len(cells) >= 4:
            half = calibration.fit_profile(dims, *arrays(cells[::2]), 1, name=name, tile_tokens=tile_tokens)
            held = calibration.errors(TimeModel(dims, half.profile, 1), *arrays(cells[1::2]))
            out["held_out_errors"] = held.to_json()
        return out
    except ValueError as exc:
        return {"fit": None, "why": str(exc)}


def run_grid(device: str, dtype: str, dims: ModelDims, profile: GpuProfile | None, experts=EXPERTS,
             tokens=TOKENS_PER_EXPERT, reps: int = REPS, device_name: str = "") -> list[dict]:
    """One JSON dict per (experts, tokens) cell and a summary dict last, for one dtype on one device."""
    gemms = ExpertGemms(dims, max(experts), max(tokens), dtype, device)
    method = gemms.choose()
    model = None if profile is None else TimeModel(dims, profile, gpus=1)
    rows = []
    for e in experts:
        for t in tokens:
            measured = time_cell(gemms, e, t, reps)
            row = {"check": "costmodel", "device": device_name, "dtype": dtype, "method": method, "experts": e,
                   "tokens_per_expert": t, "rows_per_expert": _ceil(t, gemms.align), "measured_s": measured,
                   "achieved_tflops": e * t * dims.flops_per_token / measured / 1e12,
                   "weight_gbps": e * dims.expert_bytes / measured / 1e9}
            if model is not None:
                predicted = predicted_s(model, e, t)
                row.update(predicted_s=predicted, rel_error=(predicted - measured) / measured)
            rows.append(row)
    del gemms
    summary = {"check": "costmodel_summary", "device": device_name, "dtype": dtype, "method": method,
               "profile": None if profile is None else profile.name,
               "dims": dims.label(), **quantiles([r["rel_error"] for r in rows if "rel_error" in r])}
    if profile is None:
        summary["why"] = f"no profile in the table for {device_name!r}: measured figures only"
    tile = profile.tile_tokens if profile is not None else 64
    summary.update(fit_cells(dims, rows, tile, f"{device_name or device} fitted ({dtype})"))
    return rows + [summary]


def emit(lines: list[dict], out_dir: str | None) -> None:
    """Print each dict as a JSON line; append them to $OUT/gpu_costmodel.jsonl when out_dir is set."""
    text = "".join(json.dumps(_clean(line), allow_nan=False, default=str) + "\n" for line in lines)
    sys.stdout.write(text)
    if out_dir:
        with (Path(out_dir) / OUT_NAME).open("a", encoding="utf-8") as handle:
            handle.write(text)


def _clean(value):
    """value with every non-finite float as None (strict JSON)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def main(out_dir: str | None = None) -> int:
    """The section on the CUDA device (0), or "no CUDA device" and a skip line (2)."""
    out_dir = os.environ.get("OUT") if out_dir is None else out_dir
    if not torch.cuda.is_available():
        print("no CUDA device: the cost model's grouped-GEMM timing is skipped")
        emit([{"check": "costmodel", "skipped": "no CUDA device"}], out_dir)
        return 2
    name = torch.cuda.get_device_name()
    profile = profile_for_device(name)
    dtypes = ["bf16"] + (["fp8"] if torch.cuda.get_device_capability() >= (8, 9) else [])
    for dtype in dtypes:
        dims = ModelDims(DSV3_HIDDEN, DSV3_EXPERT, 3, weight_bytes=2.0 if dtype == "bf16" else 1.0, act_bytes=2.0)
        try:
            lines = run_grid("cuda", dtype, dims, profile, device_name=name)
        except Exception as exc:  # one dtype's failure (fp8 kernels missing, memory) must not hide the other
            lines = [{"check": "costmodel_summary", "device": name, "dtype": dtype,
                      "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
        torch.cuda.empty_cache()
        emit(lines, out_dir)
        s = lines[-1]
        if "error" in s:
            print(f"INFO costmodel {dtype}: failed: {s['error']}", flush=True)
        elif s["cells"]:
            print(f"INFO costmodel {dtype} on {name} ({s['profile']}, {s['method']}): median |error| "
                  f"{s['median_rel_error']:.1%}, p90 {s['p90_rel_error']:.1%}, bias {s['median_signed_error']:+.1%} "
                  f"over {s['cells']} cells", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
