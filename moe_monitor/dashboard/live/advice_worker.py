"""The rebalance advisor off the page's thread: the Overview asks for advice on its window every tick and gets
the latest finished answer at once, while one background thread (for the whole server) recomputes it at most
every EVERY_S per key. A DeepSeek-sized window takes the advisor 1.5-2 s; no tick waits for it."""
from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

EVERY_S = 30.0      # a key's advice is recomputed at most this often
MAX_KEYS = 8        # runs x phases x layouts remembered (least recently asked dropped)

_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moe-advisor")
_LOCK = threading.Lock()


@dataclass
class _Entry:
    started_s: float | None = None  # when its last computation started (None: never)
    running: Future | None = None
    result: str = ""
    error: str = ""


_ENTRIES: OrderedDict[tuple, _Entry] = OrderedDict()


def latest(key: tuple, prepare: Callable[[], Callable[[], str]], now_s: float | None = None,
           every_s: float = EVERY_S) -> str:
    """The newest finished answer for key ("" until the first one finishes). When none runs anywhere and this
    key's is older than every_s, prepare() is called here (it copies what the computation needs: only then)
    and the computation it returns runs in the background. A computation that raised answers "no advice (its
    error)"."""
    now_s = time.monotonic() if now_s is None else now_s
    with _LOCK:
        entry = _ENTRIES.pop(key, None) or _Entry()
        _ENTRIES[key] = entry
        while len(_ENTRIES) > MAX_KEYS:
            _ENTRIES.popitem(last=False)
        if entry.running is not None and entry.running.done():
            _collect(entry)
        busy = any(e.running is not None for e in _ENTRIES.values())
        if not busy and (entry.started_s is None or now_s - entry.started_s >= every_s):
            entry.started_s = now_s
            entry.running = _POOL.submit(prepare())
        return entry.result or (f"no advice ({entry.error})" if entry.error else "")


def _collect(entry: _Entry) -> None:
    future, entry.running = entry.running, None
    if future is None:
        return
    try:
        entry.result, entry.error = future.result(), ""
    except Exception as exc:  # the advisor refused this window (ValueError) or failed: say so, keep the page
        entry.error = f"{type(exc).__name__}: {exc}"


def wait_idle(timeout_s: float) -> bool:
    """Whether every background computation finished within timeout_s (tests and shutdown)."""
    with _LOCK:
        running = [e.running for e in _ENTRIES.values() if e.running is not None]
    for future in running:
        with contextlib.suppress(Exception):  # an error is the entry's answer, collected on the next ask
            future.result(timeout=timeout_s)
    return all(f.done() for f in running)


def forget() -> None:
    """Drop every remembered answer (tests)."""
    with _LOCK:
        _ENTRIES.clear()
