"""Where the apply secret comes from (core/signing.py signs and checks with it): a file (a path option, or
$MOE_APPLY_SECRET_FILE), else $MOE_APPLY_SECRET itself. Never a command-line value: argv is visible to every user
of the machine (ps) and lands in shell histories. Nothing here logs, prints or puts the secret in a message.

The file holds the secret as text (one line; surrounding whitespace is dropped), at least MIN_SECRET_BYTES (32)
bytes, and only its owner may read or write it (mode 600 or 400: any group or other permission bit is refused on
POSIX), e.g. made with
`(umask 077; python -c "import secrets; print(secrets.token_hex(32))" > apply.key)`.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .signing import MIN_SECRET_BYTES, check_secret

SECRET_ENV = "MOE_APPLY_SECRET"
SECRET_FILE_ENV = "MOE_APPLY_SECRET_FILE"
MAX_SECRET_FILE_BYTES = 4096


def read_secret_file(path: str | os.PathLike) -> bytes:
    """The secret in the file at path (whitespace around it dropped); ValueError when it cannot be read, when
    it is not a regular file, when others may read or write it (the mode of the file opened, not of a name looked
    up earlier), or when it is shorter than MIN_SECRET_BYTES (the message names the path, never the content)."""
    try:  # O_NONBLOCK: a FIFO named by mistake is refused below instead of blocking the open
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
            info = os.fstat(handle.fileno())
            mode = stat.S_IMODE(info.st_mode)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"the apply secret file {str(path)!r} is not a regular file")
            if os.name == "posix" and mode & 0o077:
                raise ValueError(f"the apply secret file {str(path)!r} is open to others (mode {mode:03o}); make "
                                 f"it private: chmod 600 {str(path)!r}")
            raw = handle.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the apply secret file {str(path)!r}: {exc.strerror or type(exc).__name__}") \
            from None
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ValueError(f"the apply secret file {str(path)!r} is over {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return check_secret(raw.strip())
    except ValueError:
        raise ValueError(f"the apply secret in {str(path)!r} is shorter than {MIN_SECRET_BYTES} bytes (make one "
                         "with: python -c \"import secrets; print(secrets.token_hex(32))\")") from None


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
        raise ValueError(f"${SECRET_ENV} is shorter than {MIN_SECRET_BYTES} bytes (make one with: "
                         "python -c \"import secrets; print(secrets.token_hex(32))\")") from None
