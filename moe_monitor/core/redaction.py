"""Keeping a Redis URL's secrets out of messages and logs: redact() for a URL (or a text holding URLs), scrub()
for a message that may quote the URL or its secrets. Never raises; the URL need not be valid.

Secrets: the password of `user:password@` (the user name stays); a lone user info `redis://secret@host` (redis-py
sends it to AUTH: often a password typed without its colon); the values of query arguments naming a password or
a token, in any case (`?password=`, `?ssl_password=`); and everything from `://` to the last '@' after the host
(a password holding an unencoded '/', '?' or '#' ends the host early: `redis://:se/cret@host`).
"""
from __future__ import annotations

import re
from urllib.parse import unquote

HIDDEN = "***"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_SECRET_WORDS = ("pass", "pwd", "secret", "token", "auth", "credential")
# key=value pairs of a query, or of a URL written without its scheme
_PAIR = re.compile(r"(?P<key>[^&?#=\s;]+)=(?P<value>[^&#\s;]*)")


def is_secret_key(name: str) -> bool:
    """Whether a query argument's name says its value is a secret (password, ssl_password, PASSWORD, token...)."""
    lowered = unquote(name).lower()
    return any(word in lowered for word in _SECRET_WORDS)


def redact(url: object) -> str:
    """url with every secret (module docstring) replaced by '***'. A text that is not a URL but holds some keeps
    its words and has each URL in it redacted; a URL without its scheme loses what stands before its '@'."""
    text = str(url)
    if _SCHEME.match(text):
        return _redact_url(text)
    if _URL_IN_TEXT.search(text):
        return _URL_IN_TEXT.sub(lambda found: _redact_url(found.group(0)), text)
    if "@" in text:  # a URL without its scheme ("redis//:pw@host"): what comes before the '@' may be a password
        text = HIDDEN + "@" + text.rsplit("@", 1)[1]
    return _redact_pairs(text)


def _redact_url(url: str) -> str:
    scheme, _, rest = url.partition("://")
    if "@" in rest:
        userinfo, hostpart = rest.rsplit("@", 1)
        user, colon, _ = userinfo.partition(":")
        shown = f"{user}:{HIDDEN}" if colon and not re.search(r"[/?#]", user) else HIDDEN
        return f"{scheme}://{shown}@{_redact_pairs(hostpart)}"
    return f"{scheme}://{_redact_pairs(rest)}"


def _redact_pairs(text: str) -> str:
    """text with the value of every secret-named key=value pair after its first '?' hidden (all of them when
    there is no '?', as in a query given on its own)."""
    head, mark, query = text.partition("?")
    if not mark:
        head, query = "", text
    hidden = _PAIR.sub(lambda pair: f"{pair['key']}={HIDDEN}" if is_secret_key(pair["key"]) else pair.group(0), query)
    return head + mark + hidden


def secrets_of(url: str) -> list[str]:
    """The secrets a message might quote from url: the password or lone user info (as written and decoded),
    the secret query values; longest first. [] when it has none."""
    text = str(url)
    found: list[str] = []
    _, sep, rest = text.partition("://")
    if sep and "@" in rest:
        userinfo, hostpart = rest.rsplit("@", 1)
        user, colon, password = userinfo.partition(":")
        found += [password] if colon and not re.search(r"[/?#]", user) else [userinfo]
        if colon and re.search(r"[/?#]", user):
            found += [user]
    else:
        hostpart = rest if sep else text
    _, _, query = hostpart.partition("?")
    found += [pair["value"] for pair in _PAIR.finditer(query) if is_secret_key(pair["key"])]
    found += [unquote(secret) for secret in found]
    return sorted({secret for secret in found if secret}, key=len, reverse=True)


def scrub(text: object, url: str) -> str:
    """text (a message, an exception's str) with url shown redacted and each of its secrets replaced by '***',
    wherever they appear; any other URL in it redacted too."""
    out = str(text)
    if url:
        out = out.replace(str(url), redact(url))
        for secret in secrets_of(url):
            out = out.replace(secret, HIDDEN)
    return _URL_IN_TEXT.sub(lambda found: _redact_url(found.group(0)), out)
