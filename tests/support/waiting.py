"""Polling a condition in tests that watch a background thread or another process."""
from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float = 15.0, every_s: float = 0.02) -> bool:
    """True as soon as condition() is truthy, else its value one last time after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return bool(condition())
