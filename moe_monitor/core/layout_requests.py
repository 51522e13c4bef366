"""LayoutRequest: a layout asked of a running engine (the What-if page's Apply, `moe-monitor apply`), signed, with
an expiry, and its stream encoding (core.layout_requests_key): the LayoutRecord's fields (source "apply", its
step: when asked, its time: when issued) plus "exp" (expiry, unix s), "nonce" (32 hex characters, the request's
id) and "sig" (HMAC-SHA256 of core/signing.py's canonical encoding, 64 hex characters).

judge_request() is the check every runtime that moves experts applies before anything else: the run the
request names, its signature under the shared secret, its expiry. What the runtime itself can hold (slots per
rank, replicas per expert) and whether the map fits its model are the runtime's checks on top.

Shape legend: L MoE layers, P physical slots.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from .fields import _get, _text, _time
from .keys import run_key
from .layouts import LAYOUT_FIELDS, LayoutRecord, decode_layout_record, encode_layout_record
from .request_status import REFUSED_EXPIRED, REFUSED_RUN, REFUSED_SIGNATURE
from .signing import canonical_request, is_nonce, sign, signature_ok

REQUEST_FIELDS = (*LAYOUT_FIELDS, "exp", "nonce", "sig")
DEFAULT_TTL_S = 120.0      # a request's lifetime unless its sender says otherwise
MAX_TTL_S = 3600.0         # no runtime accepts a request that lives longer (expiry - issued-at)
MAX_CLOCK_SKEW_S = 60.0    # a request issued further in the future than this (by the runtime's clock) is refused


def seen_requests_key(run: str) -> str:
    """Sorted set moe:{R}:layout_requests_seen: the nonces of the requests a runtime has judged for the run (score:
    the request's expiry, unix s), so that a runtime that restarts still refuses a copy of one it judged."""
    return run_key(run, "layout_requests_seen")


@dataclass(frozen=True)
class LayoutRequest:
    """record: the LayoutRecord asked for (source "apply"; record.run the run it is for, record.time_s when it
    was issued, record.step the step it was asked at); expires_s: unix s after which no runtime applies it;
    nonce: 32 hex characters, unique per request (its id in the status stream); signature: 64 hex characters
    ("" for an unsigned request, which every runtime refuses)."""

    record: LayoutRecord
    expires_s: float
    nonce: str
    signature: str = ""

    @property
    def run(self) -> str:
        return self.record.run

    @property
    def issued_s(self) -> float:
        return self.record.time_s

    def message(self) -> bytes:
        """The canonical bytes the signature covers (core/signing.py)."""
        rec = self.record
        return canonical_request(rec.run, rec.layout_LP, rec.gpus, rec.nodes, rec.step, rec.time_s,
                                 self.expires_s, self.nonce)


def new_nonce() -> str:
    """32 random hex characters (128 bits)."""
    return secrets.token_hex(16)


def sign_request(record: LayoutRecord, secret: bytes, ttl_s: float = DEFAULT_TTL_S,
                 nonce: str | None = None) -> LayoutRequest:
    """record (source "apply"; its time_s the issued-at) as a LayoutRequest signed with secret, expiring ttl_s
    after record.time_s. ValueError for a ttl_s outside (0, MAX_TTL_S] or a record of another source."""
    if not (0 < ttl_s <= MAX_TTL_S):
        raise ValueError(f"a request's lifetime must be in (0, {MAX_TTL_S:g}] s, got {ttl_s:g}")
    if record.source != "apply":
        raise ValueError(f"a layout request has source 'apply', not {record.source!r}")
    request = LayoutRequest(record, record.time_s + float(ttl_s), nonce or new_nonce())
    return LayoutRequest(request.record, request.expires_s, request.nonce, sign(secret, request.message()))


def encode_layout_request(request: LayoutRequest) -> dict[str, bytes | str | int]:
    """LayoutRequest -> stream entry fields; ValueError when the record is one decode_layout_request refuses."""
    fields = encode_layout_record(request.record)
    fields.update({"exp": repr(float(request.expires_s)), "nonce": request.nonce, "sig": request.signature})
    decode_layout_request(fields)
    return fields


def decode_layout_request(fields: dict) -> LayoutRequest:
    """Stream entry fields -> LayoutRequest. ValueError (never another exception) on what decode_layout_record
    refuses, on a source other than "apply", and on a malformed exp / nonce / sig. An entry without "sig" (an
    older sender, or anyone who can XADD) decodes as an unsigned request: signature "", expiry NaN."""
    record = decode_layout_record(fields)
    if record.source != "apply":
        raise ValueError(f"a layout request has source 'apply', not {record.source!r}")
    if _get(fields, "sig") is None:
        nonce = _text(fields, "nonce", max_chars=64) if _get(fields, "nonce") is not None else ""
        return LayoutRequest(record, math.nan, nonce if is_nonce(nonce) else "", "")
    nonce = _text(fields, "nonce", max_chars=64)
    if not is_nonce(nonce):
        raise ValueError("field 'nonce' must be 32 lowercase hex characters")
    signature = _text(fields, "sig", max_chars=128)
    return LayoutRequest(record, _time(fields, "exp"), nonce, signature)


@dataclass(frozen=True)
class Judgement:
    """verdict: "" when the request may go on to the runtime's own checks, else one of core/request_status.py's
    refusals; detail: why, in words (never the secret)."""

    verdict: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.verdict


def judge_request(request: LayoutRequest, run: str, secret: bytes | None, now_s: float) -> Judgement:
    """The checks every runtime applies, in order: the run it names is `run`; it is signed with `secret` (None:
    this runtime has no secret, it refuses everything); it has not expired by now_s (unix s), lives at most
    MAX_TTL_S and was not issued more than MAX_CLOCK_SKEW_S in the future."""
    if request.run != run:
        return Judgement(REFUSED_RUN, f"the request is for run {request.run!r}, this engine serves {run!r}")
    if secret is None:
        return Judgement(REFUSED_SIGNATURE, "this engine has no apply secret: it applies no request")
    if not request.signature:
        return Judgement(REFUSED_SIGNATURE, "the request is unsigned")
    if not signature_ok(secret, request.message(), request.signature):
        return Judgement(REFUSED_SIGNATURE, "the signature does not match (another secret, or the request "
                                            "was changed)")
    if not now_s < request.expires_s:
        return Judgement(REFUSED_EXPIRED, f"it expired {now_s - request.expires_s:.1f} s before the engine saw it")
    if request.expires_s - request.issued_s > MAX_TTL_S:
        return Judgement(REFUSED_EXPIRED, f"it would live over {MAX_TTL_S:g} s")
    if request.issued_s > now_s + MAX_CLOCK_SKEW_S:
        return Judgement(REFUSED_EXPIRED, f"it was issued {request.issued_s - now_s:.0f} s in the future "
                                          "(clocks apart?)")
    return Judgement("")
