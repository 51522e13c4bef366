"""moe_monitor: a live load monitor for mixture-of-experts models served with expert parallelism.

Layers, bottom up (import-linter keeps the order; see pyproject.toml):
    core         records and their encodings, stream keys, the Redis client, and every idea more than one reader needs
    collectors   model side: count tokens per expert per layer per step and publish them (torch; engine integrations)
    planner      replica layouts, bounds, the rebalance advisor and its simulator (pure numpy)
    traces       columnar trace files: write, read, convert
    aggregator   sums each step's ranks once; rollups
    exporter     Prometheus metrics from the same analytics
    dashboard    the Streamlit app (never torch or pynvml)
    demo         the embedded demo: a private redis-server and a tiny MoE model on the CPU
    cli          the one `moe-monitor` command
"""
