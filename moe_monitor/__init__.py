"""moe_monitor: a live load monitor for mixture-of-experts models served with expert parallelism.

Packages, bottom up; a layer imports only those below it (import-linter; docs/architecture.md, "The layers"):
    core                             records and their encodings, stream keys, the Redis client, shared ideas
    collectors | planner | traces    model side (torch) | layouts and the advisor (numpy) | columnar trace files
    dashboard | aggregator           the Streamlit app (no torch, no pynvml) | sums each step's ranks once; rollups
    demo | exporter                  the embedded demo (private redis-server, tiny model) | Prometheus metrics
    cli                              the one `moe-monitor` command
"""
