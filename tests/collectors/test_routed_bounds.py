"""The routed-experts proxy and probe (`moe-monitor routed`) under hostile and clumsy inputs: a request
target that names another port, large upstream answers, idle clients past the limit, a .npy
header that declares terabytes, a probe answer that is malformed. The proxy runs as its own process (as an
operator runs it) in front of a real HTTP server; peak memory is the proxy's VmHWM from /proc.
"""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.cli import main as cli_main
from moe_monitor.collectors.routed import decode_vllm
from tests.collectors.test_routed_sampler import FakeEngine, steps_of

REPO = Path(__file__).resolve().parents[2]
NUM_EXPERTS = 8


def hostile_npy_b64(shape=(1 << 40, 1, 1)) -> str:
    """A .npy whose header declares `shape` int64 (8 TiB by default) followed by 8 bytes."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<i8", "fortran_order": False, "shape": shape})
    buffer.write(b"\0" * 8)
    return base64.b64encode(buffer.getvalue()).decode()


class Upstream:
    """A real HTTP server: /v1/models, /v1/completions answered as vLLM does (prompt "hostile": a hostile .npy;
    "huge:N": a JSON body of N bytes, streamed), GET /big?n=N (N bytes, streamed), GET /internal-secret (the
    secret an SSRF would read; every request to it is kept in `secret_hits`), GET /chunked (no length)."""

    def __init__(self):
        self.engine = types.SimpleNamespace(engine="vllm", sent=[])
        self.secret_hits: list[dict] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002
                pass

            def _send(self, body: bytes, status: int = 200) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, head: bytes, count: int, tail: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(head) + count + len(tail)))
                self.end_headers()
                self.wfile.write(head)
                block = b"x" * (1 << 20)
                for start in range(0, count, len(block)):
                    self.wfile.write(block[: min(len(block), count - start)])
                self.wfile.write(tail)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(json.dumps({"data": [{"id": "tiny-moe"}]}).encode())
                elif self.path.startswith("/big?n="):
                    self._stream(b"", int(self.path.split("=")[1]), b"")
                elif self.path == "/chunked":  # no length: the proxy must frame it for its client
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for piece in (b"first-", b"second"):
                        self.wfile.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                elif self.path == "/internal-secret":
                    upstream.secret_hits.append(dict(self.headers))
                    self._send(b"SECRET-TOKEN-42")
                else:
                    self._send(b"{}", 404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body.get("prompt")
                if prompt == "hostile":
                    answer = FakeEngine.answer(upstream.engine, {**body, "prompt": [1, 2]})
                    answer["choices"][0]["routed_experts"] = hostile_npy_b64()
                    self._send(json.dumps(answer).encode())
                elif isinstance(prompt, str) and prompt.startswith("huge:"):
                    self._stream(b'{"choices": [], "pad": "', int(prompt[5:]), b'"}')
                else:
                    self._send(json.dumps(FakeEngine.answer(upstream.engine, body)).encode())
        return Handler


@pytest.fixture
def upstream():
    server = Upstream()
    yield server
    server.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Proxy:
    """`moe-monitor routed --listen` in its own process; stop() returns its stderr."""

    def __init__(self, server: str, redis_url: str, run: str, *extra: str):
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moe_monitor", "routed", "--server", server, "--redis", redis_url, "--run", run,
             "--num-experts", str(NUM_EXPERTS), "--layers", "1-3", "--listen", f"127.0.0.1:{self.port}", *extra],
            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the proxy never listened: {self.stop()}") from None
                time.sleep(0.05)

    def peak_rss_bytes(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) << 10

    def raw(self, request: bytes, timeout_s: float = 10.0) -> bytes:
        """Send raw request bytes; everything the proxy answers until it closes (or timeout_s passes)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as sock:
            sock.sendall(request)
            chunks = []
            try:
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
            except TimeoutError:
                pass
        return b"".join(chunks)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, stderr = self.proc.communicate(timeout=30)
        return stderr


def drain(url: str, data: bytes | None = None) -> tuple[int, int]:
    """(status, body bytes) of a request, read in pieces and thrown away."""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    total = 0
    with urllib.request.urlopen(request, timeout=60) as response:
        while piece := response.read(1 << 20):
            total += len(piece)
        return response.status, total


def test_a_request_target_cannot_steer_the_proxy_to_another_port(upstream, redis_url):
    """--server without a port (as a service name often is): the targets `:PORT/path`, `@host:PORT/path` and an
    absolute URL are refused with 400; the other port is never reached and no Authorization leaves."""
    proxy = Proxy("http://127.0.0.1", redis_url, "ssrf")
    try:
        for target in (f":{upstream.port}/internal-secret", f"@127.0.0.1:{upstream.port}/internal-secret",
                       f"{upstream.url}/internal-secret"):
            answer = proxy.raw(f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer client-key\r\n"
                               f"Connection: close\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 400"), (target, answer[:200])
            assert b"SECRET" not in answer
    finally:
        stderr = proxy.stop()
    assert upstream.secret_hits == [], (upstream.secret_hits, stderr)


def test_large_answers_stream_through_without_being_held(upstream, redis_url):
    """A 48 MiB answer on a path that is not sampled and a 72 MiB completion (over the 64 MiB sampling cap) pass
    through byte for byte while the proxy's peak memory grows by less than 16 MiB (holding either whole would
    cost at least its size); the completion is said not sampled, and the proxy still samples a normal one."""
    proxy = Proxy(upstream.url, redis_url, "big-answers")
    try:
        base = f"http://127.0.0.1:{proxy.port}"
        assert drain(f"{base}/big?n=1024")[0] == 200
        body = json.dumps({"model": "m", "prompt": [3, 4, 5], "max_tokens": 3}).encode()
        assert drain(f"{base}/v1/completions", body)[0] == 200          # warm: the sampling path has run once
        before = proxy.peak_rss_bytes()
        assert drain(f"{base}/big?n={48 << 20}") == (200, 48 << 20)
        huge = json.dumps({"model": "m", "prompt": f"huge:{72 << 20}", "max_tokens": 1}).encode()
        assert drain(f"{base}/v1/completions", huge) == (200, (72 << 20) + 26)
        grown = proxy.peak_rss_bytes() - before
        assert drain(f"{base}/v1/completions", body)[0] == 200
        client = core.connect(redis_url)
        deadline = time.monotonic() + 20
        while len(steps_of(client, "big-answers")) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(steps_of(client, "big-answers")) == 4                 # the two normal completions
    finally:
        stderr = proxy.stop()
    assert grown < 16 << 20, f"the proxy's peak grew by {grown >> 20} MiB for 120 MiB relayed"
    assert "relayed, not sampled" in stderr and "1 too large" in stderr, stderr


def test_clients_past_the_limit_are_answered_503_and_idle_ones_are_cut(upstream, redis_url):
    """64 idle connections take every slot (the default --max-clients): the 65th is answered 503 at once; once
    they leave, requests are served again. With --client-timeout-s 1 an idle connection is closed by the
    proxy."""
    proxy = Proxy(upstream.url, redis_url, "many-clients")
    idle = []
    try:
        for _ in range(64):
            idle.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=10))
        deadline = time.monotonic() + 20   # the accepting thread takes them one by one
        while True:
            answer = proxy.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout_s=5)
            if answer.startswith(b"HTTP/1.1 503") or time.monotonic() > deadline:
                break
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + 20
        while True:
            answer = proxy.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout_s=5)
            if answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        for sock in idle:
            sock.close()
        proxy.stop()
    proxy = Proxy(upstream.url, redis_url, "idle-clients", "--client-timeout-s", "1")
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=20) as sock:
            started = time.monotonic()
            assert sock.recv(1) == b""                   # closed by the proxy, long before our 20 s
            assert time.monotonic() - started < 15
    finally:
        proxy.stop()


def test_a_hostile_npy_header_is_refused_in_words_and_the_proxy_goes_on(upstream, redis_url):
    """A routed_experts .npy declaring 8 TiB: decode_vllm refuses it with one ValueError (it used to raise
    MemoryError); through the proxy, the answer is relayed unchanged, one line says why it was not read, and
    the next completion is published."""
    with pytest.raises(ValueError, match=r"declares \(1099511627776, 1, 1\) int64"):
        decode_vllm(hostile_npy_b64())
    proxy = Proxy(upstream.url, redis_url, "hostile-npy")
    try:
        base = f"http://127.0.0.1:{proxy.port}"
        hostile = json.dumps({"model": "m", "prompt": "hostile", "max_tokens": 2}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{base}/v1/completions", data=hostile), timeout=30) as r:
            assert json.loads(r.read())["choices"][0]["routed_experts"] == hostile_npy_b64()
        body = json.dumps({"model": "m", "prompt": [3, 4, 5], "max_tokens": 3}).encode()
        assert drain(f"{base}/v1/completions", body)[0] == 200
        client = core.connect(redis_url)
        deadline = time.monotonic() + 20
        while len(steps_of(client, "hostile-npy")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(s.phase, s.tokens) for s in steps_of(client, "hostile-npy")] == [("prefill", 3), ("decode", 2)]
    finally:
        stderr = proxy.stop()
    assert "routing was not read: ValueError: routed_experts declares" in stderr, stderr
    assert "Traceback" not in stderr and "MemoryError" not in stderr, stderr


def test_the_probe_goes_on_past_a_bad_answer(upstream, redis_url, tmp_path, capsys):
    """Three probe prompts, the first answered with a hostile .npy: it is said (naming the prompt), the other two
    are published as prefill and decode records, and --once exits 1 (a prompt failed), not 2."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"hostile"\n[5, 6, 7]\n[8, 9]\n')
    code = cli_main(["routed", "--server", upstream.url, "--redis", redis_url, "--run", "probe-bad",
                     "--num-experts", str(NUM_EXPERTS), "--layers", "1-3", "--prompts", str(prompts),
                     "--max-tokens", "3", "--once"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "prompt 1: ValueError: routed_experts declares" in err
    steps = steps_of(core.connect(redis_url), "probe-bad")
    assert [(s.phase, s.tokens) for s in steps] == [("prefill", 3), ("decode", 2), ("prefill", 2), ("decode", 2)]


def test_http10_clients_bodies_on_get_and_dot_segments(upstream, redis_url):
    """An answer without a length reaches an HTTP/1.0 client unframed (the connection ends it) and an HTTP/1.1
    client chunked; a GET that declares a body is refused (its bytes would be read as the next request); a target
    with a .. segment is refused and never leaves the --server prefix."""
    proxy = Proxy(upstream.url, redis_url, "framing")
    try:
        old = proxy.raw(b"GET /chunked HTTP/1.0\r\nHost: x\r\n\r\n")
        head, _, body = old.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower() and body == b"first-second", old
        assert head.lower().count(b"\r\ndate:") == 1, head  # the upstream's Date is not sent twice
        new = proxy.raw(b"GET /chunked HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, _, body = new.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head.lower() and body == b"6\r\nfirst-\r\n6\r\nsecond\r\n0\r\n\r\n"
        smuggled = proxy.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 42\r\n\r\n"
                             b"GET /internal-secret HTTP/1.1\r\nHost: x\r\n\r\n")
        assert smuggled.startswith(b"HTTP/1.1 400") and b"SECRET" not in smuggled, smuggled[:200]
        for target in ("/v1/../internal-secret", "/./internal-secret"):
            answer = proxy.raw(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 400"), (target, answer[:200])
    finally:
        proxy.stop()
    assert upstream.secret_hits == []
