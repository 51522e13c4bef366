"""Small keyed caches for the What-if page (pure: a dict the page keeps in its state), so a rerun caused by a
click never re-plans: plans, budget curves and traffic summaries are computed once per input key."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

MAX_ENTRIES = 8
V = TypeVar("V")


@dataclass(frozen=True)
class Refused:
    """A cached ValueError: its message only, raised as a new ValueError each time (re-raising one exception
    object grows its traceback, and keeps every run's frames alive, at each rerun)."""

    message: str


def cached(store: dict[tuple, Any], key: tuple, compute: Callable[[], V], max_entries: int = MAX_ENTRIES) -> V:
    """store[key], computing it on a miss; the oldest entries go beyond max_entries. A ValueError from
    compute is cached too (as Refused, or compute may return a Refused) and raised afresh, so a bad input is not
    retried every rerun."""
    if key not in store:
        try:
            store[key] = compute()
        except ValueError as exc:
            store[key] = Refused(str(exc))
        while len(store) > max_entries:
            store.pop(next(iter(store)))
    value = store[key]
    if isinstance(value, Refused):
        raise ValueError(value.message)
    return value
