"""Expert-layout planning, pure numpy (no torch, no UI): a layout is int [L, P] (SGLang's physical_to_logical_map),
slot p on GPU p // S.

- plan -> PlanResult (planner.api; objective "tail": planner.tail); best_bound / group_partition_bound;
- repair_plan / repair_curve / experts_copied; add_replica / move_replica; replica_budget_curve; traffic;
- load_counts / load_layout / split_windows (inputs); simulate / Schedule / CostModel (straggler + migration);
- advise / periodic_schedule / static_schedule (schedules); staleness.
GPU loads and balancedness are core.loadmodel's and core.dispatch's. The CLI: `moe-monitor plan` (cli/planner.py).
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
