"""An expert-parallel (EP) runtime on the CPU: N processes (torch.distributed, gloo on loopback), each holding
the experts its layout puts on it, routing with the tiny DeepSeek-V3's own router and exchanging tokens with
all_to_all_single, watched by the collectors (counts and per-layer dispatch / compute / combine times).

    python -m moe_monitor.demo.ep --ranks 4 --redis redis://127.0.0.1:6379/0 --run ep-demo --seconds 60 [--layout FILE]
    moe-monitor apply --redis URL --run ep-demo --layout FILE     # switch the running layout live (signed with
                                                                  # the secret of --apply-secret-file)

Modules, one job each: config (EPConfig: what a run does), placement (a layout over the ranks: who holds
which expert, which replica a token goes to), store (the expert weights a rank holds, its expert FFNs),
dispatch (the two all-to-alls and the weighted sum), experts (the module that replaces a transformers MoE
layer's experts), migrate (moving expert weights between ranks for a new layout), admission (which
signed layout requests a run takes), watch (rank 0's non-blocking watch of the run's layout requests, and the
verdicts it files back), control (the per-few-steps broadcast of stop / new layout),
worker (one rank), launch (spawning the ranks), __main__ (the CLI), apply (the layout-apply CLI).
"""
from .config import EPConfig
from .launch import launch

__all__ = ["EPConfig", "launch"]
