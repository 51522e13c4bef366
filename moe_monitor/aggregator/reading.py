"""The read side of an Aggregator's rounds (worker.py), with its own state: how far the layouts stream was read,
the layout changes waiting for their collector, the run metadata last seen, the newest step entry read. One round
trip reads the new layout changes and the new step entries (XRANGE layouts, then XREADGROUP: a step never arrives
before the layout change its collector wrote first); the step entries decode into assembly.Assembler."""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

import redis

from moe_monitor import core
from moe_monitor.core.assembly import Assembler, Output

from .layoutbook import LayoutBook
from .options import GROUP
from .takeover import stream_entries

META_REFRESH_S = 5.0  # the run metadata is read again this often
LAYOUT_PAGE = 64  # layout entries a round (a 58 x 288 map is ~67 kB)
MAX_WAITING_LAYOUTS = 64  # layout changes waiting for their collector instance's first step
CHUNK_BYTES = 16 << 20  # decoded counts of one read handed to the assembler at once (a read of wide records)


def text_of(value) -> str:
    """A Redis reply (bytes, None or anything else) as text."""
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


class RoundReader:
    """Reads one run's streams for an Aggregator, into the assembler and the layout book it is handed. reset()
    forgets the read positions (a new holder reads from what Redis says); the counters (entries_in,
    layout_problems) are for the life of the process."""

    def __init__(self, client: core.Client, run: str, consumer: str, read_count: int):
        self.client, self.run, self.consumer, self.read_count = client, run, consumer, read_count
        self.steps_key, self.layouts_key, self.meta_key = core.steps_key(run), core.layouts_key(run), core.meta_key(run)
        self.entries_in = 0  # step entries consumed by this process
        self.layout_problems = 0  # layout entries or changes that could not be used
        self.reset()

    def reset(self) -> None:
        self.layouts_after = b"0-0"
        self.waiting: deque[core.LayoutRecord] = deque(maxlen=MAX_WAITING_LAYOUTS)
        self.meta_raw: object = None
        self.meta_shape: tuple[int, int] | None = None
        self.meta_due_at = -math.inf
        self.last_read_id: bytes | None = None

    def read(self, assembler: Assembler, book: LayoutBook, block_ms: int | None) -> list[tuple[bytes, dict]] | None:
        """New layout changes (taken first) and up to read_count new step entries, one round trip. None when the
        consumer group is gone (Redis restarted or the stream was deleted): the caller makes it again."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xrange(self.layouts_key, min=b"(" + self.layouts_after, count=LAYOUT_PAGE)
        pipe.xreadgroup(GROUP, self.consumer, {self.steps_key: ">"}, count=self.read_count, block=block_ms)
        layouts, reply = pipe.execute(raise_on_error=False)
        if not isinstance(layouts, Exception):
            self.take_layouts(assembler, book, layouts)
        if isinstance(reply, redis.ResponseError) and "NOGROUP" in str(reply):
            return None
        if isinstance(reply, Exception):
            raise reply
        entries: list[tuple[bytes, dict]] = []
        for _stream, items in reply or ():
            entries.extend((entry_id, fields) for entry_id, fields in stream_entries(items) if fields is not None)
        if entries:
            self.last_read_id = entries[-1][0]
        return entries

    def ingest(self, assembler: Assembler, entries: Sequence[tuple[bytes, dict]], now: float,
               take: Callable[[Output], None] | None = None) -> Output:
        """Decode entries (one that does not decode is counted and acked) and assemble them, CHUNK_BYTES of
        decoded counts at a time; take: handed each chunk's output at once (the committer encodes the steps it
        wrote, so a read of wide records never holds them all), else everything is returned."""
        out = Output()
        decoded: list[tuple[bytes, core.StepRecord]] = []
        decoded_bytes = 0
        for entry_id, fields in entries:
            try:
                rec = core.decode_step(fields)
                if rec.run != self.run:
                    raise ValueError(f"a record of run {rec.run!r} in the stream of run {self.run!r}")
            except Exception as exc:  # core raises ValueError only; anything else is one bad record too
                out.extend(assembler.bad(entry_id, f"entry {entry_id.decode('ascii', 'replace')}: {core.why(exc)}"))
                continue
            decoded.append((entry_id, rec))
            decoded_bytes += rec.counts_LE.nbytes
            if decoded_bytes >= CHUNK_BYTES:  # a read of wide records is assembled a chunk at a time
                chunk = assembler.add(decoded, now)
                if take is not None:
                    take(chunk)
                else:
                    out.extend(chunk)
                decoded, decoded_bytes = [], 0
        self.entries_in += len(entries)
        out.extend(assembler.add(decoded, now))
        return out

    def refresh_meta(self, assembler: Assembler, book: LayoutBook, now: float, force: bool = False) -> None:
        """Read the run metadata again when due (every META_REFRESH_S): its layout is the book's base."""
        if now < self.meta_due_at and not force:
            return
        self.meta_due_at = now + META_REFRESH_S
        raw = self.client.getrange(self.meta_key, 0, core.MAX_META_BYTES)
        if not raw or raw == self.meta_raw:
            return
        self.meta_raw = raw
        try:
            meta = core.decode_meta(raw)
        except ValueError as exc:
            assembler.last_problem = f"run metadata unusable ({core.why(exc)}): GPU loads use the contiguous layout"
            book.set_base(None, None)
            return
        self.meta_shape = (len(meta.layer_names), meta.num_experts)
        assembler.meta_world = int(meta.world_size)
        if assembler.size_for(*self.meta_shape) < 1:
            assembler.last_problem = assembler.budget_problem = (
                f"run metadata: counts {list(self.meta_shape)} need more than this run's share of the memory "
                "budget for one step: its records are skipped (set --memory-budget)")
        book.set_base(meta.layout.physical_to_logical_map, meta.layout.gpus)

    def take_layouts(self, assembler: Assembler, book: LayoutBook, reply=None) -> bool:
        """Fold layout changes (reply: an XRANGE page; None: read the next page here) into the book, each under
        the epoch of the collector that published it; those of a collector instance that has sent no step yet
        wait. Returns whether a full page was read."""
        if reply is None:
            reply = self.client.xrange(self.layouts_key, min=b"(" + self.layouts_after, count=LAYOUT_PAGE)
        entries = stream_entries(reply)
        for entry_id, fields in entries:
            self.layouts_after = entry_id
            try:
                if fields is None:
                    raise ValueError("the entry has no fields")
                self.waiting.append(core.decode_layout_record(fields))
            except Exception as exc:
                self.layout_problems += 1
                assembler.last_problem = f"layout entry {entry_id.decode('ascii', 'replace')}: {core.why(exc)}"
        self.place_layouts(assembler, book)
        return len(entries) >= LAYOUT_PAGE

    def place_layouts(self, assembler: Assembler, book: LayoutBook) -> None:
        """Put the waiting layout changes whose collector instance is current into the book (checked against
        the run's [L, E]); those of retired instances go, the others keep waiting."""
        if not self.waiting:
            return
        shape = assembler.shape or self.meta_shape
        current = set(assembler.instance_of_rank.values())
        waiting = list(self.waiting)
        self.waiting.clear()
        for rec in waiting:
            if rec.instance in assembler.retired:
                continue
            if shape is None or assembler.epoch is None or (rec.instance and rec.instance not in current):
                self.waiting.append(rec)
                continue
            try:
                rec.validate(shape[1], num_layers=shape[0], unused=True)
            except ValueError as exc:
                self.layout_problems += 1
                assembler.last_problem = f"layout change from step {rec.step}: {core.why(exc)}"
                continue
            book.add(assembler.epoch, rec.step, rec.layout_LP, rec.gpus)
