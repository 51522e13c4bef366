"""The What-if page's plans, repairs and advice off the page's thread. One daemon thread for the whole server runs
them one at a time, oldest asked first; a page asks (ask) and gets at once the answer so far (done or not, its
value or error, when it was first asked, how many computations run or wait before it).

A computation is keyed on what it depends on (the window's counts, GPUs, redundant slots, policy and options), so
each key computes once, whoever asks. Each asker (owner: a browser session's plan, advice or curve) holds one key;
asking another releases the previous one, and a key no owner holds is dropped: its queued computation never runs,
a running one's result is thrown away. At most MAX_KEYS keys and MAX_OWNERS owners are remembered (the least
recently asked go first), so a closed browser tab leaves at most that behind."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

MAX_KEYS = 16      # computations remembered (queued, running or done)
MAX_OWNERS = 256   # askers remembered (browser sessions x what they ask for)


@dataclass(frozen=True)
class Answer:
    """Where a key's computation stands: done (value, or error: the exception it raised), asked_s (monotonic
    seconds when it was first asked for) and ahead (computations running or queued before it; 0 once it runs)."""

    done: bool
    asked_s: float
    value: Any = None
    error: BaseException | None = None
    ahead: int = 0


class _Entry:
    def __init__(self, compute: Callable[[], Any], asked_s: float):
        self.compute: Callable[[], Any] | None = compute  # dropped once run: the inputs it holds go with it
        self.asked_s = asked_s
        self.owners: set[Hashable] = set()
        self.running = False
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


_LOCK = threading.Condition()
_ENTRIES: OrderedDict[Hashable, _Entry] = OrderedDict()
_OWNED: OrderedDict[Hashable, Hashable] = OrderedDict()  # owner -> the key it holds
_THREAD: threading.Thread | None = None


def ask(key: Hashable, prepare: Callable[[], Callable[[], Any]], owner: Hashable) -> Answer:
    """The answer so far for key, which owner now holds (releasing the key it held before). On the first ask of a
    key, prepare() runs here (it copies what the computation needs: only then) and the computation it returns is
    queued."""
    global _THREAD
    with _LOCK:
        _hold(owner, key)
        entry = _ENTRIES.get(key)
        if entry is None:
            entry = _ENTRIES[key] = _Entry(prepare(), time.monotonic())
            _LOCK.notify_all()
        else:
            _ENTRIES.move_to_end(key)
        entry.owners.add(owner)
        while len(_ENTRIES) > MAX_KEYS:
            _drop(next(iter(_ENTRIES)))
        if _THREAD is None or not _THREAD.is_alive():
            _THREAD = threading.Thread(target=_serve, name="moe-whatif-planner", daemon=True)
            _THREAD.start()
        return _answer(entry)


def release(owner: Hashable) -> None:
    """The owner holds no key any more (it found what it needs elsewhere): a key no one else holds is dropped."""
    with _LOCK:
        key = _OWNED.pop(owner, None)
        if key is not None:
            _release(owner, key)


def peek(key: Hashable) -> Answer | None:
    """The answer so far for key, None when no one holds it (never asked, or dropped)."""
    with _LOCK:
        entry = _ENTRIES.get(key)
        return None if entry is None else _answer(entry)


def wait_idle(timeout_s: float) -> bool:
    """Whether every queued and running computation finished within timeout_s (tests and shutdown)."""
    deadline = time.monotonic() + timeout_s
    with _LOCK:
        while any(not e.done for e in _ENTRIES.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _LOCK.wait(left)
        return True


def forget() -> None:
    """Drop every key and owner (tests); a running computation's result is thrown away."""
    with _LOCK:
        _ENTRIES.clear()
        _OWNED.clear()
        _LOCK.notify_all()


def _hold(owner: Hashable, key: Hashable) -> None:
    previous = _OWNED.pop(owner, None)
    _OWNED[owner] = key
    if previous is not None and previous != key:
        _release(owner, previous)
    while len(_OWNED) > MAX_OWNERS:
        gone, held = _OWNED.popitem(last=False)
        _release(gone, held)


def _release(owner: Hashable, key: Hashable) -> None:
    entry = _ENTRIES.get(key)
    if entry is not None:
        entry.owners.discard(owner)
        if not entry.owners:
            _drop(key)


def _drop(key: Hashable) -> None:
    _ENTRIES.pop(key, None)
    _LOCK.notify_all()  # wait_idle may be waiting on it


def _answer(entry: _Entry) -> Answer:
    ahead = 0 if entry.running or entry.done else sum(
        1 for e in _ENTRIES.values() if not e.done and (e.running or e.asked_s < entry.asked_s))
    return Answer(entry.done, entry.asked_s, entry.value, entry.error, ahead)


def _serve() -> None:
    while True:
        with _LOCK:
            waiting = [(e.asked_s, k) for k, e in _ENTRIES.items() if not e.done and not e.running]
            while not waiting:
                _LOCK.wait()
                waiting = [(e.asked_s, k) for k, e in _ENTRIES.items() if not e.done and not e.running]
            key = min(waiting, key=lambda w: w[0])[1]
            entry = _ENTRIES[key]
            entry.running, compute, entry.compute = True, entry.compute, None
        value: Any = None
        error: BaseException | None = None
        try:
            value = compute() if compute is not None else None
        except Exception as exc:  # the planner refused these inputs (ValueError) or failed: the answer says which
            error = exc
        with _LOCK:
            entry.running, entry.done, entry.value, entry.error = False, True, value, error
            _LOCK.notify_all()  # a dropped entry's result goes with it: it is no longer in _ENTRIES
