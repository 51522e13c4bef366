"""The Redis password never reaches the browser: the sidebar's URL field starts with REDIS_URL redacted, and the
dashboard still reads the run from the password-protected Redis with the environment's own URL. Everything the
app sends (every element and widget of the main area and the sidebar, serialised as it travels) is searched for
the password. A real redis-server started with --requirepass; nothing mocked."""
from __future__ import annotations

import pytest

from moe_monitor import core
from moe_monitor.demo.localredis import RedisServer
from tests.support import synthfill
from tests.support.apptest import open_page, run_app

PASSWORD = "pw-Zq8-never-shown"
RUN = "secret-run"


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("locked"), password=PASSWORD)
    synthfill.fill(server.client(), RUN, steps=12)
    yield server
    server.stop()


def sent_to_browser(at) -> list[bytes]:
    """Every element and widget proto of the page (main area and sidebar), serialised as it travels."""
    out, stack = [], [at.main, at.sidebar]
    while stack:
        node = stack.pop()
        proto = getattr(node, "proto", None)
        if proto is not None:
            out.append(proto.SerializeToString())
        stack.extend(getattr(node, "children", {}).values())
    return out


def assert_no_password(at) -> None:
    sent = sent_to_browser(at)
    assert len(sent) > 10  # the walk saw the page
    leaks = [blob for blob in sent if PASSWORD.encode() in blob]
    assert not leaks, leaks[:2]
    for widget in at.sidebar.text_input:
        assert PASSWORD not in str(widget.value)


def test_url_field_shows_the_redacted_url_and_the_run_is_read(locked_redis, monkeypatch):
    at = run_app(locked_redis.url, monkeypatch)
    field = at.sidebar.text_input(key="redis_url")
    assert field.value == core.redact(locked_redis.url) == f"redis://:***@127.0.0.1:{locked_redis.port}/0"
    assert field.proto.type == field.proto.PASSWORD
    assert at.sidebar.selectbox(key="run").value == RUN  # listed with the environment's real URL
    assert next(m.value for m in at.metric if m.label == "source") == "ok"
    assert any("12 steps in window" in c.value for c in at.caption)
    assert_no_password(at)
    open_page(at, "page_files/devices.py")
    assert not at.exception, at.exception
    assert_no_password(at)


def test_a_typed_url_replaces_the_environments(locked_redis, monkeypatch):
    at = run_app(locked_redis.url, monkeypatch)
    wrong = f"redis://:wrong-pass@127.0.0.1:{locked_redis.port}/0"
    at.sidebar.text_input(key="redis_url").input(wrong).run()
    assert not at.exception, at.exception
    assert any("not reachable" in c.value for c in at.sidebar.caption)  # the typed URL is the one used
    assert_no_password(at)
    # typing the redacted text back means the environment's URL again
    at.sidebar.text_input(key="redis_url").input(core.redact(locked_redis.url)).run()
    assert at.sidebar.selectbox(key="run").value == RUN
    assert_no_password(at)


TYPED_SECRET = "typed-Kx7-secret"  # typed into the (password-type) URL field: it may sit there, nowhere else


@pytest.mark.parametrize("typed, says", [
    ("redis://:{pw}@127.0.0.1:{port}/0?bogus=1", "bogus"),  # an unknown option: one message, not a TypeError
    ("redis://{pw}@127.0.0.1:{port}/0", None),  # the password written as the user name
    ("redis://127.0.0.1:{port}/0?PASSWORD={pw}", None),  # ... or as a query argument
    ("redis://:{pw}/x@127.0.0.1:{port}/0", "percent-encode"),  # an unencoded '/': redis-py's error held its start
])
def test_a_bad_or_secret_bearing_typed_url_is_one_message_without_the_secret(locked_redis, monkeypatch, typed,
                                                                               says):
    at = run_app(locked_redis.url, monkeypatch)
    at.sidebar.text_input(key="redis_url").input(typed.format(pw=TYPED_SECRET, port=locked_redis.port)).run()
    assert not at.exception, at.exception
    shown = " ".join(e.value for e in [*at.sidebar.caption, *at.sidebar.warning, *at.sidebar.error,
                                       *at.sidebar.markdown, *at.error, *at.warning, *at.caption, *at.markdown,
                                       *at.info])
    assert TYPED_SECRET[:6] not in shown, shown
    if says:
        assert says in shown, shown
