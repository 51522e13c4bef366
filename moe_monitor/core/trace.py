"""Trace files: JSON lines of meta, step, gpu and layout entries; data only, never pickle."""
from __future__ import annotations

import base64
import binascii
import json

from .fields import _json
from .gpu import GpuSample, decode_gpu_sample
from .layouts import LayoutRecord, decode_layout_record
from .meta import RunMeta, decode_meta
from .steps import StepRecord, decode_step
from .timings import TimingRecord, decode_timing

# A trace file is JSON lines: {"kind": "meta", "meta": "<RunMeta JSON>"} first, then {"kind": "step", ...}
# with the encode_step fields (bytes values base64 in "<name>_b64") and {"kind": "gpu", ...} with the
# encode_gpu_sample fields, {"kind": "layout", ...} with the encode_layout_record fields (the map as "map_b64").
# No pickle: a trace is data only.
# {"kind": "timing", ...} carries the encode_timing fields (the four float32 arrays as "<phase>_b64").
TRACE_KINDS = ("meta", "step", "gpu", "layout", "timing")
MAX_TRACE_LINE_BYTES = 32 << 20  # a longer line is refused (readers skip it without holding it)


def trace_line(kind: str, fields: dict) -> str:
    """One JSON line of a trace. fields: encode_step / encode_gpu_sample / encode_layout_record output, or
    {"meta": json}."""
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
    decode_layout_record / decode_meta(fields["meta"]). ValueError (never another exception) on anything malformed, a line over
    MAX_TRACE_LINE_BYTES included."""
    raw = _json(line, "trace line", MAX_TRACE_LINE_BYTES)
    if not isinstance(raw, dict) or raw.get("kind") not in TRACE_KINDS:
        raise ValueError("trace line lacks a known 'kind'")
    kind = raw.pop("kind")
    fields: dict = {}
    for name, value in raw.items():
        if name.endswith("_b64"):
            try:
                fields[name[:-4]] = base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError, ValueError) as exc:
                raise ValueError(f"field {name} is not base64: {exc}") from None
        else:
            fields[name] = value
    return kind, fields


def decode_trace_line(line: str) -> tuple[str, RunMeta | StepRecord | GpuSample | LayoutRecord | TimingRecord]:
    """One trace line -> ("meta", RunMeta) | ("step", StepRecord) | ("gpu", GpuSample) |
    ("layout", LayoutRecord) | ("timing", TimingRecord): the one decoder of trace lines (replay source and planner alike). ValueError (never another exception) on anything malformed
    or out of the bounds of core/keys.py."""
    kind, fields = parse_trace_line(line)
    if kind == "meta":
        meta = fields.get("meta")
        if isinstance(meta, dict):
            meta = _dumps(meta, "run metadata")
        if not isinstance(meta, (str, bytes)):
            raise ValueError("a meta line needs a 'meta' field holding the run metadata")
        return "meta", decode_meta(meta)
    if kind == "step":
        return "step", decode_step(fields)
    if kind == "layout":
        return "layout", decode_layout_record(fields)
    if kind == "timing":
        return "timing", decode_timing(fields)
    if isinstance(fields.get("gpus"), list):
        fields["gpus"] = _dumps(fields["gpus"], "GPU sample 'gpus'")
    return "gpu", decode_gpu_sample(fields)


def _dumps(value, what: str) -> str:
    try:
        return json.dumps(value)
    except (RecursionError, ValueError) as exc:
        raise ValueError(f"{what} cannot be read back: {type(exc).__name__}") from None
