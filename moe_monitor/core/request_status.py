"""LayoutRequestStatus: what a runtime that moves experts did with a layout request, and its stream encoding
(core.layout_request_status_key): every request it reads gets one final status, "applied" or a refusal, so
whoever sent it (the What-if page, `moe-monitor apply --wait-s`) can say what became of it.

Fields: v, run (the runtime's run), req (the request's stream entry id), nonce (the request's, "" when it had
none), verdict (one of VERDICTS), detail (words), step (applied: the first step the layout is in force; a
refusal: the runtime's step when it decided), t (unix s), inst (the runtime's instance id), sig (HMAC-SHA256 of
core/signing.py's canonical_status under the apply secret, 64 hex characters; "" from a runtime without one).
Anyone who can XADD can write a status: a reader trusts only one whose signature verifies under its own secret
(status_signed); an unsigned or forged "applied" counts for nothing.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .fields import _get, _instance, _int, _text, _time, _version
from .keys import MAX_STEP, SCHEMA_VERSION, check_run_name
from .signing import canonical_status, is_nonce, sign, signature_ok

APPLIED = "applied"
REFUSED_EXPIRED = "refused: expired"
REFUSED_SIGNATURE = "refused: bad signature"
REFUSED_RUN = "refused: another run"
REFUSED_SIZE = "refused: too large"
REFUSED_REPLAYED = "refused: replayed"
REFUSED_FIT = "refused: does not fit"
REFUSED_MALFORMED = "refused: malformed"
REFUSED_SUPERSEDED = "refused: superseded"  # a newer request arrived before the engine could switch
REFUSED_STOPPING = "refused: engine stopping"  # the engine stopped before it could switch
VERDICTS = (APPLIED, REFUSED_EXPIRED, REFUSED_SIGNATURE, REFUSED_RUN, REFUSED_SIZE, REFUSED_REPLAYED, REFUSED_FIT,
            REFUSED_MALFORMED, REFUSED_SUPERSEDED, REFUSED_STOPPING)
STATUS_FIELDS = ("v", "run", "req", "nonce", "verdict", "detail", "step", "t", "inst", "sig")
STATUS_MAXLEN = 1000  # the status stream is trimmed (approximately) to this many entries
MAX_DETAIL_CHARS = 500
_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


@dataclass(frozen=True)
class LayoutRequestStatus:
    """The fate of one layout request (module docstring)."""

    run: str
    request_id: str
    nonce: str
    verdict: str
    step: int
    time_s: float
    detail: str = ""
    instance: str = ""
    signature: str = ""

    @property
    def applied(self) -> bool:
        return self.verdict == APPLIED

    def message(self) -> bytes:
        """The canonical bytes the signature covers (core/signing.py canonical_status)."""
        return canonical_status(self.run, self.request_id, self.nonce, self.verdict, self.detail, self.step,
                                self.time_s, self.instance)

    def describe(self) -> str:
        """One line for a person: "applied at step S" or "refused: expired (why)"."""
        if self.applied:
            return f"applied at step {self.step}"
        return self.verdict + (f" ({self.detail})" if self.detail else "")


def sign_status(status: LayoutRequestStatus, secret: bytes | None) -> LayoutRequestStatus:
    """status (its detail cut to MAX_DETAIL_CHARS, as encoded) signed with secret; unsigned (signature "") when
    secret is None."""
    status = dataclasses.replace(status, detail=status.detail[:MAX_DETAIL_CHARS], signature="")
    return status if secret is None else dataclasses.replace(status, signature=sign(secret, status.message()))


def status_signed(status: LayoutRequestStatus, secret: bytes | None) -> bool:
    """Whether status was signed with secret (False without a secret, or for an unsigned or altered status)."""
    return secret is not None and signature_ok(secret, status.message(), status.signature)


def encode_request_status(status: LayoutRequestStatus) -> dict[str, str | int]:
    """LayoutRequestStatus -> stream entry fields (a detail over MAX_DETAIL_CHARS is cut: sign_status first, so
    the signature covers what is written); ValueError when it is one decode_request_status refuses."""
    fields: dict[str, str | int] = {
        "v": SCHEMA_VERSION, "run": check_run_name(status.run), "req": status.request_id, "nonce": status.nonce,
        "verdict": status.verdict, "detail": status.detail[:MAX_DETAIL_CHARS], "step": int(status.step),
        "t": repr(float(status.time_s)), "inst": status.instance, "sig": status.signature,
    }
    decode_request_status(fields)
    return fields


def decode_request_status(fields: dict) -> LayoutRequestStatus:
    """Stream entry fields -> LayoutRequestStatus; ValueError (never another exception) on a malformed entry: an
    unknown verdict, a request id that is not a stream entry id, a nonce that is not 32 hex characters or empty,
    a step outside 0..MAX_STEP - 1, a detail over MAX_DETAIL_CHARS. The signature is read, not checked
    (status_signed does that, with the reader's secret); an entry without "sig" decodes with signature ""."""
    _version(fields, SCHEMA_VERSION)
    request_id = _text(fields, "req", max_chars=41)
    if not _ENTRY_ID.fullmatch(request_id):
        raise ValueError(f"field 'req' is not a stream entry id: {request_id[:41]!r}")
    nonce = _text(fields, "nonce", max_chars=32)
    if nonce and not is_nonce(nonce):
        raise ValueError("field 'nonce' must be 32 lowercase hex characters or empty")
    verdict = _text(fields, "verdict", max_chars=32)
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}")
    return LayoutRequestStatus(
        run=check_run_name(_text(fields, "run", max_chars=128)), request_id=request_id, nonce=nonce,
        verdict=verdict, step=_int(fields, "step", 0, MAX_STEP), time_s=_time(fields, "t"),
        detail=_text(fields, "detail", max_chars=MAX_DETAIL_CHARS), instance=_instance(fields, "runtime"),
        signature=_text(fields, "sig", max_chars=64) if _get(fields, "sig") is not None else "")
