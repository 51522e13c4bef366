"""The plugin's compile-cache factor (collectors/vllm/rules.py), pure: no vLLM here. The engine test
tests/engines/test_vllm_plugin.py::test_a_graph_compiled_without_the_plugin_is_never_loaded_with_it runs it
against vLLM's own cache."""
from __future__ import annotations

import os
from types import SimpleNamespace

from moe_monitor.collectors.vllm.rules import CACHE_FACTOR, bind_cache_key, graph_key

SHAPE = dict(layers=2, experts=8, top_k=2, sample_tokens=16, gate=512, fused_shared=[False, False], dp=1, tp=1,
             sharded=False)


def test_the_key_names_the_sizes_the_capture_ops_are_built_from():
    key = graph_key(SHAPE)
    assert key == graph_key(dict(reversed(list(SHAPE.items())))) and len(key) == 16
    changed = {graph_key({**SHAPE, name: value}) for name, value in
               (("sample_tokens", 0), ("gate", 1024), ("experts", 16), ("fused_shared", [True, False]), ("dp", 2))}
    assert key not in changed and len(changed) == 5


def test_the_factor_goes_into_vllms_additional_config_in_place(monkeypatch):
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
    extra = {"a platform's own": 1}
    config = SimpleNamespace(additional_config=extra)
    assert "factor abc" in bind_cache_key(config, "abc")
    assert config.additional_config is extra and extra == {"a platform's own": 1, CACHE_FACTOR: "abc"}
    empty = SimpleNamespace(additional_config=None)
    bind_cache_key(empty, "abc")
    assert empty.additional_config == {CACHE_FACTOR: "abc"}
    assert "VLLM_DISABLE_COMPILE_CACHE" not in os.environ


def test_a_config_object_it_cannot_extend_turns_the_compile_cache_off(monkeypatch):
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)

    class Hashed:
        def compute_hash(self) -> str:
            return "x"
    config = SimpleNamespace(additional_config=Hashed())
    said = bind_cache_key(config, "abc")
    assert "compile cache off" in said and "Hashed" in said
    assert os.environ["VLLM_DISABLE_COMPILE_CACHE"] == "1"
