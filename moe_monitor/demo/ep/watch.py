"""Rank 0's watch of the run's layout requests: "apply" records (moe-monitor apply, the dashboard, an
operator) arrive here without the EP steps ever waiting on Redis.

A daemon thread reads new entries of core.layout_requests_key(run) every poll_s with XREAD without BLOCK (from the
stream's last entry when the watcher started: older records of a run with the same name are not applied again),
keeps the newest decodable "apply" record not published by this runtime itself, and forgets the rest. The step
loop calls take() (no I/O, no lock held across I/O). Redis down or refusing: the error is kept (last_error),
the thread backs off up to 2 s and goes on; the EP runtime never notices.
"""
from __future__ import annotations

import logging
import threading

from moe_monitor import core

log = logging.getLogger("moe_monitor.demo.ep")


class LayoutWatcher:
    def __init__(self, redis_url: str, run: str, own_instance: str, poll_s: float = 0.1, timeout_s: float = 0.5):
        self._key = core.layout_requests_key(run)
        self._client = core.connect(redis_url, timeout_s=timeout_s, retries=0)
        self._own, self._poll_s = own_instance, poll_s
        self._newest: core.LayoutRecord | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.last_error = ""
        self.bad_records = 0
        self._last_id: bytes | None = None
        self._thread = threading.Thread(target=self._run, name="ep-layout-watch", daemon=True)
        self._thread.start()

    def take(self) -> core.LayoutRecord | None:
        """The newest "apply" record that arrived since the last take(), or None. Never blocks on I/O."""
        with self._lock:
            record, self._newest = self._newest, None
        return record

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._client.close()

    def _run(self) -> None:
        backoff_s = 0.0
        while not self._stop.wait(max(self._poll_s, backoff_s)):
            try:
                self._poll()
                backoff_s, self.last_error = 0.0, ""
            except Exception as exc:  # Redis down, refusing, a bug: never the EP runtime's problem
                if not self.last_error:
                    log.warning("ep: layout watch failed (%s); retrying", core.redact(str(exc)))
                self.last_error = f"{type(exc).__name__}: {exc}"
                backoff_s = min(2.0, max(0.1, backoff_s * 2))

    def _poll(self) -> None:
        client = self._client
        if self._last_id is None:  # start after what is there now
            last = client.xrevrange(self._key, count=1)
            self._last_id = last[0][0] if last else b"0-0"
        replies = client.xread({self._key: self._last_id}, count=64)
        for _stream, entries in replies or []:
            for entry_id, fields in entries:
                self._last_id = entry_id
                try:
                    record = core.decode_layout_record(fields)
                except ValueError:
                    self.bad_records += 1
                    continue
                if record.source == "apply" and record.instance != self._own:
                    with self._lock:
                        self._newest = record
