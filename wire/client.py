"""Redis clients with explicit timeouts and retries, shared by the collectors and the dashboard.

redis-py 8 defaults to a 5 s socket timeout and 10 retries; a monitor must fail fast instead, so every
client made here states its own. URLs: redis://[[user]:password@]host:port/db, rediss:// for TLS,
unix:///path.sock. Imports neither torch nor pynvml.
"""
from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry


def redact(url: str) -> str:
    """The URL with any password (user:password@ or ?password=) replaced by '***', for messages and logs."""
    try:
        parts = urlsplit(str(url))
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if parts.password is None and "@" in str(url) and "@" not in netloc:  # no scheme: user info not parsed
        return "***@" + str(url).rsplit("@", 1)[1]
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    if any(key == "password" for key, _ in query):
        query = [(key, "***" if key == "password" else value) for key, value in query]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="*/"), parts.fragment))


def connect(url: str, *, timeout_s: float = 1.0, retries: int = 1) -> redis.Redis:
    """A client for url that gives up after timeout_s per socket operation and retries `retries` times
    with a short exponential backoff. Connecting is lazy: nothing is sent until the first command."""
    if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"Redis URL {redact(url)!r} must start with redis://, rediss:// or unix://")
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries),
        health_check_interval=30,
        decode_responses=False,
    )
