"""GPU load from expert counts under a layout, with the even-split rule.

GPU load of a step and layer = sum over the GPU's slots p of count[e_p] / replicas[e_p] (a token routed to an
expert with r replicas is assumed to be split evenly across them, as EPLB assumes). The one implementation
lives in dashboard.planner.loads (pure numpy), so the live pages and the What-if page can never disagree;
these are the names the live side uses.

Shape legend: T steps, L layers, E logical experts, P physical slots, G GPUs.
"""
from __future__ import annotations

from dashboard.planner.loads import replica_counts, validated_layout as layout_array, weighted_loads as gpu_loads
from dashboard.planner.loads import gpu_weights

__all__ = ["gpu_loads", "gpu_weights", "layout_array", "replica_counts"]
