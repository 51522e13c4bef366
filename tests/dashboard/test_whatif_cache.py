"""The What-if's keyed caches (dashboard.whatif.cache): a value is computed once per key, the oldest go beyond
max_entries, and a refusal (ValueError) is kept as its message and raised afresh on each read."""
import pytest

from moe_monitor.dashboard.whatif.cache import cached


def test_computed_once_and_bounded():
    store, calls = {}, []
    for key in ["a", "a", "b", "c"]:
        cached(store, (key,), lambda: calls.append(1) or len(calls), max_entries=2)
    assert calls == [1, 1, 1] and list(store) == [("b",), ("c",)]


def test_a_refusal_is_raised_afresh_not_retried():
    store, calls, raised = {}, [], []

    def refuse():
        calls.append(1)
        raise ValueError("R must split over the GPUs")

    for _ in range(3):
        with pytest.raises(ValueError, match="split") as info:
            cached(store, ("plan",), refuse)
        raised.append(info.value)
    assert calls == [1]
    assert len({id(e) for e in raised}) == 3  # no one object whose traceback grows (and keeps frames) per rerun
    assert all(not isinstance(v, BaseException) for v in store.values())
