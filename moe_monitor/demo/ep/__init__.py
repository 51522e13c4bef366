"""An expert-parallel (EP) runtime on the CPU: N processes (torch.distributed, gloo on loopback), each holding
the experts its layout puts on it, routing with the tiny DeepSeek-V3's own router and exchanging tokens with
all_to_all_single, watched by the collectors (counts and per-layer dispatch / compute / combine times).

    python -m moe_monitor.demo.ep --ranks 4 --redis redis://127.0.0.1:6379/0 --run ep-demo --seconds 60 [--layout FILE]
    moe-monitor apply --redis URL --run ep-demo --layout FILE     # switch the running layout live (signed)

Modules: config, placement, store, dispatch, experts, migrate (weights for a new layout), admission, watch
(rank 0's watch of layout requests), control (the stop / new-layout broadcast), worker, launch, __main__ (the
CLI). Docs: docs/ep-runtime.md.
"""
from .config import EPConfig
from .launch import launch

__all__ = ["EPConfig", "launch"]
