"""The wire format between collectors (model side) and the dashboard (reader side).

Both sides import this module and nothing else of each other. It imports neither torch nor pynvml.

Redis keys for a run R (names are ``[A-Za-z0-9_.-]``):
    moe:runs           sorted set: run name -> last time (unix s) a collector wrote to it
    (every other key of run R is moe:{R}:<name>: the braces are a Redis Cluster hash tag, so a run's keys live
    on one shard; written moe:R:<name> below)
    moe:R:meta         string: JSON of RunMeta, written with the first batch (again after a failed write
                       and whenever a batch finds it missing)
    moe:R:steps        stream: one entry per (step, rank), fields in STEP_FIELDS
    moe:R:gpu          stream: one entry per NVML sample (or one "unavailable" status entry)
    moe:R:layouts      stream: one entry per layout change (LayoutRecord: the physical_to_logical_map [L, P]
                       in force from a step on; source "initial", "engine" (EPLB rebalance) or "apply"),
                       fields in LAYOUT_FIELDS
    moe:R:timings      stream: one entry per (step, rank) of an engine that times its MoE layers (TimingRecord:
                       dispatch, expert compute, combine and whole-layer seconds, float32 [L] each, NaN =
                       not measured), fields in TIMING_FIELDS
    moe:R:physical     stream: one entry per (step, rank) of an engine that reports the tokens its balancer sent
                       to each physical slot (PhysicalRecord: int32 [L, P], SGLang's global_physical_count,
                       vLLM's expert_load_pass), fields in PHYSICAL_FIELDS; a step's ranks summed are its
                       measured GPU loads
    moe:R:agg          stream: one entry per step with its ranks summed (AggregateRecord, the aggregator),
                       plus one per late rank folded in afterwards; readers use it when it exists
    moe:R:rollup:1s    streams: rollups of the aggregated steps per second / per minute (RollupRecord), entry
    moe:R:rollup:60s   id = bucket start (unix ms), trimmed by age (MINID) to their own memory budget
    moe:R:aggregator   string: the lease of the aggregator that owns the run; moe:R:aggregator:state its progress
    moe:R:health       hash: rank -> JSON {rank, dropped_steps, published_steps, queued, last_error,
                       sink_failures, last_failure, hook_errors, invalid_ids, time_s}

Bounds (core/keys.py): every decoder refuses, with one ValueError, a record beyond MAX_LAYERS layers,
MAX_EXPERTS experts, MAX_SLOTS slots per layer, MAX_CELLS counts or layout cells, MAX_WORLD ranks, step ids
from MAX_STEP, MAX_TOKENS tokens a step per rank, times from MAX_TIME_S, MAX_META_BYTES of metadata JSON,
trace lines over MAX_TRACE_LINE_BYTES: a hostile or corrupt record can neither allocate gigabytes nor
overflow a reader's arrays.

Shape legend: L MoE layers (rows in model order), E logical experts, N sampled tokens, K top-k.
Counts travel as raw little-endian int32 bytes, row-major [L, E]; sampled routing rows as little-endian
int16 [L, N, K] with -1 where a slot was masked (padding, weight-0 slot); a layout record's map as
little-endian int32 [L, P] (P physical slots; slot p on GPU p // (P / gpus)), a physical record's counts too.
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
