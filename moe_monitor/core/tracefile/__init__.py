"""The trace containers, read and written: recording (.arrows, Arrow IPC stream), archive (.parquet, zstd) and
the JSON-lines traces the collectors' TraceFileSink writes (the format reference: docs/traces.md). Collectors
write them, the planner, the dashboard and the trace tools (moe_monitor.traces: convert, replay) read them.

    reader = open_trace("run.parquet")   # or .arrows / .jsonl
    reader.timeline()                    # Timeline: step_T, time_s_T, phase_T, tokens_T, balancedness_T
    reader.read_steps(100, 699)          # list[core.StepRecord], every rank of those steps
    reader.read_timings(100, 699)        # list[core.TimingRecord], every rank's layer timings of those steps

Imports the rest of core, numpy and pyarrow only (never streamlit, plotly or torch).
"""
from .base import TraceInfo, TraceReader
from .reader import container_of, open_trace
from .schema import FORMAT_VERSION
from .timeline import Timeline
from .writers import open_writer

__all__ = ["FORMAT_VERSION", "Timeline", "TraceInfo", "TraceReader", "container_of", "open_trace", "open_writer"]
