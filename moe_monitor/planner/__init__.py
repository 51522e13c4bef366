"""Expert-layout planning, pure numpy (no torch, no UI): layouts are SGLang's physical_to_logical_map,
int [L, P] with slot p on GPU p // S (shape legend: README, Conventions).

- plan(counts, gpus, redundant, ...) -> PlanResult: a layout with its predicted balancedness and bounds
  (policies in POLICIES: EPLB parity, refined, robust over windows, hierarchical over nodes; objective "tail":
  the per-step p99 under a dispatch policy, planner.tail; the default's held-in pick of its blend, planner.heldin);
- best_bound / group_partition_bound: how good any layout could be;
- repair_plan / repair_curve / experts_copied: fix the current layout within a move budget;
- add_replica / move_replica: one hand edit; replica_budget_curve: imbalance against redundant slots;
- traffic: all-to-all traffic of sampled top-k rows under a layout;
- (GPU loads under a layout and balancedness are the load model's: moe_monitor.core.loadmodel);
- load_counts / load_layout / split_windows: inputs (SGLang logical_count JSON or .pt, traces, layouts);
- simulate / Schedule / CostModel: replay per-step counts under a layout schedule, straggler + migration time
  (GPU loads under a dispatch policy, core.dispatch);
- advise / periodic_schedule / static_schedule: rebalance policies that write schedules;
- staleness: imbalance at t + delta of layouts fitted at t.

The CLI is `moe-monitor plan` (cli/planner.py).
"""
from .advisor import advise, periodic_schedule, static_schedule
from .api import POLICIES, PlanResult, plan
from .bounds import best_bound, group_partition_bound
from .budget import bytes_per_expert, replica_budget_curve
from .edits import add_replica, move_replica
from .io import load_counts, load_layout, load_trace_steps
from .repair import experts_copied, repair_curve, repair_plan
from .schedule import Change, Schedule, load_schedule
from .simulate import CostModel, SimResult, simulate
from .sizes import DEEPSEEK_V3, ExpertSizes
from .staleness import StalenessCurve, staleness
from .traffic import traffic
from .windows import MAX_WINDOWS, split_windows

__all__ = [
    "Change", "CostModel", "Schedule", "SimResult", "StalenessCurve", "advise", "load_schedule", "load_trace_steps",
    "periodic_schedule", "simulate", "staleness", "static_schedule",
    "DEEPSEEK_V3", "MAX_WINDOWS", "POLICIES", "ExpertSizes", "PlanResult", "add_replica",
    "best_bound", "bytes_per_expert", "experts_copied", "group_partition_bound",
    "load_counts", "load_layout", "move_replica", "plan", "repair_curve", "repair_plan",
    "replica_budget_curve", "split_windows", "traffic",
]
