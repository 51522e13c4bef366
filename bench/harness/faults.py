"""bench.faults' suite: eight faults (NAMES) against a Deployment (deployment.py), one after another, each once the
previous one has recovered (run_faults); per fault, what was written and read over its span of step ids, how long
the aggregate, the page and the exporter took to be current again (recover) and what the page said; the table
(print_table). run_suite runs faults 1, 2, 3, 5, 6 and 7 on one private redis-server, 4 on a private cluster and
8 on a redis-server of its own (its aggregator serves every run, `--all`, with a memory budget).
Used by bench/faults.py and tests/bench/test_faults_short.py; docs/scaling.md ("Faults") says what each fault does.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.harness.deployment import Deployment, Tally
from bench.harness.probes import PageSaid, said, wait_for
from bench.harness.target import start_redis
from moe_monitor import core
from moe_monitor.core.health import decode_health_report

NAMES = {1: "SIGKILL a rank, restart it", 2: "SIGKILL the aggregator mid-commit, restart it",
         3: "steal the aggregator lease, then DEL it", 4: "cluster master failover",
         5: "SIGSTOP Redis, then SIGCONT", 6: "trace disk full",
         7: "rolling restart of more than half the ranks", 8: "another run stalls with a wide [L, E]"}
SINGLE = (1, 2, 3, 5, 6, 7)  # the faults of the single-Redis run, in this order
WIDE_L, WIDE_E, WIDE_WORLD = 16, 65_536, 4  # fault 8's run: 4 MiB a step as int32, rank 0 of 4 only
WIDE_BUDGET = "256MiB"  # fault 8's aggregator --memory-budget
WIDE_SLACK_MIB = 256  # what the aggregator may grow beyond its budget (a wide run's metadata, one read's chunk)
RECOVER_S = 120.0  # far past what a loaded 2-core machine needs: it bounds a failure, it is not a goal
SETTLE_S = 2.0
IN_FLIGHT_S = 3.0  # the aggregator's 2 s deadline and a flush: steps due this long before a fault are its too
RESTART_DOWN_S = 2.0  # how long the killed rank stays down


@dataclass
class Outcome:
    """One fault as it happened: when it began and ended (monotonic s), the step due at its end, what happened
    (facts), what recovery needs (the page's feed, a step with every rank, further conditions), a deliberate loss
    to explain, and whether the fault itself went as meant."""

    fault: int
    began: float
    ended: float
    end_step: int
    facts: list[str] = field(default_factory=list)
    feed: str | None = "aggregate"
    full: bool = False
    also: dict[str, Callable[[], bool]] = field(default_factory=dict)
    deliberate: str = ""
    problems: list[str] = field(default_factory=list)
    later: Callable[[], str] | None = None  # a fact read once the fault recovered
    begin_step: int = 0  # the step due when it began
    kept_ranks: tuple[int, ...] = ()  # ranks that stayed up: each of their rank-steps must be read


@dataclass
class Row:
    """A fault's row: its Outcome, the span of step ids [lo, hi) it covers, the tally of that span, the recovery
    times (seconds from the fault's end, None: not within RECOVER_S), the page's and the exporter's lines."""

    outcome: Outcome
    lo: int
    hi: int
    recovery: dict[str, float | None]
    page: PageSaid
    exporter: str
    tally: Tally | None = None
    twice_note: str = ""

    @property
    def ok(self) -> bool:
        lost_ok = self.tally is not None and (self.tally.lost == 0 or bool(self.outcome.deliberate))
        return lost_ok and all(v is not None for v in self.recovery.values()) and not self.outcome.problems


# ------------------------------------------------------------------ the faults
def fault_rank(d: Deployment, echo) -> Outcome:
    began = time.monotonic()
    killed_at = d.due()
    segment = d.kill_solo()
    out = Outcome(1, began, began, killed_at, full=True)
    time.sleep(RESTART_DOWN_S)
    first = d.restart_solo()
    out.ended, out.end_step = d.clock.time_of(first), first
    out.facts.append(f"rank {d.solo_rank} SIGKILLed at step {killed_at} (its last health report: {segment.published} "
                     f"steps published), back as a new collector instance from step {first} "
                     f"({out.ended - began:.1f} s later)")
    return out


def fault_aggregator(d: Deployment, echo) -> Outcome:
    tail = d.tail
    assert tail is not None
    holder = d.client.get(core.aggregator_key(d.run))
    seen = len(tail.entries)
    wait_for(lambda: len(tail.entries) > seen, 30.0, every_s=0.005)  # a commit just landed: the next is under way
    time.sleep(random.uniform(0.0, 0.03))
    wait_for(lambda: d.pending_entries() > 0, 2.0, every_s=0.005)  # entries delivered to it, not acknowledged
    began = time.monotonic()
    d.kill_aggregator()
    pending = d.pending_entries()
    d.start_aggregator()
    out = Outcome(2, began, time.monotonic(), d.due())
    out.facts.append(f"aggregator SIGKILLed with {pending} entries delivered to it and not acknowledged; a new one "
                     f"started at once (lease {d.lease_s:g} s)")

    def taken() -> bool:
        now = d.client.get(core.aggregator_key(d.run))
        return now is not None and now != holder

    out.also["lease taken over"] = taken
    return out


def fault_lease(d: Deployment, echo) -> Outcome:
    key = core.aggregator_key(d.run)
    began = time.monotonic()
    d.client.set(key, "thief", px=3_600_000)
    page = d.page
    assert page is not None
    fell = wait_for(lambda: page.latest is not None and page.latest.feed == "steps" and bool(page.latest.stall_note),
                    90.0)
    d.client.delete(key)
    out = Outcome(3, began, time.monotonic(), d.due())
    if fell is None:
        out.problems.append("the readers did not fall back to the per-rank steps within 90 s")
        out.facts.append("lease stolen; the page never fell back to the per-rank steps")
    else:
        out.facts.append(f"lease stolen; the page fell back to summing the per-rank steps {fell:.1f} s later "
                         f"(STALL_S 15 s + a check every 5 s); lease deleted {out.ended - began:.1f} s after the theft")

    def back() -> bool:
        now = d.client.get(key)
        return now is not None and now != b"thief"

    out.also["lease taken back"] = back
    return out


def fault_stall(d: Deployment, echo, pid: int, stall_s: float) -> Outcome:
    began = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(stall_s)
    finally:
        os.kill(pid, signal.SIGCONT)
    out = Outcome(5, began, time.monotonic(), d.due())
    out.facts.append(f"redis-server SIGSTOPped for {stall_s:g} s")
    return out


def _health_error(d: Deployment, rank: int) -> str:
    with contextlib.suppress(Exception):
        raw = d.client.hget(core.health_key(d.run), str(rank))
        return str(decode_health_report(raw).get("last_error") or "") if raw else ""
    return ""


def fault_disk(d: Deployment, echo, full_s: float) -> Outcome:
    assert d.solo is not None and d.trace_path is not None
    path, pid, rank = d.trace_path, d.solo.pid, d.solo_rank
    began = time.monotonic()
    size = os.path.getsize(path)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, hard))
    try:
        said_s = wait_for(lambda: "trace" in _health_error(d, rank), max(full_s, 30.0))
        time.sleep(max(0.0, full_s - (time.monotonic() - began)))
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
    out = Outcome(6, began, time.monotonic(), d.due())
    out.facts.append(f"the trace file of rank {rank} could not grow past {size:,} B for {out.ended - began:.1f} s "
                     f"(RLIMIT_FSIZE of its process)")
    if said_s is None:
        out.problems.append("the rank's health never said the trace failed")
    else:
        out.facts.append(f"its Redis health said the trace failed {said_s:.1f} s in: {_health_error(d, rank)[:120]!r}"
                         if _health_error(d, rank) else f"its Redis health said the trace failed {said_s:.1f} s in")
    out.also["trace writing again"] = lambda: "trace" not in _health_error(d, rank) and os.path.getsize(path) > size
    return out


def fault_rolling(d: Deployment, echo) -> Outcome:
    """Every process but the last ordinary one restarted, one after another, then the solo rank: more than half
    the ranks come back as new collector instances (step ids going on from the clock); the others stay up."""
    began = time.monotonic()
    stale_before = int(d.progress().get("stale_records", 0) or 0)
    restarted: list[int] = []
    first = d.due()
    ordinary = len([g for g in d.groups if g is not d.solo])
    for index in range(ordinary - 1):
        ranks, first = d.restart_group(index)
        restarted += ranks
        time.sleep(RESTART_DOWN_S)
    d.kill_solo()
    time.sleep(RESTART_DOWN_S)
    first = d.restart_solo()
    restarted.append(d.solo_rank)
    out = Outcome(7, began, d.clock.time_of(first), first, full=True)
    out.kept_ranks = tuple(r for r in range(d.ranks) if r not in restarted)
    out.facts.append(f"{len(restarted)} of {d.ranks} ranks SIGKILLed and restarted as new collector instances, one "
                     f"process after another ({out.ended - began:.1f} s); the other {len(out.kept_ranks)} (ranks "
                     f"{', '.join(map(str, out.kept_ranks[:3]))}, ..., {out.kept_ranks[-1]}) stayed up")
    if len(restarted) * 2 <= d.ranks:
        out.problems.append(f"only {len(restarted)} of {d.ranks} ranks restarted: use --processes 3 or more")

    def no_stale() -> bool:
        return int(d.progress().get("stale_records", 0) or 0) == stale_before

    out.also["no record of a live instance stale"] = no_stale
    return out


def _status_mib(pid: int, key: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) >> 10
    return None


def fault_wide(d: Deployment, echo, stall_s: float) -> Outcome:
    """A second run of the same Redis whose ranks stall: metadata [16, 65536] of 4 ranks, rank 0's records only
    (all zeros) at the deployment's pace for stall_s, so that every step waits for its deadline; the aggregator
    (`--all`, one budget for both runs) must stay within its budget and the deployment's run go on."""
    from moe_monitor.aggregator.progress import decode_progress, state_key

    run = f"{d.run}-wide"
    meta = core.RunMeta(run=run, model_name="wide", layer_names=[f"layers.{i}.mlp" for i in range(WIDE_L)],
                        num_experts=WIDE_E, top_k=8, hidden_size=64, moe_intermediate_size=32, dtype_bytes=2,
                        layout=core.Layout(gpus=4, nodes=1,
                                           physical_to_logical_map=core.contiguous_layout(WIDE_L, WIDE_E)),
                        world_size=WIDE_WORLD, started_s=time.time(), host="bench", instance="wide0")
    assert d.aggregator is not None
    pid = d.aggregator.pid
    rss0 = _status_mib(pid, "VmRSS")
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # its peak resident set starts from now
    d.client.set(core.meta_key(run), core.encode_meta(meta))
    zeros = np.zeros((WIDE_L, WIDE_E), dtype=np.int32)
    began = time.monotonic()
    step = 0
    while time.monotonic() - began < stall_s:
        rec = core.StepRecord(run=run, rank=0, world_size=WIDE_WORLD, step=step, time_s=time.time(), phase="decode",
                              tokens=1, counts_LE=zeros, instance="wide0")
        d.client.xadd(core.steps_key(run), core.encode_step(rec))
        d.client.zadd(core.RUNS_KEY, {run: time.time()})
        step += 1
        time.sleep(max(0.0, began + step / d.steps_per_s - time.monotonic()))
    out = Outcome(8, began, time.monotonic(), d.due())
    budget_mib = int(WIDE_BUDGET.removesuffix("MiB"))
    out.facts.append(f"run {run!r}: {step} records of rank 0 of {WIDE_WORLD}, counts [{WIDE_L}, {WIDE_E}] (4 MiB a "
                     f"step as int32; {step * 8} MiB if every step waited for its deadline), {stall_s:g} s")

    def wide_read() -> bool:
        c = decode_progress(d.client.hgetall(state_key(run))).counters
        return c.steps_written + c.over_budget >= step

    out.also["the wide run aggregated"] = wide_read
    out.facts.append(f"the aggregator's resident set before: {rss0} MiB")

    def said() -> str:
        c = decode_progress(d.client.hgetall(state_key(run))).counters
        peak = _status_mib(pid, "VmHWM")
        if peak is None or rss0 is None:
            out.problems.append("the aggregator's resident set could not be read (/proc)")
        elif peak - rss0 > budget_mib + WIDE_SLACK_MIB:
            out.problems.append(f"the aggregator grew {peak - rss0} MiB: more than its budget {WIDE_BUDGET} + "
                                f"{WIDE_SLACK_MIB} MiB")
        return (f"the aggregator's peak resident set {peak} MiB ({'?' if peak is None or rss0 is None else peak - rss0}"
                f" MiB more; budget {WIDE_BUDGET}); the wide run: {c.steps_written} steps written, "
                f"{c.budget_writes} of them before their deadline to stay within the budget, {c.rank_steps_missing} "
                f"rank-steps missing, {c.over_budget} records skipped")

    out.later = said
    return out


def fault_failover(d: Deployment, echo, cluster) -> Outcome:
    began = time.monotonic()
    old, new = cluster.kill_master_of(core.steps_key(d.run))
    out = Outcome(4, began, time.monotonic(), d.due())
    out.facts.append(f"master :{old} of the run's slot SIGKILLed; its replica :{new} promoted "
                     f"{out.ended - began:.1f} s later (cluster-node-timeout 1 s)")
    out.deliberate = ("Redis replicates asynchronously: writes the old master had acknowledged but not yet sent to "
                      "its replica are gone with it; the writers counted them as landed and do not write them "
                      "again (how many depends on the moment of the kill: often none)")
    return out


# ------------------------------------------------------------------ running them
def recover(d: Deployment, out: Outcome, timeout_s: float = RECOVER_S) -> dict[str, float | None]:
    """Seconds from out.ended until each recovery condition held (None: not within timeout_s)."""
    every = (1 << d.ranks) - 1
    tail = d.tail
    assert tail is not None
    conditions: dict[str, Callable[[], bool]] = {
        "aggregate": lambda: d.aggregate_current(out.end_step) and (
            not out.full or tail.has_step_with(out.end_step, every)),
        # a tick after the aggregate got there (before, the page's newest step may be the per-rank feed's)
        "page": lambda: "aggregate" in at and d.page is not None and d.page.latest is not None
        and d.page.latest.t > at["aggregate"] and d.page_current(out.end_step, out.feed, out.full),
        **out.also,
    }
    if d.exporter is not None:
        exporter = d.exporter
        conditions["exporter"] = lambda: exporter.moved_since(out.ended)
    at: dict[str, float] = {}  # monotonic time each condition first held
    deadline = time.monotonic() + timeout_s
    while len(at) < len(conditions) and time.monotonic() < deadline:
        for name, condition in conditions.items():
            if name not in at and condition():
                at[name] = time.monotonic()
        time.sleep(0.1)
    times = {name: max(0.0, t - out.ended) for name, t in at.items()}
    return {name: times.get(name) for name in conditions}


def run_faults(d: Deployment, faults: list[int], echo, run_fault: Callable[[int], Outcome]) -> list[Row]:
    """Start the deployment, wait until it is current, then each fault in turn, each once the previous recovered;
    stop it and count."""
    d.start()
    warm = d.due() + round(2 * d.steps_per_s)
    took = wait_for(lambda: d.aggregate_current(warm) and d.page_current(warm)
                    and (d.exporter is None or d.exporter.serving), RECOVER_S)
    if took is None:
        raise RuntimeError(f"the deployment never became current (tail at step {d.tail.newest_step if d.tail else '?'}"
                           f", page {d.page.latest if d.page else None}, aggregator log in {d.tmp})")
    echo(f"  current {took:.1f} s after the start: aggregate at step {d.tail.newest_step if d.tail else '?'}, page "
         f"on the aggregate feed")
    rows: list[Row] = []
    for fault in faults:
        begin_step = d.due()
        echo(f"  fault {fault}: {NAMES[fault]} (at step {begin_step})")
        failures, state = d.writer_failures(), d.progress()
        out = run_fault(fault)
        out.begin_step = begin_step
        recovery = recover(d, out)
        time.sleep(SETTLE_S)
        until = time.monotonic()
        failed, dropped = (now - before for now, before in zip(d.writer_failures(), failures))
        out.facts.append(f"the writers: {failed:,} failed writes (each kept its batch and retried it), {dropped:,} "
                         "steps dropped (by their health reports)")
        out.facts.append("the aggregator: " + progress_delta(state, d.progress()))
        if out.later is not None:
            out.facts.append(out.later())
        page = said(d.page.looks if d.page else [], out.began - 1.0, until, out.ended, out.began)
        rows.append(Row(out, 0, 0, recovery, page,
                        d.exporter.said(out.began - 1.0, until, out.ended) if d.exporter else "exporter: off"))
        echo("    " + "; ".join(out.facts + out.problems))
        echo("    recovered: " + recovery_text(recovery))
    d.stop()
    vanished = d.tail.vanished(d.url) if d.tail else []
    # a fault's row starts IN_FLIGHT_S of steps before it began: steps still in flight or assembling then are its
    in_flight = round(IN_FLIGHT_S * d.steps_per_s)
    for i, row in enumerate(rows):
        row.lo = 0 if i == 0 else max(rows[i - 1].lo + 1, row.outcome.begin_step - in_flight)
        if i:
            rows[i - 1].hi = row.lo
    if rows:
        rows[-1].hi = d.stop_step or rows[-1].lo + 1
    d.stranded = d.stranded_entries()
    if d.stranded and rows:
        rows[-1].outcome.facts.append(
            f"{d.stranded} entries of the steps stream were delivered to an aggregator and are still not "
            "acknowledged at the end (idle > 5 s while it is caught up): the aggregator claims back entries "
            "delivered by a read whose reply never reached it after a failed round, so these are a bug")
    tail = d.tail
    if tail is not None and (tail.bad or tail.errors):
        rows[-1].outcome.facts.append(f"the tail of the aggregate: {tail.bad} entries that did not decode, "
                                      f"{tail.errors} failed reads (last: {tail.last_error[:120]!r})")
    for row in rows:
        row.tally = d.tally(row.lo, row.hi, vanished)
        if row.outcome.kept_ranks:  # every rank-step of the ranks that stayed up must have been read
            kept = d.tally(row.lo, row.hi, vanished, ranks=row.outcome.kept_ranks)
            row.outcome.facts.append(f"the {len(row.outcome.kept_ranks)} ranks that stayed up: written "
                                     f"{kept.written:,}, read {kept.read:,}, lost {kept.lost:,}")
            if kept.lost or kept.read != kept.written:
                row.outcome.problems.append(f"{kept.lost:,} rank-steps of ranks that stayed up were not read")
        for step in sorted({step for step, _ in row.tally.lost_sample})[:3]:
            held = [e for e in tail.snapshot() if e.step == step] if tail is not None else []
            row.outcome.facts.append(
                f"step {step} lost rank(s) {[r for s, r in row.tally.lost_sample if s == step]}; its aggregate "
                "entries: " + ("none" if not held else ", ".join(
                    f"{bin(e.ranks).count('1')} ranks{' late' if e.late else ''} (epoch {e.epoch[:14]}, read "
                    f"{e.seen_s - row.outcome.ended:+.1f} s after the fault's end)" for e in held)))
        if row.outcome.deliberate:
            row.outcome.facts.append(f"rank-steps the writers saw acknowledged and the stream lost with the old "
                                     f"master: {row.tally.lost:,}")
        gone = [e for e in vanished if row.lo <= e.step < row.hi]
        if gone:
            ranks = sum(bin(e.ranks).count("1") for e in gone)
            row.outcome.facts.append(f"{len(gone)} aggregate entries ({ranks} rank-steps) the tail had read are no "
                                     "longer in the stream (taken back by the failover)")
    return rows


def progress_delta(before: dict[str, str], after: dict[str, str]) -> str:
    """What the aggregator's progress hash counted over a fault (its counters are cumulative)."""
    def grew(name: str) -> int:
        try:
            return int(after.get(name, 0)) - int(before.get(name, 0))
        except ValueError:
            return 0

    return (f"{grew('rank_steps_missing'):,} rank-steps missing when their step was written at its deadline "
            f"({grew('late_ranks'):,} of them folded in late), {grew('duplicates'):,} duplicate records skipped, "
            f"{grew('stale_records'):,} stale, {grew('too_old'):,} too old")


def recovery_text(recovery: dict[str, float | None]) -> str:
    never = f"not within {RECOVER_S:.0f} s"
    return ", ".join(f"{name} {never if s is None else f'{s:.1f} s'}" for name, s in recovery.items())


def trace_figures(path: str | None) -> str:
    """Step lines of a trace file (distinct steps) and lines that do not parse (a line cut by the full disk)."""
    if path is None or not os.path.exists(path):
        return "no trace file"
    steps: set[int] = set()
    bad = lines = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            lines += 1
            try:
                fields = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if fields.get("kind") == "step":
                steps.add(int(fields["step"]))
    span = f"steps {min(steps)}..{max(steps)}" if steps else "no step"
    return f"{len(steps):,} distinct steps in the trace ({span}), {bad} line(s) that do not parse of {lines:,}"


@dataclass
class Suite:
    load_before: tuple[float, float, float]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stranded: int = 0  # steps-stream entries delivered to an aggregator and never acknowledged, at the end

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(row.ok for row in self.rows)


def run_suite(faults: list[int], ranks: int = 32, steps_per_s: float = 20.0, processes: int = 2,
              stall_s: float = 10.0, disk_full_s: float = 5.0, lease_s: float = 5.0, exporter: bool = True,
              tmp: Path | None = None, echo=print) -> Suite:
    """The faults asked for (their numbers; 1, 2, 3, 5, 6 in one single-Redis run, 4 against a cluster)."""
    unknown = sorted(set(faults) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}: choose from {sorted(NAMES)}")
    suite = Suite(os.getloadavg())
    began = time.monotonic()
    tmp = Path(tmp or tempfile.mkdtemp(prefix="bench-faults-"))
    single = [f for f in SINGLE if f in faults]
    if single:
        folder = tmp / "single"
        folder.mkdir(parents=True, exist_ok=True)
        server = start_redis(str(folder), 1 << 30, "noeviction")
        d = Deployment(server.url, "faults", ranks, steps_per_s, folder, processes, lease_s=lease_s,
                       exporter=exporter)
        echo(f"== one private redis-server: {ranks} ranks x {steps_per_s:g} steps/s, faults {single}")

        def one(fault: int) -> Outcome:
            if fault == 1:
                return fault_rank(d, echo)
            if fault == 2:
                return fault_aggregator(d, echo)
            if fault == 3:
                return fault_lease(d, echo)
            if fault == 5:
                return fault_stall(d, echo, server.proc.pid, stall_s)
            if fault == 7:
                return fault_rolling(d, echo)
            return fault_disk(d, echo, disk_full_s)

        try:
            suite.rows += run_faults(d, single, echo, one)
            suite.stranded += d.stranded
            state = d.progress()
            suite.notes.append("single Redis: aggregator progress " + ", ".join(
                f"{k} {state[k]}" for k in ("steps_written", "rank_steps_missing", "late_ranks", "duplicates",
                                            "stale_records", "too_old") if k in state))
            if 6 in single and d.solo is not None:
                label = d.solo.config.label
                mine = [r for g in d.reports if g.label == label for r in g.ranks]
                suite.notes.append(f"trace of rank {d.solo_rank} (its last instance, {label}): "
                                   f"{trace_figures(d.trace_path)}; its Redis sink published "
                                   + ", ".join(f"{r.published:,} steps from step {r.first_step} (trace sink: "
                                               f"{r.trace_published} published, {r.trace_failures} failed writes)"
                                               for r in mine))
        finally:
            d.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.proc.pid, signal.SIGCONT)
            server.stop()
    if 8 in faults:
        folder = tmp / "wide"
        folder.mkdir(parents=True, exist_ok=True)
        server = start_redis(str(folder), 1 << 30, "noeviction")
        d = Deployment(server.url, "faults", ranks, steps_per_s, folder, processes, lease_s=lease_s,
                       exporter=exporter, aggregate_all=True, memory_budget=WIDE_BUDGET)
        echo(f"== one private redis-server, the aggregator with --all --memory-budget {WIDE_BUDGET}: {ranks} ranks x "
             f"{steps_per_s:g} steps/s, fault 8")
        try:
            suite.rows += run_faults(d, [8], echo, lambda fault: fault_wide(d, echo, stall_s))
            suite.stranded += d.stranded
        finally:
            d.close()
            server.stop()
    if 4 in faults:
        from moe_monitor.demo.localcluster import LocalCluster

        folder = tmp / "cluster"
        folder.mkdir(parents=True, exist_ok=True)
        cluster = LocalCluster(folder, masters=3, replicas=1)
        try:
            run = "faults-cluster"
            home = cluster.master_of(core.steps_key(run))
            # the URL everything connects through: a master that is not killed (a fresh client still finds one)
            url = cluster.url_of(next(port for port in cluster.masters() if port != home))
            d = Deployment(url, run, ranks, steps_per_s, folder, processes, lease_s=lease_s, exporter=exporter)
            echo(f"== private Redis Cluster, 3 masters x 1 replica: {ranks} ranks x {steps_per_s:g} steps/s, fault 4")
            try:
                suite.rows += run_faults(d, [4], echo, lambda fault: fault_failover(d, echo, cluster))
                suite.stranded += d.stranded
                state = d.progress()
                suite.notes.append("cluster: aggregator progress " + ", ".join(
                    f"{k} {state[k]}" for k in ("steps_written", "rank_steps_missing", "late_ranks", "duplicates",
                                                "stale_records", "too_old") if k in state))
            finally:
                d.close()
        finally:
            cluster.stop()
    suite.rows.sort(key=lambda row: row.outcome.fault)
    suite.seconds = time.monotonic() - began
    return suite


# ------------------------------------------------------------------ the table
def print_table(suite: Suite, echo=print) -> None:
    echo("")
    echo("| # | fault | step ids | written | read (aggregate) | lost | recovered after the fault's end | page said |")
    echo("|---|---|---|---|---|---|---|---|")
    marks: dict[int, int] = {}
    for row in suite.rows:
        t = row.tally
        lost = "-" if t is None else f"{t.lost:,}"
        if t is not None and row.outcome.deliberate:
            marks[row.outcome.fault] = len(marks) + 1
            lost += f" [{marks[row.outcome.fault]}]"
        recovered = ", ".join(f"{name} {'-' if s is None else f'{s:.1f} s'}" for name, s in row.recovery.items())
        echo(f"| {row.outcome.fault} | {NAMES[row.outcome.fault]} | {row.lo}-{row.hi - 1} | "
             f"{t.written if t else 0:,} | {t.read if t else 0:,} | {lost} | {recovered} | {row.page.short()} |")
    for row in suite.rows:
        echo(f"\nfault {row.outcome.fault} ({NAMES[row.outcome.fault]}), steps {row.lo}..{row.hi - 1}"
             + ("" if row.ok else "  <-- NOT OK"))
        for fact in row.outcome.facts + [f"PROBLEM: {p}" for p in row.outcome.problems]:
            echo(f"  {fact}")
        t = row.tally
        if t is not None:
            echo(f"  written {t.written:,}, read {t.read:,}, lost {t.lost:,}, read but not counted written "
                 f"{t.extra:,}, rank-steps in two entries {t.twice:,}")
            if t.lost_sample:
                echo("  written, never read (step, rank): " + ", ".join(f"({s}, {r})" for s, r in t.lost_sample))
        echo(f"  recovered: {recovery_text(row.recovery)}")
        for line in row.page.lines():
            echo(f"  page: {line}")
        echo(f"  {row.exporter}")
    for fault, mark in marks.items():
        row = next(r for r in suite.rows if r.outcome.fault == fault)
        echo(f"\n[{mark}] deliberate loss, fault {fault}: {row.tally.lost if row.tally else 0:,} rank-steps. "
             f"{row.outcome.deliberate}.")
    for note in suite.notes:
        echo(note)
