"""Checking a Redis URL before a client is made from it, with one clear ValueError per mistake.

redis-py reads a URL lazily and says its mistakes in its own words, some at the first command: an unknown query
argument is a TypeError then (`?bogus=1`), a bad port a ValueError that quotes the text after the host, which
is the start of the password when that password holds an unencoded '/', '?' or '#'. check_url() says each of
these at once, in this project's words, and never quotes a secret (core.redaction)."""
from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from redis.connection import URL_QUERY_ARGUMENT_PARSERS

from .redaction import redact

SCHEMES = ("redis", "rediss", "unix")
# options that need a Python object (a list of exception classes) or belong to another pool class: never from a URL
_NOT_FROM_A_URL = frozenset({"retry_on_error", "timeout"})
# redis-py's string-valued connection settings a URL may carry (as well as those it parses, URL_QUERY_ARGUMENT_PARSERS)
_STRING_OPTIONS = frozenset({"client_name", "username", "password", "encoding", "encoding_errors", "lib_name",
                             "lib_version", "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs",
                             "ssl_ca_path", "ssl_password", "ssl_ciphers"})
OPTIONS = frozenset(URL_QUERY_ARGUMENT_PARSERS) - _NOT_FROM_A_URL | _STRING_OPTIONS
_ENCODE_HINT = "percent-encode '/', '?', '#' and '@' in a user name or password (%2F, %3F, %23, %40)"


def check_url(url: object) -> str:
    """url when it is a Redis URL redis-py can use (redis://, rediss://, unix://; a valid port; only options
    redis-py knows, each with a value it accepts); ValueError otherwise, saying what is wrong without any
    secret."""
    if not isinstance(url, str) or not url.startswith(tuple(f"{scheme}://" for scheme in SCHEMES)):
        raise ValueError(f"Redis URL {redact(url)!r} must start with redis://, rediss:// or unix://")
    shown = redact(url)
    rest = url.split("://", 1)[1]
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in rest[len(netloc):]:
        raise ValueError(f"Redis URL {shown!r} has an '@' past its host: {_ENCODE_HINT}")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ValueError(f"Redis URL {shown!r} is not a valid URL (an IPv6 host goes in brackets: [::1])") from None
    try:
        parts.port  # noqa: B018 (reading it checks it)
    except ValueError:
        raise ValueError(f"Redis URL {shown!r}: the port must be a number from 0 to 65535") from None
    if parts.scheme != "unix" and not re.fullmatch(r"/?(\d+)?", parts.path):
        raise ValueError(f"Redis URL {shown!r}: the path must be the database number (redis://host:6379/0)")
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        _check_option(name, parts.scheme, shown)
    return url


def _check_option(name: str, scheme: str, shown: str) -> None:
    if name in OPTIONS and (scheme == "rediss" or not name.startswith("ssl_")):
        return
    if name in OPTIONS:
        raise ValueError(f"Redis URL {shown!r}: {name} is an option of rediss:// (TLS) URLs only")
    lower = f" (options are lower case: {name.lower()})" if name.lower() in OPTIONS else ""
    raise ValueError(f"Redis URL {shown!r} has an unknown option {name!r}{lower}: the options are redis-py's "
                     "connection settings (db, username, password, client_name, socket_timeout, protocol; "
                     "ssl_ca_certs, ssl_certfile, ssl_keyfile for rediss://)")


def explain(exc: BaseException, url: str) -> ValueError:
    """What redis-py raised while making a client of url (a value it refused), as this project's ValueError: its
    own message only when it quotes no part of the URL ("Invalid value for 'db' ..."), else a generic one."""
    text = str(exc)
    said = text if text.startswith("Invalid value for '") or text.startswith("protocol must be") else \
        f"redis-py refused the value of one of its options ({type(exc).__name__}; its message is not repeated: it " \
        "may quote a secret)"
    return ValueError(f"Redis URL {redact(url)!r} cannot be used: {said}")
