"""Who may move experts from the What-if page: Apply is off unless the server enables it for the run
(MOE_APPLY_RUNS + the apply secret, as `moe-monitor dashboard --apply-run RUN --apply-secret-file FILE` passes
them); the confirmation names the run and the Redis (password redacted) and never carries over to another run;
the page shows what the engine did with its request (a real LayoutWatcher of the EP runtime answering through
the tests' real redis-server) and only what an engine holding the same secret signed (a forged "applied" or an
engine with another secret is not believed), and the network banner says visitors could apply. Rendered by
AppTest."""
from __future__ import annotations

import argparse
import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from moe_monitor import core
from moe_monitor.cli.dashboard import apply_env
from moe_monitor.dashboard.sources import request_status
from moe_monitor.dashboard.sources.apply_gate import ApplyGate, gate_from_env
from moe_monitor.dashboard.sources.request_status import outcome
from tests.support import synthfill
from tests.support.apptest import open_page, run_app
from tests.support.waiting import wait_until

L, E, G, R = 2, 8, 2, 2
SECRET = "whatif-apply-test-secret-0123456789"


def _fill(url: str, run: str, steps: int = 20):
    client = core.connect(url, timeout_s=2.0)
    synthfill.fill(client, run, steps=steps, num_layers=L, num_experts=E, gpus=G, world_size=R, instance="i0")
    return client


def _whatif(url: str, monkeypatch, runs: str | None = None, secret: str | None = SECRET,
            run: str | None = None) -> AppTest:
    monkeypatch.setenv("REDIS_URL", url)
    for name, value in (("MOE_APPLY_RUNS", runs), ("MOE_APPLY_SECRET", secret)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("MOE_APPLY_SECRET_FILE", raising=False)
    at = run_app(url, monkeypatch)
    if run is not None:
        at.selectbox(key="run").set_value(run).run()
    open_page(at, "page_files/whatif.py")
    assert not at.exception, at.exception
    return at


def _keys(at: AppTest) -> set[str]:
    return {b.key for b in at.button}


def test_apply_is_off_by_default_and_says_how_to_turn_it_on(redis_url, monkeypatch):
    client = _fill(redis_url, "off")
    at = _whatif(redis_url, monkeypatch)
    (line,) = [i.value for i in at.info if "Apply is off" in i.value]
    assert "--apply-run RUN --apply-secret-file FILE" in line
    assert "whatif_apply" not in _keys(at) and "whatif_apply_confirm" not in _keys(at)
    assert client.xlen(core.layout_requests_key("off")) == 0


def test_apply_is_off_for_runs_not_listed_and_without_a_usable_secret(redis_url, monkeypatch):
    _fill(redis_url, "unlisted")
    at = _whatif(redis_url, monkeypatch, runs="prod,staging")
    assert any("Apply is off for run 'unlisted'" in i.value and "prod, staging" in i.value for i in at.info)
    assert "whatif_apply" not in _keys(at)
    at = _whatif(redis_url, monkeypatch, runs="unlisted", secret="hunter2")
    (line,) = [i.value for i in at.info if "Apply is off" in i.value]
    assert "shorter than 32 bytes" in line and "hunter2" not in line
    assert "whatif_apply" not in _keys(at)
    at = _whatif(redis_url, monkeypatch, runs="unlisted", secret=None)
    assert any("no apply secret" in i.value for i in at.info) and "whatif_apply" not in _keys(at)


def test_gate_is_for_the_servers_own_redis_only():
    gate = gate_from_env({"MOE_APPLY_RUNS": "a, b", "MOE_APPLY_SECRET": SECRET, "REDIS_URL": "redis://h:1/0"})
    assert gate.enabled and gate.runs == ("a", "b") and gate.allows("redis://h:1/0", "a")
    assert not gate.allows("redis://other:1/0", "a") and not gate.allows("redis://h:1/0", "c")
    assert "dashboard's own Redis" in gate.why_off("redis://other:1/0", "a")
    assert SECRET not in repr(gate)
    assert not gate_from_env({}).enabled and gate_from_env({"MOE_APPLY_RUNS": "bad name!"}).problem
    ttl = gate_from_env({"MOE_APPLY_RUNS": "a", "MOE_APPLY_SECRET": SECRET, "MOE_APPLY_TTL_S": "0"})
    assert not ttl.enabled and "MOE_APPLY_TTL_S" in ttl.problem


def test_confirmation_names_run_and_redacted_redis_and_never_carries_over(tmp_path, monkeypatch):
    from moe_monitor.demo.localredis import RedisServer

    server = RedisServer(tmp_path, password="s3cret-redis-pw")
    try:
        client = _fill(server.url, "alpha")
        _fill(server.url, "beta")
        at = _whatif(server.url, monkeypatch, runs="alpha,beta", run="alpha")
        at.button(key="whatif_apply").click().run()
        (warning,) = [w.value for w in at.warning if "Switch the engine" in w.value]
        assert "run **alpha**" in warning and core.redact(server.url) in warning
        assert "s3cret-redis-pw" not in warning and ":***@" in warning
        assert "whatif_apply_confirm" in _keys(at)
        at.selectbox(key="run").set_value("beta").run()  # another run: the confirmation is gone
        assert not at.exception, at.exception
        assert "whatif_apply_confirm" not in _keys(at) and "whatif_apply" in _keys(at)
        assert not any("Switch the engine" in w.value for w in at.warning)
        assert client.xlen(core.layout_requests_key("alpha")) == client.xlen(core.layout_requests_key("beta")) == 0
    finally:
        server.stop()


def _answer_with_watcher(url: str, run: str, secret: bytes, max_slots_per_rank: int = 64):
    """The EP runtime's own watch of run's requests (demo/ep/watch.py), judging with secret."""
    from moe_monitor.demo.ep.admission import RequestRules
    from moe_monitor.demo.ep.watch import LayoutWatcher

    rules = RequestRules(run=run, num_layers=L, num_experts=E, ranks=G, max_slots_per_rank=max_slots_per_rank,
                         max_replicas_per_expert=G)
    watcher = LayoutWatcher(url, rules, "test-runtime", secret, current_step=lambda: 20, poll_s=0.02)
    assert wait_until(lambda: watcher._last_id is not None, 60)
    return watcher


def _apply(at: AppTest) -> AppTest:
    at.button(key="whatif_apply").click().run()
    at.button(key="whatif_apply_confirm").click().run()
    assert not at.exception, at.exception
    return at


def _last_request_line(at: AppTest) -> str:
    lines = [e.value for kind in (at.info, at.error, at.success) for e in kind
             if e.value.startswith("Last request from this page")]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("case", ["too large", "expired"])
def test_page_shows_the_engines_refusal(redis_url, monkeypatch, case):
    run = f"refused-{case.replace(' ', '-')}"
    client = _fill(redis_url, run)
    if case == "expired":
        monkeypatch.setenv("MOE_APPLY_TTL_S", "0.001")  # expired before any engine reads it
    watcher = _answer_with_watcher(redis_url, run, SECRET.encode(), max_slots_per_rank=1 if case == "too large"
                                   else 64)
    try:
        at = _apply(_whatif(redis_url, monkeypatch, runs=run))
        assert wait_until(lambda: client.xlen(core.keys.layout_request_status_key(run)) >= 1, 60)
        at.run()
        assert not at.exception, at.exception
    finally:
        watcher.close()
    line = _last_request_line(at)
    assert line.startswith(f"Last request from this page: refused: {case} ("), line
    assert not any("requested at step" in s.value for s in at.success)


def _forge_applied(client, run: str, secret: bytes | None) -> None:
    """Once the page's request is in the stream: an "applied" status for it, signed with secret (None: unsigned),
    as anyone who can XADD could write it."""
    from moe_monitor.core.layout_requests import decode_layout_request
    from moe_monitor.core.request_status import APPLIED, LayoutRequestStatus, encode_request_status, sign_status

    assert wait_until(lambda: client.xlen(core.layout_requests_key(run)) >= 1, 60)
    ((entry_id, fields),) = client.xrange(core.layout_requests_key(run))
    request = decode_layout_request(fields)
    forged = LayoutRequestStatus(run=run, request_id=entry_id.decode(), nonce=request.nonce, verdict=APPLIED,
                                 step=request.record.step, time_s=time.time(), instance="forger")
    client.xadd(core.keys.layout_request_status_key(run), encode_request_status(sign_status(forged, secret)))


@pytest.mark.parametrize("writer", ["unsigned", "another secret"])
def test_page_does_not_believe_a_forged_or_unverifiable_answer(redis_url, monkeypatch, writer):
    """An "applied" written by someone without the secret (unsigned, or signed with another
    one, as an engine holding another secret signs its refusals) is never shown as this request's answer nor in
    the engine's latest answers; once the request expires the page says no engine answered with a signed
    verdict."""
    run = f"forged-{writer.replace(' ', '-')}"
    client = _fill(redis_url, run)
    monkeypatch.setenv("MOE_APPLY_TTL_S", "1.0")
    monkeypatch.setattr(request_status, "ANSWER_GRACE_S", 0.5)
    at = _apply(_whatif(redis_url, monkeypatch, runs=run))
    _forge_applied(client, run, None if writer == "unsigned" else b"the engine's other secret, 32 b.")
    at.run()
    assert not at.exception, at.exception
    assert "waiting for the engine" in _last_request_line(at), _last_request_line(at)
    assert not any("applied" in s.value for s in at.success)
    assert not any("applied at step" in m.value for m in at.markdown)  # the latest answers list leaves it out
    assert wait_until(lambda: _expired(client, run), 60)
    at.run()
    line = _last_request_line(at)
    assert "no engine answered with a verdict signed with this apply secret" in line, line
    assert not any("applied" in s.value for s in at.success)


def _expired(client, run: str) -> bool:
    from moe_monitor.core.layout_requests import decode_layout_request

    ((_, fields),) = client.xrange(core.layout_requests_key(run))
    return time.time() > decode_layout_request(fields).expires_s + request_status.ANSWER_GRACE_S


def test_page_says_when_no_engine_answered_before_expiry(redis_url, monkeypatch):
    _fill(redis_url, "nobody")
    monkeypatch.setenv("MOE_APPLY_TTL_S", "0.5")
    monkeypatch.setattr(request_status, "ANSWER_GRACE_S", 0.5)
    at = _apply(_whatif(redis_url, monkeypatch, runs="nobody"))
    assert "requested at step 20; waiting for the engine" in _last_request_line(at)
    time.sleep(1.1)
    at.run()
    assert "no engine answered" in _last_request_line(at)
    grace = request_status.ANSWER_GRACE_S
    assert not outcome(None, 3, expires_s=10.0, now_s=5.0).final
    assert "expired, waiting for its answer" in outcome(None, 3, expires_s=10.0, now_s=10.0 + grace / 2).text
    assert outcome(None, 3, expires_s=10.0, now_s=10.0 + grace).final


def test_page_shows_applied_at_step(redis_url, monkeypatch):
    run = "applied-here"
    client = _fill(redis_url, run)
    watcher = _answer_with_watcher(redis_url, run, SECRET.encode())
    try:
        at = _apply(_whatif(redis_url, monkeypatch, runs=run))
        assert wait_until(lambda: watcher._newest is not None, 60)
        watcher.report_applied(watcher.take(), from_step=23)  # what the step loop does once the ranks switched
        assert wait_until(lambda: client.xlen(core.keys.layout_request_status_key(run)) >= 1, 60)
        at.run()
    finally:
        watcher.close()
    assert _last_request_line(at) == "Last request from this page: applied at step 23"
    assert any(s.value == "Last request from this page: applied at step 23" for s in at.success)


@pytest.fixture
def address():
    before = st.config.get_option("server.address")
    yield lambda value: st.config.set_option("server.address", value)
    st.config.set_option("server.address", before)


@pytest.mark.parametrize("allow", ["", "1"])
def test_network_banner_says_visitors_could_apply(address, monkeypatch, allow):
    address("0.0.0.0")
    monkeypatch.setenv("MOE_DASHBOARD_ALLOW_REMOTE", allow)
    monkeypatch.setenv("MOE_APPLY_RUNS", "prod")
    monkeypatch.setenv("MOE_APPLY_SECRET", SECRET)
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    banner = at.warning[0].value
    assert "reachable from the network" in banner and "**Apply is on** for run(s) prod" in banner
    assert "visitors could also ask those runs' engines to move expert weights" in banner
    monkeypatch.delenv("MOE_APPLY_RUNS")
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    assert not any("Apply is on" in w.value for w in at.warning)


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"apply_run": [], "apply_secret_file": None, "apply_ttl_s": None, **kw})


def test_dashboard_command_passes_the_setting_in_the_environment_only(tmp_path):
    from moe_monitor.dashboard.serve import streamlit_command

    key = tmp_path / "apply.key"
    key.write_text(SECRET)
    key.chmod(0o600)
    inherited = {"MOE_APPLY_RUNS": "sneaky", "MOE_APPLY_SECRET": SECRET, "PATH": "/bin"}
    assert apply_env(_args(), inherited) == {"PATH": "/bin"}  # off: nothing inherited turns it on
    env = apply_env(_args(apply_run=["prod", "b"], apply_secret_file=str(key), apply_ttl_s=30.0), {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "MOE_APPLY_RUNS": "prod,b", "MOE_APPLY_SECRET_FILE": str(key),
                   "MOE_APPLY_TTL_S": "30.0"}
    gate = gate_from_env({**env, "REDIS_URL": "redis://h:1/0"})
    assert isinstance(gate, ApplyGate) and gate.allows("redis://h:1/0", "prod") and gate.ttl_s == 30.0
    env = apply_env(_args(apply_run=["prod"]), {"MOE_APPLY_SECRET": SECRET})
    assert env == {"MOE_APPLY_RUNS": "prod", "MOE_APPLY_SECRET": SECRET}
    with pytest.raises(ValueError, match="needs the secret"):
        apply_env(_args(apply_run=["prod"]), {})
    with pytest.raises(ValueError, match="--apply-ttl-s"):
        apply_env(_args(apply_run=["prod"], apply_ttl_s=7200.0), {"MOE_APPLY_SECRET": SECRET})
    assert not any(SECRET in part for part in streamlit_command(8501))
