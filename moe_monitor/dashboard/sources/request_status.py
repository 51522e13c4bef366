"""What became of a layout request: the runtime's LayoutRequestStatus for it, read from the run's status stream
(core.layout_request_status_key), newest first, or what the sender can say without one (waiting; expired with no
answer: no engine watches the run, or it is down). No Streamlit: a redis client and the wire."""
from __future__ import annotations

import time
from dataclasses import dataclass

from moe_monitor.core.keys import layout_request_status_key
from moe_monitor.core.request_status import LayoutRequestStatus, decode_request_status

SCAN_ENTRIES = 200  # newest status entries looked through for a request's
RECENT_ANSWERS = 8  # the engine's newest answers the page lists (any sender's requests)
ANSWER_GRACE_S = 5.0  # after its expiry, how long a request's answer may still come (the engine refuses it then)


def find_status(client, run: str, nonce: str, scan: int = SCAN_ENTRIES) -> LayoutRequestStatus | None:
    """The newest status the run's runtime filed for the request with this nonce (None: none among the newest
    `scan` entries). Malformed entries are skipped; Redis errors are raised as they are."""
    for _entry_id, fields in client.xrevrange(layout_request_status_key(run), count=scan):
        try:
            status = decode_request_status(fields)
        except ValueError:
            continue
        if status.nonce == nonce and status.run == run:
            return status
    return None


def recent_statuses(client, run: str, count: int = RECENT_ANSWERS) -> list[LayoutRequestStatus]:
    """The run's runtime's newest `count` answers, newest first, whoever sent the requests (this page, another
    page, `moe-monitor apply`, or a writer without the secret): malformed entries and other runs' are skipped.
    Redis errors are raised as they are."""
    found: list[LayoutRequestStatus] = []
    for _entry_id, fields in client.xrevrange(layout_request_status_key(run), count=4 * count):
        try:
            status = decode_request_status(fields)
        except ValueError:
            continue
        if status.run == run:
            found.append(status)
            if len(found) == count:
                break
    return found


@dataclass(frozen=True)
class RequestOutcome:
    """final: the runtime answered (status set), or the request expired unanswered; text: one line for a person."""

    final: bool
    text: str
    status: LayoutRequestStatus | None = None


def outcome(status: LayoutRequestStatus | None, asked_step: int, expires_s: float,
            now_s: float | None = None) -> RequestOutcome:
    """What to say of a request asked at asked_step, expiring at expires_s (unix s), given its status (or None).
    Without a status it is final ANSWER_GRACE_S after the expiry: an engine that reads the request late still
    answers it (refused: expired) in that time."""
    if status is not None:
        return RequestOutcome(True, status.describe(), status)
    now = time.time() if now_s is None else now_s
    if now >= expires_s + ANSWER_GRACE_S:
        return RequestOutcome(True, f"requested at step {asked_step}; no engine answered (is a runtime that moves "
                                    "experts watching this run?)")
    left = f"expires in {expires_s - now:.0f} s" if now < expires_s else "expired, waiting for its answer"
    return RequestOutcome(False, f"requested at step {asked_step}; waiting for the engine ({left})")
