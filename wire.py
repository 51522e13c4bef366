"""The wire format between collectors (model side) and the dashboard (reader side).

Both sides import this module and nothing else of each other. It imports neither torch nor pynvml.

Redis keys for a run R (names are ``[A-Za-z0-9_.-]``):
    moe:runs           sorted set: run name -> last time (unix s) a collector wrote to it
    moe:R:meta         string: JSON of RunMeta, written once per run (rewritten when the layout changes)
    moe:R:steps        stream: one entry per (step, rank), fields in STEP_FIELDS
    moe:R:gpu          stream: one entry per NVML sample (or one "unavailable" status entry)
    moe:R:health       hash: rank -> JSON {dropped_steps, queued, last_error, time_s}

Shape legend: L MoE layers (rows in model order), E logical experts, N sampled tokens, K top-k.
Counts travel as raw little-endian int32 bytes, row-major [L, E]; sampled routing rows as little-endian
int16 [L, N, K] with -1 where a slot was masked (padding, weight-0 slot).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

SCHEMA_VERSION = 1
KEY_PREFIX = "moe"
RUNS_KEY = f"{KEY_PREFIX}:runs"
PHASES = ("prefill", "decode", "mixed", "unknown")
_RUN_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
COUNTS_DTYPE = np.dtype("<i4")
SAMPLE_DTYPE = np.dtype("<i2")

STEP_FIELDS = ("v", "run", "inst", "rank", "world", "step", "t", "phase", "tokens", "L", "E", "counts", "dropped")
MAX_SAMPLE_EXPERTS = 32767  # sampled ids travel as int16
SAMPLE_FIELDS = ("sample_n", "sample_k", "sample")


def check_run_name(run: str) -> str:
    """Return run unchanged if it is a valid run name, else raise ValueError."""
    if not isinstance(run, str) or not _RUN_NAME.match(run):
        raise ValueError(f"run name {run!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
    return run


def steps_key(run: str) -> str:
    return f"{KEY_PREFIX}:{check_run_name(run)}:steps"


def gpu_key(run: str) -> str:
    return f"{KEY_PREFIX}:{check_run_name(run)}:gpu"


def meta_key(run: str) -> str:
    return f"{KEY_PREFIX}:{check_run_name(run)}:meta"


def health_key(run: str) -> str:
    return f"{KEY_PREFIX}:{check_run_name(run)}:health"


# ---------------------------------------------------------------------------------------------- steps
@dataclass(frozen=True)
class StepRecord:
    """Expert counts of one step on one rank.

    counts_LE: int32 [L, E] tokens routed to each logical expert in each MoE layer during this step.
    sample_ids_LNK: int16 [L, N, K] top-k expert ids of N sampled tokens per layer (-1 = masked), or None.
    dropped_steps: steps this rank's writer has dropped so far (queue full / Redis down), cumulative.
    instance: the collector process that wrote it (steps restart at 0 when a collector restarts under the
    same run name: a new instance tells the reader to start a new window).
    """

    run: str
    rank: int
    world_size: int
    step: int
    time_s: float
    phase: str
    tokens: int
    counts_LE: np.ndarray
    dropped_steps: int = 0
    sample_ids_LNK: np.ndarray | None = None
    instance: str = ""


def new_instance_id() -> str:
    """A short id unique to one collector process (time + pid + randomness)."""
    import os
    import secrets
    import time

    return f"{int(time.time()):x}-{os.getpid():x}-{secrets.token_hex(3)}"


def encode_step(rec: StepRecord) -> dict[str, bytes | str | int]:
    """StepRecord -> stream entry fields (values redis-py can send as they are)."""
    counts = np.ascontiguousarray(rec.counts_LE, dtype=COUNTS_DTYPE)
    if counts.ndim != 2:
        raise ValueError(f"counts_LE must be 2-D [layers, experts], got shape {counts.shape}")
    if rec.phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {rec.phase!r}")
    fields: dict[str, bytes | str | int] = {
        "v": SCHEMA_VERSION,
        "run": check_run_name(rec.run),
        "inst": rec.instance,
        "rank": int(rec.rank),
        "world": int(rec.world_size),
        "step": int(rec.step),
        "t": repr(float(rec.time_s)),
        "phase": rec.phase,
        "tokens": int(rec.tokens),
        "L": counts.shape[0],
        "E": counts.shape[1],
        "counts": counts.tobytes(),
        "dropped": int(rec.dropped_steps),
    }
    if rec.sample_ids_LNK is not None:
        if counts.shape[1] > MAX_SAMPLE_EXPERTS:
            raise ValueError(f"sampled rows need E <= {MAX_SAMPLE_EXPERTS} (int16 ids), got E={counts.shape[1]}")
        sample = np.ascontiguousarray(rec.sample_ids_LNK, dtype=SAMPLE_DTYPE)
        if sample.ndim != 3 or sample.shape[0] != counts.shape[0]:
            raise ValueError(f"sample_ids_LNK must be [L={counts.shape[0]}, N, K], got {sample.shape}")
        fields.update(sample_n=sample.shape[1], sample_k=sample.shape[2], sample=sample.tobytes())
    return fields


def _text(fields: dict, name: str) -> str:
    value = fields.get(name, fields.get(name.encode()))
    if value is None:
        raise ValueError(f"missing field {name!r}")
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _raw(fields: dict, name: str) -> bytes:
    value = fields.get(name, fields.get(name.encode()))
    if value is None:
        raise ValueError(f"missing field {name!r}")
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"field {name!r} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _int(fields: dict, name: str, lo: int = 0) -> int:
    try:
        value = int(_text(fields, name))
    except ValueError as exc:
        raise ValueError(f"field {name!r} is not an integer: {exc}") from None
    if value < lo:
        raise ValueError(f"field {name!r} = {value} is below {lo}")
    return value


def decode_step(fields: dict) -> StepRecord:
    """Stream entry fields (bytes or str keys) -> StepRecord. Raises ValueError on any malformed entry:
    wrong schema version, missing field, wrong byte length, negative counts."""
    version = _int(fields, "v")
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema version {version} is not supported (this reader speaks {SCHEMA_VERSION})")
    num_layers, num_experts = _int(fields, "L", 1), _int(fields, "E", 1)
    raw = _raw(fields, "counts")
    if len(raw) != num_layers * num_experts * COUNTS_DTYPE.itemsize:
        raise ValueError(f"counts has {len(raw)} bytes, expected {num_layers}x{num_experts} int32")
    counts = np.frombuffer(raw, dtype=COUNTS_DTYPE).reshape(num_layers, num_experts)
    if (counts < 0).any():
        raise ValueError("counts contain negative values")
    phase = _text(fields, "phase")
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    time_s = float(_text(fields, "t"))
    if not math.isfinite(time_s):
        raise ValueError("time is not finite")
    sample = None
    if fields.get("sample", fields.get(b"sample")) is not None:
        n, k = _int(fields, "sample_n"), _int(fields, "sample_k", 1)
        raw_sample = _raw(fields, "sample")
        if len(raw_sample) != num_layers * n * k * SAMPLE_DTYPE.itemsize:
            raise ValueError(f"sample has {len(raw_sample)} bytes, expected {num_layers}x{n}x{k} int16")
        sample = np.frombuffer(raw_sample, dtype=SAMPLE_DTYPE).reshape(num_layers, n, k)
        if ((sample < -1) | (sample >= num_experts)).any():
            raise ValueError("sample holds expert ids outside [-1, E)")
    rank, world = _int(fields, "rank"), _int(fields, "world", 1)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world size {world}")
    has_inst = fields.get("inst", fields.get(b"inst")) is not None
    return StepRecord(
        run=check_run_name(_text(fields, "run")), rank=rank, world_size=world, step=_int(fields, "step"),
        time_s=time_s, phase=phase, tokens=_int(fields, "tokens"), counts_LE=counts,
        dropped_steps=_int(fields, "dropped"), sample_ids_LNK=sample,
        instance=_text(fields, "inst") if has_inst else "",
    )


# ---------------------------------------------------------------------------------------------- meta
def contiguous_layout(num_layers: int, num_experts: int, num_slots: int | None = None) -> list[list[int]]:
    """physical_to_logical_map [L][P] with P = num_slots (default E): slot p holds expert p % E."""
    num_slots = num_experts if num_slots is None else num_slots
    if num_slots < num_experts:
        raise ValueError(f"{num_slots} slots cannot hold {num_experts} experts")
    row = [p % num_experts for p in range(num_slots)]
    return [list(row) for _ in range(num_layers)]


@dataclass
class Layout:
    """Where the replicas live. physical_to_logical_map: [L][P] (SGLang's name and shape);
    GPU of slot p is p // (P / gpus); node of GPU g is g // (gpus / nodes)."""

    gpus: int
    nodes: int
    physical_to_logical_map: list[list[int]]

    def validate(self, num_layers: int, num_experts: int) -> "Layout":
        if self.gpus < 1 or self.nodes < 1 or self.gpus % self.nodes:
            raise ValueError(f"gpus={self.gpus} must be a positive multiple of nodes={self.nodes}")
        rows = self.physical_to_logical_map
        if len(rows) != num_layers:
            raise ValueError(f"layout has {len(rows)} layers, the model has {num_layers}")
        for layer, row in enumerate(rows):
            if len(row) % self.gpus or len(row) != len(rows[0]):
                raise ValueError(f"layer {layer}: {len(row)} slots do not split evenly over {self.gpus} GPUs")
            if sorted(set(row)) != list(range(num_experts)):
                raise ValueError(f"layer {layer}: every expert 0..{num_experts - 1} needs a slot, and only those")
        return self


def default_gpus(num_experts: int, world_size: int = 1) -> int:
    """GPUs of the default layout: the EP world size when distributed, else the largest of 32, 16, 8, 4, 2, 1
    that divides E (a typical DeepSeek-class EP deployment)."""
    if world_size > 1 and num_experts % world_size == 0:
        return world_size
    return next(g for g in (32, 16, 8, 4, 2, 1) if num_experts % g == 0)


@dataclass
class RunMeta:
    """Written once per run. Sizes feed the traffic model (2*k*d*b bytes per token per layer) and the
    memory cost of a replica (3 * hidden * moe_intermediate * dtype_bytes for a gated FFN)."""

    run: str
    model_name: str
    layer_names: list[str]
    num_experts: int
    top_k: int
    hidden_size: int
    moe_intermediate_size: int
    dtype_bytes: int
    layout: Layout
    world_size: int = 1
    started_s: float = 0.0
    host: str = ""
    sample_tokens_per_layer: int = 0
    extra: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    instance: str = ""


def encode_meta(meta: RunMeta) -> str:
    meta.layout.validate(len(meta.layer_names), meta.num_experts)
    check_run_name(meta.run)
    return json.dumps(asdict(meta), separators=(",", ":"))


_META_TYPES = {"run": str, "model_name": str, "layer_names": list, "num_experts": int, "top_k": int,
               "hidden_size": int, "moe_intermediate_size": int, "dtype_bytes": int, "world_size": int,
               "started_s": (int, float), "host": str, "sample_tokens_per_layer": int, "extra": dict,
               "schema_version": int, "instance": str}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_meta(text: str | bytes) -> RunMeta:
    """JSON -> RunMeta; ValueError (never another exception) when it is not valid JSON, lacks fields or
    holds a field of the wrong type."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
        raise ValueError(f"run metadata is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("layout"), dict):
        raise ValueError("run metadata must be an object with a 'layout' object")
    for name, value in raw.items():
        want = _META_TYPES.get(name)
        if want is None and name != "layout":
            raise ValueError(f"run metadata has an unknown field {name!r}")
        if want is int and not _is_int(value) or want not in (None, int) and not isinstance(value, want):
            raise ValueError(f"run metadata field {name!r} has the wrong type ({type(value).__name__})")
    if not all(isinstance(n, str) for n in raw.get("layer_names", [])):
        raise ValueError("run metadata layer_names must be strings")
    lay = raw.pop("layout")
    rows = lay.get("physical_to_logical_map")
    if not (_is_int(lay.get("gpus")) and _is_int(lay.get("nodes")) and isinstance(rows, list)
            and all(isinstance(r, list) and all(_is_int(v) for v in r) for r in rows)) or set(lay) - {
            "gpus", "nodes", "physical_to_logical_map"}:
        raise ValueError("run metadata layout must be {gpus: int, nodes: int, physical_to_logical_map: [[int]]}")
    try:
        meta = RunMeta(layout=Layout(**lay), **raw)
    except TypeError as exc:
        raise ValueError(f"run metadata is malformed: {exc}") from None
    if meta.schema_version != SCHEMA_VERSION:
        raise ValueError(f"run metadata schema {meta.schema_version} is not supported")
    meta.layout.validate(len(meta.layer_names), meta.num_experts)
    return meta


# ---------------------------------------------------------------------------------------------- NVML
GPU_FIELDS = (
    # name                      unit      DCGM exporter field / nvitop attribute
    "index",                  # -         gpu
    "name",                   # -         modelName
    "uuid",                   # -         UUID
    "gpu_utilization_percent",  # %       DCGM_FI_DEV_GPU_UTIL / gpu_utilization (time-based: a kernel ran)
    "memory_used_bytes",      # B         DCGM_FI_DEV_FB_USED / memory_used
    "memory_total_bytes",     # B         memory_total
    "power_usage_w",          # W         DCGM_FI_DEV_POWER_USAGE / power_usage
    "power_limit_w",          # W         power_limit
    "sm_clock_mhz",           # MHz       DCGM_FI_DEV_SM_CLOCK / sm_clock
    "temperature_c",          # Celsius   DCGM_FI_DEV_GPU_TEMP / temperature
)


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of every GPU on one host, or a status: status "ok" with gpus, or "unavailable"
    with reason (no NVIDIA driver, no GPU). A value NVML could not read is None, never invented."""

    rank: int
    host: str
    time_s: float
    status: str
    gpus: list[dict] = field(default_factory=list)
    reason: str = ""


def encode_gpu_sample(sample: GpuSample) -> dict[str, str | int]:
    if sample.status not in ("ok", "unavailable"):
        raise ValueError(f"status must be 'ok' or 'unavailable', got {sample.status!r}")
    return {
        "v": SCHEMA_VERSION, "rank": sample.rank, "host": sample.host, "t": repr(float(sample.time_s)),
        "status": sample.status, "reason": sample.reason,
        "gpus": json.dumps([{k: g.get(k) for k in GPU_FIELDS} for g in sample.gpus], separators=(",", ":")),
    }


_GPU_TEXT_FIELDS = ("name", "uuid")


def _clean_gpu(raw: dict) -> dict:
    """One GPU's reading with every numeric field a finite number >= 0 or None; ValueError otherwise."""
    out = {}
    for key in GPU_FIELDS:
        value = raw.get(key)
        if key in _GPU_TEXT_FIELDS:
            if value is not None and not isinstance(value, str):
                raise ValueError(f"GPU field {key!r} must be text")
        elif value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"GPU field {key!r} must be a finite number >= 0 or null, got {value!r}")
            if key == "index" and not _is_int(value):
                raise ValueError("GPU field 'index' must be an integer")
        out[key] = value
    if out["index"] is None:
        raise ValueError("GPU reading lacks its index")
    return out


def decode_gpu_sample(fields: dict) -> GpuSample:
    """Stream entry -> GpuSample; ValueError on any malformed entry (wrong types, NaN, negative values)."""
    version = _int(fields, "v")
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema version {version} is not supported")
    status = _text(fields, "status")
    if status not in ("ok", "unavailable"):
        raise ValueError(f"unknown GPU status {status!r}")
    try:
        gpus = json.loads(_text(fields, "gpus"))
        time_s = float(_text(fields, "t"))
    except (json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"GPU sample is malformed: {exc}") from None
    if not math.isfinite(time_s):
        raise ValueError("time is not finite")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise ValueError("gpus must be a list of objects")
    return GpuSample(rank=_int(fields, "rank"), host=_text(fields, "host"), time_s=time_s,
                     status=status, gpus=[_clean_gpu(g) for g in gpus], reason=_text(fields, "reason"))


def maxlen_for_budget(memory_budget_bytes: int, num_layers: int, num_experts: int, sample_bytes: int = 0) -> int:
    """Stream MAXLEN that keeps one run's step stream near memory_budget_bytes (~200 B of overhead/entry)."""
    entry_bytes = num_layers * num_experts * COUNTS_DTYPE.itemsize + sample_bytes + 200
    return max(100, int(memory_budget_bytes // entry_bytes))


# ---------------------------------------------------------------------------------------------- traces
# A trace file is JSON lines: {"kind": "meta", "meta": {...RunMeta...}} first, then {"kind": "step", ...}
# with the encode_step fields (bytes values base64 in "<name>_b64") and {"kind": "gpu", ...} with the
# encode_gpu_sample fields. No pickle: a trace is data only.
TRACE_KINDS = ("meta", "step", "gpu")


def trace_line(kind: str, fields: dict) -> str:
    """One JSON line of a trace. fields: encode_step / encode_gpu_sample output, or {"meta": json}."""
    import base64

    if kind not in TRACE_KINDS:
        raise ValueError(f"trace kind must be one of {TRACE_KINDS}")
    out: dict = {"kind": kind}
    for name, value in fields.items():
        if isinstance(value, (bytes, bytearray)):
            out[f"{name}_b64"] = base64.b64encode(value).decode()
        else:
            out[name] = value
    return json.dumps(out, separators=(",", ":"))


def parse_trace_line(line: str) -> tuple[str, dict]:
    """A trace line -> (kind, fields) with bytes restored, ready for decode_step / decode_gpu_sample /
    decode_meta(fields["meta"]). ValueError on anything malformed."""
    import base64
    import binascii

    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"trace line is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("kind") not in TRACE_KINDS:
        raise ValueError("trace line lacks a known 'kind'")
    kind = raw.pop("kind")
    fields: dict = {}
    for name, value in raw.items():
        if name.endswith("_b64"):
            try:
                fields[name[:-4]] = base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError) as exc:
                raise ValueError(f"field {name} is not base64: {exc}") from None
        else:
            fields[name] = value
    return kind, fields
