"""The HTTP side of `moe-monitor routed`: the one upstream server it talks to, and the proxy in front of it.

Every door bounded (figures and the reasons: docs/collectors.md, "The routed-experts proxy"):
- the upstream's scheme, host and port are fixed by --server; a client's request target must be a path ("/...")
  and is only ever sent to that host and port (no client can steer the proxy elsewhere);
- responses stream through in CHUNK_BYTES pieces; only a sampled completion (JSON, status 200, at most
  max_body_bytes) is also kept, from a byte budget shared by every client, and parsed one at a time;
- request bodies: at most max_body_bytes each, from the same budget (413 / 503 beyond);
- at most max_clients connections at once (503 beyond), each cut after client_timeout_s idle.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SAMPLED_PATHS = ("/v1/completions", "/v1/chat/completions")
CHUNK_BYTES = 64 << 10
MAX_JSON_CONTAINERS = 1 << 16   # arrays + objects in a sampled body: beyond, not parsed (each costs ~50 B)
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                         "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
                         "accept-encoding", "expect"})
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 41\r\n"
        b"Connection: close\r\n\r\nthe proxy is at its limit of clients: retry")


@dataclass(frozen=True)
class Upstream:
    """The engine's server, fixed when the command starts: scheme (http, https), host, port, path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"

    def target(self, path: str) -> str:
        """The request target sent upstream for a client's `path`; ValueError unless it is a path ("/...")."""
        if not path.startswith("/") or any(c in path for c in " \t\r\n\x00"):
            raise ValueError("the request target must be a path starting with /")
        if any(part in (".", "..") for part in path.split("?", 1)[0].split("/")):
            raise ValueError("the request target may not hold . or .. segments")
        return self.prefix + path

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout_s)


def parse_server(url: str) -> Upstream:
    """--server as an Upstream: http(s)://host[:port][/prefix]; the port defaults to the scheme's (80, 443).
    ValueError for anything else (credentials, a query or a fragment included)."""
    parts = urllib.parse.urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"--server {url!r}: the port is not a number 0-65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--server {url!r} must be http://HOST[:PORT] or https://HOST[:PORT]")
    if parts.username is not None or parts.query or parts.fragment:
        raise ValueError(f"--server {url!r}: no credentials, query or fragment (send credentials as headers)")
    return Upstream(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80),
                    parts.path.rstrip("/"))


def fetch_json(upstream: Upstream, method: str, path: str, body: dict | None, timeout_s: float,
               max_bytes: int) -> Any:
    """One JSON request to the upstream and its decoded answer. OSError / http.client.HTTPException when it does
    not answer, ValueError for a status other than 200, a body over max_bytes or one that is not JSON."""
    conn = upstream.connect(timeout_s)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, upstream.target(path), body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = response.read(max_bytes + 1)
    finally:
        conn.close()
    if response.status != 200:
        raise ValueError(f"{path} answered {response.status} {response.reason}")
    if len(payload) > max_bytes:
        raise ValueError(f"{path} answered more than {max_bytes} bytes")
    return parse_sampled(payload)


def parse_sampled(payload: bytes | bytearray) -> Any:
    """json.loads of a response body, refused (ValueError) when it holds more than MAX_JSON_CONTAINERS arrays and
    objects: the parse then costs at most a few times the body's bytes."""
    containers = payload.count(b"[") + payload.count(b"{")
    if containers > MAX_JSON_CONTAINERS:
        raise ValueError(f"the body holds {containers} JSON arrays and objects (at most {MAX_JSON_CONTAINERS} read)")
    return json.loads(payload)


def ask_for_routing(raw: bytes) -> bytes:
    """SGLang's request body with "return_routed_experts": true as its last member (the last of duplicate keys
    wins), without parsing it; a body that is not one JSON object is returned unchanged."""
    text = raw.strip()
    if not (text.startswith(b"{") and text.endswith(b"}")):
        return raw
    inner = text[1:-1].strip()
    return b"{" + inner + (b"," if inner else b"") + b'"return_routed_experts":true}'


class ByteBudget:
    """Bytes that buffered bodies may hold together; take() never waits."""

    def __init__(self, total: int):
        self.total, self.used = total, 0
        self._lock = threading.Lock()

    def take(self, count: int) -> bool:
        with self._lock:
            if self.used + count > self.total:
                return False
            self.used += count
            return True

    def give(self, count: int) -> None:
        with self._lock:
            self.used -= count


@dataclass
class ProxyCounts:
    """What the proxy did: responses relayed, sampled, not sampled (too large, budget full, unreadable),
    clients refused at the limit, requests refused."""

    relayed: int = 0
    sampled: int = 0
    too_large: int = 0
    busy: int = 0
    unreadable: int = 0
    clients_refused: int = 0
    requests_refused: int = 0
    said: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        """One more of `name` (handler threads count at once: under the lock)."""
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)

    def first(self, kind: str) -> bool:
        """Whether `kind` is seen for the first time (and now marked seen)."""
        with self.lock:
            new = kind not in self.said
            self.said.add(kind)
            return new


@dataclass
class ProxySettings:
    upstream: Upstream
    sample: Callable[[Any], object]         # takes a parsed sampled body (RoutedSampler.add); may raise
    say: Callable[[str], None]
    sglang: bool = False
    timeout_s: float = 60.0                 # towards the upstream, per socket operation
    client_timeout_s: float = 30.0          # a client idle this long is cut
    max_body_bytes: int = 64 << 20          # a request body, a sampled response
    budget: ByteBudget = field(default_factory=lambda: ByteBudget(256 << 20))
    counts: ProxyCounts = field(default_factory=ProxyCounts)
    parse_lock: threading.Lock = field(default_factory=threading.Lock)

    def say_once(self, kind: str, line: str) -> None:
        if self.counts.first(kind):
            self.say(line + " (said once; counted at exit)")


class ProxyServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with at most max_clients connections served at once: one more is answered 503 and
    closed by the accepting thread, which never waits on it."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], settings: ProxySettings, max_clients: int):
        self.settings = settings
        self._slots = threading.BoundedSemaphore(max_clients)
        handler = type("Handler", (ProxyHandler,), {"settings": settings, "timeout": settings.client_timeout_s})
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.settings.counts.add("clients_refused")
            with contextlib.suppress(OSError):
                request.settimeout(0)
                request.send(BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client gone mid-answer is not news; everything else is caught in the handler


class ProxyHandler(BaseHTTPRequestHandler):
    """Relays one client's requests to settings.upstream (ProxyServer makes a subclass with the settings)."""

    protocol_version = "HTTP/1.1"
    settings: ProxySettings

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def do_GET(self):
        if self.headers.get("Transfer-Encoding") or (self.headers.get("Content-Length") or "0").strip() != "0":
            self._refuse(400, "a GET request carries no body here")  # unread, it would be read as the next request
            return
        self._relay(None)

    def do_POST(self):
        settings = self.settings
        length = self._body_length()
        if length is None:
            return
        if not settings.budget.take(length):
            self._refuse(503, "the proxy's buffers are full: retry")
            return
        try:
            raw = self.rfile.read(length)
        except OSError:
            raw = b""
        try:
            if len(raw) < length:
                self.close_connection = True
                return
            path = self.path.split("?")[0]
            if path in SAMPLED_PATHS and settings.sglang:
                raw = ask_for_routing(raw)
            self._relay(raw, sample=path in SAMPLED_PATHS)
        finally:
            settings.budget.give(length)

    def _body_length(self) -> int | None:
        """The request body's declared length, or None after refusing the request."""
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "send the request body with a Content-Length")
            return None
        text = (self.headers.get("Content-Length") or "0").strip()
        if not text.isdigit():
            self._refuse(400, "bad Content-Length")
            return None
        if int(text) > self.settings.max_body_bytes:
            self._refuse(413, f"a request body is at most {self.settings.max_body_bytes} bytes here")
            return None
        return int(text)

    def _refuse(self, status: int, reason: str) -> None:
        self.settings.counts.add("requests_refused")
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.send_error(status, reason)

    def _relay(self, raw: bytes | None, sample: bool = False) -> None:
        settings = self.settings
        try:
            target = settings.upstream.target(self.path)
        except ValueError as exc:
            self._refuse(400, str(exc))
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        conn = settings.upstream.connect(settings.timeout_s)
        try:
            try:
                conn.request(self.command, target, body=raw, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._refuse(502, f"the server did not answer: {exc}")
                return
            sample = (sample and response.status == 200
                      and "json" in (response.getheader("Content-Type") or "application/json"))
            reserved = self._reserve(response.length) if sample else 0
            try:
                kept = self._pass_on(response, reserved)
                if kept is not None:
                    self._sample(kept)
            finally:
                settings.budget.give(reserved)
        finally:
            conn.close()

    def _reserve(self, length: int | None) -> int:
        """Budget bytes for keeping a sampled response of `length` bytes (None: not known, the cap); 0 (counted
        and said once) when it is over the cap or the budget is in use."""
        settings = self.settings
        want = length if length is not None else settings.max_body_bytes
        if want > settings.max_body_bytes:
            settings.counts.add("too_large")
            settings.say_once("large", f"a response of {want} bytes was relayed, not sampled (over "
                                       f"--max-body-bytes {settings.max_body_bytes})")
            return 0
        if not settings.budget.take(want):
            settings.counts.add("busy")
            settings.say_once("busy", "a response was relayed, not sampled: the buffer budget is in use")
            return 0
        return want

    def _pass_on(self, response: http.client.HTTPResponse, reserved: int) -> bytearray | None:
        """Send the upstream's response to the client as it arrives; its whole body when reserved > 0 and it
        fits in that many bytes, else None."""
        length = response.length
        kept: bytearray | None = bytearray() if reserved else None
        try:
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_HEADERS and key.lower() not in ("server", "date"):  # send_response's own
                    self.send_header(key, value)
            chunked = length is None and self.request_version != "HTTP/1.0"
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            elif length is not None:
                self.send_header("Content-Length", str(length))
            else:                                   # an HTTP/1.0 client: the body ends when the connection does
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            while True:
                try:
                    chunk = response.read1(CHUNK_BYTES)
                except (OSError, http.client.HTTPException):
                    self.close_connection = True   # the upstream broke off: so does the answer
                    return None
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                if kept is not None:
                    if len(kept) + len(chunk) > reserved:
                        kept = None
                        self.settings.counts.add("too_large")
                    else:
                        kept += chunk
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:                            # the client went away or stalled past its timeout
            self.close_connection = True
            return None
        self.settings.counts.add("relayed")
        return kept

    def _sample(self, body: bytearray) -> None:
        settings = self.settings
        try:
            with settings.parse_lock:            # one parse at a time: what it builds stays a few x the body
                settings.sample(parse_sampled(body))
            settings.counts.add("sampled")
        except (ValueError, TypeError, KeyError, MemoryError, RecursionError) as exc:
            settings.counts.add("unreadable")
            settings.say(f"a response's routing was not read: {type(exc).__name__}: {str(exc)[:200]}")
