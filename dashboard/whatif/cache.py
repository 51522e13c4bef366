"""Small keyed caches for the What-if page (pure: a dict the page keeps in st.session_state), so a rerun
caused by a click never re-plans: plans and budget curves are computed once per input key."""
from __future__ import annotations

from typing import Callable

MAX_ENTRIES = 8


def cached(store: dict, key: tuple, compute: Callable[[], object], max_entries: int = MAX_ENTRIES):
    """store[key], computing it on a miss; the oldest entries go beyond max_entries. An exception from
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
