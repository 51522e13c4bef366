"""The read path of an Aggregator round (worker.py): the run metadata, layout changes and new step entries in
one pipelined round trip (XRANGE layouts, then XREADGROUP: a step never arrives before the layout change its
collector wrote first), and the decoding of step entries into assembly.Assembler."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import redis

from moe_monitor import core

from .assembly import Output
from .options import GROUP
from .takeover import stream_entries

if TYPE_CHECKING:
    from .worker import Aggregator

META_REFRESH_S = 5.0  # the run metadata is read again this often
LAYOUT_PAGE = 64  # layout entries a round (a 58 x 288 map is ~67 kB)


def _text(value) -> str:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def read_round(agg: Aggregator, now: float) -> list[tuple[bytes, dict]]:
    """New layout changes (taken first) and up to read_count new step entries, one round trip."""
    pipe = agg.client.pipeline(transaction=False)
    pipe.xrange(agg.layouts_key, min=b"(" + agg._layouts_after, count=LAYOUT_PAGE)
    pipe.xreadgroup(GROUP, agg.consumer, {agg.steps_key: ">"}, count=agg.options.read_count,
                    block=block_ms(agg, now))
    layouts, reply = pipe.execute(raise_on_error=False)
    if not isinstance(layouts, Exception):
        take_layouts(agg, now, layouts)
    if isinstance(reply, redis.ResponseError) and "NOGROUP" in str(reply):
        agg._log(f"aggregate {agg.run}: the consumer group is gone (Redis restarted or the stream was "
             "deleted): made again")
        agg._ensure_group()
        return []
    if isinstance(reply, Exception):
        raise reply
    entries: list[tuple[bytes, dict]] = []
    for _stream, items in reply or ():
        entries.extend((entry_id, fields) for entry_id, fields in stream_entries(items) if fields is not None)
    if entries:
        agg._last_read_id = entries[-1][0]
    return entries


def block_ms(agg: Aggregator, now: float) -> int | None:
    """XREADGROUP's BLOCK: up to block_ms, never past the next step's deadline; None: do not block."""
    if not agg.options.block_ms or agg._outbox or agg._heartbeat:
        return None
    wait_ms = float(agg.options.block_ms)
    deadline = agg.assembler.next_deadline_s(now)
    if deadline is not None:
        wait_ms = min(wait_ms, deadline * 1000)
    return int(wait_ms) if wait_ms >= 1 else None


def ingest(agg: Aggregator, entries: Sequence[tuple[bytes, dict]], now: float) -> Output:
    """Decode entries (one that does not decode is counted and acked) and assemble them."""
    out = Output()
    decoded: list[tuple[bytes, core.StepRecord]] = []
    for entry_id, fields in entries:
        try:
            rec = core.decode_step(fields)
            if rec.run != agg.run:
                raise ValueError(f"a record of run {rec.run!r} in the stream of run {agg.run!r}")
        except Exception as exc:  # wire raises ValueError only; anything else is one bad record too
            out.extend(agg.assembler.bad(entry_id, f"entry {entry_id.decode('ascii', 'replace')}: "
                                                   f"{core.why(exc)}"))
            continue
        decoded.append((entry_id, rec))
    agg.entries_in += len(entries)
    out.extend(agg.assembler.add(decoded, now))
    return out


def read_meta(agg: Aggregator, now: float) -> None:
    agg._meta_at = now + META_REFRESH_S
    raw = agg.client.getrange(agg.meta_key, 0, core.MAX_META_BYTES)
    if not raw or raw == agg._meta_raw:
        return
    agg._meta_raw = raw
    try:
        meta = core.decode_meta(raw)
    except ValueError as exc:
        agg.assembler.last_problem = f"run metadata unusable ({core.why(exc)}): GPU loads use the contiguous layout"
        agg.book.set_base(None, None)
        return
    agg._meta_shape = (len(meta.layer_names), meta.num_experts)
    agg.book.set_base(meta.layout.physical_to_logical_map, meta.layout.gpus)


def take_layouts(agg: Aggregator, now: float, reply=None, more: bool = False) -> bool:
    """Fold layout changes (reply: an XRANGE page; more=True: read the next page here) into the book, each
    under the epoch of the collector that published it; those of a collector instance that has sent no step
    yet wait. Returns whether a full page was read."""
    if more:
        reply = agg.client.xrange(agg.layouts_key, min=b"(" + agg._layouts_after, count=LAYOUT_PAGE)
    entries = stream_entries(reply)
    for entry_id, fields in entries:
        agg._layouts_after = entry_id
        try:
            if fields is None:
                raise ValueError("the entry has no fields")
            agg._waiting_layouts.append(core.decode_layout_record(fields))
        except Exception as exc:
            agg.layout_problems += 1
            agg.assembler.last_problem = f"layout entry {entry_id.decode('ascii', 'replace')}: {core.why(exc)}"
    place_layouts(agg)
    return len(entries) >= LAYOUT_PAGE


def place_layouts(agg: Aggregator) -> None:
    if not agg._waiting_layouts:
        return
    assembler = agg.assembler
    shape = assembler.shape or agg._meta_shape
    current = set(assembler.instance_of_rank.values())
    waiting = list(agg._waiting_layouts)
    agg._waiting_layouts.clear()
    for rec in waiting:
        if rec.instance in assembler.retired:
            continue
        if shape is None or assembler.epoch is None or (rec.instance and rec.instance not in current):
            agg._waiting_layouts.append(rec)
            continue
        try:
            rec.validate(shape[1], num_layers=shape[0])
        except ValueError as exc:
            agg.layout_problems += 1
            assembler.last_problem = f"layout change from step {rec.step}: {core.why(exc)}"
            continue
        agg.book.add(assembler.epoch, rec.step, rec.physical_to_logical_LP, rec.gpus)
