"""The trace folder's uploads, kept apart from its recordings: their names (upload-<UTC time>-<random>[-<stem>]
<container suffix>, never the client's name), the check before one is kept (opened in a child process under
an address-space limit, with nothing secret in its environment, one check at a time: core/tracefile/sandbox.py),
and how long and how many are kept: uploads older than UPLOAD_MAX_AGE_S are deleted; before a new one is kept
the oldest uploads of the same session go until that session keeps at most UPLOAD_MAX_FILES whose bytes with the
new one's fit in UPLOAD_QUOTA_BYTES. Another session's uploads are never deleted before they expire: when all
uploads together would pass FOLDER_MAX_FILES or FOLDER_QUOTA_BYTES the new one is refused. Recordings (any file
not named like an upload) are never deleted. No Streamlit here: the sidebar (dashboard.views.sidebar) calls it
with the names of its session's uploads.
"""
from __future__ import annotations

import os
import re
import secrets
import threading
import time
from collections.abc import Collection
from pathlib import Path

UPLOAD_QUOTA_BYTES = 1 << 30      # one session's uploads together
UPLOAD_MAX_FILES = 8              # uploads one session keeps in the trace folder
FOLDER_QUOTA_BYTES = 4 << 30      # every session's uploads together
FOLDER_MAX_FILES = 64             # uploads of every session in the trace folder
UPLOAD_MAX_AGE_S = 24 * 3600.0    # an upload older than this is deleted
PART_MAX_AGE_S = 3600.0           # a half-written upload left by a server that stopped mid-write
UPLOAD_ADDRESS_MIB = 2048         # address space the check of one upload may take beyond its own start
UPLOAD_CHECK_TIMEOUT_S = 60.0     # seconds the check of one upload may take
UPLOAD_CHECKS_AT_ONCE = 1         # checks running at once in this server (each may take UPLOAD_ADDRESS_MIB)
UPLOAD_QUEUE_WAIT_S = 2 * UPLOAD_CHECK_TIMEOUT_S  # how long an upload waits for its turn before it is refused
UPLOAD_NAME = re.compile(r"^upload-\d{8}-\d{6}-[0-9a-f]{8}(-[A-Za-z0-9_-]+)?\.(jsonl|parquet|arrows)$")
PART_NAME = re.compile(r"^\.upload-.*\.part$")
_CHECKS = threading.BoundedSemaphore(UPLOAD_CHECKS_AT_ONCE)  # held from writing an upload to keeping it


def is_upload(name: str) -> bool:
    """Whether a trace-folder file name is an upload's (upload_name's form), not a recording's."""
    return bool(UPLOAD_NAME.match(name))


def upload_container(data: bytes) -> str:
    """'parquet', 'arrows' or 'jsonl': the trace container an upload's first bytes announce (as open_trace
    tells files apart)."""
    from moe_monitor.core.tracefile import IPC_MAGIC, PARQUET_MAGIC
    head = data[:4]
    return "parquet" if head == PARQUET_MAGIC else "arrows" if head == IPC_MAGIC else "jsonl"


def upload_name(client_name: str, now_s: float | None = None, suffix: str = ".jsonl") -> str:
    """A fresh file name for an upload: upload-<UTC time>-<random>[-<the client's stem, letters, digits, _ and -
    only>]<suffix> (.jsonl, .parquet or .arrows: the container its bytes are, never the client's extension).
    Never the client's name as such: no path separators, no dots, nothing hidden."""
    base = re.split(r"[\\/]", str(client_name))[-1]
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", base.rsplit(".", 1)[0] if "." in base else base).strip("-_")[:40]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now_s is None else now_s))
    return f"upload-{stamp}-{secrets.token_hex(4)}" + (f"-{stem}" if stem else "") + suffix


def _uploads(root: Path) -> list[tuple[float, int, Path]]:
    """(modification time, bytes, path) of the uploads in root, oldest first."""
    found = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        if not is_upload(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # removed meanwhile
            continue
        found.append((info.st_mtime, info.st_size, Path(entry.path)))
    return sorted(found)


def expire_uploads(root: Path, now_s: float | None = None) -> list[str]:
    """Delete the uploads older than UPLOAD_MAX_AGE_S and the half-written ones older than PART_MAX_AGE_S;
    the names deleted."""
    now_s = time.time() if now_s is None else now_s
    gone = [path for mtime, _, path in _uploads(root) if now_s - mtime > UPLOAD_MAX_AGE_S]
    try:
        parts = [Path(e.path) for e in os.scandir(root) if PART_NAME.match(e.name)]
    except OSError:
        parts = []
    for part in parts:
        try:
            if now_s - part.stat(follow_symlinks=False).st_mtime > PART_MAX_AGE_S:
                gone.append(part)
        except OSError:
            continue
    return [path.name for path in gone if _remove(path)]


def make_room(root: Path, incoming_bytes: int, own: Collection[str] = ()) -> list[str]:
    """Delete the oldest of the session's uploads (own: their names) until one more of incoming_bytes keeps
    them within UPLOAD_MAX_FILES files and UPLOAD_QUOTA_BYTES bytes; the names deleted. ValueError, nothing
    more deleted, when the uploads of every session with the new one would pass FOLDER_MAX_FILES or
    FOLDER_QUOTA_BYTES (another session's uploads stay until they expire)."""
    every = _uploads(root)
    mine = [item for item in every if item[2].name in own]
    doomed = []  # decided first, deleted only once the new upload is known to fit the folder too
    while mine and (len(mine) + 1 > UPLOAD_MAX_FILES or sum(b for _, b, _ in mine) + incoming_bytes > UPLOAD_QUOTA_BYTES):
        doomed.append(mine.pop(0)[2])
    kept = [item for item in every if item[2] not in doomed]
    held = sum(b for _, b, _ in kept)
    if len(kept) + 1 > FOLDER_MAX_FILES or held + incoming_bytes > FOLDER_QUOTA_BYTES:
        oldest_s = min((mtime for mtime, _, _ in kept), default=time.time())
        wait_h = max(0.0, UPLOAD_MAX_AGE_S - (time.time() - oldest_s)) / 3600
        raise ValueError(f"the trace folder holds {len(kept)} uploads ({held >> 20:,} MiB), as many as all sessions "
                         f"may keep; the oldest expires in {wait_h:.1f} h (or copy the trace into the folder)")
    return [path.name for path in doomed if _remove(path)]


def _remove(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def save_upload(root: Path, client_name: str, data: bytes, own: Collection[str] = ()) -> str:
    """Write data into root under upload_name(client_name) and return that name; own: the names of the
    session's uploads kept so far. One upload at a time (UPLOAD_CHECKS_AT_ONCE; one waits up to
    UPLOAD_QUEUE_WAIT_S for its turn): it is written to a hidden temporary file and opened there in a child
    process (core/tracefile/sandbox.py: under UPLOAD_ADDRESS_MIB of address space and UPLOAD_CHECK_TIMEOUT_S
    seconds, the decoded-bytes budget applying, its first view read); ValueError (why it is not kept) and
    nothing is kept when it does not open. Then old uploads are expired, the session's oldest make room
    (make_room), and the file is renamed into place (the picker never lists half a file). ValueError when
    the upload alone is above the session's quota, or the folder holds all uploads it may; OSError when the
    folder cannot take it."""
    from moe_monitor.core.tracefile.sandbox import check_in_child

    if len(data) > UPLOAD_QUOTA_BYTES:
        raise ValueError(f"it is larger than the {UPLOAD_QUOTA_BYTES >> 20} MiB one session's uploads may take together")
    root.mkdir(parents=True, exist_ok=True)
    container = upload_container(data)
    name = upload_name(client_name, suffix=".jsonl" if container == "jsonl" else f".{container}")
    tmp = root / f".{name}.part"
    if not _CHECKS.acquire(timeout=UPLOAD_QUEUE_WAIT_S):
        raise ValueError(f"other uploads were being checked for {UPLOAD_QUEUE_WAIT_S:.0f} s; try again in a minute")
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
        why = check_in_child(tmp, UPLOAD_ADDRESS_MIB << 20, UPLOAD_CHECK_TIMEOUT_S)
        if why:
            raise ValueError(why.replace(str(tmp), "the upload"))
        expire_uploads(root)
        make_room(root, len(data), own)
        os.replace(tmp, root / name)
    finally:
        tmp.unlink(missing_ok=True)
        _CHECKS.release()
    return name
