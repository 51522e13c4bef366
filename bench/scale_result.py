"""The figures of one target's main load in bench.scale (the summary's rows), apart so that bench.scale_split can
report a split against them without importing bench.scale."""
from __future__ import annotations

from dataclasses import dataclass, field

from bench import loadgen
from bench.scale_aggregator import Ceiling, Lag
from bench.scale_probe import DashboardFigures


@dataclass
class Result:
    """The figures of one target's main load (the summary's rows)."""

    label: str
    ranks: int
    steps_per_s: float
    seconds: float
    report: loadgen.LoadReport
    run_port: int
    memory_peak: float  # INFO used_memory_peak of the master holding the run, right after the load
    node_cpu_s: dict[int, float]  # redis-server CPU seconds during the load, by port (replicas too)
    node_peak: dict[int, int]  # used_memory sampled max during the load, by port (masters)
    aggregator: bool = False
    lag: Lag = field(default_factory=Lag)
    caught_up_s: float | None = None
    progress: dict[str, str] = field(default_factory=dict)
    dashboard: DashboardFigures | None = None
    entry_bytes: int = 0
    xadd_rate: float | None = None
    ceiling: Ceiling | None = None
    backlog_rate: float | None = None

    @property
    def lost(self) -> int:
        return self.report.expected - self.report.written

    @property
    def missing(self) -> int | None:
        value = self.progress.get("rank_steps_missing")
        return int(value) if value is not None else None

    @property
    def keeps_up(self) -> bool:
        """Caught up within 2 s of the last write, every step written with all its ranks."""
        return self.caught_up_s is not None and self.caught_up_s <= 2.0 and self.missing == 0 \
            and int(self.progress.get("steps_written", -1)) == self.report.config.steps
