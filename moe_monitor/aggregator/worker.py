"""Aggregator: the Redis side of the aggregator for one run (design: docs/scaling.md).

One round (step()) of the lease holder: renew the lease when due, read new layout changes and up to
read_count step entries in one pipelined round trip (XRANGE layouts, then XREADGROUP: a step never arrives
before the layout change its collector wrote first), decode and assemble them (assembly.Assembler), fold what
was written into the rollups (rollup.RollupBuilder), then commit: one MULTI/EXEC, under WATCH of the lease,
holding the aggregates, the rollups that closed, the XACKs of every entry consumed and the progress hash.
A standby's round tries to take the lease; a round that fails on Redis buffers everything and backs off.
The reads and their decoding are reading.py's, the outbox and the commit commit.py's.
"""
from __future__ import annotations

import math
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable

import redis

from moe_monitor import core
from moe_monitor.core.assembly import Assembler, Output, entry_id_key
from moe_monitor.core.membudget import MemoryBudget, format_bytes

from .commit import CommitResult, Committer
from .layoutbook import LayoutBook
from .lease import KEPT, LOST, RETAKEN, Lease
from .options import GROUP, AggregateOptions
from .progress import decode_progress, state_key
from .reading import RoundReader, text_of
from .rollup import RollupBuilder
from .takeover import claim, entry_id_bytes, last_bucket_start, read_tail, replay, stream_entries

TRIM_EVERY_S = 1.0  # the steps stream is trimmed this often
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 5.0
REPORT_AGAIN_S = 30.0  # a Redis failure that goes on is reported again this often
QUIET_LOG_EVERY = 12  # while nothing arrives, one progress line every this many intervals
ROLLUP_SHARE = 4  # the open rollup seconds may hold 1/ROLLUP_SHARE of a run's share of the memory budget
COMMIT_BYTES = 16 << 20  # a read whose written steps encode to more commits them before it goes on


def aggregator_budget(total_bytes: int) -> MemoryBudget:
    """The memory budget one aggregator process shares among its runs."""
    return MemoryBudget(total_bytes, label="the aggregator's memory budget", shared_by="every run it aggregates",
                        setting="set --memory-budget")


def default_consumer() -> str:
    """A consumer name unique to this process: host, pid, randomness."""
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{secrets.token_hex(3)}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Aggregator:
    """Aggregates one run: sums each step's ranks once into core.aggregate_key(run), writes its 1 s and 60 s
    rollups, and competes for the run's lease with any other aggregator (the loser waits as standby).

    step() does one round and returns whether it did work; run() loops until stopped; close() commits what
    it can and releases the lease; abandon() stops without either (what a crash does). Counters:
    `counters` (assembly.Counters: steps written, missing ranks, late, duplicates, bad...), `rollups.counters`,
    `entries_in` (stream entries consumed by this process), `commits`, `redis_errors`, `lag_entries`."""

    def __init__(self, url: str, run: str, options: AggregateOptions | None = None, *, consumer: str | None = None,
                 client: core.Client | None = None, log: Callable[[str], None] | None = None,
                 budget: MemoryBudget | None = None, share_bytes: int | None = None):
        """budget: the process's memory budget (shared by every run of `moe-monitor aggregate --all`; default:
        one of options.memory_budget_bytes for this run alone); share_bytes: what this run may hold of it
        (default: all of it)."""
        self.run = core.check_run_name(run)
        self.options = options or AggregateOptions()
        self.budget = budget if budget is not None else aggregator_budget(self.options.memory_budget_bytes)
        self.share_bytes = int(share_bytes if share_bytes is not None else self.budget.total_bytes)
        self.where = core.redact(url)
        self.client: core.Client = client if client is not None else core.connect(
            url, timeout_s=self.options.timeout_s, retries=0)
        self._own_client = client is None
        self.consumer = consumer or default_consumer()
        self._log = log or _stderr
        self.steps_key, self.agg_key = core.steps_key(self.run), core.aggregate_key(self.run)
        self.layouts_key, self.meta_key = core.layouts_key(self.run), core.meta_key(self.run)
        self.state_key = state_key(self.run)
        self.lease = Lease(self.client, self.run, self.consumer, self.options.lease_s, self.state_key)
        self.holder = False  # the lease is ours
        self.synced = False  # ... and the takeover read what it needed
        self.redis_errors = 0
        self.recovered_entries = 0  # entries of reads whose reply was lost, read again (_own_lost_replies)
        self._recheck_own = False
        self.lag_entries = -1
        self.last_error = ""
        self.reader = RoundReader(self.client, self.run, self.consumer, self.options.read_count)
        self.committer = Committer(self.client, self.run, self.consumer, self.options, self._report_error)
        now = time.monotonic()
        self._acquire_at = self._retry_at = now
        self._backoff_s = 0.0
        self._failing_since: float | None = None
        self._reported_at = -math.inf
        self._standby_note = ""
        self._log_at = now + self.options.log_every_s
        self._logged = (now, 0, 0, 0)  # (time, entries_in, steps written, bad records) at the last log line
        self._entries_per_s = 0.0
        self._quiet_lines = 0
        self._fresh()

    # ------------------------------------------------------------------------------------------ public
    @property
    def counters(self):
        return self.assembler.counters

    @property
    def entries_in(self) -> int:
        return self.reader.entries_in

    @property
    def commits(self) -> int:
        return self.committer.commits

    @property
    def layout_problems(self) -> int:
        return self.reader.layout_problems

    def stats(self) -> dict[str, object]:
        """Counters and state for a benchmark or a test, as plain values."""
        return dict(self.counters.as_dict(), holder=self.holder, synced=self.synced, entries_in=self.entries_in,
                    commits=self.commits, redis_errors=self.redis_errors, lag_entries=self.lag_entries,
                    pending_steps=self.assembler.pending_steps, epoch=self.assembler.epoch,
                    reserved_bytes=self.assembler.reserved_bytes + self.rollups.open_bytes,
                    buckets_1s=self.rollups.counters.buckets_1s, buckets_60s=self.rollups.counters.buckets_60s,
                    buffered=self.committer.outbox.sizes(), last_error=self.last_error)

    def step(self) -> bool:
        """One round; True when it consumed entries or wrote something. Never raises on Redis failures (they
        are reported, counted and backed off from); nothing buffered is lost."""
        now = time.monotonic()
        if now < self._retry_at:
            return False
        try:
            did = self._round(now)
        except core.REDIS_ERRORS as exc:
            self._failed(exc, now, "Redis")
            return False
        except Exception as exc:  # a bug must not end the aggregator: reported and backed off like Redis
            self._failed(exc, now, "internal error")
            return False
        if self._failing_since is not None:
            self._log(f"aggregate {self.run}: Redis at {self.where} answers again after "
                      f"{now - self._failing_since:.1f} s")
            self._failing_since, self._backoff_s = None, 0.0
        if now >= self._log_at:
            self._report(now)
        return did

    def set_share(self, share_bytes: int) -> None:
        """What this run may hold of the budget from now on (the service gives every run an equal share): the
        steps waiting for their ranks and the held records (sized again from the run's [L, E] when known), and
        the open rollup seconds (1/ROLLUP_SHARE of it)."""
        self.share_bytes = int(share_bytes)
        rollup_bytes = self.share_bytes // ROLLUP_SHARE
        self.assembler.share_bytes = self.share_bytes - rollup_bytes
        self.rollups.max_open_bytes = rollup_bytes
        if self.assembler.max_rows is not None:
            self.assembler.resize()

    def idle_wait_s(self) -> float:
        """How long a caller may sleep after a round that did nothing."""
        now = time.monotonic()
        if now < self._retry_at:
            return self._retry_at - now
        if not self.holder:
            return max(0.0, min(self._acquire_at - now, 1.0))
        return 0.0 if self.options.block_ms else 0.02

    def run_until(self, stop: threading.Event | None = None, duration_s: float | None = None) -> None:
        """Round after round until `stop` is set (or duration_s passed)."""
        stop = stop or threading.Event()
        end = math.inf if duration_s is None else time.monotonic() + duration_s
        while not stop.is_set() and time.monotonic() < end:
            if not self.step():
                wait = self.idle_wait_s()
                if wait > 0:
                    stop.wait(min(wait, max(0.0, end - time.monotonic())))

    def close(self, release: bool = True) -> None:
        """Commit what is buffered (one try) and give the lease up; steps still assembling stay pending in the
        consumer group for whoever takes over. Then close the client (when this aggregator made it)."""
        try:
            if self.holder and self.synced and release:
                if self.committer.outbox:
                    self._commit(time.monotonic())
                self.lease.release()
        except core.REDIS_ERRORS as exc:
            self._log(f"aggregate {self.run}: could not release the lease ({core.why(exc)}); it expires in "
                      f"{self.options.lease_s:g} s")
        finally:
            self.holder = self.synced = False
            if self._own_client:
                self.client.close()

    def abandon(self) -> None:
        """Stop without committing or releasing anything, as a crash would (the lease expires on its own)."""
        self.holder = self.synced = False
        if self._own_client:
            self.client.close()

    # ------------------------------------------------------------------------------------------ rounds
    def _fresh(self) -> None:
        """Forget everything held in memory (a new holder starts from what Redis says)."""
        o = self.options
        for old in (getattr(self, "assembler", None), getattr(self, "rollups", None)):
            if old is not None:
                old.release()  # its bytes go back to the budget now
        self.assembler = Assembler(self.run, o.deadline_s, o.max_pending_steps, o.remember_steps, budget=self.budget)
        self.book = LayoutBook()
        self.rollups = RollupBuilder(self.run, self.book, o.grace_s, budget=self.budget)
        self.set_share(self.share_bytes)
        self._budget_reported = 0
        self.reader.reset()
        self.committer.reset()
        self._trimmed_ms = 0
        self._trim_at = self._reclaim_at = self._renew_at = -math.inf
        self._heartbeat = False
        self._bad_reported = self.assembler.counters.bad_records

    def _round(self, now: float) -> bool:
        if not self.holder:
            if now < self._acquire_at:
                return False
            self._acquire_at = now + min(1.0, self.options.lease_s / 3)
            if not self.lease.acquire():
                self._note_standby()
                return False
            self.holder, self.synced = True, False
            self._standby_note = ""
        if not self.synced:
            self._takeover(now)
            return True
        if now >= self._renew_at and not self._keep_lease(now):
            return False
        self.reader.refresh_meta(self.assembler, self.book, now)
        entries = self.reader.read(self.assembler, self.book, self._block_ms(now))
        if entries is None:
            self._log(f"aggregate {self.run}: the consumer group is gone (Redis restarted or the stream was "
                      "deleted): made again")
            self._ensure_group()
            entries = []
        out = self.reader.ingest(self.assembler, entries, now, self._take(now))
        self.reader.place_layouts(self.assembler, self.book)  # changes waiting for an instance that showed up now
        if now >= self._reclaim_at:
            out.extend(self._reclaim(now))
        if self._recheck_own:
            out.extend(self._own_lost_replies(now))
            self._recheck_own = False
        out.extend(self.assembler.due(now))
        self.committer.queue(out, now, self.assembler, self.rollups)
        wrote = bool(self.committer.outbox)
        if self.committer.outbox or self._heartbeat:
            self._commit(now)
        if now >= self._trim_at:
            self._trim(now)
        return bool(entries) or wrote

    def _take(self, now: float) -> Callable[[Output], None]:
        """What a read hands each chunk's output to: the committer's outbox (steps encoded at once)."""
        def take(out: Output) -> None:
            if not self.holder:  # the lease went with an early commit: the holder reads these entries again
                return
            self.committer.queue(out, now, self.assembler, self.rollups)
            if self.committer.outbox.nbytes > COMMIT_BYTES:
                self._commit(now)

        return take

    def _block_ms(self, now: float) -> int | None:
        """XREADGROUP's BLOCK: up to block_ms, never past the next step's deadline; None: do not block."""
        if not self.options.block_ms or self.committer.outbox or self._heartbeat:
            return None
        wait_ms = float(self.options.block_ms)
        deadline = self.assembler.next_deadline_s(now)
        if deadline is not None:
            wait_ms = min(wait_ms, deadline * 1000)
        return int(wait_ms) if wait_ms >= 1 else None

    def _commit(self, now: float) -> None:
        """Commit what is buffered, and act on what the commit found of the lease."""
        result = self.committer.commit(now, self.assembler, self.rollups, self.lag_entries, self._entries_per_s)
        if result is CommitResult.WRITTEN:
            self._heartbeat = False
            self._renew_at = now + self.options.lease_s / 3
        elif result is CommitResult.LEASE_FREE:
            if self._keep_lease(now):
                self._heartbeat = True  # taken again: the next round commits
        elif result is CommitResult.LEASE_HELD:
            self._lose("another aggregator holds it")
        else:
            self._lose("taken by another aggregator while committing")

    def _report_error(self, message: str) -> None:
        """A problem of the whole run: kept in last_error; logged once per kind (its text before the first ':'),
        not at every commit while it lasts."""
        if message.partition(":")[0] != self.last_error.partition(":")[0]:
            self._log(f"aggregate {self.run}: {message}")
        self.last_error = message

    def _note_standby(self) -> None:
        name, ttl_ms = self.lease.holder()
        note = f"aggregate {self.run}: standby, the run is aggregated by {name or '(nobody)'}"
        if note != self._standby_note:
            self._standby_note = note
            self._log(f"{note} (its lease expires in {max(ttl_ms, 0) / 1000:.1f} s unless renewed)")

    def _keep_lease(self, now: float) -> bool:
        verdict = self.lease.renew()
        self._renew_at = now + self.options.lease_s / 3
        if verdict == KEPT:
            return True
        if verdict == RETAKEN:
            self._log(f"aggregate {self.run}: the lease was gone with nobody else's progress in its place (Redis "
                      "restarted or flushed?): taken again, nothing buffered is lost")
            self._ensure_group()
            self._heartbeat = True
            return True
        self._lose("another aggregator holds it" if verdict == LOST else "another aggregator held it meanwhile")
        return False

    def _lose(self, why: str) -> None:
        self._log(f"aggregate {self.run}: lost the lease ({why}); back to standby, what was buffered is left to "
                  "the holder (its entries are still pending in the consumer group)")
        self.holder = self.synced = False
        self._fresh()
        self._acquire_at = time.monotonic() + min(1.0, self.options.lease_s / 3)

    # ------------------------------------------------------------------------------------------ takeover
    def _ensure_group(self) -> None:
        """The consumer group on the steps stream, from the start of what is there (created with the stream
        when it does not exist)."""
        try:
            self.client.xgroup_create(self.steps_key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _takeover(self, now: float) -> None:
        """Read what the predecessors left (progress hash, aggregate tail, rollups, layouts), claim their
        pending entries, and write the progress hash under this consumer's name."""
        o = self.options
        self._fresh()
        self._renew_at = now + o.lease_s / 3
        self._ensure_group()
        progress = decode_progress(self.client.hgetall(self.state_key))
        tail = read_tail(self.client, self.run, progress.epoch, o.agg_maxlen)
        epoch = progress.epoch if progress.epoch is not None else tail.epoch
        same = progress.instances is not None and epoch == progress.epoch
        instances = progress.instances if same and progress.instances is not None else {}
        self.assembler.restore(epoch, instances, progress.retired, tail.written, tail.horizon, progress.counters,
                               held=progress.held if same else ())
        self._bad_reported = progress.counters.bad_records
        self.rollups.counters = progress.rollups
        top_1s = last_bucket_start(self.client, self.run, 1)
        top_60s = last_bucket_start(self.client, self.run, 60)
        self.rollups.already_written(1, top_1s)
        self.rollups.already_written(60, top_60s)
        self.reader.refresh_meta(self.assembler, self.book, now, force=True)
        while self.reader.take_layouts(self.assembler, self.book):
            pass
        wall = time.time()
        replay_from = next((entry_id for entry_id, t in tail.entries if t >= top_60s + 60), None)
        replayed = 0
        if replay_from is not None:
            for rec in replay(self.client, self.run, replay_from, epoch):
                self.rollups.add(rec, now, wall)
                replayed += 1
                if not self._still_holding():
                    return
        claimed, take = 0, self._take(now)  # the steps a claim writes are committed as a read's are
        for entries, gone in claim(self.client, self.run, GROUP, self.consumer, o.read_count):
            claimed += len(entries)
            out = self.reader.ingest(self.assembler, entries, now, take)
            if not self.holder:  # an early commit found the lease gone: the holder claims these entries again
                return
            out.acks.extend(gone)
            self.committer.queue(out, now, self.assembler, self.rollups)
            if not self._still_holding():
                return
        self._drop_idle_consumers()
        self.synced = True
        self._heartbeat = True
        self._log(f"aggregate {self.run}: took over as {self.consumer}: epoch {epoch!r}, last step "
                  f"{self.assembler.last_step}, {len(tail.written)} steps known written (horizon {tail.horizon}), "
                  f"{claimed} pending entries claimed, {replayed} aggregates replayed into the rollups")
        self._commit(now)

    def _still_holding(self) -> bool:
        """Renew the lease when due during a long takeover; False when it was lost (state already dropped)."""
        now = time.monotonic()
        return now < self._renew_at or self._keep_lease(now)

    def _drop_idle_consumers(self) -> None:
        """Remove the group's other consumers that hold nothing (dead predecessors)."""
        for info in self.client.xinfo_consumers(self.steps_key, GROUP):
            name = info.get("name")
            name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            if name != self.consumer and not info.get("pending"):
                self.client.xgroup_delconsumer(self.steps_key, GROUP, name)

    def _own_lost_replies(self, now: float) -> Output:
        """Entries delivered to this consumer whose reply never came back: a read that timed out while Redis
        was stopped still runs when Redis resumes, and hands its entries to this consumer (XREADGROUP '>' never
        gives them again). After a failed round, this consumer's pending entries that nothing here holds (not
        assembling, not waiting to be acknowledged) are claimed back and read (counted in recovered_entries)."""
        known = self.assembler.held_entry_ids() | set(self.committer.outbox.acks)
        lost: list[bytes] = []
        start = "-"
        while True:
            page = self.client.xpending_range(self.steps_key, GROUP, min=start, max="+",
                                              count=self.options.read_count, consumername=self.consumer)
            ids = [entry_id_bytes(p["message_id"]) for p in page]
            lost += [i for i in ids if i not in known]
            if len(page) < self.options.read_count:
                break
            start = "(" + ids[-1].decode()
        if not lost:
            return Output()
        self.recovered_entries += len(lost)
        self._log(f"aggregate {self.run}: {len(lost)} entries delivered while Redis did not answer read again")
        out, take = Output(), self._take(now)
        for first in range(0, len(lost), self.options.read_count):
            ids = lost[first:first + self.options.read_count]
            entries = stream_entries(self.client.xclaim(self.steps_key, GROUP, self.consumer, 0, list(ids)))
            out.extend(self.reader.ingest(self.assembler, [(i, f) for i, f in entries if f is not None], now, take))
            out.acks.extend(i for i, f in entries if f is None)
            claimed = {i for i, _ in entries}
            out.acks.extend(i for i in ids if i not in claimed)  # trimmed away meanwhile: nothing to read
        return out

    def _reclaim(self, now: float) -> Output:
        """Entries another consumer took and left (a holder that lost the lease between its last renewal and
        a read): claimed once they are idle for two leases."""
        self._reclaim_at = now + self.options.lease_s
        idle_ms = int(2000 * self.options.lease_s)
        pending = self.client.xpending_range(self.steps_key, GROUP, min="-", max="+", count=self.options.read_count,
                                             idle=idle_ms)
        ids = [p["message_id"] for p in pending if text_of(p.get("consumer")) != self.consumer]
        if not ids:
            return Output()
        entries = stream_entries(self.client.xclaim(self.steps_key, GROUP, self.consumer, idle_ms, ids))
        out = self.reader.ingest(self.assembler, [(entry_id, fields) for entry_id, fields in entries
                                                  if fields is not None], now, self._take(now))
        out.acks.extend(entry_id for entry_id, fields in entries if fields is None)
        return out

    # ------------------------------------------------------------------------------------------ writing
    def _trim(self, now: float) -> None:
        """XTRIM MINID ~ the steps stream to keep_raw_s behind the newest entry read, never past an entry still
        waiting for its step (nor, therefore, past the group's last delivered entry)."""
        self._trim_at = now + TRIM_EVERY_S
        if self.reader.last_read_id is None:
            return
        bound_ms = entry_id_key(self.reader.last_read_id)[0] - int(self.options.keep_raw_s * 1000)
        held = [i for i in (self.assembler.oldest_pending_id(),
                            min(self.committer.outbox.acks, key=entry_id_key, default=None)) if i is not None]
        for entry_id in held:
            bound_ms = min(bound_ms, entry_id_key(entry_id)[0])
        if bound_ms > self._trimmed_ms:
            self.client.xtrim(self.steps_key, minid=bound_ms, approximate=True)
            self._trimmed_ms = bound_ms

    # ------------------------------------------------------------------------------------------ health
    def _failed(self, exc: BaseException, now: float, what: str) -> None:
        self.redis_errors += 1
        self._recheck_own = True  # a read may have run without its reply reaching here
        self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff_s * 2))
        self._retry_at = now + self._backoff_s
        self.last_error = f"{what}: {core.why(exc)}"
        if self._failing_since is None or now - self._reported_at >= REPORT_AGAIN_S:
            records, rollups, acks = self.committer.outbox.sizes()
            self._log(f"aggregate {self.run}: {what} at {self.where} failed ({core.why(exc)}); {records} aggregates, "
                      f"{rollups} rollups and {acks} acks buffered, {self.assembler.pending_steps} steps "
                      f"assembling; retrying (backoff up to {BACKOFF_MAX_S:g} s)")
            self._reported_at = now
        if self._failing_since is None:
            self._failing_since = now

    def _report(self, now: float) -> None:
        """The progress line (and lag) every log_every_s; malformed entries since the last line in one line."""
        self._log_at = now + self.options.log_every_s
        c = self.counters
        then, entries_then, steps_then, _ = self._logged
        span = max(now - then, 1e-9)
        self._entries_per_s = (self.entries_in - entries_then) / span
        steps_per_s = (c.steps_written - steps_then) / span
        self._logged = (now, self.entries_in, c.steps_written, c.bad_records)
        if not (self.holder and self.synced):
            return
        try:
            groups = self.client.xinfo_groups(self.steps_key)
            lag = next((g.get("lag") for g in groups if text_of(g.get("name")) == GROUP), None)
            self.lag_entries = -1 if lag is None else int(lag)
        except core.REDIS_ERRORS:
            self.lag_entries = -1
        self._heartbeat = True
        quiet = self.entries_in == entries_then and c.steps_written == steps_then
        self._quiet_lines = self._quiet_lines + 1 if quiet else 0
        if quiet and self._quiet_lines % QUIET_LOG_EVERY:  # idle: a line now and then, not every interval
            return
        line = (f"aggregate {self.run}: epoch {self.assembler.epoch!r} step {self.assembler.last_step}: "
                f"{c.steps_written} steps written ({steps_per_s:.1f}/s), {self._entries_per_s:.0f} entries/s, "
                f"{self.assembler.pending_steps} assembling, lag {self.lag_entries}, missing {c.rank_steps_missing} "
                f"rank-steps, late {c.late_ranks} ranks, duplicates {c.duplicates}, stale {c.stale_records}, "
                f"too old {c.too_old}, rollups {self.rollups.counters.buckets_1s} x 1 s + "
                f"{self.rollups.counters.buckets_60s} x 60 s")
        if self.assembler.last_missing is not None:
            step, ranks = self.assembler.last_missing
            line += f"; last step short: {step} without ranks {ranks}"
        self._log(line)
        if c.budget_writes + c.over_budget > self._budget_reported:
            self._log(f"aggregate {self.run}: {c.budget_writes} steps written before their deadline and "
                      f"{c.over_budget} records skipped to stay within the memory budget ({format_bytes(self.share_bytes)} "
                      f"for this run of {self.budget.describe()}); latest: {self.assembler.budget_problem}")
            self._budget_reported = c.budget_writes + c.over_budget
        if c.bad_records > self._bad_reported:
            self._log(f"aggregate {self.run}: {c.bad_records - self._bad_reported} malformed entries acked and "
                      f"skipped since the last report ({c.bad_records} in all); latest: {self.assembler.last_problem}")
            self._bad_reported = c.bad_records
