"""Rank 0's watch of the run's layout requests: signed "apply" requests (moe-monitor apply, the dashboard) arrive
here without the EP steps ever waiting on Redis, and every request read gets its fate written back.

A daemon thread polls core.layout_requests_key(run) (XREAD without BLOCK), judges each entry
(admission.judge_entry), keeps the newest admitted one and writes signed verdicts to
core.layout_request_status_key(run); the nonces it judged go to core.layout_requests.seen_requests_key and are
read back at start, so a replay after a restart is refused. The step loop calls take() and report() only (no
I/O); Redis down: last_error kept, back off up to 2 s, go on. The rules: docs/ep-runtime.md.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from moe_monitor import core
from moe_monitor.core.keys import layout_request_status_key
from moe_monitor.core.layout_requests import MAX_CLOCK_SKEW_S, MAX_TTL_S, seen_requests_key
from moe_monitor.core.request_status import (
    APPLIED,
    REFUSED_STOPPING,
    REFUSED_SUPERSEDED,
    STATUS_MAXLEN,
    LayoutRequestStatus,
    encode_request_status,
    sign_status,
)
from moe_monitor.core.signing import is_nonce

from .admission import MAX_REMEMBERED_NONCES, Admitted, NonceBook, RequestRules, judge_entry

log = logging.getLogger("moe_monitor.demo.ep")
MAX_QUEUED_STATUSES = 1000  # statuses waiting for Redis; beyond this the oldest are dropped (and counted)


class LayoutWatcher:
    """rules: what a request must match (admission.RequestRules); secret: the shared apply secret (None: every
    request is refused "bad signature"); current_step: the runtime's step now (the step a refusal is filed
    at); clock: unix seconds (expiry checks)."""

    def __init__(self, redis_url: str, rules: RequestRules, own_instance: str, secret: bytes | None,
                 current_step: Callable[[], int] = lambda: 0, poll_s: float = 0.1, timeout_s: float = 0.5,
                 clock: Callable[[], float] = time.time):
        self.rules = rules
        self._key = core.layout_requests_key(rules.run)
        self._status_key = layout_request_status_key(rules.run)
        self._seen_key = seen_requests_key(rules.run)
        self._client = core.connect(redis_url, timeout_s=timeout_s, retries=0)
        self._own, self._secret, self._poll_s = own_instance, secret, poll_s
        self._current_step, self._clock = current_step, clock
        self._nonces = NonceBook(since_s=clock())
        self._newest: Admitted | None = None
        self._outbox: list[LayoutRequestStatus] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.last_error = ""
        self.bad_records = 0
        self.refused = 0
        self.dropped_statuses = 0
        self._last_id: bytes | None = None
        self._thread = threading.Thread(target=self._run, name="ep-layout-watch", daemon=True)
        self._thread.start()

    def take(self) -> Admitted | None:
        """The newest admitted request that arrived since the last take(), or None. Never blocks on I/O."""
        with self._lock:
            admitted, self._newest = self._newest, None
        return admitted

    def report_applied(self, admitted: Admitted, from_step: int) -> None:
        """The ranks switched to admitted's layout from from_step: file "applied" (written by the thread)."""
        self._file(admitted.request_id, admitted.request.nonce, APPLIED, from_step, "")

    def report_stopping(self, admitted: Admitted, step: int) -> None:
        """The run stopped at step before it could switch to admitted's layout: file "refused: engine stopping"."""
        self._file(admitted.request_id, admitted.request.nonce, REFUSED_STOPPING, step, "the run ended first")

    def close(self) -> None:
        """Stop the thread; statuses still queued are written once more, best effort."""
        self._stop.set()
        self._thread.join(5.0)
        self._client.close()

    def _file(self, request_id: str, nonce: str, verdict: str, step: int, detail: str) -> None:
        status = LayoutRequestStatus(run=self.rules.run, request_id=request_id, nonce=nonce, verdict=verdict,
                                     step=max(0, int(step)), time_s=self._clock(), detail=detail, instance=self._own)
        with self._lock:
            self._outbox.append(status)
            if len(self._outbox) > MAX_QUEUED_STATUSES:
                self.dropped_statuses += len(self._outbox) - MAX_QUEUED_STATUSES
                del self._outbox[:-MAX_QUEUED_STATUSES]

    def _run(self) -> None:
        backoff_s = 0.0
        while not self._stop.wait(max(self._poll_s, backoff_s)):
            try:
                self._poll()
                self._flush()
                backoff_s, self.last_error = 0.0, ""
            except Exception as exc:  # Redis down, refusing, a bug: never the EP runtime's problem
                if not self.last_error:
                    log.warning("ep: layout watch failed (%s); retrying", core.redact(str(exc)))
                self.last_error = f"{type(exc).__name__}: {core.redact(str(exc))}"
                backoff_s = min(2.0, max(0.1, backoff_s * 2))
        try:
            self._flush()
        except Exception as exc:  # the run is ending: a status that cannot be written is logged, not raised
            log.warning("ep: %d layout request statuses not written (%s)", len(self._outbox), type(exc).__name__)

    def _flush(self) -> None:
        self._save_nonces()
        with self._lock:
            pending, self._outbox = self._outbox, []
        written = 0
        try:
            for status in pending:
                self._client.xadd(self._status_key, encode_request_status(sign_status(status, self._secret)),
                                  maxlen=STATUS_MAXLEN, approximate=True)
                written += 1
        finally:
            if written < len(pending):
                with self._lock:  # put back what was not written, in order
                    self._outbox[:0] = pending[written:]

    def _save_nonces(self) -> None:
        """The nonces judged since the last save into the run's seen set (module docstring); kept for a retry
        when Redis fails."""
        unsaved = self._nonces.unsaved
        if not unsaved:
            return
        now = self._clock()
        client = self._client
        client.zadd(self._seen_key, dict(unsaved))
        client.zremrangebyscore(self._seen_key, "-inf", now)
        client.zremrangebyrank(self._seen_key, 0, -MAX_REMEMBERED_NONCES - 1)
        client.expire(self._seen_key, int(MAX_TTL_S + MAX_CLOCK_SKEW_S) + 1)
        del unsaved[:]

    def _restore_nonces(self) -> None:
        """The nonces an earlier watch of this run saved that have not expired, read back (malformed members and
        expiries beyond any request's lifetime skipped; at most MAX_REMEMBERED_NONCES)."""
        now = self._clock()
        latest = now + MAX_TTL_S + MAX_CLOCK_SKEW_S
        saved = self._client.zrangebyscore(self._seen_key, now, latest, start=0, num=MAX_REMEMBERED_NONCES,
                                           withscores=True)
        for member, expires_s in saved:
            nonce = member.decode("ascii", "replace") if isinstance(member, bytes) else str(member)
            if is_nonce(nonce) and math.isfinite(expires_s):
                self._nonces.restore(nonce, float(expires_s), now)

    def _poll(self) -> None:
        client = self._client
        if self._last_id is None:  # start after what is there now, knowing what earlier watches judged
            self._restore_nonces()
            last = client.xrevrange(self._key, count=1)
            self._last_id = last[0][0] if last else b"0-0"
        replies = client.xread({self._key: self._last_id}, count=64)
        for _stream, entries in replies or []:
            for entry_id, fields in entries:
                self._last_id = entry_id
                self._judge(entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id), fields)

    def _judge(self, request_id: str, fields: dict) -> None:
        request, judged = judge_entry(fields, self.rules, self._secret, self._clock(), self._nonces)
        if request is not None and request.record.instance == self._own:
            return
        if request is None or not judged.ok:
            self.refused += 1
            self.bad_records += request is None
            log.warning("ep: layout request %s %s (%s)", request_id, judged.verdict, judged.detail)
            self._file(request_id, request.nonce if request is not None else "", judged.verdict,
                       self._current_step(), judged.detail)
            return
        admitted = Admitted(request_id, request, request.record.layout_LP.astype("int64"))
        with self._lock:
            replaced, self._newest = self._newest, admitted
        if replaced is not None:
            self._file(replaced.request_id, replaced.request.nonce, REFUSED_SUPERSEDED, self._current_step(),
                       f"request {request_id} arrived before the engine could switch")
