"""The "timing" lines (core.trace_line) of a JSON-lines file: a .jsonl trace, or the side file
<path>.side.jsonl of an .arrows recording (the .parquet timings sidecar is timings.py's).

They are indexed at open by their step id only (TimingLines: a canonical core.trace_line line is recognised
by its first bytes, its step read with a pattern, without decoding it) and decoded by core.decode_trace_line
when a range is read: a line that does not decode, or whose decoded step or layer count does not fit, is one
bad record (counted once)."""
from __future__ import annotations

import re
from array import array

import numpy as np

from moe_monitor import core

from .lines import decode_line, iter_lines
from .timings import TimingRead, check_read_size

MAX_TIMING_LINES = 1 << 23      # timing lines indexed in one JSON-lines file (1M steps x 8 ranks)

_TIMING_HEAD = b'{"kind":"timing",'
_STEP_FIELD = re.compile(rb'"step":([0-9]{1,19})[,}]')


def timing_line_step(raw: bytes) -> int | None:
    """The step id of a canonical timing line (core.trace_line("timing", ...): it starts with
    '{"kind":"timing",') read without decoding it; None for any other line (decode it to know)."""
    if not raw.startswith(_TIMING_HEAD):
        return None
    found = _STEP_FIELD.search(raw)
    return int(found.group(1)) if found is not None else None


class TimingLines:
    """The timing lines of a JSON-lines file (a .jsonl trace or an .arrows side file): (step id, byte offset)
    per line, noted while the file is indexed (at most MAX_TIMING_LINES), decoded when read()."""

    def __init__(self, path: str):
        self.path = path
        self._step = array("q")
        self._offset = array("q")
        self._index: tuple[np.ndarray, np.ndarray] | None = None
        self._dead: set[int] = set()  # offsets of lines found bad (counted once)

    @property
    def rows(self) -> int:
        """Timing lines indexed (less those found bad when read)."""
        return len(self._step) - len(self._dead)

    def take(self, offset: int, raw: bytes) -> bool:
        """Index the line at offset when it is a canonical timing line (True); False for any other line.
        ValueError when MAX_TIMING_LINES are already indexed (the caller counts a bad record)."""
        step = timing_line_step(raw)
        if step is None:
            return False
        self.add(offset, step)
        return True

    def add(self, offset: int, step: int) -> None:
        """Index a timing line of step `step` at byte `offset`."""
        if len(self._step) >= MAX_TIMING_LINES:
            raise ValueError(f"more than {MAX_TIMING_LINES} timing lines")
        self._step.append(int(step))
        self._offset.append(int(offset))
        self._index = None

    def read(self, first_step: int, last_step: int, meta: core.RunMeta) -> TimingRead:
        """The timing records of steps first_step..last_step (file order), each decoded by
        core.decode_trace_line and checked against the run's layer count; a bad line is counted in the result
        the first time it is read."""
        out = TimingRead()
        if not len(self._step):
            return out
        if self._index is None:
            self._index = (np.frombuffer(self._step, dtype=np.int64).copy(),
                           np.frombuffer(self._offset, dtype=np.int64).copy())
        step_R, offset_R = self._index
        picked = np.flatnonzero((step_R >= first_step) & (step_R <= last_step))
        num_layers = len(meta.layer_names)
        check_read_size(len(picked), num_layers, first_step, last_step)
        if not len(picked):
            return out
        with open(self.path, "rb") as handle:
            for offset in sorted(int(o) for o in offset_R[picked]):
                if offset in self._dead:
                    continue
                handle.seek(offset)
                raw = next((line for _, line in iter_lines(handle)), None)
                try:
                    if raw is None:
                        raise ValueError(f"longer than {core.MAX_TRACE_LINE_BYTES} bytes, or gone")
                    _, item = decode_line(raw)
                    if not isinstance(item, core.TimingRecord):
                        raise ValueError("not a timing line (the file changed since it was indexed)")
                    if item.layer_s_L.shape[0] != num_layers:
                        raise ValueError(f"timings of {item.layer_s_L.shape[0]} layers, the run has {num_layers}")
                    if not first_step <= item.step <= last_step:
                        raise ValueError(f"its step {item.step} is not the one it was indexed under")
                except ValueError as exc:
                    self._dead.add(offset)
                    out.bad(f"timing line at byte {offset}: {exc}")
                    continue
                out.records.append(item)
        return out
