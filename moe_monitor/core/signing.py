"""Signing layout requests and the runtime's verdicts on them: HMAC-SHA256 (stdlib hmac) over a canonical encoding
of what a request asks for (or what a verdict says), with a secret the dashboard server (and `moe-monitor apply`)
shares with the runtime that moves experts. Pure functions: bytes and numbers in, bytes and booleans out; where
the secret comes from is core/apply_secret.py's job.

The canonical encodings (canonical_request, canonical_status: length-prefixed fields under a domain tag of
each kind): docs/ep-runtime.md, "What is signed". Shape legend: L MoE layers, P physical slots.
"""
from __future__ import annotations

import hashlib
import hmac
import re

import numpy as np

DOMAIN = b"moe-monitor layout request v1"
STATUS_DOMAIN = b"moe-monitor layout request status v1"
SIGNATURE_HEX_CHARS = 64  # HMAC-SHA256, hex
MIN_SECRET_BYTES = 32  # as many as the HMAC's output: a shorter secret is the weakest link
_HEX_SIGNATURE = re.compile(f"[0-9a-f]{{{SIGNATURE_HEX_CHARS}}}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_MAP_DTYPE = np.dtype("<i4")



def is_nonce(text: str) -> bool:
    """Whether text is a layout request's nonce: 32 lowercase hex characters (16 random bytes)."""
    return _NONCE.fullmatch(text) is not None

def canonical_request(run: str, layout_LP: np.ndarray, gpus: int, nodes: int, step: int, issued_s: float,
                      expires_s: float, nonce: str) -> bytes:
    """The bytes a request's signature covers (module docstring). layout_LP: int [L, P] (expert ids, written as
    int32). ValueError for a map that is not 2-D integers."""
    layout = np.asarray(layout_LP)
    if layout.ndim != 2 or layout.dtype.kind not in "iu":
        raise ValueError(f"layout must be a 2-D int array [layers, slots], got {layout.dtype} {layout.shape}")
    map_digest = hashlib.sha256(np.ascontiguousarray(layout, dtype=_MAP_DTYPE).tobytes()).digest()
    parts = [run.encode(), f"{layout.shape[0]}x{layout.shape[1]}".encode(), str(int(gpus)).encode(),
             str(int(nodes)).encode(), str(int(step)).encode(), repr(float(issued_s)).encode(),
             repr(float(expires_s)).encode(), nonce.encode(), map_digest]
    return _framed(DOMAIN, parts)


def canonical_status(run: str, request_id: str, nonce: str, verdict: str, detail: str, step: int, time_s: float,
                     instance: str) -> bytes:
    """The bytes a verdict's signature covers: STATUS_DOMAIN, then run, request entry id, nonce, verdict, detail,
    step, time (repr of the float) and the runtime's instance id, each length-prefixed (module docstring)."""
    parts = [run.encode(), request_id.encode(), nonce.encode(), verdict.encode(), detail.encode(),
             str(int(step)).encode(), repr(float(time_s)).encode(), instance.encode()]
    return _framed(STATUS_DOMAIN, parts)


def _framed(domain: bytes, parts: list[bytes]) -> bytes:
    return domain + b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def check_secret(secret: bytes) -> bytes:
    """secret unchanged when it is bytes of at least MIN_SECRET_BYTES; ValueError otherwise (the message never
    contains the secret)."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the apply secret must be at least {MIN_SECRET_BYTES} bytes")
    return bytes(secret)


def sign(secret: bytes, message: bytes) -> str:
    """HMAC-SHA256 of message under secret, as 64 lowercase hex characters."""
    return hmac.new(check_secret(secret), message, hashlib.sha256).hexdigest()


def signature_ok(secret: bytes, message: bytes, signature: str) -> bool:
    """Whether signature is sign(secret, message) (lowercase hex), compared in constant time; False for a
    malformed one."""
    if not isinstance(signature, str) or not _HEX_SIGNATURE.fullmatch(signature):
        return False
    return hmac.compare_digest(sign(secret, message), signature)
