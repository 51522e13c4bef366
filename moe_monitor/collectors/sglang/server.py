"""The SGLang server's recorder endpoints, driven over HTTP with the standard library (no code in SGLang).

POST /start_expert_distribution_record   start recording (and clear what was recorded)
POST /dump_expert_distribution_record    write the dump files into SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR
                                         and start over (recording goes on)
POST /stop_expert_distribution_record    stop recording

The endpoints need the server's admin API key when one is set: the bridge sends `Authorization: Bearer` with
the key read from an environment variable (never from the command line).
"""
from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from urllib.parse import urlsplit

ENDPOINTS = {
    "start": "/start_expert_distribution_record",
    "dump": "/dump_expert_distribution_record",
    "stop": "/stop_expert_distribution_record",
}


class ServerError(Exception):
    """A call that did not succeed; str() is one line saying why."""


def check_server_url(url: str) -> str:
    """url without a trailing slash when it is an http(s) URL with a host; ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--server {url!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:30000")
    return url.rstrip("/")


class ServerDriver:
    """Calls one SGLang server's recorder endpoints, each call bounded by timeout_s."""

    def __init__(self, url: str, timeout_s: float, api_key: str | None = None):
        self.url = check_server_url(url)
        self.timeout_s = timeout_s
        self._api_key = api_key

    def call(self, action: str) -> None:
        """POST the endpoint of action ("start", "dump" or "stop"). ServerError when the server cannot be
        reached, does not answer within timeout_s or answers anything but 2xx."""
        request = urllib.request.Request(self.url + ENDPOINTS[action], data=b"", method="POST")
        if self._api_key:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:  # noqa: S310 (http(s) only)
                reply.read(4096)
        except urllib.error.HTTPError as exc:
            hint = " (set the admin API key: --api-key-env)" if exc.code in (401, 403) else ""
            body = exc.read(200).decode(errors="replace").strip().splitlines()
            raise ServerError(f"{action}: HTTP {exc.code} {exc.reason}{hint}"
                              f"{': ' + body[0][:160] if body else ''}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(f"{action}: {type(exc).__name__}: {reason}") from None
