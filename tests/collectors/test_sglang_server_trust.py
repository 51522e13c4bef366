"""The SGLang bridge sends its admin API key to --server only: a redirect is refused (one error naming the status
and the Location, never the key), and plain http to another host is said once. Real local HTTP servers: one
that redirects, one that records every request it gets."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from moe_monitor.collectors.sglang import Bridge, BridgeOptions
from moe_monitor.collectors.sglang.server import ServerDriver, ServerError, is_loopback

KEY = "admin-Kq7-never-forwarded"


class Served:
    """A ThreadingHTTPServer on a free loopback port, serving `handler` on a thread of its own."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Recorder(Served):
    """Answers 200 to anything and keeps (method, path, Authorization) of every request."""

    def __init__(self):
        self.requests: list[tuple[str, str, str | None]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                owner.requests.append((self.command, self.path, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = do_HEAD = _answer

            def log_message(self, *args):
                pass

        super().__init__(Handler)


class Redirector(Served):
    """Answers every POST with `status` and a Location on another server."""

    def __init__(self, status: int, location: str):
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                owner.hits += 1
                self.send_response(status)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(Handler)


@pytest.fixture
def recorder():
    server = Recorder()
    yield server
    server.close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_the_key_never_reaches_its_target(tmp_path, redis_url, recorder, status):
    redirector = Redirector(status, recorder.url + "/start_expert_distribution_record?token=abc")
    try:
        lines: list[str] = []
        (tmp_path / "dumps").mkdir()
        opts = BridgeOptions(dump_dir=str(tmp_path / "dumps"), redis_url=redis_url, run="redirected",
                             server_url=redirector.url, poll_s=0.02, top_k=8, server_timeout_s=2.0, api_key=KEY)
        assert Bridge(opts, log=lines.append).run_once() == 1
    finally:
        redirector.close()
    assert redirector.hits == 1
    assert recorder.requests == []  # nothing at all reached the redirect's target, so neither did the key
    errors = [line for line in lines if line.startswith("sglang server")]
    assert len(errors) == 1, lines
    assert f"HTTP {status}" in errors[0] and f"{recorder.url}/start_expert_distribution_record" in errors[0]
    assert "token=abc" not in errors[0]  # the Location is shown without its query
    assert "refused the call" in errors[0] and "not followed" in errors[0]  # it answered: not "unreachable"
    assert not any(KEY in line for line in lines)


def test_the_same_call_without_a_redirect_sends_the_key(recorder):
    ServerDriver(recorder.url, 2.0, api_key=KEY).call("dump")
    assert recorder.requests == [("POST", "/dump_expert_distribution_record", f"Bearer {KEY}")]


def test_driver_error_is_one_line_without_the_key(recorder):
    redirector = Redirector(302, recorder.url + "/elsewhere")
    try:
        with pytest.raises(ServerError) as err:
            ServerDriver(redirector.url, 2.0, api_key=KEY).call("start")
    finally:
        redirector.close()
    text = str(err.value)
    assert "\n" not in text and KEY not in text and err.value.answered
    assert text.startswith("start: HTTP 302") and "/elsewhere" in text


def test_plain_http_to_another_host_is_said_once():
    said: list[str] = []
    # TEST-NET-1 (RFC 5737): never routed, so the calls fail fast at the timeout; only the warning matters here
    driver = ServerDriver("http://192.0.2.1:30000", 0.2, api_key=KEY, warn=said.append)
    for _ in range(3):
        with pytest.raises(ServerError):
            driver.call("dump")
    assert len(said) == 1, said
    assert "plain http" in said[0] and "admin API key" in said[0] and KEY not in said[0]


def test_loopback_and_https_are_not_warned(recorder):
    said: list[str] = []
    for url in (recorder.url, recorder.url.replace("127.0.0.1", "localhost")):
        ServerDriver(url, 2.0, api_key=KEY, warn=said.append).call("dump")
    with pytest.raises(ServerError):  # nothing listens there; https is not warned about, whatever the host
        ServerDriver("https://192.0.2.1:30000", 0.2, api_key=KEY, warn=said.append).call("dump")
    assert said == []


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("LOCALHOST", True), ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True),
    ("[::1]", True), ("10.0.0.5", False), ("sglang-0.internal", False), ("", False), ("0.0.0.0", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback
