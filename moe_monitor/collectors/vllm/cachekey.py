"""The plugin's share of vLLM's compile-cache key (pure: no vLLM import).

vLLM keeps compiled graphs on disk (torch.compile's AOT artifacts, on by default with torch >= 2.10) under a
key made of its config and environment, computed before Dynamo traces the model: it never sees the capture
functions the plugin gives every fused-MoE router. Without a factor of the plugin's own, an engine with the
plugin loads the graph an engine without it compiled (and counts nothing), and a plugin of other code or other
settings loads a graph whose counting ops are not its own. bind_cache_key() adds that factor to
vllm_config.additional_config, which vLLM hashes into every compile-cache key: a digest of the plugin's
counting code and of the sizes its traced ops are built from.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

CACHE_FACTOR = "moe_monitor_graph"
_HERE = Path(__file__).resolve().parent
TRACED_SOURCES = (_HERE / "binding.py", _HERE / "rows.py", _HERE / "capture.py", _HERE.parent / "counter.py")


def graph_key(shape: Mapping[str, object]) -> str:
    """16 hex digits naming the capture ops the plugin traces into the graph: its counting code (the
    TRACED_SOURCES' bytes) and `shape`, the sizes those ops are built from (layers, experts, top-k, sampled
    rows, gate length, ...; JSON values)."""
    digest = hashlib.sha256()
    for path in TRACED_SOURCES:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps(dict(shape), sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def bind_cache_key(vllm_config, key: str) -> str:
    """Put `key` into vLLM's compile-cache key (vllm_config.additional_config, a dict by default, changed in
    place: the model keeps the same config object). An additional_config of another kind cannot take it: the
    compile cache is turned off in this process instead (VLLM_DISABLE_COMPILE_CACHE, read by vLLM when it
    compiles, after the model is loaded). Returns what was done, for the log."""
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict):
        extra[CACHE_FACTOR] = key
        return f"compile-cache factor {key}"
    if extra is None:
        vllm_config.additional_config = {CACHE_FACTOR: key}
        return f"compile-cache factor {key}"
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    return f"compile cache off (additional_config is a {type(extra).__name__}, not a dict)"
