"""Sharing a fused-MoE router's one capture slot (BaseRouter.set_capture_fn) with vLLM's own routed-experts
capturer (no import of vLLM here).

A router keeps a single capture_fn. vLLM binds its capturer (--enable-return-routed-experts, Model Runner V2)
in initialize_kv_cache, after load_model, where the plugin binds: a plain set_capture_fn would drop whichever
came first. attach() installs the plugin's function beside any other, now and later: the router's
set_capture_fn is replaced, on that router only, by one that keeps the plugin's function called after the new one.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

Capture = Callable[[Any], None]


def chained(other: Capture | None, ours: Capture) -> Capture:
    """ours alone, or a function calling other and then ours with the same topk_ids [N, K]."""
    if other is None or other is ours:
        return ours

    def both(topk_ids: Any) -> None:
        other(topk_ids)
        ours(topk_ids)
    return both


def attach(router: Any, ours: Capture) -> None:
    """Make ours one of the router's capture functions, whatever is set before or after."""
    original_set = router.set_capture_fn
    original_set(chained(getattr(router, "capture_fn", None), ours))
    router.set_capture_fn = lambda fn: original_set(chained(fn, ours))
