"""Columnar traces: recording (.arrows, Arrow IPC stream), archives (.parquet, zstd), the JSON-lines import,
replay into Redis and conversion (docs: docs_traces_section.md; CLI: python -m traces).

    reader = open_trace("run.parquet")   # or .arrows / .jsonl
    reader.timeline()                    # Timeline: step_T, time_s_T, phase_T, tokens_T, balancedness_T
    reader.read_steps(100, 699)          # list[wire.StepRecord], every rank of those steps
    reader.read_timings(100, 699)        # list[wire.TimingRecord], every rank's layer timings of those steps

Imports wire, planner, numpy and pyarrow only (never streamlit, plotly or torch).
"""
from .base import TraceInfo, TraceReader
from .reader import container_of, open_trace
from .schema import FORMAT_VERSION
from .timeline import Timeline
from .writers import open_writer

__all__ = ["FORMAT_VERSION", "Timeline", "TraceInfo", "TraceReader", "container_of", "open_trace", "open_writer"]
