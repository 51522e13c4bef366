"""AggregateOptions: the aggregator's knobs (the CLI's flags), checked once."""
from __future__ import annotations

import math
from dataclasses import dataclass

from moe_monitor.core.membudget import AGGREGATOR_DEFAULT_BYTES, MAX_BUDGET_BYTES, MIN_BUDGET_BYTES

GROUP = "moe-aggregate"  # the consumer group every aggregator of a run reads the steps stream in


@dataclass(frozen=True)
class AggregateOptions:
    """deadline_s: a step is written once all its world's ranks arrived or this many seconds after its first
    record arrived here (monotonic clock); the ranks still missing are named and counted.
    read_count: stream entries one XREADGROUP / XAUTOCLAIM returns at most; block_ms: how long an XREADGROUP
    waits for entries (0: not at all).
    agg_maxlen: the aggregate stream's MAXLEN ~ (entries, one per step plus one per late fold).
    keep_raw_s: seconds of per-rank entries kept in the steps stream behind what was consumed (XTRIM MINID ~).
    retention_1s_s, retention_60s_s: how long 1 s and 60 s rollup buckets are kept (MINID by bucket start).
    rollup_grace_s: a rollup bucket closes once aggregated steps are this far past its end, or the wall clock
    is and nothing arrived for it in that long (default deadline_s + 1).
    lease_s: the run's aggregator lease (a standby takes over this long after the holder stopped renewing).
    timeout_s: every Redis command's socket timeout.
    log_every_s: seconds between progress lines (and lag readings).
    max_pending_steps: steps assembled at once (beyond: the oldest is written with what it has).
    remember_steps: written steps whose ranks are remembered (a rank arriving for an older step is dropped as
    too old: whether it was written cannot be told).
    memory_budget_bytes: what the steps waiting for their ranks, the held records and the open rollup seconds
    of every run one process aggregates may hold together (core.membudget; each run gets an equal share).
    """

    deadline_s: float = 2.0
    read_count: int = 512
    block_ms: int = 100
    agg_maxlen: int = 4096
    keep_raw_s: float = 5.0
    retention_1s_s: int = 900
    retention_60s_s: int = 86_400
    rollup_grace_s: float | None = None
    lease_s: float = 5.0
    timeout_s: float = 2.0
    log_every_s: float = 5.0
    max_pending_steps: int = 4096
    remember_steps: int = 16_384
    memory_budget_bytes: int = AGGREGATOR_DEFAULT_BYTES

    def __post_init__(self) -> None:
        def positive(name: str, value: float, low: float = 0.0, high: float = 1e9) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low < value <= high:
                raise ValueError(f"{name} must be a number in ({low:g}, {high:g}], got {value!r}")

        def whole(name: str, value: int, low: int, high: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number in {low}..{high}, got {value!r}")

        positive("deadline_s", self.deadline_s, 0.0, 3600.0)
        whole("read_count", self.read_count, 1, 100_000)
        whole("block_ms", self.block_ms, 0, 60_000)
        whole("agg_maxlen", self.agg_maxlen, 16, 1 << 30)
        positive("keep_raw_s", self.keep_raw_s, 0.0, 1e7)
        whole("retention_1s_s", self.retention_1s_s, 1, 1 << 30)
        whole("retention_60s_s", self.retention_60s_s, 60, 1 << 30)
        if self.rollup_grace_s is not None:
            positive("rollup_grace_s", self.rollup_grace_s, 0.0, 3600.0)
        positive("lease_s", self.lease_s, 0.05, 3600.0)
        positive("timeout_s", self.timeout_s, 0.0, 600.0)
        positive("log_every_s", self.log_every_s, 0.0, 1e6)
        whole("max_pending_steps", self.max_pending_steps, 1, 1 << 20)
        whole("remember_steps", self.remember_steps, 16, 1 << 24)
        whole("memory_budget_bytes", self.memory_budget_bytes, MIN_BUDGET_BYTES, MAX_BUDGET_BYTES)
        if self.block_ms / 1000 >= self.timeout_s:
            raise ValueError(f"block_ms ({self.block_ms}) must stay below the socket timeout ({self.timeout_s} s)")

    @property
    def grace_s(self) -> float:
        """The rollup buckets' closing grace (rollup_grace_s, default deadline_s + 1)."""
        return self.deadline_s + 1.0 if self.rollup_grace_s is None else float(self.rollup_grace_s)
