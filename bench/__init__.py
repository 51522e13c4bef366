"""Benchmarks (make bench): each prints ratios measured side by side in one run. Run from the repo root as
`python -m bench.collector`, `python -m bench.dashboard`, `python -m bench.planner`. Scaling to many ranks:
`python -m bench.wire` (bytes per rank-step, codecs, Redis XADD rate), `python -m bench.scale` (256 ranks into one
Redis, with the aggregator when it exists); `bench.harness.loadgen` is their load generator (simulated ranks
writing through the real collectors.sinks.RedisSink)."""
