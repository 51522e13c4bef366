"""The dump folder, polled: which SGLang dump files are complete (pure file-system reads, no torch).

SGLang writes a dump with torch.save straight into its final name, so a file is taken as complete once its
size and modification time are the same at two polls in a row (and it is not empty). Only regular files
named like SGLang's dumps count; symlinks, folders, devices and other names are left alone.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from moe_monitor.core.sglang_dumps import DumpName, parse_name


@dataclass(frozen=True)
class DumpFile:
    """A dump file as listed: name, path, size_bytes, mtime_ns and what its name says (time, rank)."""

    name: str
    path: str
    size_bytes: int
    mtime_ns: int
    named: DumpName

    @property
    def order(self) -> tuple[float, int, str]:
        """Sort key: dump time, then rank (stat files first), then name."""
        return (self.named.time_s, -1 if self.named.rank is None else self.named.rank, self.name)


class Folder:
    """Lists `path` at each poll(); a file is ready when it looked the same at the previous poll."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._previous: dict[str, tuple[int, int]] = {}

    def poll(self) -> list[DumpFile]:
        """The complete dump files, oldest dump first. Raises OSError when the folder cannot be listed."""
        listed: dict[str, tuple[int, int]] = {}
        ready = []
        with os.scandir(self.path) as entries:
            for entry in entries:
                named = parse_name(entry.name)
                if named is None:
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # gone since the listing
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue
                key = (info.st_size, info.st_mtime_ns)
                listed[entry.name] = key
                if info.st_size > 0 and self._previous.get(entry.name) == key:
                    ready.append(DumpFile(entry.name, entry.path, info.st_size, info.st_mtime_ns, named))
        self._previous = listed
        return sorted(ready, key=lambda f: f.order)
