"""The vLLM plugin: install this package into the serving environment, set MOE_MONITOR_REDIS_URL, serve.

vLLM loads the `vllm.general_plugins` entry point `moe_monitor = collectors.vllm:register` in every process
(VLLM_PLUGINS selects plugins by name when set). Without MOE_MONITOR_REDIS_URL register() logs one line and
does nothing else. With it, every model runner that loads a model with fused-MoE layers gets a RunnerBinding
(binding.py) on the ranks that publish: one step record per execute_model call, EPLB's layout changes and each
pass's physical load. Modules: rules.py (settings, who publishes, a step's facts and rows, the compile-cache
key), patch.py (the hooks into vLLM), binding.py (the counting and publishing).
"""
from __future__ import annotations

import logging
import os

from .rules import PluginSettings, settings_from_env

log = logging.getLogger("vllm.moe_monitor")
_installed = False


def register() -> None:
    """vLLM's entry point: read the environment and patch the model runners (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        settings = settings_from_env(os.environ)
    except ValueError as exc:
        log.warning("moe monitor: off: %s", exc)
        return
    if settings.redis_url is None:
        log.info("moe monitor: off (set MOE_MONITOR_REDIS_URL to publish expert load)")
        return
    from .patch import install
    install(lambda runner: _bind(runner, settings), _layout_committed, _eplb_pass)


def _bind(runner, settings: PluginSettings):
    """A RunnerBinding for a runner that has just loaded its model, or None for a rank that does not publish."""
    from .binding import RunnerBinding, worker_publishing
    publishing = worker_publishing(runner.vllm_config)
    if not publishing.publishes:
        log.info("moe monitor: this rank does not publish: %s", publishing.reason)
        return None
    return RunnerBinding(runner, settings, publishing)


def _layout_committed() -> None:
    from .binding import BINDINGS
    for binding in BINDINGS:
        binding.layout_committed()


def _eplb_pass(state) -> None:
    from .binding import BINDINGS
    for binding in BINDINGS:
        if getattr(binding.runner, "eplb_state", None) is state:
            binding.physical_pass(state)


__all__ = ["register", "settings_from_env", "PluginSettings"]
