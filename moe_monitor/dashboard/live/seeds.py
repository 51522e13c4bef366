"""A copy of each live run the server's sessions watch, for the next session that opens the same run (a new tab,
a reload): it starts from the copy, with its decoded window and cached loads, and polls on from where the copy
left off instead of reading and decoding the whole window again. No Streamlit; dashboard.views.session uses it.

A copy is offered by a session's WatchedRun before a tick (at most every OFFER_EVERY_S per run, one copier at a
time) and given out while it is younger than MAX_AGE_S and its source says a copy may go on (RedisSource.continues:
the same streams, the same metadata); anything else starts afresh. Each copy holds its own bytes of the memory
budget, given back as soon as it is dropped: every offer and take drops the copies older than MAX_AGE_S, and a
session short of rows drops them all (MemoryBudget.add_relief). None is made of a run holding more than
BUDGET_SHARE of what the budget has left (window, rings, GPU readings).
"""
from __future__ import annotations

import collections
import copy
import threading
import time
import weakref
from collections.abc import Callable

from moe_monitor.dashboard.live.watched import WatchedRun

OFFER_EVERY_S = 5.0  # a run's copy is replaced at most this often
MAX_AGE_S = 60.0     # an older copy is not given out (catching up would read most of the window anyway)
MAX_RUNS = 4         # copies kept, the least recently offered dropped first
BUDGET_SHARE = 0.25  # a run is copied only while it holds at most this share of the budget still free
GPU_ROW_BYTES = 1024  # one NVML reading kept as a dict row (GpuHistory.series; its arrays are counted apart)


class _Kept:
    """One kept copy: when it was made, and how many take() calls are copying it (it is closed, its
    reservations given back, once it is dropped and none is)."""

    __slots__ = ("made_s", "run", "users", "dropped")

    def __init__(self, made_s: float, run: WatchedRun):
        self.made_s, self.run, self.users, self.dropped = made_s, run, 0, False


class Seeds:
    """Copies of watched runs by key (a session's Settings.monitor_key()); thread-safe. clock: monotonic
    seconds (tests pass their own)."""

    def __init__(self, max_runs: int = MAX_RUNS, every_s: float = OFFER_EVERY_S, max_age_s: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic):
        self.max_runs, self.every_s, self.max_age_s, self.clock = max_runs, every_s, max_age_s, clock
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[tuple, _Kept] = collections.OrderedDict()
        self._copying: set[tuple] = set()  # keys an offer() is copying now (one copier per key)
        self._given: weakref.WeakSet[WatchedRun] = weakref.WeakSet()  # copies given out, not offered back at once

    def held_keys(self) -> list[tuple]:
        """The keys a copy is kept for, the least recently offered first."""
        with self._lock:
            return list(self._held)

    def offer(self, key: tuple, watched: WatchedRun) -> None:
        """Keep a copy of watched for key, unless one younger than every_s is kept or being made, watched was
        given out by take() and has not ticked since, or its source cannot go on from a copy."""
        now = self.clock()
        with self._lock:
            gone = self._drop_old(now)
            given = watched in self._given
            self._given.discard(watched)
            held = self._held.get(key)
            busy = given or key in self._copying or held is not None and now - held.made_s < self.every_s
            if not busy and _copyable(watched):
                self._copying.add(key)  # claimed: the copy itself is made outside the lock
            else:
                busy = True
        _close(gone)
        if busy:
            return
        kept = None
        try:
            kept = _copy(watched)
        except ValueError:  # the memory budget cannot hold another copy
            pass
        finally:
            with self._lock:
                self._copying.discard(key)
                if kept is not None:
                    gone = [self._held.pop(key)] if key in self._held else []
                    self._held[key] = _Kept(now, kept)
                    while len(self._held) > self.max_runs:
                        gone.append(self._held.popitem(last=False)[1])
                    gone = self._dropping(gone)
        if kept is not None:
            _close(gone)
            if kept.window is not None:  # a session short of rows drops the copies first
                kept.window.budget.add_relief(self.clear)

    def take(self, key: tuple) -> WatchedRun | None:
        """A WatchedRun of its own for a new session, copied from the one kept for key; None when none is kept,
        it is older than max_age_s, its source cannot go on from it or the budget cannot hold the copy."""
        with self._lock:
            gone = self._drop_old(self.clock())
            held = self._held.get(key)
            if held is not None:
                held.users += 1
        _close(gone)
        if held is None:
            return None
        given = None
        try:
            if held.run.source.continues():  # type: ignore[attr-defined]
                given = _copy(held.run)
            else:
                with self._lock:
                    if self._held.get(key) is held:
                        del self._held[key]
                        held.dropped = True
        except ValueError:  # the memory budget cannot hold the copy
            pass
        finally:
            with self._lock:
                held.users -= 1
                if given is not None:
                    self._given.add(given)
                gone = [held] if held.dropped and held.users == 0 else []
        _close(gone)
        return given

    def clear(self) -> None:
        """Drop every copy (their reservations are given back once no take() is copying them)."""
        with self._lock:
            gone = self._dropping(list(self._held.values()))
            self._held.clear()
        _close(gone)

    def _drop_old(self, now: float) -> list[_Kept]:
        """(Under the lock.) Drop the copies older than max_age_s: they would never be given out; returns those
        to close."""
        old = [key for key, held in self._held.items() if now - held.made_s > self.max_age_s]
        return self._dropping([self._held.pop(key) for key in old])

    @staticmethod
    def _dropping(kept: list[_Kept]) -> list[_Kept]:
        """(Under the lock.) Mark copies no longer held; returns those no take() is copying (to close now)."""
        for held in kept:
            held.dropped = True
        return [held for held in kept if held.users == 0]


def copy_bytes(watched: WatchedRun) -> int:
    """Bytes a copy of watched holds: its window's, sample ring's and timing ring's reservations and its GPU
    readings (not reserved: their arrays plus GPU_ROW_BYTES a reading row)."""
    held = sum(part.reserved_bytes for part in (watched.window, watched.samples, watched.timings) if part is not None)
    gpus = watched.gpus
    # GpuHistory reserves nothing and says nothing of its size: its arrays are counted here
    readings = sum(r.time_s.nbytes + r.values.nbytes for r in gpus._readings.values())
    return held + readings + GPU_ROW_BYTES * sum(len(rows) for rows in gpus.series.values())


def _copyable(watched: WatchedRun) -> bool:
    """A window to copy, a source a copy may go on from, and room: the sessions' share of the budget comes first."""
    window = watched.window
    if window is None or not callable(getattr(watched.source, "continues", None)):
        return False
    return copy_bytes(watched) <= BUDGET_SHARE * window.budget.available_bytes


def _copy(watched: WatchedRun) -> WatchedRun:
    """A deep copy sharing only the Redis client (a socket pool, one per URL for the whole server)."""
    client = getattr(watched.source, "client", None)
    return copy.deepcopy(watched, memo={} if client is None else {id(client): client})


def _close(kept: list[_Kept]) -> None:
    """Give the dropped copies' reservations back now (not at their garbage collection)."""
    for held in kept:
        run = held.run
        for part in (run.window, run.samples, run.timings):
            if part is not None:
                part.close()


SEEDS = Seeds()  # the server's
