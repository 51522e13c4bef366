"""Signed layout requests (core/signing.py, core/layout_requests.py, core/apply_secret.py, core/request_status.py):
a request signed with the shared secret passes judge_request; any change to what it asks for (run, one slot,
shape, expiry, nonce, issued-at), another secret, no signature, an expired one: refused with the right verdict.
A runtime's verdict is signed the same way (any changed field, another secret or none: not signed); the secret is
at least 32 bytes and its file private to its owner."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from moe_monitor.core import apply_secret, signing
from moe_monitor.core.keys import layout_request_status_key
from moe_monitor.core.layout_requests import (
    MAX_CLOCK_SKEW_S,
    MAX_TTL_S,
    LayoutRequest,
    decode_layout_request,
    encode_layout_request,
    judge_request,
    sign_request,
)
from moe_monitor.core.layouts import LayoutRecord, encode_layout_record
from moe_monitor.core.request_status import (
    APPLIED,
    REFUSED_EXPIRED,
    REFUSED_RUN,
    REFUSED_SIGNATURE,
    LayoutRequestStatus,
    decode_request_status,
    encode_request_status,
    sign_status,
    status_signed,
)

SECRET = b"0123456789abcdef0123456789abcdef"
NOW = 1.7e9


def _record(run: str = "prod", layout_LP=None, step: int = 7, time_s: float = NOW) -> LayoutRecord:
    layout = np.tile(np.arange(8, dtype=np.int32), (2, 1)) if layout_LP is None else layout_LP
    return LayoutRecord(run=run, step=step, time_s=time_s, layout_LP=layout, gpus=2, nodes=1,
                        source="apply", instance="dash")


def _signed(**kw) -> LayoutRequest:
    return sign_request(_record(**kw), SECRET, ttl_s=60.0)


def _with_record(req: LayoutRequest, **changes) -> LayoutRequest:
    return dataclasses.replace(req, record=dataclasses.replace(req.record, **changes))


def test_a_signed_request_passes_and_survives_the_wire():
    req = _signed()
    assert judge_request(req, "prod", SECRET, NOW + 1).ok
    back = decode_layout_request(encode_layout_request(req))
    assert (back.nonce, back.signature, back.expires_s) == (req.nonce, req.signature, NOW + 60.0)
    np.testing.assert_array_equal(back.record.layout_LP, req.record.layout_LP)
    assert judge_request(back, "prod", SECRET, NOW + 1).ok
    assert len(req.nonce) == 32 and len(req.signature) == 64
    assert _signed().nonce != req.nonce


@pytest.mark.parametrize("change", ["run", "slot", "shape", "expiry", "issued", "nonce", "step", "gpus"])
def test_tampering_breaks_the_signature(change):
    req = _signed()
    layout = req.record.layout_LP.copy()
    if change == "run":  # re-addressed to another run: judged against that run, the signature fails
        tampered = _with_record(req, run="other")
        assert judge_request(tampered, "other", SECRET, NOW + 1).verdict == REFUSED_SIGNATURE
        return
    if change == "slot":
        layout[1, [0, 1]] = layout[1, [1, 0]]
        tampered = _with_record(req, layout_LP=layout)
    elif change == "shape":
        tampered = _with_record(req, layout_LP=layout.reshape(1, 16))
    elif change == "expiry":
        tampered = dataclasses.replace(req, expires_s=req.expires_s + 3000)
    elif change == "issued":
        tampered = _with_record(req, time_s=NOW + 0.5)
    elif change == "nonce":
        tampered = dataclasses.replace(req, nonce="f" * 32)
    elif change == "step":
        tampered = _with_record(req, step=8)
    else:
        tampered = _with_record(req, gpus=1)
    judged = judge_request(tampered, "prod", SECRET, NOW + 1)
    assert judged.verdict == REFUSED_SIGNATURE and "does not match" in judged.detail


def test_tampered_fields_on_the_wire_are_refused():
    fields = encode_layout_request(_signed())
    changed = dict(fields, exp=repr(NOW + 600.0))
    assert judge_request(decode_layout_request(changed), "prod", SECRET, NOW + 1).verdict == REFUSED_SIGNATURE
    layout = np.frombuffer(fields["map"], dtype="<i4").copy()
    layout[:2] = layout[1::-1]
    changed = dict(fields, map=layout.tobytes())
    assert judge_request(decode_layout_request(changed), "prod", SECRET, NOW + 1).verdict == REFUSED_SIGNATURE


def test_other_secret_unsigned_and_no_secret_are_refused():
    req = _signed()
    assert judge_request(req, "prod", b"another secret of 32 bytes......", NOW).verdict == REFUSED_SIGNATURE
    assert "no apply secret" in judge_request(req, "prod", None, NOW).detail
    unsigned = decode_layout_request(encode_layout_record(_record()))  # an XADD of a bare LayoutRecord
    assert unsigned.signature == "" and np.isnan(unsigned.expires_s)
    judged = judge_request(unsigned, "prod", SECRET, NOW)
    assert judged.verdict == REFUSED_SIGNATURE and judged.detail == "the request is unsigned"


def test_run_expiry_lifetime_and_clock_skew():
    req = _signed()
    assert judge_request(req, "staging", SECRET, NOW).verdict == REFUSED_RUN
    assert judge_request(req, "prod", SECRET, req.expires_s).verdict == REFUSED_EXPIRED
    assert judge_request(req, "prod", SECRET, NOW + 61).verdict == REFUSED_EXPIRED
    future = sign_request(_record(time_s=NOW + MAX_CLOCK_SKEW_S + 5), SECRET, ttl_s=120.0)
    assert judge_request(future, "prod", SECRET, NOW).verdict == REFUSED_EXPIRED
    with pytest.raises(ValueError, match="lifetime"):
        sign_request(_record(), SECRET, ttl_s=MAX_TTL_S + 1)
    with pytest.raises(ValueError, match="lifetime"):
        sign_request(_record(), SECRET, ttl_s=0)
    # signed with a long life by someone holding the secret: still refused beyond MAX_TTL_S
    long = LayoutRequest(req.record, NOW + 2 * MAX_TTL_S, req.nonce)
    long = dataclasses.replace(long, signature=signing.sign(SECRET, long.message()))
    assert judge_request(long, "prod", SECRET, NOW).verdict == REFUSED_EXPIRED


def test_malformed_requests_raise_value_error():
    fields = encode_layout_request(_signed())
    for bad in ({"sig": "zz"}, {"nonce": "x" * 32}, {"exp": "nan"}, {"source": "engine"}):
        entry = dict(fields, **bad)
        if "sig" in bad:  # a malformed signature decodes, and fails the check
            assert judge_request(decode_layout_request(entry), "prod", SECRET, NOW).verdict == REFUSED_SIGNATURE
            continue
        with pytest.raises(ValueError):
            decode_layout_request(entry)


def test_signature_is_hmac_sha256_of_the_canonical_bytes():
    import hashlib
    import hmac

    req = _signed()
    assert req.signature == hmac.new(SECRET, req.message(), hashlib.sha256).hexdigest()
    assert req.message().startswith(signing.DOMAIN)
    assert not signing.signature_ok(SECRET, req.message(), req.signature.upper())  # lowercase hex only
    assert not signing.signature_ok(SECRET, req.message(), "é" * 64)
    with pytest.raises(ValueError, match="at least 32 bytes"):
        signing.sign(b"short", b"m")


def _private(path, text: str):
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_secret_from_file_or_environment(tmp_path):
    path = _private(tmp_path / "apply.key", SECRET.decode() + "\n")
    assert apply_secret.load_secret(path, environ={}) == SECRET
    assert apply_secret.load_secret(None, environ={"MOE_APPLY_SECRET_FILE": str(path)}) == SECRET
    assert apply_secret.load_secret(None, environ={"MOE_APPLY_SECRET": SECRET.decode()}) == SECRET
    assert apply_secret.load_secret(None, environ={}) is None
    path.write_text("hunter2")
    with pytest.raises(ValueError) as short:
        apply_secret.load_secret(path, environ={})
    assert "hunter2" not in str(short.value) and "shorter than 32" in str(short.value)
    with pytest.raises(ValueError, match="cannot read"):
        apply_secret.load_secret(tmp_path / "missing", environ={})
    with pytest.raises(ValueError) as env_short:
        apply_secret.load_secret(None, environ={"MOE_APPLY_SECRET": "hunter2"})
    assert "hunter2" not in str(env_short.value)


def test_status_record_round_trip():
    status = LayoutRequestStatus(run="prod", request_id="1700000000000-0", nonce="a" * 32, verdict=APPLIED, step=42,
                                 time_s=time.time(), instance="rt")
    back = decode_request_status(encode_request_status(status))
    assert back == status and back.describe() == "applied at step 42"
    signed = sign_status(status, SECRET)
    back = decode_request_status(encode_request_status(signed))
    assert back == signed and status_signed(back, SECRET) and len(back.signature) == 64
    refused = dataclasses.replace(status, verdict=REFUSED_EXPIRED, detail="it expired 3.0 s before", nonce="")
    assert decode_request_status(encode_request_status(refused)).describe() == "refused: expired (it expired 3.0 s before)"
    for bad in ({"verdict": "maybe"}, {"req": "x"}, {"nonce": "short"}, {"step": -1}):
        with pytest.raises(ValueError):
            decode_request_status(dict(encode_request_status(status), **bad))
    assert layout_request_status_key("prod") == "moe:{prod}:layout_request_status"


def _status(**changes) -> LayoutRequestStatus:
    base = LayoutRequestStatus(run="prod", request_id="1700000000000-0", nonce="b" * 32, verdict=APPLIED, step=42,
                               time_s=NOW, detail="", instance="runtime-1")
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("change", [
    {"run": "staging"}, {"request_id": "1700000000000-1"}, {"nonce": "c" * 32}, {"verdict": REFUSED_EXPIRED},
    {"detail": "x"}, {"step": 43}, {"time_s": NOW + 0.5}, {"instance": "runtime-2"}])
def test_a_verdict_is_signed_and_any_changed_field_breaks_it(change):
    """The status stream's verdicts (inst included) carry an HMAC a reader checks."""
    signed = sign_status(_status(), SECRET)
    fields = encode_request_status(signed)
    assert status_signed(decode_request_status(fields), SECRET)
    tampered = dataclasses.replace(signed, **change)
    assert not status_signed(decode_request_status(encode_request_status(tampered)), SECRET)


def test_unsigned_other_secret_and_cross_domain_verdicts_are_not_signed():
    status = _status()
    assert not status_signed(decode_request_status(encode_request_status(status)), SECRET)  # no "sig" at all
    fields = {k: v for k, v in encode_request_status(status).items() if k != "sig"}  # an older writer
    assert decode_request_status(fields).signature == "" and not status_signed(decode_request_status(fields), SECRET)
    other = sign_status(status, b"another secret of 32 bytes......")
    assert not status_signed(other, SECRET) and not status_signed(sign_status(status, SECRET), None)
    assert sign_status(status, None).signature == ""
    # a request's signature never verifies as a verdict's, whatever the fields say
    req = _signed()
    assert not status_signed(dataclasses.replace(status, signature=req.signature), SECRET)
    assert status.message().startswith(signing.STATUS_DOMAIN) and not status.message().startswith(signing.DOMAIN)
    long = sign_status(dataclasses.replace(status, detail="d" * 900), SECRET)  # cut as encoded, then signed
    assert status_signed(decode_request_status(encode_request_status(long)), SECRET)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660], ids=lambda m: f"{m:03o}")
def test_a_secret_file_others_may_open_is_refused(tmp_path, mode):
    """A group- or world-readable (or writable) secret file is refused, with one message that
    names the file and the fix, never the secret."""
    path = _private(tmp_path / "apply.key", SECRET.decode())
    path.chmod(mode)
    for load in (lambda: apply_secret.load_secret(path, environ={}),
                 lambda: apply_secret.load_secret(None, environ={"MOE_APPLY_SECRET_FILE": str(path)})):
        with pytest.raises(ValueError) as refused:
            load()
        message = str(refused.value)
        assert f"mode {mode:03o}" in message and "chmod 600" in message and str(path) in message
        assert SECRET.decode() not in message and "\n" not in message
    path.chmod(0o400)
    assert apply_secret.load_secret(path, environ={}) == SECRET


def test_a_secret_under_32_bytes_is_refused_from_a_file_or_the_environment(tmp_path):
    """31 bytes (the old floor was 16) refused, 32 accepted."""
    short = "k" * 31
    path = _private(tmp_path / "apply.key", short + "\n")
    with pytest.raises(ValueError) as refused:
        apply_secret.load_secret(path, environ={})
    assert "shorter than 32 bytes" in str(refused.value) and short not in str(refused.value)
    with pytest.raises(ValueError, match="shorter than 32 bytes"):
        apply_secret.load_secret(None, environ={"MOE_APPLY_SECRET": short})
    with pytest.raises(ValueError, match="at least 32"):
        sign_request(_record(), short.encode())
    _private(path, short + "k\n")
    assert apply_secret.load_secret(path, environ={}) == b"k" * 32
    assert apply_secret.load_secret(None, environ={"MOE_APPLY_SECRET": short + "k"}) == b"k" * 32


def test_a_secret_path_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "apply.fifo"
    os.mkfifo(fifo, 0o600)  # opening it for reading would wait for a writer
    with pytest.raises(ValueError, match="not a regular file"):
        apply_secret.load_secret(fifo, environ={})
