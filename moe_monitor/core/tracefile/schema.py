"""The columnar trace schema: one row per (step, rank), and the schema metadata every container carries.

Shape legend (README, Conventions): L MoE layers, E logical experts, N sampled tokens, K top-k, T steps.

Columns (STEP_SCHEMA; the same content as core.StepRecord, checked with the same bounds, core/keys.py):

    step         int64      the run's step id (0 <= step < core.MAX_STEP)
    rank         int32      0 <= rank < world
    world        int32      ranks of the run (<= core.MAX_WORLD)
    time_s       float64    unix seconds the step ended (finite, |t| < core.MAX_TIME_S)
    phase        dictionary<string>  one of core.PHASES
    tokens       int64      tokens of the step on this rank
    dropped      int64      steps this rank's writer had dropped so far
    instance     dictionary<string>  the collector process (<= core.MAX_NAME_CHARS)
    scope        dictionary<string>  one of core.SCOPES
    counts       fixed_size_binary(L*E*4)  little-endian int32 [L, E], row-major
    sample       binary (nullable)   little-endian int16 [L, N, K] sampled top-k ids (-1 masked)
    sample_n     int32 (nullable)    N
    sample_k     int32 (nullable)    K
    balancedness float64    mean over layers of the step's balancedness (mean/max GPU load, ranks summed,
                            under the layout in force, even split across replicas: planner.loads); the same
                            value on every rank's row of a step; NaN where unknown (not every rank of the
                            step was in one write, or every layer idle)

Schema metadata (bytes keys, UTF-8 values): META_FORMAT = "moe-trace", META_VERSION = FORMAT_VERSION,
META_RUN = the core.RunMeta JSON (core.encode_meta), META_LAYOUTS = the layout records known when the schema
was written, as JSON lines of core.trace_line("layout", ...), META_SHAPE = "L,E". A .parquet trace's
key-value metadata also holds "moe.timing_rows" (core/tracefile/timings.py META_TIMING_ROWS): the rows written to
its timings sidecar, "0" for none; absent in a trace written before timings were kept (it reads as before).

Layer timings (core.TimingRecord) are a table of their own, one row per (step, rank), in the same format
version 1 (a reader that does not know them reads the steps as before): the sidecar <stem>.timings.parquet of
a .parquet trace, "timing" lines in an .arrows side file or a JSON-lines trace (core/tracefile/timings.py):

    step          int64      0 <= step < core.MAX_STEP
    rank          int32      0 <= rank < world
    world         int32      1 <= world <= core.MAX_WORLD
    time_s        float64    unix seconds (finite, |t| < core.MAX_TIME_S)
    instance      dictionary<string>  the collector process (<= core.MAX_NAME_CHARS)
    dispatch_s_L  fixed_size_binary(L*4)  little-endian float32 [L] seconds, NaN = not measured
    compute_s_L   fixed_size_binary(L*4)  idem
    combine_s_L   fixed_size_binary(L*4)  idem
    layer_s_L     fixed_size_binary(L*4)  idem

with schema metadata moe.format = "moe-trace-timings", moe.format_version = 1, moe.layers = L (the run's
len(layer_names)). Raw float32 bytes like the counts: a row group reads as zero-copy float32 [R, L] views,
about twice as fast as list<float32> or fixed_size_list<float32> with pyarrow, NaN bits kept exactly.
"""
from __future__ import annotations

import pyarrow as pa

from moe_monitor import core

FORMAT_NAME = "moe-trace"
FORMAT_VERSION = 1
META_FORMAT = b"moe.format"
META_VERSION = b"moe.format_version"
META_RUN = b"moe.run_meta"
META_LAYOUTS = b"moe.layouts"
META_SHAPE = b"moe.shape"
MAX_LAYOUTS_BYTES = 64 << 20  # layout records in the schema metadata (about 100 DeepSeek-V3 maps)

DICTIONARY_TEXT = pa.dictionary(pa.int32(), pa.string())  # the dictionary<string> columns
# the columns that place a row, first in the step table and in the timings table (core/tracefile/timings.py)
ROW_KEY_FIELDS = (pa.field("step", pa.int64(), nullable=False), pa.field("rank", pa.int32(), nullable=False),
                  pa.field("world", pa.int32(), nullable=False), pa.field("time_s", pa.float64(), nullable=False))
STEP_COLUMNS = ("step", "rank", "world", "time_s", "phase", "tokens", "dropped", "instance", "scope", "counts",
                "sample", "sample_n", "sample_k", "balancedness")


def step_schema(num_layers: int, num_experts: int, metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    """The step table's schema for counts [L, E] (sizes checked against core/keys.py)."""
    num_layers, num_experts, _ = core.check_sizes(num_layers, num_experts)
    return pa.schema([
        *ROW_KEY_FIELDS,
        pa.field("phase", DICTIONARY_TEXT, nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("dropped", pa.int64(), nullable=False),
        pa.field("instance", DICTIONARY_TEXT, nullable=False),
        pa.field("scope", DICTIONARY_TEXT, nullable=False),
        pa.field("counts", pa.binary(num_layers * num_experts * core.COUNTS_DTYPE.itemsize), nullable=False),
        pa.field("sample", pa.binary()),
        pa.field("sample_n", pa.int32()),
        pa.field("sample_k", pa.int32()),
        pa.field("balancedness", pa.float64(), nullable=False),
    ], metadata=metadata)


def schema_metadata(meta: core.RunMeta, layouts: list[core.LayoutRecord]) -> dict[bytes, bytes]:
    """The metadata of a trace's schema: format, version, the run metadata and the layout records so far."""
    lines = "\n".join(core.trace_line("layout", core.encode_layout_record(rec)) for rec in layouts)
    return {META_FORMAT: FORMAT_NAME.encode(), META_VERSION: str(FORMAT_VERSION).encode(),
            META_RUN: core.encode_meta(meta).encode(), META_LAYOUTS: lines.encode(),
            META_SHAPE: f"{len(meta.layer_names)},{meta.num_experts}".encode()}


def parse_metadata(schema: pa.Schema, raw: dict[bytes, bytes] | None = None
                   ) -> tuple[core.RunMeta, list[core.LayoutRecord], int]:
    """(run metadata, layout records, bad layout records) from a trace's schema (metadata from raw when given:
    a Parquet file's key-value metadata); ValueError with one clear message when it is not a trace of this
    format or version, or its columns differ from step_schema."""
    raw = (schema.metadata if raw is None else raw) or {}
    if raw.get(META_FORMAT) != FORMAT_NAME.encode():
        raise ValueError("not a MoE trace (its schema metadata lacks moe.format = moe-trace)")
    version = raw.get(META_VERSION, b"")
    if version != str(FORMAT_VERSION).encode():
        raise ValueError(f"trace format version {version[:20]!r} is not supported (this reader speaks "
                         f"{FORMAT_VERSION})")
    meta_json = raw.get(META_RUN)
    if meta_json is None:
        raise ValueError("trace schema metadata lacks the run metadata")
    meta = core.decode_meta(meta_json)  # bounded: MAX_META_BYTES, sizes checked before anything is built
    shape = (len(meta.layer_names), meta.num_experts)
    if raw.get(META_SHAPE) != f"{shape[0]},{shape[1]}".encode():
        raise ValueError(f"trace shape {raw.get(META_SHAPE, b'')[:40]!r} does not match the run metadata "
                         f"({shape[0]} layers x {shape[1]} experts)")
    want = step_schema(*shape)
    for field in want:
        index = schema.get_field_index(field.name)
        if index < 0:
            raise ValueError(f"trace lacks the column {field.name!r}")
        if not schema.field(index).type.equals(field.type):
            raise ValueError(f"trace column {field.name!r} is {schema.field(index).type}, expected {field.type}")
    layouts, bad = parse_layout_lines(raw.get(META_LAYOUTS, b""), meta)
    return meta, layouts, bad


def parse_layout_lines(text: bytes, meta: core.RunMeta) -> tuple[list[core.LayoutRecord], int]:
    """Layout records from JSON lines (core.trace_line("layout", ...)), each checked against the run's L and
    E; (records in step order, records that did not decode or fit)."""
    if len(text) > MAX_LAYOUTS_BYTES:
        raise ValueError(f"layout records take {len(text)} bytes of metadata, at most {MAX_LAYOUTS_BYTES}")
    out, bad = [], 0
    for line in text.split(b"\n"):
        if not line.strip():
            continue
        try:
            kind, rec = core.decode_trace_line(line.decode("utf-8"))
            if not isinstance(rec, core.LayoutRecord):
                raise ValueError(f"a {kind} line among the layout records")
            out.append(rec.validate(meta.num_experts, num_layers=len(meta.layer_names)))
        except (ValueError, UnicodeDecodeError):
            bad += 1
    return sorted(out, key=lambda rec: rec.step), bad
