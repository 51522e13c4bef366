"""The dashboard warns at the top of every page when it is not bound to loopback."""
import pytest
import streamlit as st

from tests.support.apptest import run_app


@pytest.fixture
def address():
    before = st.config.get_option("server.address")
    yield lambda value: st.config.set_option("server.address", value)
    st.config.set_option("server.address", before)


@pytest.mark.parametrize("value", ["0.0.0.0", None])
def test_banner_when_reachable_from_the_network(address, monkeypatch, value):
    address(value)
    monkeypatch.delenv("MOE_DASHBOARD_ALLOW_REMOTE", raising=False)
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    banner = at.warning[0].value
    assert "reachable from the network" in banner and "--address 127.0.0.1" in banner


@pytest.mark.parametrize("value,allow", [("127.0.0.1", ""), ("::1", ""), ("0.0.0.0", "1")])
def test_no_banner_on_loopback_or_when_allowed(address, monkeypatch, value, allow):
    address(value)
    monkeypatch.setenv("MOE_DASHBOARD_ALLOW_REMOTE", allow)
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    assert not any("reachable from the network" in w.value for w in at.warning)


def test_viewers_see_no_tracebacks():
    """.streamlit/config.toml: client.showErrorDetails = "type" (streamlit accepts it, as `streamlit config show`
    prints), so an uncaught exception shows the browser its type and a generic message, never a traceback or the
    exception's message (paths, URLs). AppTest reads the same config.toml (tests run from the repo root)."""
    import subprocess
    import sys
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    root = Path(__file__).resolve().parents[2]
    client = (root / ".streamlit" / "config.toml").read_text().split("[client]")[1].split("\n[")[0]
    assert '\nshowErrorDetails = "type"\n' in client
    from moe_monitor.dashboard.serve import streamlit_command  # what `moe-monitor dashboard` passes, from any folder
    assert "--client.showErrorDetails=type" in streamlit_command(8501)
    assert "--server.address=127.0.0.1" in streamlit_command(8501)
    shown = subprocess.run([sys.executable, "-m", "streamlit", "config", "show"], cwd=root, capture_output=True,
                           text=True, timeout=60).stdout
    assert '\nshowErrorDetails = "type"\n' in shown
    assert st.config.get_option("client.showErrorDetails") == "type"
    at = AppTest.from_string("raise ValueError('redis://:hunter2@db:6379/0 in /srv/secret/path')").run()
    (exc,) = at.exception
    assert exc.proto.type == "ValueError" and not exc.stack_trace
    assert "hunter2" not in str(exc.proto) and "/srv/secret" not in str(exc.proto)
