"""The bridge loop (one thread): watch SGLang's dump folder, turn each complete dump into records (jobs.py),
publish them through collectors.sinks.RedisSink, remember what was read (state.py); optionally drive the
server's recorder endpoints on a period (server.py). GPUs and metadata: runmeta.py.

Every failure is one log line, once per outage or per file, never a crash: Redis down (retried at the next poll;
nothing is marked read until it landed), the server down (retried every period), the folder missing, a bad dump
(refused, remembered). Settings that cannot work (no top-k where a dump needs it, --gpus that does not divide
the layout) stop the bridge with a ConfigError.
"""
from __future__ import annotations

import copy
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from moe_monitor import core
from moe_monitor.collectors.sinks import PartialWrite, RedisSink, StreamExhausted
from moe_monitor.core.health import HealthReport
from moe_monitor.core.redaction import scrub
from moe_monitor.core.sglang_dumps import PassDump, StatDump, read_dump
from moe_monitor.core.sglang_records import SAMPLE_TOKENS, top_k_of

from . import state as store
from .folder import DumpFile, Folder
from .jobs import Job, convert
from .runmeta import ConfigError, MetaSettings, run_meta_for
from .server import ServerDriver, ServerError
from .stepids import StepIds

BATCH_RECORDS = 256        # step records per RedisSink.write
HEARTBEAT_S = 5.0          # health written this often while idle
MAX_FILES_PER_POLL = 64    # files read per round of the loop (a backlog does not hold up the server's dumps)
REDIS_ERRORS: tuple[type[BaseException], ...] = (*core.REDIS_ERRORS, PartialWrite)  # a batch Redis took only part of counts as Redis's failure


@dataclass(frozen=True)
class BridgeOptions:
    """Settings of `moe-monitor sglang` (see its --help)."""

    dump_dir: str
    redis_url: str
    run: str
    server_url: str | None = None
    every_s: float = 10.0
    poll_s: float = 1.0
    top_k: int | None = None
    gpus: int | None = None
    nodes: int = 1
    model_name: str = ""
    max_file_bytes: int = 1 << 30
    redis_timeout_s: float = 2.0
    server_timeout_s: float = 30.0
    memory_budget_bytes: int = 256 << 20
    sample_tokens: int = SAMPLE_TOKENS
    api_key: str | None = None
    dispatch_algorithm: str | None = None  # SGLang's --ep-dispatch-algorithm (runmeta.sglang_dispatch maps it)
    same_batch_ranks: int = 1  # G > 1: the G ranks route the same batch (no DP attention): jobs.convert


def _say(line: str) -> None:
    print(f"sglang-bridge: {line}", file=sys.stderr, flush=True)


class Bridge:
    """Watches opts.dump_dir and publishes to opts.redis_url under opts.run. poll() does one round; run()
    loops (and drives the server); run_once() reads what is complete now and returns."""

    def __init__(self, opts: BridgeOptions, log: Callable[[str], None] = _say):
        self.opts, self.log = opts, log
        self.run_name = core.check_run_name(opts.run)
        self.where = core.redact(opts.redis_url)
        self.client = core.connect(opts.redis_url, timeout_s=opts.redis_timeout_s, retries=0)
        self.folder = Folder(opts.dump_dir)
        self.server = (ServerDriver(opts.server_url, opts.server_timeout_s, opts.api_key, warn=self.log)
                       if opts.server_url else None)
        self.loaded = False
        self.seen: dict[str, store.Seen] = {}
        self.meta: core.RunMeta | None = None
        self.sink: RedisSink | None = None
        self.instance = ""
        self.ids = StepIds()
        self.layout_sha = ""
        self.top_k: int | None = opts.top_k
        self.published_by_rank: dict[int, int] = {}
        self.files_published = self.files_refused = 0
        self._job: Job | None = None
        self._unsaved: dict[str, store.Seen] = {}  # refusals not yet written to Redis
        self._redis_error = ""      # standing Redis failure ("" when fine), said once
        self._folder_error = ""
        self._server_error = ""
        self._sink_failures = 0
        self._last_failure = ""
        self._heartbeat_at = 0.0
        self.recording = False

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event) -> int:
        """Poll until stop is set; with a server, start recording and dump every every_s. On stop: a last
        dump and stop of the server's recorder, and the files it wrote published. Exit code: 0, or 2 for a
        ConfigError."""
        self.log(self._banner())
        next_call = time.monotonic()
        try:
            while not stop.is_set():
                if self.server is not None and time.monotonic() >= next_call:
                    self._drive()
                    next_call = time.monotonic() + self.opts.every_s
                self.poll(MAX_FILES_PER_POLL)
                stop.wait(self.opts.poll_s)
            if self.server is not None and self.recording:
                self._call("dump")
                self._call("stop")
                for _ in range(3):  # the last dump's files: complete once they look the same twice
                    self.poll()
                    time.sleep(self.opts.poll_s)
                self.poll()
        except ConfigError as exc:
            self.log(f"error: {exc}")
            return 2
        finally:
            self.close()
        return 0

    def run_once(self) -> int:
        """With a server: ask it to dump. Then read every complete dump (two listings poll_s apart), publish,
        return 0; 1 when the server or Redis failed (what could not be published is read next time), 2 for
        a ConfigError."""
        self.log(self._banner())
        failed = False
        try:
            if self.server is not None:
                failed = not self._call("dump")
            self.poll()
            time.sleep(self.opts.poll_s)
            done = self.poll()
        except ConfigError as exc:
            self.log(f"error: {exc}")
            return 2
        finally:
            self.close()
        return 1 if failed or not done else 0

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
        self.client.close()

    def _banner(self) -> str:
        server = f"; driving {self.server.url} (dump every {self.opts.every_s:g} s)" if self.server else ""
        return (f"watching {self.opts.dump_dir} for SGLang expert-distribution dumps -> {self.where} "
                f"run {self.run_name}{server}")

    # ------------------------------------------------------------------ the server
    def _drive(self) -> None:
        """One period: start recording when it is not known to be on, else dump."""
        if not self.recording:
            self.recording = self._call("start")
            if self.recording:
                self.log(f"{self.server.url if self.server else ''}: recording started")
        elif not self._call("dump"):
            self.recording = False  # it may have restarted: start again once it answers

    def _call(self, action: str) -> bool:
        assert self.server is not None
        try:
            self.server.call(action)
        except ServerError as exc:
            if not self._server_error:
                said = "refused the call" if exc.answered else "unreachable"
                self.log(f"sglang server {self.server.url} {said} ({exc}); retrying every {self.opts.every_s:g} s")
            self._server_error = f"sglang server: {exc}"
            return False
        if self._server_error:
            self.log(f"sglang server {self.server.url} answers again")
            self._server_error = ""
        return True

    # ------------------------------------------------------------------ one round
    def poll(self, max_files: int | None = None) -> bool:
        """One round: load the saved state (once), finish a pending publish, read the complete new dumps (at
        most max_files of them: the loop keeps driving the server through a backlog). True when nothing is left
        waiting on Redis."""
        if not self._load():
            return False
        if self._job is not None and not self._publish(self._job):
            return False
        try:
            ready = self.folder.poll()
        except OSError as exc:
            if not self._folder_error:
                missing = isinstance(exc, FileNotFoundError)
                self.log(f"waiting for {self.opts.dump_dir} to appear (SGLang creates it with its first dump)"
                         if missing else f"cannot list {self.opts.dump_dir}: {exc}")
            self._folder_error = str(exc)
            return self._flush_unsaved()
        if self._folder_error:
            self.log(f"{self.opts.dump_dir} can be listed again")
            self._folder_error = ""
        ranks_hint = len({f.named.rank for f in ready if f.named.rank is not None})
        new = [f for f in ready if not ((entry := self.seen.get(f.name)) and entry.same_file(f.size_bytes, f.mtime_ns))]
        for dump_file in new[:max_files]:
            job = self._read(dump_file, ranks_hint)
            if job is not None and not self._publish(job):
                return False
        self._heartbeat()
        return self._flush_unsaved()

    def _load(self) -> bool:
        if self.loaded:
            return True
        try:
            seen, saved, meta, problems = store.load(self.client, self.run_name)
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            return False
        self._redis_back()
        if problems:
            self.log(problems)
        self.seen, self.meta = seen, meta
        try:
            self._restore(saved or {})
        except (ValueError, TypeError, AttributeError) as exc:
            self.log(f"{store.state_key(self.run_name)} is malformed ({exc}): step ids start afresh under a new "
                     "collector instance")
            self._restore({})
        self.top_k = self.opts.top_k or self.top_k or (meta.top_k if meta and meta.top_k else None)
        if meta is not None:
            if meta.instance != self.instance:
                meta.instance = self.instance  # the run continues under this bridge's instance
            self._make_sink(meta)
        done = sum(1 for entry in seen.values() if entry.status != "refused")
        refused = len(seen) - done
        if seen:
            self.log(f"{done} dump files already read{f', {refused} refused before' if refused else ''} "
                     f"({store.seen_key(self.run_name)}): not read again")
        self.loaded = True
        return True

    def _restore(self, saved: dict) -> None:
        """The saved state (state.py) into this bridge; ValueError / TypeError when it is malformed."""
        self.ids = StepIds.from_json(saved.get("ids", {}))
        self.instance = str(saved.get("instance") or "")[:core.MAX_NAME_CHARS] or core.new_instance_id()
        self.layout_sha = str(saved.get("layout_sha256", ""))
        self.top_k = _positive(saved.get("top_k"))
        self.published_by_rank = {int(k): int(v) for k, v in dict(saved.get("published_by_rank", {})).items()}

    # ------------------------------------------------------------------ one file
    def _read(self, dump_file: DumpFile, ranks_hint: int) -> Job | None:
        """Load and convert one file into a job; None (after one line) when it is refused or empty."""
        try:
            dump = read_dump(dump_file.path, self.opts.max_file_bytes)
        except FileNotFoundError:
            return None  # gone since the listing: nothing to read
        except (ValueError, OSError) as exc:
            self._refuse(dump_file, str(exc) if isinstance(exc, ValueError) else f"{dump_file.name}: {exc}")
            return None
        try:
            return self._job_for(dump_file, dump, ranks_hint)
        except ValueError as exc:
            self._refuse(dump_file, f"{dump_file.name}: {exc}")
            return None

    def _refuse(self, dump_file: DumpFile, why: str) -> None:
        self.log(f"refused {why}")
        entry = store.Seen(dump_file.size_bytes, dump_file.mtime_ns, "refused", why=why)
        self.seen[dump_file.name] = self._unsaved[dump_file.name] = entry
        self.files_refused += 1

    def _job_for(self, dump_file: DumpFile, dump: StatDump | PassDump, ranks_hint: int) -> Job | None:
        """The records of one checked dump. ValueError: the file does not fit this run (refused);
        ConfigError: the settings cannot handle it."""
        top_k = self.top_k or (top_k_of(dump) if isinstance(dump, PassDump) else None)
        if top_k is None:
            raise ConfigError(f"{dump_file.name}: stat and per_pass dumps do not say the model's top-k: pass "
                              "--top-k (8 for DeepSeek-V3)")
        meta = self.meta or self._new_meta(dump, top_k, ranks_hint)
        num_layers, num_experts = len(meta.layer_names), meta.num_experts
        if (dump.num_layers, dump.num_experts) != (num_layers, num_experts):
            raise ValueError(f"the dump is [{dump.num_layers} layers, {dump.num_experts} experts], run "
                             f"{self.run_name} is [{num_layers}, {num_experts}] (its metadata): use another --run")
        job = convert(dump_file, dump, self.run_name, meta, top_k, copy.deepcopy(self.ids), self.layout_sha,
                      self.instance, self.opts.sample_tokens, self.opts.every_s, self.opts.same_batch_ranks)
        if isinstance(job, str):
            self._empty(dump_file, job)
            return None
        return job

    def _empty(self, dump_file: DumpFile, why: str) -> None:
        self.seen[dump_file.name] = self._unsaved[dump_file.name] = store.Seen(
            dump_file.size_bytes, dump_file.mtime_ns, "empty", why=why)
        return None

    def _new_meta(self, dump: StatDump | PassDump, top_k: int, ranks_hint: int) -> core.RunMeta:
        """The run's metadata from its first dump (runmeta.py), and the sink that writes it."""
        opts = self.opts
        settings = MetaSettings(gpus=opts.gpus, nodes=opts.nodes, model_name=opts.model_name,
                                sample_tokens=opts.sample_tokens, dump_dir=opts.dump_dir,
                                dispatch_algorithm=opts.dispatch_algorithm, same_batch_ranks=opts.same_batch_ranks)
        meta, said = run_meta_for(self.run_name, dump, top_k, ranks_hint, settings, self.instance)
        self.log(said)
        self.meta, self.top_k = meta, top_k
        self._make_sink(meta)
        return meta

    def _make_sink(self, meta: core.RunMeta) -> None:
        sample_bytes = len(meta.layer_names) * meta.sample_tokens_per_layer * max(meta.top_k, 1) * 2
        maxlen = core.maxlen_for_budget(self.opts.memory_budget_bytes, len(meta.layer_names), meta.num_experts,
                                        sample_bytes)
        self.sink = RedisSink(self.opts.redis_url, meta, maxlen, self.opts.redis_timeout_s,
                              self.opts.memory_budget_bytes, log=self.log)

    # ------------------------------------------------------------------ publishing
    def _publish(self, job: Job) -> bool:
        """Send the job's layout record, step records and physical records, then mark the file read with the new
        state, all or retried at the next poll from where it stopped. True when it all landed."""
        self._job = job
        assert self.sink is not None
        try:
            # the sink writes the layout before the steps, and sends the layout in force again to a Redis
            # restarted empty (sinks.RedisSink)
            while job.records or job.layout is not None or job.physical:
                chunk = job.records[:BATCH_RECORDS]  # one file: one rank
                counted = job.physical[:BATCH_RECORDS]
                layouts = [job.layout] if job.layout is not None else []
                rank = (chunk or counted or layouts)[0].rank
                try:
                    self.sink.write(chunk, [], self._health(rank, job, len(chunk)), layouts=layouts,
                                    physical=counted)
                except PartialWrite as exc:  # what landed is not sent again
                    if layouts and 0 in exc.layouts_landed:
                        job.layout = None
                    job.records = [rec for i, rec in enumerate(job.records) if i >= len(chunk) or i not in exc.landed]
                    job.physical = [rec for i, rec in enumerate(job.physical)
                                    if i >= len(counted) or i not in exc.physical_landed]
                    job.landed_by_rank[rank] = job.landed_by_rank.get(rank, 0) + len(exc.landed)
                    raise
                job.layout = None
                job.records = job.records[len(chunk):]
                job.physical = job.physical[len(counted):]
                job.landed_by_rank[rank] = job.landed_by_rank.get(rank, 0) + len(chunk)
            published = dict(self.published_by_rank)
            for rank, count in job.landed_by_rank.items():
                published[rank] = published.get(rank, 0) + count
            saved = self._state(job.ids, job.layout_sha, published)
            store.commit(self.client, self.run_name, {**self._unsaved, job.file.name: job.seen}, saved)
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            return False
        self._redis_back()
        self._unsaved.clear()
        self._job = None
        self.seen[job.file.name] = job.seen
        self.ids, self.layout_sha, self.published_by_rank = job.ids, job.layout_sha, published
        self.files_published += 1
        self.log(f"published {job.summary}")
        return True

    def _state(self, ids: StepIds, layout_sha: str, published: dict[int, int]) -> dict:
        return {"instance": self.instance, "ids": ids.to_json(), "layout_sha256": layout_sha,
                "gpus": self.meta.layout.gpus if self.meta else None, "world": self.meta.world_size if self.meta else None,
                "top_k": self.top_k, "published_by_rank": {str(k): v for k, v in published.items()}}

    def _flush_unsaved(self) -> bool:
        """Write refusals and empty files noted while nothing else was published."""
        if not self._unsaved:
            return self._job is None
        try:
            store.commit(self.client, self.run_name, self._unsaved, None)
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            return False
        self._redis_back()
        self._unsaved.clear()
        return self._job is None

    def _health(self, rank: int, job: Job | None = None, sending: int = 0) -> HealthReport:
        landed = job.landed_by_rank.get(rank, 0) if job else 0
        return HealthReport(
            rank=rank, published_steps=self.published_by_rank.get(rank, 0) + landed + sending,
            queued=len(job.records) - sending if job else 0, last_error=self._standing(),
            sink_failures=self._sink_failures, last_failure=self._last_failure, time_s=time.time(),
            extra={"files_published": self.files_published, "files_refused": self.files_refused,
                   "collector": "sglang-bridge"})

    def _standing(self) -> str:
        return "; ".join(e for e in (self._server_error, self._folder_error and f"folder: {self._folder_error}") if e)

    def _heartbeat(self) -> None:
        """Health of every rank published so far, every HEARTBEAT_S while idle (a bridge waiting for dumps is
        not a silent collector)."""
        now = time.monotonic()
        if self.meta is None or now - self._heartbeat_at < HEARTBEAT_S:
            return
        self._heartbeat_at = now
        ranks = sorted(self.published_by_rank) or [0]
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(core.health_key(self.run_name),
                      mapping={str(r): self._health(r).encode() for r in ranks})
            pipe.execute()
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)

    def _redis_failed(self, exc: BaseException) -> None:
        """One line per outage (none for an exhausted stream: the sink said it), its reason never holding the
        URL's secrets."""
        why = scrub(f"{type(exc).__name__}: {exc}", self.opts.redis_url)
        self._sink_failures += 1
        self._last_failure = why
        if not self._redis_error and not isinstance(exc, StreamExhausted):
            said = "refused part of a write" if isinstance(exc, PartialWrite) else "unreachable"
            self.log(f"redis {self.where} {said} ({why}); retrying every {self.opts.poll_s:g} s, "
                     "nothing is marked read until it landed")
        self._redis_error = why

    def _redis_back(self) -> None:
        if self._redis_error:
            self.log(f"redis {self.where} reachable again")
            self._redis_error = ""


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
