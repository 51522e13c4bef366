"""Constants, Redis key names and the stream budget of the wire format."""
from __future__ import annotations

import re

import numpy as np

SCHEMA_VERSION = 1
KEY_PREFIX = "moe"
RUNS_KEY = f"{KEY_PREFIX}:runs"
# A step's phase; codes are positions (rollups count steps per phase in this order): new phases go at the end.
# "train": one training iteration (forward and backward of every micro-batch), from the training collectors.
PHASES = ("prefill", "decode", "mixed", "unknown", "train")
LEGACY_PHASE_COUNT = 4  # rollups written before "train" count 4 phases
# How an engine shares an expert's tokens among its replicas (core.dispatch computes each; the metadata names one).
DISPATCH_POLICIES = ("even", "round_robin", "lp", "ideal")
_RUN_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
COUNTS_DTYPE = np.dtype("<i4")
SAMPLE_DTYPE = np.dtype("<i2")

# Bounds a reader enforces on every record (decode raises ValueError beyond them; the collectors stay far inside).
# They keep one hostile or corrupt record from allocating gigabytes or overflowing the reader's int64 arrays.
MAX_LAYERS = 1024              # L: MoE layers of a run
MAX_EXPERTS = 65536            # E: logical experts
MAX_SLOTS = 65536              # P: physical slots of a layout (E + redundant)
MAX_CELLS = 1 << 20            # L x E of a step's counts, L x P of a layout (DeepSeek-V3: 58 x 288 = 16,704)
MAX_WORLD = 65536              # ranks: 0 <= rank < world <= MAX_WORLD
MAX_STEP = 1 << 62             # step ids and dropped-step counts: 0 <= value < MAX_STEP
MAX_TOKENS = 1 << 40           # tokens of one step on one rank: 0 <= tokens < MAX_TOKENS
MAX_TIME_S = 1e11              # times (unix s): finite and |t| < MAX_TIME_S (year ~5100)
MAX_NAME_CHARS = 256           # collector instance ids, host names, GPU names and UUIDs
MAX_META_BYTES = 16 << 20      # the run metadata JSON (and a layout file)

STEP_FIELDS = ("v", "run", "inst", "rank", "world", "step", "t", "phase", "tokens", "L", "E", "counts", "dropped")
COMPACT_FIELDS = ("ct", "cz")  # version 2 step records: the counts' type and codec (core/compact.py)
MAX_SAMPLE_EXPERTS = 32767  # sampled ids travel as int16
SAMPLE_FIELDS = ("sample_n", "sample_k", "sample")


def check_run_name(run: str) -> str:
    """Return run unchanged if it is a valid run name, else raise ValueError."""
    if not isinstance(run, str) or not _RUN_NAME.match(run):
        raise ValueError(f"run name {run!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
    return run


def run_key(run: str, name: str) -> str:
    """moe:{R}:name. The braces are a Redis Cluster hash tag: every key of a run hashes to one slot, so a run's
    streams live on one shard (and a MULTI or a script may touch several of them) while runs spread over the
    shards. A single Redis ignores the braces."""
    return f"{KEY_PREFIX}:{{{check_run_name(run)}}}:{name}"


def steps_key(run: str) -> str:
    """Stream of the run's per-rank step records (core/steps.py), one entry per (step, rank)."""
    return run_key(run, "steps")


def aggregate_key(run: str) -> str:
    """Stream of the run's aggregated steps (core/aggregates.py): ranks summed by the aggregator, one entry
    per step (plus one per late rank folded in afterwards). Readers use it when it exists."""
    return run_key(run, "agg")


def rollup_key(run: str, resolution_s: int) -> str:
    """Stream of the run's rollups at one resolution (core/rollups.py; 1 s or 60 s buckets), entry id = the
    bucket's start in unix ms, so a bucket is written once however many aggregators try."""
    return run_key(run, f"rollup:{int(resolution_s)}s")


def aggregator_key(run: str) -> str:
    """String: the lease of the aggregator that owns the run (its consumer name, with an expiry), plus its
    progress hash at aggregator_state_key(run)."""
    return run_key(run, "aggregator")


def aggregator_state_key(run: str) -> str:
    """Hash: the progress of the run's aggregator (aggregator/progress.py: counters, epoch, the time and tag of
    its last commit), read by successors and by readers that check the aggregate still moves."""
    return aggregator_key(run) + ":state"


def timings_key(run: str) -> str:
    """Stream of the run's per-step layer timings (core/timings.py), one entry per (step, rank)."""
    return run_key(run, "timings")


def physical_key(run: str) -> str:
    """Stream of the run's measured physical-slot counts (core/physical.py), one entry per (step, rank) of an
    engine that reports what its balancer dispatched."""
    return run_key(run, "physical")


def layouts_key(run: str) -> str:
    """Stream of the run's layout changes (core/layouts.py), one entry per change."""
    return run_key(run, "layouts")


def layout_requests_key(run: str) -> str:
    """Stream of layouts asked for (core/layout_requests.py: a LayoutRecord with source "apply", its step: when
    asked, plus expiry, nonce and HMAC signature) that a runtime able to move experts picks up; it publishes the
    change it makes to layouts_key, from the step it takes force, and what it did with each request to
    layout_request_status_key. Readers of the run's layout history never read requests."""
    return run_key(run, "layout_requests")


def layout_request_status_key(run: str) -> str:
    """Stream of what the runtime did with each layout request (core/request_status.py: applied at step S, or
    refused and why), one entry per request it read."""
    return run_key(run, "layout_request_status")


def gpu_key(run: str) -> str:
    return run_key(run, "gpu")


def meta_key(run: str) -> str:
    return run_key(run, "meta")


def health_key(run: str) -> str:
    return run_key(run, "health")


def maxlen_for_budget(memory_budget_bytes: int, num_layers: int, num_experts: int, sample_bytes: int = 0,
                      counts_bytes: int | None = None) -> int:
    """Stream MAXLEN that keeps one run's step stream near memory_budget_bytes (~200 B of overhead/entry).
    counts_bytes: what one record's counts take on the wire (compact records: typically a tenth of the int32
    [L, E]); the int32 size when not given, a bound that holds for every record."""
    if counts_bytes is None:
        counts_bytes = num_layers * num_experts * COUNTS_DTYPE.itemsize
    entry_bytes = counts_bytes + sample_bytes + 200
    return max(100, int(memory_budget_bytes // entry_bytes))
