"""Where the apply secret comes from (core/signing.py signs and checks with it): a file (a path option, or
$MOE_APPLY_SECRET_FILE), else $MOE_APPLY_SECRET itself. Never a command-line value: argv is visible to every user
of the machine (ps) and lands in shell histories. Nothing here logs, prints or puts the secret in a message.

The file holds the secret as text (one line; surrounding whitespace is dropped), e.g. made with
`python -c "import secrets; print(secrets.token_hex(32))" > apply.key; chmod 600 apply.key`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .signing import MIN_SECRET_BYTES, check_secret

SECRET_ENV = "MOE_APPLY_SECRET"
SECRET_FILE_ENV = "MOE_APPLY_SECRET_FILE"
MAX_SECRET_FILE_BYTES = 4096


def read_secret_file(path: str | os.PathLike) -> bytes:
    """The secret in the file at path (whitespace around it dropped); ValueError when it cannot be read or is
    shorter than MIN_SECRET_BYTES (the message names the path, never the content)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the apply secret file {str(path)!r}: {exc.strerror or type(exc).__name__}") \
            from None
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ValueError(f"the apply secret file {str(path)!r} is over {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return check_secret(raw.strip())
    except ValueError:
        raise ValueError(f"the apply secret in {str(path)!r} is shorter than {MIN_SECRET_BYTES} bytes") from None


def load_secret(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The apply secret: the file at path when given, else the file $MOE_APPLY_SECRET_FILE names, else
    $MOE_APPLY_SECRET's text; None when none of them is set. ValueError for an unreadable or short one."""
    env = os.environ if environ is None else environ
    file_path = path or env.get(SECRET_FILE_ENV) or None
    if file_path:
        return read_secret_file(Path(file_path))
    text = env.get(SECRET_ENV, "").strip()
    if not text:
        return None
    try:
        return check_secret(text.encode())
    except ValueError:
        raise ValueError(f"${SECRET_ENV} is shorter than {MIN_SECRET_BYTES} bytes") from None
