"""Which layout requests the EP runtime takes (demo/ep/admission.py) and what its watch reports back
(demo/ep/watch.py), against the tests' real redis-server: unsigned, expired, another run's, oversized, replayed,
ill-fitting and malformed requests are refused and each is reported on the run's status stream, signed; a good
one is handed to the step loop, and "applied" is reported once the loop says so. A copy of a judged request
XADDed again after the runtime restarts is refused. The whole runtime (ranks, migration) is test_ep_runtime.py's."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core.keys import layout_request_status_key
from moe_monitor.core.layout_requests import encode_layout_request, sign_request
from moe_monitor.core.request_status import (
    APPLIED,
    REFUSED_EXPIRED,
    REFUSED_FIT,
    REFUSED_MALFORMED,
    REFUSED_REPLAYED,
    REFUSED_RUN,
    REFUSED_SIGNATURE,
    REFUSED_SIZE,
    REFUSED_SUPERSEDED,
    decode_request_status,
    status_signed,
)
from moe_monitor.dashboard.sources.request_status import find_status
from moe_monitor.demo.ep.admission import NonceBook, RequestRules, judge_entry
from moe_monitor.demo.ep.watch import LayoutWatcher
from tests.support.waiting import wait_until

SECRET = b"ep-admission-test-secret-0123456"
RUN, L, E, RANKS = "ep-admit", 2, 8, 2
RULES = RequestRules(run=RUN, num_layers=L, num_experts=E, ranks=RANKS, max_slots_per_rank=16,
                     max_replicas_per_expert=RANKS)


UNUSED_MAP = np.tile(np.array([0, 1, 2, 3, -1, 4, 5, 6, 7, -1]), (L, 1))  # vLLM's -1: a slot with no expert


def _record(layout_LP=None, run: str = RUN, time_s: float | None = None, gpus: int = RANKS) -> core.LayoutRecord:
    layout = np.tile(np.arange(E, dtype=np.int32)[::-1], (L, 1)) if layout_LP is None else layout_LP
    return core.LayoutRecord(run=run, step=3, time_s=time.time() if time_s is None else time_s,
                             layout_LP=np.asarray(layout, dtype=np.int32), gpus=gpus, source="apply",
                             instance="test-sender")


def _signed(record: core.LayoutRecord | None = None, ttl_s: float = 60.0) -> dict:
    return encode_layout_request(sign_request(record or _record(), SECRET, ttl_s))


def _cases() -> dict[str, tuple[dict, str]]:
    """name -> (stream fields, the verdict the runtime must give)."""
    wide = np.tile(np.concatenate([np.arange(E), np.zeros(40 - E, dtype=int)]), (L, 1))  # 20 slots a rank
    hot = np.tile(np.concatenate([np.arange(E), [0, 0]]), (L, 1))  # expert 0 three times: over 2 replicas
    missing = np.tile(np.array([0, 1, 2, 3, 4, 5, 6, 6]), (L, 1))  # expert 7 has no slot
    return {
        "unsigned": (core.encode_layout_record(_record()), REFUSED_SIGNATURE),
        "expired": (_signed(_record(time_s=time.time() - 100), ttl_s=10), REFUSED_EXPIRED),
        "another run": (_signed(_record(run="someone-else")), REFUSED_RUN),
        "too many slots": (_signed(_record(wide)), REFUSED_SIZE),
        "too many replicas": (_signed(_record(hot)), REFUSED_SIZE),
        "does not fit": (_signed(_record(missing)), REFUSED_FIT),
        "other gpus": (_signed(_record(gpus=1)), REFUSED_FIT),
        "malformed": ({**_signed(), "map": b"\x00"}, REFUSED_MALFORMED),
        "other secret": (encode_layout_request(sign_request(_record(), b"x" * 32)), REFUSED_SIGNATURE),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_judge_entry_refuses(name):
    fields, verdict = _cases()[name]
    _, judged = judge_entry(fields, RULES, SECRET, time.time(), NonceBook())
    assert judged.verdict == verdict, judged


def test_judge_entry_admits_a_good_request_once():
    fields, book = _signed(), NonceBook()
    request, judged = judge_entry(fields, RULES, SECRET, time.time(), book)
    assert judged.ok and request is not None and request.run == RUN
    assert judge_entry(fields, RULES, SECRET, time.time(), book)[1].verdict == REFUSED_REPLAYED
    assert judge_entry(fields, RULES, None, time.time(), NonceBook())[1].verdict == REFUSED_SIGNATURE


def test_nonce_book_forgets_expired_nonces_first():
    book = NonceBook(capacity=2)
    assert not book.seen("a", 10.0, 0.0) and not book.seen("b", 100.0, 0.0)
    assert not book.seen("c", 100.0, 50.0)  # full: "a" (expired at 10) goes
    assert book.seen("b", 100.0, 50.0) and book.seen("c", 100.0, 50.0) and not book.seen("a", 10.0, 50.0)


def _statuses(client) -> list:
    return [decode_request_status(f) for _, f in client.xrange(layout_request_status_key(RUN))]


def test_watcher_reports_every_refusal_and_the_applied_one(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.xadd(core.layout_requests_key(RUN), _signed())  # before the watcher: never applied, never judged
    step = {"now": 5}
    watcher = LayoutWatcher(redis_url, RULES, "runtime-instance", SECRET, current_step=lambda: step["now"],
                            poll_s=0.02)
    try:
        assert wait_until(lambda: watcher._last_id is not None, 60)
        ids = {name: client.xadd(core.layout_requests_key(RUN), fields).decode()
               for name, (fields, _) in _cases().items()}
        good = client.xadd(core.layout_requests_key(RUN), _signed()).decode()
        assert wait_until(lambda: len(_statuses(client)) == len(ids), 60)
        by_id = {s.request_id: s for s in _statuses(client)}
        for name, (_, verdict) in _cases().items():
            status = by_id[ids[name]]
            assert (status.verdict, status.step, status.run, status.instance) == (verdict, 5, RUN,
                                                                                  "runtime-instance"), name
            assert status.detail, name
        taken = []  # the good request is the last entry: the watcher may judge it a poll after the refusals
        assert wait_until(lambda: taken.append(watcher.take()) or taken[-1] is not None, 60)
        admitted = taken[-1]
        assert admitted.request_id == good and watcher.take() is None
        assert admitted.layout_LP.dtype == np.int64 and admitted.layout_LP.shape == (L, E)
        assert find_status(client, RUN, admitted.request.nonce, SECRET) is None  # pending: no status yet
        watcher.report_applied(admitted, from_step=8)
        assert wait_until(lambda: find_status(client, RUN, admitted.request.nonce, SECRET) is not None, 60)
        status = find_status(client, RUN, admitted.request.nonce, SECRET)
        assert status.verdict == APPLIED and status.describe() == "applied at step 8"
        assert all(status_signed(s, SECRET) for s in _statuses(client))  # every verdict, refusals too
        assert watcher.refused == len(ids) and watcher.bad_records == 1
    finally:
        watcher.close()
        client.close()


def test_a_newer_request_supersedes_a_waiting_one(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    watcher = LayoutWatcher(redis_url, RULES, "rt", SECRET, poll_s=0.02)
    try:
        assert wait_until(lambda: watcher._last_id is not None, 60)
        first = client.xadd(core.layout_requests_key(RUN), _signed()).decode()
        assert wait_until(lambda: watcher._newest is not None, 60)
        second = client.xadd(core.layout_requests_key(RUN), _signed()).decode()
        assert wait_until(lambda: len(_statuses(client)) == 1, 60)
        (status,) = _statuses(client)
        assert (status.request_id, status.verdict) == (first, REFUSED_SUPERSEDED) and second in status.detail
        assert watcher.take().request_id == second
    finally:
        watcher.close()
        client.close()


def _judged_or_taken(client, watcher: LayoutWatcher, request_id: str):
    """The status filed for request_id, or "taken" when the watcher admitted it instead (what old code did)."""
    found: list = []

    def settled() -> bool:
        found[:] = [s for s in _statuses(client) if s.request_id == request_id]
        return bool(found) or watcher._newest is not None

    assert wait_until(settled, 60)
    return found[-1] if found else "taken"


def _apply_once(redis_url: str, client, make_fields, instance: str) -> dict:
    """A runtime (its watch) that admits the request make_fields() makes once it runs, applies it and stops; the
    request's fields."""
    watcher = LayoutWatcher(redis_url, RULES, instance, SECRET, poll_s=0.02)
    try:
        assert wait_until(lambda: watcher._last_id is not None, 60)
        fields = make_fields()
        client.xadd(core.layout_requests_key(RUN), fields)
        taken: list = []
        assert wait_until(lambda: taken.append(watcher.take()) or taken[-1] is not None, 60)
        watcher.report_applied(taken[-1], from_step=4)
    finally:
        watcher.close()
    return fields


@pytest.mark.parametrize("issued", ["now", "ahead"])
def test_a_request_replayed_after_the_runtime_restarts_is_refused(redis_url, issued):
    """A signed request applied by one runtime, XADDed again (a copy read off the stream) after
    that runtime restarted, within the request's lifetime, is refused "replayed" by the new one. "now": issued
    before the restart (refused for that); "ahead": issued by a sender whose clock runs 30 s ahead (within the
    60 s allowed), so after the restart by the runtime's clock: refused because the nonce was kept in Redis."""
    client = core.connect(redis_url, timeout_s=2.0)
    offset_s = {"now": 0.0, "ahead": 30.0}[issued]
    fields = _apply_once(redis_url, client, lambda: _signed(_record(time_s=time.time() + offset_s), ttl_s=120.0),
                         "runtime-before")
    assert any(s.verdict == APPLIED for s in _statuses(client))
    restarted = LayoutWatcher(redis_url, RULES, "runtime-after", SECRET, poll_s=0.02)
    try:
        assert wait_until(lambda: restarted._last_id is not None, 60)
        replay = client.xadd(core.layout_requests_key(RUN), fields).decode()
        status = _judged_or_taken(client, restarted, replay)
        assert status != "taken", "the replayed request was admitted by the restarted runtime"
        assert status.verdict == REFUSED_REPLAYED and status.instance == "runtime-after", status
        assert status_signed(status, SECRET) and restarted.take() is None
        fresh = client.xadd(core.layout_requests_key(RUN), _signed()).decode()  # a new request still goes through
        taken: list = []
        assert wait_until(lambda: taken.append(restarted.take()) or taken[-1] is not None, 60)
        assert taken[-1].request_id == fresh
    finally:
        restarted.close()
        client.close()


def test_the_kept_nonces_are_bounded_and_hostile_members_are_skipped(redis_url):
    """What the watch keeps in Redis: each judged nonce with its request's expiry, expired ones dropped, the key
    itself expiring; members that are not nonces, or whose expiry lies beyond any request's lifetime, are not
    read back."""
    from moe_monitor.core.layout_requests import MAX_CLOCK_SKEW_S, MAX_TTL_S, seen_requests_key

    client = core.connect(redis_url, timeout_s=2.0)
    run = "ep-admit-kept"
    rules = RequestRules(run=run, num_layers=L, num_experts=E, ranks=RANKS, max_slots_per_rank=16,
                         max_replicas_per_expert=RANKS)
    key, now, far, old, kept = seen_requests_key(run), time.time(), "d" * 32, "e" * 32, "f" * 32
    client.zadd(key, {"not-a-nonce": now + 60, far: now + 10 * (MAX_TTL_S + MAX_CLOCK_SKEW_S), old: now - 1,
                      kept: now + 60})
    watcher = LayoutWatcher(redis_url, rules, "rt-kept", SECRET, poll_s=0.02)
    try:
        assert wait_until(lambda: watcher._last_id is not None, 60)
        known = watcher._nonces._expires_s
        assert set(known) == {kept} and known[kept] == now + 60
        request = sign_request(_record(run=run), SECRET, 60.0)
        client.xadd(core.layout_requests_key(run), encode_layout_request(request))
        assert wait_until(lambda: client.zscore(key, request.nonce) is not None, 60)
        assert client.zscore(key, request.nonce) == request.expires_s
        assert client.zscore(key, old) is None  # expired: dropped on the save
        assert 0 < client.ttl(key) <= MAX_TTL_S + MAX_CLOCK_SKEW_S + 1
    finally:
        watcher.close()
        client.close()


def test_a_request_issued_before_the_engine_started_is_a_replay():
    book = NonceBook(since_s=time.time())
    _, judged = judge_entry(_signed(_record(time_s=book.since_s - 5)), RULES, SECRET, time.time(), book)
    assert judged.verdict == REFUSED_REPLAYED and "before this engine started" in judged.detail
    assert judge_entry(_signed(_record(time_s=book.since_s + 0.001)), RULES, SECRET, time.time(), book)[1].ok


def test_apply_cli_sends_a_vllm_layout_and_the_runtime_admits_it(redis_url, tmp_path, capsys):
    """`moe-monitor apply` reads a layout with -1 (an unused slot) and sends it; the runtime's watch admits it
    (an unused slot holds no expert: it fits), the runtime reports it applied, and the command prints that."""
    import threading

    from moe_monitor.cli import main as cli_main
    from tests.support.synthfill import make_meta

    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(make_meta(RUN, L, E, gpus=RANKS)))
    key = tmp_path / "apply.key"
    key.write_bytes(SECRET)
    key.chmod(0o600)
    layout = tmp_path / "vllm.json"
    layout.write_text(json.dumps({"physical_to_logical_map": UNUSED_MAP.tolist()}))
    watcher = LayoutWatcher(redis_url, RULES, "runtime-instance", SECRET, current_step=lambda: 5, poll_s=0.02)
    taken: list = []

    def runtime() -> None:  # what a rank-0 loop does: take the admitted layout, apply it, report it
        if wait_until(lambda: taken.append(watcher.take()) or taken[-1] is not None, 60):
            watcher.report_applied(taken[-1], 7)

    side = threading.Thread(target=runtime, daemon=True)
    try:
        assert wait_until(lambda: watcher._last_id is not None, 60)
        side.start()
        code = cli_main(["apply", "--redis", redis_url, "--run", RUN, "--layout", str(layout), "--secret-file",
                         str(key), "--wait-s", "60"])
        out = capsys.readouterr().out
        side.join(60)
        assert code == 0 and f"layout [{L} x 10] requested" in out and "applied" in out.splitlines()[-1], out
        np.testing.assert_array_equal(taken[-1].layout_LP, UNUSED_MAP)
        (status,) = _statuses(client)
        assert status.verdict == "applied" and status.step == 7 and status_signed(status, SECRET)
    finally:
        watcher.close()
        client.close()
