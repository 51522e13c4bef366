"""The harness behind bench.scale and bench.faults: simulated ranks writing real-shaped steps (loadgen.py: through
RedisSink, measuring what lands; ranks.py: through the collectors' Publisher, for faults), where they write
(target.py), the aggregator as its own process (aggregator.py), what is read while the load runs (probes.py), and
the two benchmarks' measurements (scale.py with its Load, faults.py against a Deployment, deployment.py).
"""
