"""Constants, Redis key names and the stream budget of the wire format."""
from __future__ import annotations

import re

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


def maxlen_for_budget(memory_budget_bytes: int, num_layers: int, num_experts: int, sample_bytes: int = 0) -> int:
    """Stream MAXLEN that keeps one run's step stream near memory_budget_bytes (~200 B of overhead/entry)."""
    entry_bytes = num_layers * num_experts * COUNTS_DTYPE.itemsize + sample_bytes + 200
    return max(100, int(memory_budget_bytes // entry_bytes))
