"""What became of a layout request: the runtime's LayoutRequestStatus for it, read from the run's status stream
(core.layout_request_status_key), newest first, or what the sender can say without one (waiting; expired with no
answer: no engine watches the run, or it is down). Only a status signed with the apply secret counts (anyone who
can XADD can write one): an unsigned, altered or other-secret status is skipped, so a forged "applied" is never
shown or believed. No Streamlit: a redis client and the wire."""
from __future__ import annotations

import time
from dataclasses import dataclass

from moe_monitor.core.keys import layout_request_status_key
from moe_monitor.core.request_status import LayoutRequestStatus, decode_request_status, status_signed
from moe_monitor.dashboard.sources.apply_gate import gate_from_env

SCAN_ENTRIES = 200  # newest status entries looked through for a request's
RECENT_ANSWERS = 8  # the engine's newest answers the page lists (any sender's requests)
ANSWER_GRACE_S = 5.0  # after its expiry, how long a request's answer may still come (the engine refuses it then)


def server_secret() -> bytes | None:
    """The dashboard server's apply secret (sources/apply_gate.py; None when Apply is off or it is unusable)."""
    return gate_from_env().secret


def find_status(client, run: str, nonce: str, secret: bytes | None = None,
                scan: int = SCAN_ENTRIES) -> LayoutRequestStatus | None:
    """The newest status signed with secret (None: the server's, server_secret()) that the run's runtime filed
    for the request with this nonce; None when there is none among the newest `scan` entries. Malformed and
    unsigned entries are skipped; Redis errors are raised as they are."""
    key = secret if secret is not None else server_secret()
    for _entry_id, fields in client.xrevrange(layout_request_status_key(run), count=scan):
        try:
            status = decode_request_status(fields)
        except ValueError:
            continue
        if status.nonce == nonce and status.run == run and status_signed(status, key):
            return status
    return None


def recent_statuses(client, run: str, count: int = RECENT_ANSWERS,
                    secret: bytes | None = None) -> list[LayoutRequestStatus]:
    """The run's runtime's newest `count` answers signed with secret (None: the server's), newest first, whoever
    sent the requests (this page, another page, `moe-monitor apply`, or a writer without the secret): malformed,
    unsigned and other runs' entries are skipped. Redis errors are raised as they are."""
    key = secret if secret is not None else server_secret()
    found: list[LayoutRequestStatus] = []
    for _entry_id, fields in client.xrevrange(layout_request_status_key(run), count=4 * count):
        try:
            status = decode_request_status(fields)
        except ValueError:
            continue
        if status.run == run and status_signed(status, key):
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
        return RequestOutcome(True, f"requested at step {asked_step}; no engine answered with a verdict signed with "
                                    "this apply secret (is a runtime that moves experts, holding the same secret, "
                                    "watching this run?)")
    left = f"expires in {expires_s - now:.0f} s" if now < expires_s else "expired, waiting for its answer"
    return RequestOutcome(False, f"requested at step {asked_step}; waiting for the engine ({left})")
