"""`moe-monitor apply --wait-s` believes only a verdict signed with its apply secret: an
"applied" XADDed by someone without the secret (unsigned, or signed with another one) leaves it waiting and it
exits 1; the EP runtime's own watch, holding the same secret, answers with a signed "applied" and it exits 0.
Against the tests' real redis-server, the CLI in this process; the forger and the watch in threads."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core.layout_requests import decode_layout_request
from moe_monitor.core.request_status import APPLIED, LayoutRequestStatus, encode_request_status, sign_status
from tests.support import synthfill
from tests.support.cli import in_process
from tests.support.waiting import wait_until

SECRET = "apply-verdicts-test-secret-0123456789abcdef"
L, E, G = 2, 8, 2


def _setup(client, tmp_path, run: str) -> tuple[str, str]:
    """The run in Redis, a layout file and a private secret file: their paths."""
    synthfill.fill(client, run, steps=12, num_layers=L, num_experts=E, gpus=G)
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"physical_to_logical_map": np.tile(np.arange(E)[::-1], (L, 1)).tolist()}))
    secret = tmp_path / "apply.key"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    return str(layout), str(secret)


def _forger(redis_url: str, run: str, secret: bytes | None) -> threading.Thread:
    """A thread that, once the CLI's request is in the stream, writes an "applied" status for it."""
    def forge() -> None:
        client = core.connect(redis_url, timeout_s=2.0)
        try:
            assert wait_until(lambda: client.xlen(core.layout_requests_key(run)) >= 1, 60)
            ((entry_id, fields),) = client.xrange(core.layout_requests_key(run))
            request = decode_layout_request(fields)
            forged = LayoutRequestStatus(run=run, request_id=entry_id.decode(), nonce=request.nonce,
                                         verdict=APPLIED, step=request.record.step, time_s=time.time(),
                                         instance="forger")
            client.xadd(core.keys.layout_request_status_key(run), encode_request_status(sign_status(forged, secret)))
        finally:
            client.close()

    thread = threading.Thread(target=forge, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("writer", ["unsigned", "another secret"])
def test_a_forged_applied_does_not_make_apply_exit_0(redis_server, redis_url, tmp_path, writer):
    client = redis_server.client()
    run = f"forged-cli-{writer.replace(' ', '-')}"
    layout, secret = _setup(client, tmp_path, run)
    forger = _forger(redis_url, run, None if writer == "unsigned" else b"another secret, also 32 bytes...")
    done = in_process("apply", "--redis", redis_url, "--run", run, "--layout", layout, "--secret-file", secret,
                      "--wait-s", "3")
    forger.join(60)
    statuses = client.xrange(core.keys.layout_request_status_key(run))
    assert len(statuses) == 1 and statuses[0][1][b"verdict"] == APPLIED.encode()  # the forgery was there to read
    assert done.returncode == 1, done.stdout
    assert "waiting for the engine" in done.stdout and "applied at step" not in done.stdout, done.stdout


def test_a_signed_applied_from_the_runtime_makes_apply_exit_0(redis_server, redis_url, tmp_path):
    from moe_monitor.demo.ep.admission import RequestRules
    from moe_monitor.demo.ep.watch import LayoutWatcher

    client = redis_server.client()
    run = "signed-cli"
    layout, secret = _setup(client, tmp_path, run)
    rules = RequestRules(run=run, num_layers=L, num_experts=E, ranks=G, max_slots_per_rank=64,
                         max_replicas_per_expert=G)
    watcher = LayoutWatcher(redis_url, rules, "runtime", SECRET.encode(), current_step=lambda: 12, poll_s=0.02)
    stop = threading.Event()

    def step_loop() -> None:  # what the runtime's step loop does: take the admitted request, switch, report
        while not stop.is_set():
            admitted = watcher.take()
            if admitted is not None:
                watcher.report_applied(admitted, from_step=13)
            stop.wait(0.02)

    loop = threading.Thread(target=step_loop, daemon=True)
    try:
        assert wait_until(lambda: watcher._last_id is not None, 60)
        loop.start()
        done = in_process("apply", "--redis", redis_url, "--run", run, "--layout", layout, "--secret-file",
                          secret, "--wait-s", "60")
    finally:
        stop.set()
        loop.join(5)
        watcher.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("apply: applied at step 13"), done.stdout
