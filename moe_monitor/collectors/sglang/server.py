"""The SGLang server's recorder endpoints, driven over HTTP with the standard library (no code in SGLang):
POST /start_expert_distribution_record (and clear), /dump_expert_distribution_record (write the dump files and
start over), /stop_expert_distribution_record.

The admin API key, read from an environment variable, goes as `Authorization: Bearer` to --server only: a
redirect (any 3xx) is refused with one error naming the status and Location, never followed; the first call over
plain http to a host that is not loopback says once that the key crosses the network unencrypted.
"""
from __future__ import annotations

import http.client
import ipaddress
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

log = logging.getLogger("moe_monitor.collectors")

ENDPOINTS = {
    "start": "/start_expert_distribution_record",
    "dump": "/dump_expert_distribution_record",
    "stop": "/stop_expert_distribution_record",
}


class ServerError(Exception):
    """A call that did not succeed; str() is one line saying why. answered: whether the server answered (an
    HTTP status, a redirect) rather than not being reached at all."""

    def __init__(self, message: str, answered: bool = False):
        super().__init__(message)
        self.answered = answered


class _Redirected(Exception):
    """The server answered a redirect, which is never followed: the admin API key would go along."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect before anything is sent to where it points (raises _Redirected)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        location = str(headers.get("Location") or headers.get("URI") or newurl or "")
        fp.close()
        where = f"redirecting to {_shown(location)}" if location else "(a redirect without a Location)"
        raise _Redirected(f"HTTP {code} {msg} {where}: redirects are not followed (the admin API key goes to "
                          "--server only); give --server the address that answers")

    def http_error_302(self, req, fp, code, msg, headers):
        # every 3xx, whatever its Location (urllib's own handler would let some through or say less)
        return self.redirect_request(req, fp, code, msg, headers, headers.get("Location", ""))

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _shown(location: str) -> str:
    """A Location as a message may show it: no user info, no query, at most 200 characters."""
    try:
        parts = urlsplit(location)
        host = parts.netloc.rsplit("@", 1)[-1]
        text = f"{parts.scheme}://{host}{parts.path}" if parts.scheme else parts.path
    except ValueError:
        text = "an unreadable Location"
    return repr(text[:200])


def is_loopback(host: str) -> bool:
    """Whether host (a name or an address, as in a URL) is this machine's loopback: localhost, 127.x, ::1."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_server_url(url: str) -> str:
    """url without a trailing slash when it is an http(s) URL with a host; ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--server {url!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:30000")
    return url.rstrip("/")


class ServerDriver:
    """Calls one SGLang server's recorder endpoints, each call bounded by timeout_s. warn: where the one
    plain-http warning goes (the logger's warning by default)."""

    def __init__(self, url: str, timeout_s: float, api_key: str | None = None,
                 warn: Callable[[str], None] | None = None):
        self.url = check_server_url(url)
        self.timeout_s = timeout_s
        self._api_key = api_key
        self._warn = warn or log.warning
        self._opener = urllib.request.build_opener(_NoRedirects)
        parts = urlsplit(self.url)
        self._cleartext = parts.scheme == "http" and not is_loopback(parts.hostname or "")

    def call(self, action: str) -> None:
        """POST the endpoint of action ("start", "dump" or "stop"). ServerError when the server cannot be
        reached, does not answer within timeout_s, answers a redirect or anything but 2xx."""
        if self._cleartext:
            self._cleartext = False
            key = "the admin API key and " if self._api_key else ""
            self._warn(f"{self.url} is plain http to another host: {key}the recorder calls cross the network "
                       "unencrypted; use https:// or a tunnel to 127.0.0.1")
        request = urllib.request.Request(self.url + ENDPOINTS[action], data=b"", method="POST")
        if self._api_key:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as reply:
                reply.read(4096)
        except _Redirected as exc:
            raise ServerError(f"{action}: {exc}", answered=True) from None
        except urllib.error.HTTPError as exc:
            hint = " (set the admin API key: --api-key-env)" if exc.code in (401, 403) else ""
            body = exc.read(200).decode(errors="replace").strip().splitlines()
            raise ServerError(f"{action}: HTTP {exc.code} {exc.reason}{hint}"
                              f"{': ' + body[0][:160] if body else ''}", answered=True) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(f"{action}: {type(exc).__name__}: {reason}") from None
