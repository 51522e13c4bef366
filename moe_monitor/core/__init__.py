"""The bottom layer of moe_monitor: every other package imports it (`from moe_monitor import core`), it imports
nothing else of ours, nor torch or pynvml.

It holds the records and their encodings (one encode_* / decode_* pair each), the Redis key names and the
bounds every decoder enforces (keys.py), the Redis client (client.py), and every idea more than one reader
needs, once: the layout timeline, the load model and dispatch policies, the collector-restart rule, health.
Keys, record fields and byte layouts: docs/wire.md.

Shape legend: L MoE layers (model order), E logical experts, P physical slots (slot p on GPU p // (P / gpus)),
N sampled tokens, K top-k.
"""
from __future__ import annotations

from .aggregates import AGGREGATE_FIELDS, AGGREGATE_VERSION, AggregateRecord, decode_aggregate, encode_aggregate
from .client import AutoClient, Client, connect, redact
from .compact import CODECS, COUNT_TYPES, pack_counts, unpack_counts
from .errors import MAX_ERROR_CHARS, REDIS_ERRORS, REDIS_ONLY_ERRORS, why
from .fields import parse_json
from .gpu import GPU_FIELDS, MAX_GPUS_PER_SAMPLE, GpuSample, decode_gpu_sample, encode_gpu_sample
from .keys import (
                   COMPACT_FIELDS,
                   COUNTS_DTYPE,
                   KEY_PREFIX,
                   MAX_CELLS,
                   MAX_EXPERTS,
                   MAX_LAYERS,
                   MAX_META_BYTES,
                   MAX_NAME_CHARS,
                   MAX_SAMPLE_EXPERTS,
                   MAX_SLOTS,
                   MAX_STEP,
                   MAX_TIME_S,
                   MAX_TOKENS,
                   MAX_WORLD,
                   PHASES,
                   RUNS_KEY,
                   SAMPLE_DTYPE,
                   SAMPLE_FIELDS,
                   SCHEMA_VERSION,
                   STEP_FIELDS,
                   aggregate_key,
                   aggregator_key,
                   aggregator_state_key,
                   check_run_name,
                   gpu_key,
                   health_key,
                   layout_requests_key,
                   layouts_key,
                   maxlen_for_budget,
                   meta_key,
                   physical_key,
                   rollup_key,
                   run_key,
                   steps_key,
                   timings_key,
)
from .layouts import LAYOUT_FIELDS, LAYOUT_SOURCES, LayoutRecord, decode_layout_record, encode_layout_record
from .meta import (
                   Layout,
                   RunMeta,
                   check_layout_map,
                   check_sizes,
                   contiguous_layout,
                   decode_meta,
                   default_gpus,
                   encode_meta,
                   parse_layout_json,
)
from .physical import (
                   PHYSICAL_FIELDS,
                   PHYSICAL_SOURCES,
                   PhysicalRecord,
                   check_physical_counts,
                   decode_physical,
                   encode_physical,
                   measured_gpu_loads,
)
from .rollups import (
                   ETA_BINS,
                   ROLLUP_FIELDS,
                   ROLLUP_RESOLUTIONS_S,
                   ROLLUP_VERSION,
                   RollupRecord,
                   decode_rollup,
                   encode_rollup,
                   eta_histogram,
                   eta_quantile,
                   merge_rollups,
)
from .steps import (
                   SCOPES,
                   STEP_VERSION,
                   STEP_VERSIONS,
                   StepRecord,
                   decode_step,
                   encode_step,
                   encode_steps,
                   new_instance_id,
)
from .timings import (
                   MAX_PHASE_S,
                   TIMING_FIELDS,
                   TIMING_PHASES,
                   TimingRecord,
                   decode_timing,
                   encode_timing,
)
from .trace import MAX_TRACE_LINE_BYTES, TRACE_KINDS, decode_trace_line, parse_trace_line, trace_line

__all__ = [
    "COUNTS_DTYPE", "GPU_FIELDS", "KEY_PREFIX", "LAYOUT_FIELDS", "LAYOUT_SOURCES", "MAX_CELLS", "MAX_EXPERTS", "MAX_GPUS_PER_SAMPLE", "MAX_LAYERS",
    "MAX_META_BYTES", "MAX_NAME_CHARS", "MAX_SAMPLE_EXPERTS", "MAX_SLOTS", "MAX_STEP", "MAX_TIME_S", "MAX_TOKENS",
    "MAX_TRACE_LINE_BYTES", "MAX_WORLD", "PHASES", "RUNS_KEY", "SAMPLE_DTYPE",
    "SAMPLE_FIELDS", "SCHEMA_VERSION", "SCOPES", "STEP_FIELDS", "TRACE_KINDS", "GpuSample", "Layout", "LayoutRecord", "RunMeta",
    "StepRecord", "check_layout_map", "check_run_name", "check_sizes", "connect", "contiguous_layout", "decode_gpu_sample", "decode_layout_record", "decode_meta", "decode_step", "decode_trace_line",
    "default_gpus", "encode_gpu_sample", "encode_layout_record", "encode_meta", "encode_step", "encode_steps", "gpu_key", "health_key", "layout_requests_key", "layouts_key",
    "maxlen_for_budget", "meta_key", "new_instance_id", "parse_json", "parse_layout_json", "parse_trace_line", "redact", "steps_key", "trace_line",
]
__all__ += ["AGGREGATE_FIELDS", "AGGREGATE_VERSION", "AggregateRecord", "decode_aggregate", "encode_aggregate",
            "ETA_BINS", "ROLLUP_FIELDS", "ROLLUP_RESOLUTIONS_S", "ROLLUP_VERSION", "RollupRecord", "decode_rollup",
            "encode_rollup", "eta_histogram", "eta_quantile", "merge_rollups"]
__all__ += ["CODECS", "COMPACT_FIELDS", "COUNT_TYPES", "STEP_VERSION", "STEP_VERSIONS", "aggregate_key", "aggregator_key", "aggregator_state_key",
            "pack_counts", "rollup_key", "run_key", "unpack_counts"]
__all__ += ["AutoClient", "Client"]
__all__ += ["MAX_PHASE_S", "TIMING_FIELDS", "TIMING_PHASES", "TimingRecord", "decode_timing", "encode_timing",
            "timings_key"]
__all__ += ["MAX_ERROR_CHARS", "REDIS_ERRORS", "REDIS_ONLY_ERRORS", "why"]
__all__ += ["PHYSICAL_FIELDS", "PHYSICAL_SOURCES", "PhysicalRecord", "check_physical_counts", "decode_physical",
            "encode_physical", "measured_gpu_loads", "physical_key"]
