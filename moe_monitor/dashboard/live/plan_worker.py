"""The What-if page's plans, repairs and advice off the page's thread. One daemon thread for the whole server runs
them one at a time, oldest asked first; a page asks (ask) and gets at once the answer so far (done or not, its
value or failure, when first asked, how many computations run or wait before it, or busy: no room yet).

A computation is keyed on what it depends on, so each key computes once, whoever asks. Each owner (a browser
session's plan, advice or curve) holds one key; asking another releases it, and a key no owner holds is dropped
(queued: never run; running: its result thrown away). A key held by an owner seen in the last LAPSE_S is never
evicted: beyond MAX_KEYS only the others go, done first; held keys queue up to MAX_HELD_KEYS, then a new key is
answered busy. A failure other than a refusal (ValueError) is told once to each owner, then the key is dropped."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

MAX_KEYS = 16        # keys kept beyond this only while held (queued, running or done, not yet picked up)
MAX_HELD_KEYS = 48   # hard cap: a new key beyond it is answered busy, not queued (~16 sessions x 3 keys)
MAX_OWNERS = 256     # askers remembered (browser sessions x what they ask for)
LAPSE_S = 120.0      # an owner silent this long (no ask, no peek) no longer keeps its key from eviction


class Failed(RuntimeError):
    """A computation (or its prepare) failed with something other than a refusal: raised afresh for each
    reader, from the failure's type name and message."""


@dataclass(frozen=True)
class Failure:
    """What a computation raised, without the exception object (its traceback would keep the asking run's frames
    alive and grow with every re-raise): kind (the type's name), message, refused (a ValueError: the planner
    refused these inputs; anything else may be transient and is retried on a later ask)."""

    kind: str
    message: str
    refused: bool

    @staticmethod
    def of(exc: BaseException) -> Failure:
        return Failure(type(exc).__name__, str(exc), isinstance(exc, ValueError))

    def exception(self) -> Exception:
        """A new exception to raise: ValueError(message) for a refusal, else Failed("kind: message")."""
        return ValueError(self.message) if self.refused else Failed(f"{self.kind}: {self.message}")


@dataclass(frozen=True)
class Answer:
    """Where a key's computation stands: done (value, or error: its Failure), asked_s (monotonic seconds when it
    was first asked for), ahead (computations running or queued before it; 0 once it runs) and busy (not queued:
    MAX_HELD_KEYS are held; ask again, it keeps its asked_s)."""

    done: bool
    asked_s: float
    value: Any = None
    error: Failure | None = None
    ahead: int = 0
    busy: bool = False


class _Entry:
    def __init__(self, compute: Callable[[], Any] | None, asked_s: float, failure: Failure | None = None):
        self.compute = compute  # dropped once run: the inputs it holds go with it
        self.asked_s = self.seen_s = asked_s
        self.owners: set[Hashable] = set()
        self.running = False
        self.done = failure is not None
        self.value: Any = None
        self.error = failure


_LOCK = threading.Condition()
_ENTRIES: OrderedDict[Hashable, _Entry] = OrderedDict()
_OWNED: OrderedDict[Hashable, Hashable] = OrderedDict()  # owner -> the key it holds
_ASKED: OrderedDict[Hashable, float] = OrderedDict()     # key -> first asked_s, of keys still wanted but not kept
_THREAD: threading.Thread | None = None


def ask(key: Hashable, prepare: Callable[[], Callable[[], Any]], owner: Hashable) -> Answer:
    """The answer so far for key, which owner now holds (releasing the key it held before). On the first ask of a
    key, prepare() runs here, outside the lock (it copies what the computation needs: only then), and the
    computation it returns is queued; prepare's exception is the key's failure."""
    with _LOCK:
        _hold(owner, key)
        entry = _ENTRIES.get(key)
        if entry is not None:
            return _seen(key, entry, owner)
        if _full():
            return _busy(key)
    try:
        compute, failure = prepare(), None
    except Exception as exc:  # noqa: BLE001 (any failure is the key's answer, as a computation's is)
        compute, failure = None, Failure.of(exc)
    with _LOCK:
        entry = _ENTRIES.get(key)  # another session may have queued it meanwhile
        if entry is None:
            if _OWNED.get(owner) != key:  # the owner asked for another key meanwhile: nothing to queue
                return Answer(False, time.monotonic())
            if _full():
                return _busy(key)
            entry = _ENTRIES[key] = _Entry(compute, _first_asked(key), failure)
            _start()
            _LOCK.notify_all()
        return _seen(key, entry, owner)


def release(owner: Hashable) -> None:
    """The owner holds no key any more (it found what it needs elsewhere): a key no one else holds is dropped."""
    with _LOCK:
        key = _OWNED.pop(owner, None)
        if key is not None:
            _release(owner, key)


def peek(key: Hashable, owner: Hashable | None = None) -> Answer | None:
    """The answer so far for key, None when it is not kept (never asked, dropped, or busy). An owner that holds
    the key keeps it, and its own place among owners, as an ask does (a page that only watches)."""
    with _LOCK:
        entry = _ENTRIES.get(key)
        if entry is None:
            return None
        if owner is not None and _OWNED.get(owner) == key:
            _OWNED.move_to_end(owner)
            entry.seen_s = time.monotonic()
        return _answer(entry)


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
        _ASKED.clear()
        _LOCK.notify_all()


def _hold(owner: Hashable, key: Hashable) -> None:
    previous = _OWNED.pop(owner, None)
    _OWNED[owner] = key
    if previous is not None and previous != key:
        _release(owner, previous)
    while len(_OWNED) > MAX_OWNERS:
        gone, held = _OWNED.popitem(last=False)
        _release(gone, held, left=False)


def _seen(key: Hashable, entry: _Entry, owner: Hashable) -> Answer:
    """The answer to owner's ask of a kept entry; a failure other than a refusal is told once to each owner: the
    owner lets go of it, and the key, once no one holds it, is dropped, so the next ask retries it."""
    entry.owners.add(owner)
    entry.seen_s = time.monotonic()
    answer = _answer(entry)
    if entry.done and entry.error is not None and not entry.error.refused:
        _OWNED.pop(owner, None)
        _release(owner, key)
    return answer


def _release(owner: Hashable, key: Hashable, left: bool = True) -> None:
    """owner no longer holds key; left False: it was forgotten (MAX_OWNERS), not gone elsewhere, so a key dropped
    now keeps its asked_s for when it is asked again."""
    entry = _ENTRIES.get(key)
    if entry is not None:
        entry.owners.discard(owner)
        if not entry.owners:
            if not left and not entry.done:
                _remember(key, entry.asked_s)
            _drop(key)


def _drop(key: Hashable) -> None:
    _ENTRIES.pop(key, None)
    _LOCK.notify_all()  # wait_idle may be waiting on it


def _evictable(entry: _Entry, now: float) -> bool:
    return not entry.running and (not entry.owners or now - entry.seen_s > LAPSE_S)


def _full() -> bool:
    """Whether a new key finds no room: beyond MAX_KEYS the evictable keys go (done first, then the least recently
    asked), and held keys count up to MAX_HELD_KEYS."""
    now = time.monotonic()
    while len(_ENTRIES) >= MAX_KEYS:
        gone = [(not e.done, e.seen_s, k) for k, e in _ENTRIES.items() if _evictable(e, now)]
        if not gone:
            break
        _, _, key = min(gone, key=lambda g: g[:2])
        if not _ENTRIES[key].done:
            _remember(key, _ENTRIES[key].asked_s)
        _drop(key)
    return len(_ENTRIES) >= MAX_HELD_KEYS


def _busy(key: Hashable) -> Answer:
    return Answer(False, _first_asked(key, keep=True), ahead=sum(1 for e in _ENTRIES.values() if not e.done),
                  busy=True)


def _remember(key: Hashable, asked_s: float) -> None:
    _ASKED[key] = min(asked_s, _ASKED.get(key, asked_s))
    _ASKED.move_to_end(key)
    while len(_ASKED) > MAX_OWNERS:
        _ASKED.popitem(last=False)


def _first_asked(key: Hashable, keep: bool = False) -> float:
    """When key was first asked for: now, or (asked within LAPSE_S) when it was refused busy or evicted while
    wanted, so a key asked again keeps its place in the queue."""
    now = time.monotonic()
    asked = _ASKED.pop(key, now)
    asked = asked if now - asked <= LAPSE_S else now
    if keep:
        _remember(key, asked)
    return asked


def _answer(entry: _Entry) -> Answer:
    ahead = 0 if entry.running or entry.done else sum(
        1 for e in _ENTRIES.values() if not e.done and (e.running or e.asked_s < entry.asked_s))
    return Answer(entry.done, entry.asked_s, entry.value, entry.error, ahead)


def _start() -> None:
    global _THREAD
    if _THREAD is None or not _THREAD.is_alive():
        _THREAD = threading.Thread(target=_serve, name="moe-whatif-planner", daemon=True)
        _THREAD.start()


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
        failure: Failure | None = None
        try:
            value = compute() if compute is not None else None
        except Exception as exc:  # noqa: BLE001 (refused (ValueError) or failed: the answer says which)
            failure = Failure.of(exc)
        del compute  # its inputs go now, not when the next computation replaces it
        with _LOCK:
            entry.running, entry.done, entry.value, entry.error = False, True, value, failure
            _LOCK.notify_all()  # a dropped entry's result goes with it: it is no longer in _ENTRIES
        del entry, value  # not kept alive while the thread waits for the next
