"""A copy of each live run the server's sessions watch, for the next session that opens the same run (a new tab,
a reload): it starts from the copy, with its decoded window and cached loads, and polls on from where the copy
left off instead of reading and decoding the whole window again. No Streamlit; dashboard.views.session uses it.

A copy is offered by a session's WatchedRun before a tick (at most every OFFER_EVERY_S per run) and given out
while it is younger than MAX_AGE_S and its source says a copy may go on (RedisSource.continues: the same
streams, the same metadata); anything else (a trace, the aggregate feed, a run written afresh) starts afresh.
Each copy holds its own bytes of the memory budget; none is made of a window larger than BUDGET_SHARE of what
the budget has left, or that the budget cannot hold.
"""
from __future__ import annotations

import collections
import copy
import threading
import time
import weakref

from moe_monitor.dashboard.live.watched import WatchedRun

OFFER_EVERY_S = 5.0  # a run's copy is replaced at most this often
MAX_AGE_S = 60.0     # an older copy is not given out (catching up would read most of the window anyway)
MAX_RUNS = 4         # copies kept, the least recently offered dropped first
BUDGET_SHARE = 0.25  # a window is copied only while it holds at most this share of the budget still free


class Seeds:
    """Copies of watched runs by key (a session's Settings.monitor_key()); thread-safe."""

    def __init__(self, max_runs: int = MAX_RUNS, every_s: float = OFFER_EVERY_S, max_age_s: float = MAX_AGE_S):
        self.max_runs, self.every_s, self.max_age_s = max_runs, every_s, max_age_s
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[tuple, tuple[float, WatchedRun]] = collections.OrderedDict()
        self._given: weakref.WeakSet[WatchedRun] = weakref.WeakSet()  # copies given out, not offered back at once

    def offer(self, key: tuple, watched: WatchedRun) -> None:
        """Keep a copy of watched for key, unless one younger than every_s is kept, watched was given out by
        take() and has not ticked since, or its source cannot go on from a copy."""
        now = time.monotonic()
        with self._lock:
            if watched in self._given:
                self._given.discard(watched)
                return
            held = self._held.get(key)
        if held is not None and now - held[0] < self.every_s or watched.window is None:
            return
        if not callable(getattr(watched.source, "continues", None)):
            return
        window = watched.window
        if window.reserved_bytes > BUDGET_SHARE * window.budget.available_bytes:  # the sessions' room comes first
            return
        try:
            kept = _copy(watched)
        except ValueError:  # the memory budget cannot hold another window
            return
        with self._lock:
            self._held[key] = (now, kept)
            self._held.move_to_end(key)
            while len(self._held) > self.max_runs:
                self._held.popitem(last=False)

    def take(self, key: tuple) -> WatchedRun | None:
        """A WatchedRun of its own for a new session, copied from the one kept for key; None when none is kept,
        it is older than max_age_s, its source cannot go on from it or the budget cannot hold the copy."""
        with self._lock:
            held = self._held.get(key)
        if held is None:
            return None
        made_s, kept = held
        if time.monotonic() - made_s > self.max_age_s or not kept.source.continues():  # type: ignore[attr-defined]
            with self._lock:
                if self._held.get(key) is held:
                    del self._held[key]
            return None
        try:
            given = _copy(kept)
        except ValueError:
            return None
        with self._lock:
            self._given.add(given)
        return given

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


def _copy(watched: WatchedRun) -> WatchedRun:
    """A deep copy sharing only the Redis client (a socket pool, one per URL for the whole server)."""
    client = getattr(watched.source, "client", None)
    return copy.deepcopy(watched, memo={} if client is None else {id(client): client})


SEEDS = Seeds()  # the server's
