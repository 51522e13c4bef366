"""Where the vLLM plugin hooks into vLLM (no import of vLLM here: the plugin is loaded in every vLLM process, most
of which never build a model runner). Used by the package's register() and by binding.RunnerBinding.

As their modules are imported: the model runners' load_model (binds a RunnerBinding right after the model is
built, before vLLM compiles it or captures CUDA graphs) and execute_model (the step boundary), EPLB's map commits
(a new layout) and EplbState.step (each pass's physical load). At binding: each fused-MoE router's one capture
slot, shared with vLLM's own routed-experts capturer (attach). A failure in any of this is logged and leaves
vLLM untouched.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger("vllm.moe_monitor")

RUNNER_MODULES = {  # module -> classes whose own load_model / execute_model are wrapped
    "vllm.v1.worker.gpu_model_runner": ("GPUModelRunner",),
    "vllm.v1.worker.cpu_model_runner": ("CPUModelRunner",),
    "vllm.v1.worker.gpu.model_runner": ("GPUModelRunner",),
}
EPLB_MODULE = "vllm.distributed.eplb.eplb_state"
EPLB_COMMITS = ("_commit_eplb_maps", "_commit_eplb_maps_for_layer")
EPLB_CLASS = "EplbState"
_MARK = "__moe_monitor_wrapped__"
Capture = Callable[[Any], None]


# ------------------------------------------------------------------ a router's capture slot
def chained(other: Capture | None, ours: Capture) -> Capture:
    """ours alone, or a function calling other and then ours with the same topk_ids [N, K]."""
    if other is None or other is ours:
        return ours

    def both(topk_ids: Any) -> None:
        other(topk_ids)
        ours(topk_ids)
    return both


def attach(router: Any, ours: Capture) -> None:
    """Make ours one of the router's capture functions, whatever is set before or after. A router keeps a single
    capture_fn (BaseRouter.set_capture_fn) and vLLM binds its routed-experts capturer after load_model, where
    the plugin binds: the router's set_capture_fn is replaced, on that router only, by one that keeps ours called
    after the new one."""
    original_set = router.set_capture_fn
    original_set(chained(getattr(router, "capture_fn", None), ours))
    router.set_capture_fn = lambda fn: original_set(chained(fn, ours))


# ------------------------------------------------------------------ runner and EPLB methods
def wrap_load_model(original: Callable, bind: Callable) -> Callable:
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if getattr(self, "_moe_binding", None) is None:
            try:
                self._moe_binding = bind(self)
            except Exception as exc:  # the model serves on, unwatched
                self._moe_binding = False
                log.warning("moe monitor: not watching this model: %s: %s", type(exc).__name__, exc)
        return result
    setattr(load_model, _MARK, True)
    return load_model


def wrap_execute_model(original: Callable) -> Callable:
    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        binding = getattr(self, "_moe_binding", None)
        if binding:
            try:
                binding.begin(scheduler_output)
            except Exception as exc:
                binding.monitor._note_failure(f"step begin: {type(exc).__name__}: {exc}")
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            if binding:
                try:
                    binding.end()
                except Exception as exc:
                    binding.monitor._note_failure(f"step end: {type(exc).__name__}: {exc}")
    setattr(execute_model, _MARK, True)
    return execute_model


def wrap_commit(original: Callable, on_commit: Callable[[], None]) -> Callable:
    @functools.wraps(original)
    def commit(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            on_commit()
        except Exception as exc:
            log.warning("moe monitor: EPLB layout change not noted: %s", exc)
        return result
    setattr(commit, _MARK, True)
    return commit


def step_flags(args: tuple, kwargs: dict) -> tuple[bool, bool]:
    """(is_dummy, is_profile) of an EplbState.step call: by keyword, else the first and second bool positional
    (recent vLLM: step(is_dummy, is_profile, log_stats); older: step(model, is_dummy, is_profile, log_stats))."""
    flags = [arg for arg in args if isinstance(arg, bool)]
    is_dummy = kwargs.get("is_dummy", flags[0] if flags else False)
    is_profile = kwargs.get("is_profile", flags[1] if len(flags) > 1 else False)
    return bool(is_dummy), bool(is_profile)


def wrap_eplb_step(original: Callable, on_pass: Callable[[Any], None]) -> Callable:
    """EplbState.step with on_pass(state) called first on real (not dummy, not profile) steps, while the pass's
    expert_load_pass is still unzeroed (EPLB skips dummy and profile steps too); a failure there is logged and
    never reaches vLLM."""
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


def patch_module(module: ModuleType, bind: Callable, on_commit: Callable[[], None],
                 on_pass: Callable[[object], None] | None = None) -> None:
    """Wrap what `module` defines (a runner module or EPLB's state module); twice is harmless. on_pass(state):
    called by EplbState.step before each real step (wrap_eplb_step); None leaves step unwrapped."""
    for class_name in RUNNER_MODULES.get(module.__name__, ()):
        cls = getattr(module, class_name, None)
        if cls is None:
            continue
        for name, wrap in (("load_model", lambda f: wrap_load_model(f, bind)), ("execute_model", wrap_execute_model)):
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, _MARK, False):
                setattr(cls, name, wrap(method))
    if module.__name__ == EPLB_MODULE:
        for name in EPLB_COMMITS:
            function = getattr(module, name, None)
            if function is not None and not getattr(function, _MARK, False):
                setattr(module, name, wrap_commit(function, on_commit))
        if on_pass is not None:
            patch_eplb_class(module, on_pass)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the target modules right after they execute, whenever they are first imported."""

    def __init__(self, patch: Callable[[ModuleType], None]):
        self._patch = patch
        self._busy: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        if fullname not in RUNNER_MODULES and fullname != EPLB_MODULE or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader, patch = spec.loader, self._patch

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module)

        spec.loader = _Loader()
        return spec


def install(bind: Callable, on_commit: Callable[[], None], on_pass: Callable[[object], None] | None = None) -> None:
    """Patch the runner and EPLB modules now if imported, else when they are."""
    patch = functools.partial(patch_module, bind=bind, on_commit=on_commit, on_pass=on_pass)
    for name in (*RUNNER_MODULES, EPLB_MODULE):
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(patch))
