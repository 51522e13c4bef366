"""Model side of the MoE load monitor: count tokens per expert per layer per step and publish them.

    from moe_monitor.collectors import attach
    monitor = attach(model, redis_url="redis://127.0.0.1:6379/0", run="deepseek-prod")
    model.generate(**batch)
    monitor.counts()      # int64 [L, E] (MoE layers x experts), cumulative; monitor.layer_names: the rows
    monitor.close()

Other engines feed ExpertLoadMonitor (monitor.py) directly; tuning knobs are MonitorOptions fields (options.py),
passed as options= or by name. Integrations: hf, megatron, torchtitan, vllm/, sglang/. docs/collectors.md.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .discovery import MoELayer, find_moe_layers
    from .hf import AttachedMonitor, attach
    from .monitor import ExpertLoadMonitor
    from .options import MonitorOptions
    from .trace import record_trace

# Imported on first use: the aggregator (moe-monitor aggregate), the vLLM plugin's entry point and the SGLang
# bridge run without loading torch and transformers until a model-side name is asked for.
_LAZY = {"MoELayer": ".discovery", "find_moe_layers": ".discovery", "AttachedMonitor": ".hf", "attach": ".hf",
         "ExpertLoadMonitor": ".monitor", "MonitorOptions": ".options", "record_trace": ".trace"}

__all__ = ["attach", "AttachedMonitor", "ExpertLoadMonitor", "find_moe_layers", "MoELayer", "MonitorOptions",
           "record_trace"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
