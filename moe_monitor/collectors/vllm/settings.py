"""The vLLM plugin's configuration, read from the environment of every vLLM process (pure: no vLLM import).

    MOE_MONITOR_REDIS_URL        where to publish (redis://, rediss://, with user:password); unset: the plugin
                                 does nothing but log one line
    MOE_MONITOR_RUN              the run's name (default: the served model's name, made a valid run name)
    MOE_MONITOR_SAMPLE_TOKENS    sampled routing rows per layer and step (default 16; 0: off)
    MOE_MONITOR_QUEUE_STEPS      steps kept while Redis is unreachable (default 1024)
    MOE_MONITOR_MEMORY_BUDGET_MB the step stream's memory budget in Redis (default 256)
    MOE_MONITOR_NVML             1/0: sample the GPUs with NVML (default 1)
    MOE_MONITOR_TRACE            also append every step to this trace file
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_URL = "MOE_MONITOR_REDIS_URL"
ENV_RUN = "MOE_MONITOR_RUN"
_INT_OPTIONS = {"MOE_MONITOR_SAMPLE_TOKENS": ("sample_tokens", 0, 4096, 1),
                "MOE_MONITOR_QUEUE_STEPS": ("queue_steps", 1, 1 << 20, 1),
                "MOE_MONITOR_MEMORY_BUDGET_MB": ("memory_budget_bytes", 1, 1 << 20, 1 << 20)}


@dataclass(frozen=True)
class PluginSettings:
    """redis_url None: the plugin stays off. run None: named after the served model. options: MonitorOptions
    fields by name."""

    redis_url: str | None
    run: str | None
    options: dict[str, Any] = field(default_factory=dict)


def settings_from_env(env: Mapping[str, str]) -> PluginSettings:
    """The plugin's settings from environment variables; ValueError naming the variable that is wrong."""
    url = env.get(ENV_URL, "").strip() or None
    run = env.get(ENV_RUN, "").strip() or None
    options: dict[str, Any] = {}
    for name, (option, least, most, scale) in _INT_OPTIONS.items():
        text = env.get(name, "").strip()
        if not text:
            continue
        if not re.fullmatch(r"[0-9]{1,9}", text) or not least <= int(text) <= most:
            raise ValueError(f"{name}={text[:40]!r} must be a whole number {least}..{most}")
        options[option] = int(text) * scale
    nvml = env.get("MOE_MONITOR_NVML", "").strip()
    if nvml:
        if nvml not in ("0", "1"):
            raise ValueError(f"MOE_MONITOR_NVML={nvml[:40]!r} must be 0 or 1")
        options["nvml"] = nvml == "1"
    trace = env.get("MOE_MONITOR_TRACE", "").strip()
    if trace:
        options["trace_path"] = trace
    return PluginSettings(url, run, options)


def run_name_for(model_name: str) -> str:
    """A valid run name from a served model's name: its last path part, other characters as '-'."""
    tail = model_name.rstrip("/").split("/")[-1] or "vllm"
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", tail)[:128]
