"""Where published steps go: one Sink protocol, two sinks (a run's Redis keys, a JSON-lines trace file).

The publisher thread (publisher.py) is the only caller. It hands every sink the same batches, in step
order, and keeps a queue and a writer thread per sink: a write that raises has not landed (PartialWrite:
only in part) and is offered again after a backoff, so a sink never retries on its own and one sink's
failure (or hang) never holds up another. A batch carries step records, NVML samples, layout changes
(core.LayoutRecord, written before the batch's steps), layer timings and physical-slot counts
(core.PhysicalRecord, after the steps; only the Redis sink stores them) and the publisher's health report.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TextIO

import redis
from redis.typing import EncodableT, FieldT

from moe_monitor import core
from moe_monitor.core.health import HealthReport
from moe_monitor.core.runwrite import PHYSICAL_BUDGET_BYTES, RUNS_INDEX_EVERY_S, fields_of, queue_batch

from .exhausted import ExhaustedStreams

log = logging.getLogger("moe_monitor.collectors")


class Sink(Protocol):
    """A destination for a run's step records, NVML samples, layout changes and the publisher's health report."""

    name: str  # names the sink in error messages: "redis", "trace"
    keeps_health: bool  # whether write() stores the health report (a failure is cleared once one has it)

    def write(self, records: Sequence[core.StepRecord], samples: Sequence[core.GpuSample],
              health: HealthReport, layouts: Sequence[core.LayoutRecord] = (),
              timings: Sequence[core.TimingRecord] = (), physical: Sequence[core.PhysicalRecord] = ()) -> None:
        """Write one batch (any list may be empty; layouts go before the steps). Raising means the batch did
        not land (PartialWrite: only in part). The publisher passes timings=[core.TimingRecord, ...] and
        physical=[core.PhysicalRecord, ...] (after the steps) only when it has some: a sink that writes them
        takes them as keywords."""
        ...

    def close(self) -> None:
        """Release what the sink holds (called once, after the last write)."""
        ...


class PartialWrite(Exception):
    """A batch that landed in part (a Redis that refused some commands: out of memory, no permission).
    landed: indices of the records that did land; samples_landed: whether every NVML sample did;
    layouts_landed: indices of the layout records that did land (none when not given). The publisher takes
    what landed off its queues and offers the rest again after its backoff."""

    def __init__(self, message: str, landed: frozenset[int], samples_landed: bool,
                 layouts_landed: frozenset[int] = frozenset(), timings_landed: frozenset[int] = frozenset(),
                 physical_landed: frozenset[int] = frozenset()):
        super().__init__(message)
        self.landed, self.samples_landed, self.layouts_landed = landed, samples_landed, layouts_landed
        self.timings_landed = timings_landed  # indices of the timing records that did land
        self.physical_landed = physical_landed  # indices of the physical records that did land


class StreamExhausted(PartialWrite):
    """A batch refused (in part) because a stream of the run holds the last possible id (core.runwrite): it
    takes no entry until it is deleted. streams: their keys. The sink has said so once already (its log)."""

    def __init__(self, message: str, streams: Sequence[str], landed: frozenset[int], samples_landed: bool,
                 layouts_landed: frozenset[int] = frozenset(), timings_landed: frozenset[int] = frozenset(),
                 physical_landed: frozenset[int] = frozenset()):
        super().__init__(message, landed, samples_landed, layouts_landed, timings_landed, physical_landed)
        self.streams = tuple(streams)


class RedisSink:
    """Writes StepRecords, GpuSamples, LayoutRecords, TimingRecords, PhysicalRecords and health to one run's keys,
    one pipelined round trip per batch (layouts XADDed to core.layouts_key(run), MAXLEN ~ LAYOUTS_MAXLEN, before
    the batch's steps; physical records to core.physical_key(run) after them, MAXLEN ~ a quarter of
    memory_budget_bytes of their entries: core.runwrite.physical_maxlen).
    The metadata goes with the first batch, again with the first after a failure, and again whenever the
    previous batch found it missing (every batch asks EXISTS: a Redis restarted empty, flushed or failed
    over between two batches gets it back within one flush interval); likewise, once a layout has landed,
    every batch asks whether the layout stream still exists and, when it does not, sends the latest layout
    that landed again with the next batch, so the layout in force is never lost with an emptied Redis.
    Commands are not transactional: a refused command (OOM under maxmemory noeviction, NOPERM) refuses only itself, and the records whose
    XADD landed are reported as landed (PartialWrite), so a retry does not write them twice. A write that
    times out may still be executed by a Redis that was only stalled: the stream then holds that step twice
    (readers skip a repeated (instance, rank, step); a layout sent twice is the same change twice).
    The run's entry in moe:runs (when a collector last wrote) is refreshed at most once a second (and with
    every write that carries the metadata). Step records are compact (version 2). With memory_budget_bytes the steps
    stream's MAXLEN follows the entries' real size (a running mean), never below the maxlen given (sized for
    int32 counts): compact records make it about ten times longer for the same memory.

    The URL may name a single Redis or any node of a Redis Cluster (core.connect decides at the first write
    that reaches it). In a cluster the run's keys share one slot (core.run_key's hash tag) and moe:runs has its
    own: the pipeline (core.client.ClusterBatch) sends each node its share of the batch, one round trip per
    node. A command whose node stopped answering mid-batch (a master gone before its replica takes over) is an
    exception in its reply like a refused one, never retried on its own (so steps land in order and a write
    stays within the timeouts): PartialWrite reports what landed, the rest goes again after the publisher's
    backoff, and the metadata goes with the next batch (the promoted replica may lack what the old master had
    not replicated yet). A node that cannot be connected to fails the whole write, as a single Redis does.

    A stream holding the last possible id refuses every entry (core.runwrite.exhausted_stream): the sink says
    so once through log (the collectors' logger by default) and again once it takes entries, raises
    StreamExhausted meanwhile (the publisher retries after its backoff: it lands once the stream is deleted),
    and the health it writes names the stream in last_error and counts those steps as queued, not published."""

    name = "redis"
    keeps_health = True

    def __init__(self, url: str, meta: core.RunMeta, maxlen: int, timeout_s: float,
                 memory_budget_bytes: int | None = None, log: Callable[[str], None] | None = None):
        self._run, self._maxlen = meta.run, maxlen
        self._min_maxlen, self._budget = maxlen, memory_budget_bytes
        self._entry_bytes = 0.0  # running mean of the step entries' bytes (0: none written yet)
        self._indexed_at = float("-inf")  # time.monotonic() of the last ZADD to moe:runs that landed
        self._client = core.connect(url, timeout_s=timeout_s, retries=0)
        self._meta_json = core.encode_meta(meta)
        self._needs_meta = True
        self._last_layout: dict[FieldT, EncodableT] | None = None  # fields of the latest layout that landed
        self._resend_layout = False  # the layout stream was found missing: send _last_layout again
        self._exhausted = ExhaustedStreams(log or _log_error, log or _log_warning)  # streams at the last possible id
        # the physical-count stream's share: a quarter of the budget (its entries are [L, P] int32, 67 kB each)
        self._physical_budget = PHYSICAL_BUDGET_BYTES if memory_budget_bytes is None else max(1, memory_budget_bytes // 4)

    def write(self, records: Sequence[core.StepRecord], samples: Sequence[core.GpuSample],
              health: HealthReport, layouts: Sequence[core.LayoutRecord] = (),
              timings: Sequence[core.TimingRecord] = (), physical: Sequence[core.PhysicalRecord] = ()) -> None:
        run = self._run
        with_meta = self._needs_meta
        resend = self._last_layout if self._resend_layout else None
        layout_fields = [fields_of(core.encode_layout_record(rec)) for rec in layouts]
        check_layouts = self._last_layout is not None or bool(layouts)
        health = self._exhausted.amend(health, core.steps_key(run), len(records))
        try:
            # batch() may be where the first write learns whether the server is a cluster (core.connect)
            pipe: Any = self._client.batch()  # redis-py's command methods, typed for its clients, queue on it
            if with_meta:
                pipe.set(core.meta_key(run), self._meta_json)
            step_fields = core.encode_steps(records)
            self._track_entry_bytes([_nbytes(fields["counts"]) + _nbytes(fields.get("sample", b""))
                                     for fields in step_fields])
            streams = queue_batch(pipe, run, layouts=([resend] if resend is not None else []) + layout_fields,
                                  steps=step_fields, samples=samples, timings=timings, steps_maxlen=self._maxlen,
                                  physical=physical, physical_budget_bytes=self._physical_budget)
            pipe.hset(core.health_key(run), str(health.rank), health.encode())
            # moe:runs (when a collector last wrote) at most every RUNS_INDEX_EVERY_S: in a cluster it is another
            # node's key, and every batch of every rank reaching two nodes doubles the writers' round trips
            index_runs = with_meta or time.monotonic() - self._indexed_at >= RUNS_INDEX_EVERY_S
            if index_runs:
                pipe.zadd(core.RUNS_KEY, {run: time.time()})
            if check_layouts:
                pipe.exists(core.layouts_key(run))
            pipe.exists(core.meta_key(run))
            replies = pipe.execute(raise_on_error=False)
        except Exception:
            self._needs_meta = True  # the connection may have gone, and with it an emptied Redis
            raise
        self._exhausted.update(streams, replies[int(with_meta): int(with_meta) + len(streams)])
        first = (1 if with_meta else 0) + (resend is not None)
        layout_replies = replies[first: first + len(layouts)]
        first += len(layouts)
        step_replies = replies[first: first + len(records)]
        sample_replies = replies[first + len(records): first + len(records) + len(samples)]
        first += len(records) + len(samples)
        timing_replies = replies[first: first + len(timings)]
        physical_replies = replies[first + len(timings): first + len(timings) + len(physical)]
        asked = -2 if check_layouts else -1  # the EXISTS at the end prove nothing when refused (a write-only ACL)
        if index_runs and not isinstance(replies[asked - 1], Exception):
            self._indexed_at = time.monotonic()
        errors = [reply for reply in replies[:asked] if isinstance(reply, Exception)]
        meta_gone = replies[-1] == 0  # an EXISTS the user may not run (write-only ACL) proves nothing
        # a node lost under the batch (a cluster reports it per command): the one that takes over may lack the meta
        lost_node = any(isinstance(reply, _UNREACHABLE) for reply in replies)
        self._needs_meta = (with_meta and isinstance(replies[0], Exception)) or meta_gone or lost_node
        for fields, reply in zip(layout_fields, layout_replies):
            if not isinstance(reply, Exception):
                self._last_layout = fields
        # the layout stream gone (a Redis emptied or restarted under the run): the layout in force goes again
        self._resend_layout = check_layouts and self._last_layout is not None and replies[-2] == 0
        if errors:
            refused = errors[0]
            message = f"{len(errors)} of {len(replies)} commands: {type(refused).__name__}: {refused}"
            landed = frozenset(i for i, reply in enumerate(step_replies) if not isinstance(reply, Exception))
            layouts_landed = frozenset(i for i, reply in enumerate(layout_replies) if not isinstance(reply, Exception))
            timings_landed = frozenset(i for i, reply in enumerate(timing_replies) if not isinstance(reply, Exception))
            physical_landed = frozenset(i for i, r in enumerate(physical_replies) if not isinstance(r, Exception))
            samples_landed = not any(isinstance(r, Exception) for r in sample_replies)
            if self._exhausted.found:
                raise StreamExhausted(f"{len(errors)} of {len(replies)} commands: {self._exhausted.message}",
                                      list(self._exhausted.found), landed, samples_landed, layouts_landed,
                                      timings_landed, physical_landed)
            raise PartialWrite(message, landed, samples_landed, layouts_landed, timings_landed, physical_landed)

    def _track_entry_bytes(self, payloads: Sequence[int]) -> None:
        """With a memory budget: MAXLEN follows the entries' real size (compact records take a tenth of the
        int32 bound the initial maxlen was sized for), never below that initial maxlen. payloads: the bytes of
        each entry's counts and sampled rows. The size is a running mean over the batches' entries (each batch's
        mean, weighted by its entries: about 100 entries' memory)."""
        if self._budget is None or not payloads:
            return
        size = ENTRY_OVERHEAD_BYTES + sum(payloads) / len(payloads)
        keep = 0.99 ** len(payloads)
        self._entry_bytes = size if not self._entry_bytes else keep * self._entry_bytes + (1 - keep) * size
        self._maxlen = max(self._min_maxlen, min(MAX_STEPS_MAXLEN, int(self._budget // self._entry_bytes)))

    def close(self) -> None:
        self._client.close()


MAX_STEPS_MAXLEN = 10_000_000  # a budget over tiny entries still bounds the stream's length
ENTRY_OVERHEAD_BYTES = 256  # a step entry beside its counts and sampled rows: its short fields, Redis's own

_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)  # a reply from a node lost


def _nbytes(value: bytes | str | int) -> int:
    """The length of a field's value on the wire (an int's is in the entry's overhead)."""
    return len(value) if isinstance(value, (bytes, str)) else 0


def _log_error(line: str) -> None:
    log.error("moe monitor: %s", line)


def _log_warning(line: str) -> None:
    log.warning("moe monitor: %s", line)


class TraceFileSink:
    """Appends the run's metadata once (when opened), then one line per layout change, step record and NVML
    sample, and flushes after every batch: a live replay sees it, a killed process loses at most one batch.
    Health is not recorded. A batch written again after a failed write may repeat lines the failure let through;
    the readers skip duplicate steps.

    max_bytes (None: no cap): before a line would take the file past it, the file is rotated once:
    `<path>` becomes `<path>.1` (replacing the previous one) and a new `<path>` starts with the metadata
    line and the latest layout line written (the layout in force), so each file replays on its own and the pair holds at most about 2 x max_bytes. A single line
    longer than the cap still goes in (into a file of its own).

    A path ending in ".arrows" records the columnar trace instead (Arrow IPC stream, traces.recorder.ArrowRecorder,
    pyarrow imported only then), with the same cap, rotation and failed-write recovery; its layout records and
    NVML samples after the header go to <path>.side.jsonl."""

    name = "trace"
    keeps_health = False

    def __init__(self, path: str | os.PathLike[str], meta: core.RunMeta, max_bytes: int | None = None):
        self._path = os.fspath(path)
        self._max_bytes = max_bytes
        self._columnar = None
        if self._path.lower().endswith(".arrows"):
            from moe_monitor.core.tracefile.writers import ArrowRecorder  # pyarrow only for a columnar trace

            self._columnar = ArrowRecorder(self._path, meta, max_bytes)
            return
        self._meta_line = core.trace_line("meta", {"meta": core.encode_meta(meta)}) + "\n"
        self._layout_line = ""  # the latest layout line written ("" before any): starts every new file too
        self._file = self._open_new()

    def _header(self) -> str:
        """What a new file starts with: the metadata line, then the layout in force (when one was written)."""
        return self._meta_line + (self._layout_line + "\n" if self._layout_line else "")

    def _open_new(self) -> TextIO:
        handle = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 (open for the run's lifetime)
        header = self._header()
        handle.write(header)
        self._size = self._header_bytes = len(header.encode())
        return handle

    def _reopen(self) -> None:
        """After a failed write: append to the file as it is on disk (a new one gets the header)."""
        self._file = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run's lifetime)
        self._size = os.fstat(self._file.fileno()).st_size
        if self._size == 0:
            header = self._header()
            self._file.write(header)
            self._size = self._header_bytes = len(header.encode())

    def _rotate(self) -> None:
        self._file.close()
        os.replace(self._path, self._path + ".1")
        self._file = self._open_new()

    def write(self, records: Sequence[core.StepRecord], samples: Sequence[core.GpuSample],
              health: HealthReport, layouts: Sequence[core.LayoutRecord] = (),
              timings: Sequence[core.TimingRecord] = (), physical: Sequence[core.PhysicalRecord] = ()) -> None:
        """physical: not recorded (trace files hold no physical counts; only Redis does)."""
        if self._columnar is not None:
            self._columnar.write(records, samples, layouts, timings)
            return
        lines = [core.trace_line("layout", core.encode_layout_record(rec)) for rec in layouts]
        lines += [core.trace_line("step", core.encode_step(rec)) for rec in records]
        lines += [core.trace_line("timing", core.encode_timing(rec)) for rec in timings]  # a step's layer times
        lines += [core.trace_line("gpu", core.encode_gpu_sample(sample)) for sample in samples]
        try:
            if self._file.closed:  # a write failed before (a full disk): start again from the file on disk
                self._reopen()
            self._write_lines(lines, len(layouts))
        except Exception:
            # what the failure let through stays (a cut line reads as one bad record); the rest is
            # discarded and the size re-read from disk at the next try, so retries never inflate it
            with contextlib.suppress(OSError, ValueError):
                self._file.close()
            raise

    def _write_lines(self, lines: list[str], num_layouts: int = 0) -> None:
        """Append lines (the first num_layouts are layout lines), rotating before one would pass the cap."""
        cap, chunk = self._max_bytes, list[str]()
        for i, line in enumerate(lines):
            size = len(line.encode()) + 1
            if cap is not None and self._size + size > cap and self._size > self._header_bytes:
                if chunk:
                    self._file.write("\n".join(chunk) + "\n")
                    chunk = []
                self._rotate()
            chunk.append(line)
            self._size += size
            if i < num_layouts:
                self._layout_line = line
        if chunk:
            self._file.write("\n".join(chunk) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._columnar is not None:
            self._columnar.close()
        elif not self._file.closed:
            self._file.close()
