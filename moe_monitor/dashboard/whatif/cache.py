"""Small keyed caches for the What-if page (pure: a dict the page keeps in its state), so a rerun caused by a
click never re-plans: plans, budget curves and traffic summaries are computed once per input key."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

MAX_ENTRIES = 8
V = TypeVar("V")


def cached(store: dict[tuple, Any], key: tuple, compute: Callable[[], V], max_entries: int = MAX_ENTRIES) -> V:
    """store[key], computing it on a miss; the oldest entries go beyond max_entries. A ValueError from
    compute is cached too (as the exception) and re-raised, so a bad input is not retried every rerun."""
    if key not in store:
        try:
            store[key] = compute()
        except ValueError as exc:
            store[key] = exc
        while len(store) > max_entries:
            store.pop(next(iter(store)))
    value = store[key]
    if isinstance(value, ValueError):
        raise value
    return value
