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
    assert "reachable from the network" in banner and "--server.address 127.0.0.1" in banner


@pytest.mark.parametrize("value,allow", [("127.0.0.1", ""), ("::1", ""), ("0.0.0.0", "1")])
def test_no_banner_on_loopback_or_when_allowed(address, monkeypatch, value, allow):
    address(value)
    monkeypatch.setenv("MOE_DASHBOARD_ALLOW_REMOTE", allow)
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    assert not any("reachable from the network" in w.value for w in at.warning)
