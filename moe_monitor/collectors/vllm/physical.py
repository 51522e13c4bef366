"""vLLM EPLB's per-pass physical load, read for ExpertLoadMonitor.record_physical (no import of vLLM here).

With --enable-eplb vLLM keeps, per model, `expert_load_pass` int [L, P]: the tokens this rank sent to each
physical expert in the current forward pass (recent vLLM; older releases count local experts only, [L, P / ranks],
which no reader can sum to GPU loads, so those are not published). EplbState.step(), called by the runner after
every forward (inside execute_model, before our step boundary closes the step), copies it into its window and
zeroes it. The step is wrapped: before the original runs, the pass's load (still on the device) is handed to the
binding of that runner, which publishes it as the open step's physical record (a device tensor: copied to
pinned memory behind an event, no host sync). Dummy and profile steps are skipped, as EPLB skips them.

Shape legend: L MoE layers, P physical experts (slots).
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("vllm.moe_monitor")
EPLB_CLASS = "EplbState"
_MARK = "__moe_monitor_wrapped__"


def pass_load(state: Any, num_layers: int) -> Any:
    """The first model's expert_load_pass [L, P] tensor of an EplbState (recent vLLM: state.model_states[name];
    older: on the state itself) whose L is num_layers; None when there is none."""
    models = getattr(state, "model_states", None)
    candidates = list(models.values()) if isinstance(models, dict) and models else [state]
    for model_state in candidates:
        load = getattr(model_state, "expert_load_pass", None)
        shape = getattr(load, "shape", None)
        if shape is not None and len(shape) == 2 and int(shape[0]) == num_layers:
            return load
    return None


def step_flags(args: tuple, kwargs: dict) -> tuple[bool, bool]:
    """(is_dummy, is_profile) of an EplbState.step call: by keyword, else the first and second bool positional
    (recent vLLM: step(is_dummy, is_profile, log_stats); older: step(model, is_dummy, is_profile, log_stats))."""
    flags = [arg for arg in args if isinstance(arg, bool)]
    is_dummy = kwargs.get("is_dummy", flags[0] if flags else False)
    is_profile = kwargs.get("is_profile", flags[1] if len(flags) > 1 else False)
    return bool(is_dummy), bool(is_profile)


def wrap_eplb_step(original: Callable, on_pass: Callable[[Any], None]) -> Callable:
    """EplbState.step with on_pass(state) called first on real (not dummy, not profile) steps; a failure there is
    logged and never reaches vLLM."""
    @functools.wraps(original)
    def step(self, *args, **kwargs):
        is_dummy, is_profile = step_flags(args, kwargs)
        if not is_dummy and not is_profile:
            try:
                on_pass(self)
            except Exception as exc:
                log.warning("moe monitor: EPLB pass load not read: %s: %s", type(exc).__name__, exc)
        return original(self, *args, **kwargs)
    setattr(step, _MARK, True)
    return step


def patch_eplb_class(module: Any, on_pass: Callable[[Any], None]) -> None:
    """Wrap module.EplbState.step (when the module defines it); twice is harmless."""
    cls = getattr(module, EPLB_CLASS, None)
    if cls is None:
        return
    method = vars(cls).get("step")
    if method is not None and not getattr(method, _MARK, False):
        cls.step = wrap_eplb_step(method, on_pass)
