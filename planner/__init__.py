"""Pure planning core: layouts (physical_to_logical_map [L, P]), bounds, policies and what-if tools.

No torch / streamlit imports here. Public entry points:
plan (api), bounds (bounds), replica_budget_curve (budget), traffic_under_layout (traffic),
repair_layout / repair_curve (repair), add_replica / move_replica (edits), load_counts (io).
"""
