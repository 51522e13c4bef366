"""Benchmarks (make bench): each prints ratios measured side by side in one run. Run from the repo root as
`python -m bench.collector`, `python -m bench.dashboard`, `python -m bench.planner`."""
