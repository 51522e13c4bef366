"""The aggregator against a real redis-server: exact sums, missing and late ranks, duplicates, malformed entries,
two aggregators at once, a holder killed, Redis killed and restarted empty, collector restarts, the CLI."""
from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy as np
import pytest
import redis

from moe_monitor import core
from moe_monitor.aggregator import Aggregator
from moe_monitor.aggregator.commit import Committer
from moe_monitor.aggregator.options import GROUP
from moe_monitor.aggregator.progress import state_key
from moe_monitor.cli import build_parser, main
from moe_monitor.cli.aggregate import aggregate
from tests.support.aggregates import aggregates, drive, options, publish, rank_record
from tests.support.redisfaults import FaultyRedis
from tests.support.waiting import wait_until

L, E = 4, 16


def step_record(run: str, step: int, rank: int, world: int = 4, inst: str = "c", counts=None,
                phase: str = "decode") -> core.StepRecord:
    """Rank `rank`'s record of a step, sent now; counts: random L x E counts (seeded by run, step, rank, inst)
    when None."""
    if counts is None:
        counts = np.random.default_rng(hash((run, step, rank, inst)) % 2**32).integers(0, 300, (L, E))
    return rank_record(run, step, rank, counts, world, instance=inst, phase=phase)


def aggregator(url: str, run: str, lines: list[str] | None = None, **change) -> Aggregator:
    return Aggregator(url, run, options(**change), log=(lines.append if lines is not None else lambda _: None))


@pytest.fixture
def server(tmp_path):
    """A private redis-server that the test may kill and restart (tests.support.redisfaults), stopped after it."""
    server = FaultyRedis(tmp_path)
    yield server
    server.stop()


def by_step(records: list[core.AggregateRecord]) -> dict[tuple[str, int], list[core.AggregateRecord]]:
    out: dict[tuple[str, int], list[core.AggregateRecord]] = {}
    for rec in records:
        out.setdefault((rec.instance, rec.step), []).append(rec)
    return out


def check_exact(client, run: str, sent: list[core.StepRecord]) -> dict:
    """Every step's entries (one epoch) together hold each rank once and sum exactly the raw records sent; one
    non-late entry a step. Returns the entries by (epoch, step)."""
    steps = by_step(aggregates(client, run))
    assert len({epoch for epoch, _ in steps}) <= 1
    raw: dict[int, np.ndarray] = {}
    ranks: dict[int, list[int]] = {}
    for rec in sent:
        raw[rec.step] = raw.get(rec.step, 0) + rec.counts_LE.astype(np.int64)
        ranks.setdefault(rec.step, []).append(rec.rank)
    for (_, step), entries in steps.items():
        assert sum(not e.late for e in entries) == 1, f"step {step} written {len(entries)} times"
        got = sorted(r for e in entries for r in e.ranks_R.tolist())
        assert got == sorted(set(got)) == sorted(ranks[step]), f"step {step}: ranks {got}"
        assert (sum(e.counts_LE for e in entries) == raw[step]).all()
    assert {step for _, step in steps} == set(raw)
    return steps


def pending(client, run: str) -> int:
    return int(client.xpending(core.steps_key(run), GROUP)["pending"])


def test_sums_equal_the_raw_records_and_every_entry_is_acked(redis_url):
    client = core.connect(redis_url)
    sent = [step_record("exact", s, r) for s in range(25) for r in (2, 0, 3, 1)]
    publish(client, sent)
    agg = aggregator(redis_url, "exact")
    assert drive([agg], lambda: agg.counters.steps_written == 25)
    steps = check_exact(client, "exact", sent)
    assert len(steps) == 25 and all(not e.late and e.missing_ranks.size == 0 for v in steps.values() for e in v)
    assert pending(client, "exact") == 0 and agg.counters.rank_steps_missing == 0
    state = client.hgetall(state_key("exact"))
    assert state[b"steps_written"] == b"25" and state[b"last_step"] == b"24"
    assert state[b"consumer"] == agg.consumer.encode()
    assert drive([agg], lambda: client.hget(state_key("exact"), "lag_entries") == b"0")
    agg.close()
    assert client.get(core.aggregator_key("exact")) is None  # released


def test_a_missing_rank_is_named_after_the_deadline_and_folded_in_when_it_arrives_late(redis_url):
    client = core.connect(redis_url)
    lines: list[str] = []
    sent = [step_record("late", s, r) for s in range(4) for r in range(4) if (s, r) != (2, 1)]
    publish(client, sent)
    agg = aggregator(redis_url, "late", lines)
    assert drive([agg], lambda: agg.counters.steps_written == 4)
    short = by_step(aggregates(client, "late"))[("c", 2)]
    assert short[0].missing_ranks.tolist() == [1] and agg.counters.rank_steps_missing == 1
    assert drive([agg], lambda: any("without ranks [1]" in line for line in lines))
    rank1 = step_record("late", 2, 1)
    publish(client, [rank1])
    assert drive([agg], lambda: agg.counters.late_ranks == 1)
    entries = by_step(aggregates(client, "late"))[("c", 2)]
    assert [e.late for e in entries] == [False, True] and entries[1].ranks_R.tolist() == [1]
    check_exact(client, "late", sent + [rank1])
    assert pending(client, "late") == 0
    agg.close()


def test_duplicates_are_skipped_and_counted(redis_url):
    client = core.connect(redis_url)
    sent = [step_record("dup", s, r) for s in range(3) for r in range(4)]
    publish(client, sent[:6] + sent[:2] + sent[6:])  # step 0's first ranks again while it assembles
    agg = aggregator(redis_url, "dup")
    assert drive([agg], lambda: agg.counters.steps_written == 3)
    publish(client, sent[-1:])  # again after its step was written
    assert drive([agg], lambda: agg.counters.duplicates == 3)
    check_exact(client, "dup", sent)
    assert pending(client, "dup") == 0 and len(aggregates(client, "dup")) == 3
    agg.close()


def test_malformed_entries_are_acked_counted_and_reported_in_one_line(redis_url):
    client = core.connect(redis_url)
    lines: list[str] = []
    key = core.steps_key("bad")
    good = [step_record("bad", 0, r) for r in range(4)]
    publish(client, good[:2])
    client.xadd(key, {"v": 2, "run": "bad"})  # missing fields
    fields = core.encode_step(step_record("bad", 1, 0))
    client.xadd(key, {**fields, "counts": b"\x00\x01"})  # counts cut short
    client.xadd(key, core.encode_step(step_record("other", 1, 0)))  # another run's record
    publish(client, good[2:])
    agg = aggregator(redis_url, "bad", lines)
    assert drive([agg], lambda: agg.counters.steps_written == 1 and agg.counters.bad_records == 3)
    assert pending(client, "bad") == 0
    assert drive([agg], lambda: any("3 malformed entries" in line for line in lines))
    assert client.hget(state_key("bad"), "bad_records") == b"3"
    check_exact(client, "bad", good)
    agg.close()


def test_two_aggregators_at_once_write_each_step_exactly_once(redis_url):
    client = core.connect(redis_url)
    first, second = aggregator(redis_url, "twice"), aggregator(redis_url, "twice")
    sent = []
    for s in range(30):
        batch = [step_record("twice", s, r) for r in range(4) if (s % 7, r) != (3, 2)]
        sent += batch
        publish(client, batch)
        for agg in (first, second):
            agg.step()
    assert drive([first, second], lambda: first.counters.steps_written + second.counters.steps_written == 30)
    assert sorted([first.holder, second.holder]) == [False, True]
    steps = check_exact(client, "twice", sent)
    assert len(steps) == 30 and pending(client, "twice") == 0
    first.close()
    second.close()


def test_killing_the_holder_lets_the_standby_take_over_without_losing_or_repeating_a_step(redis_url):
    client = core.connect(redis_url)
    holder = aggregator(redis_url, "kill", deadline_s=5.0)
    lines: list[str] = []
    standby = aggregator(redis_url, "kill", lines, deadline_s=5.0)
    sent = [step_record("kill", s, r) for s in range(6) for r in range(4)]
    sent += [step_record("kill", s, r) for s in range(6, 12) for r in range(3)]  # rank 3 not there yet
    publish(client, sent)
    assert drive([holder, standby], lambda: holder.counters.steps_written == 6 and pending(client, "kill") == 18)
    assert holder.holder and not standby.holder
    holder.abandon()  # stops without releasing: its lease expires, its 18 entries stay pending
    rank3 = [step_record("kill", s, 3) for s in range(6, 12)]
    late = step_record("kill", 4, 3, counts=np.ones((L, E)))  # a duplicate of a step the holder wrote
    publish(client, rank3 + [late])
    assert drive([standby], lambda: standby.counters.steps_written == 12, timeout_s=15)
    assert any("18 pending entries claimed" in line for line in lines)
    steps = check_exact(client, "kill", sent + rank3)
    assert len(steps) == 12 and standby.counters.duplicates == 1 and pending(client, "kill") == 0
    assert client.hget(state_key("kill"), "steps_written") == b"12"  # counters carried over
    standby.close()


def test_a_successor_of_a_trimmed_aggregate_stream_places_late_ranks_only_where_it_can_tell(redis_url):
    client = core.connect(redis_url)
    sent = [step_record("trimmed", s, r) for s in range(40) for r in range(4) if (s, r) not in ((5, 3), (38, 3))]
    publish(client, sent)
    first = aggregator(redis_url, "trimmed", agg_maxlen=16)
    assert drive([first], lambda: first.counters.steps_written == 40)
    first.close()
    assert client.xlen(core.aggregate_key("trimmed")) < 40  # MAXLEN ~ 16 trimmed it
    lines: list[str] = []
    second = aggregator(redis_url, "trimmed", lines, agg_maxlen=16)
    again = [step_record("trimmed", 5, 3), step_record("trimmed", 38, 3), step_record("trimmed", 2, 0),
             step_record("trimmed", 39, 0)]
    publish(client, again)
    assert drive([second], lambda: second.counters.too_old + second.counters.late_ranks
                 + second.counters.duplicates == 4)
    # steps 5 and 38 went short at their deadline, after the others: the tail knows them, rank 3 is late.
    # Step 2 is older than the tail: whether its rank 0 was written cannot be told, so it is dropped, never
    # doubled; step 39's rank 0 is a duplicate.
    assert (second.counters.too_old, second.counters.late_ranks, second.counters.duplicates) == (1, 2, 1), lines
    late = [e for e in aggregates(client, "trimmed") if e.late]
    assert sorted((e.step, e.ranks_R.tolist()) for e in late) == [(5, [3]), (38, [3])]
    assert any("horizon" in line and "horizon 0" not in line for line in lines)
    second.close()


def test_a_holder_that_stalled_past_its_lease_cannot_commit_and_its_entries_are_reclaimed(redis_url):
    client = core.connect(redis_url)
    stalled = aggregator(redis_url, "stall", deadline_s=5.0)
    other = aggregator(redis_url, "stall", deadline_s=5.0)
    sent = [step_record("stall", 0, r) for r in range(4)] + [step_record("stall", 1, r) for r in range(3)]
    publish(client, sent)
    assert drive([stalled], lambda: stalled.counters.steps_written == 1 and pending(client, "stall") == 3)
    time.sleep(0.7)  # the lease expires while "stalled" hangs
    assert drive([other], lambda: other.holder and other.synced)  # claims step 1's three entries
    rank3 = step_record("stall", 1, 3)
    publish(client, [rank3])
    stalled._renew_at = math.inf  # it hung right after renewing: it reads before it notices
    commits = stalled.commits
    stalled.step()  # reads rank 3, completes step 1 from memory; the commit's WATCH of the lease refuses it
    assert not stalled.holder and stalled.commits == commits
    assert [e.step for e in aggregates(client, "stall")] == [0]
    # rank 3's entry was delivered to "stalled": the holder claims it once it is idle for two leases
    assert drive([other, stalled], lambda: other.counters.steps_written == 2, timeout_s=5)  # counted on from 1
    check_exact(client, "stall", sent + [rank3])
    assert pending(client, "stall") == 0 and not stalled.holder
    other.close()


def test_redis_killed_and_restarted_empty_costs_no_crash_and_loses_nothing_buffered(server):
    client = server.client()
    lines: list[str] = []
    agg = aggregator(server.url, "faulty", lines, deadline_s=0.6, timeout_s=0.3, block_ms=10)
    first = [step_record("faulty", s, r) for s in range(3) for r in range(4)]
    publish(client, first)
    assert drive([agg], lambda: agg.counters.steps_written == 3)
    short = [step_record("faulty", 3, r) for r in range(3)]
    publish(client, short)
    assert drive([agg], lambda: agg.assembler.pending_steps == 1)
    server.kill()
    for _ in range(30):
        agg.step()  # no exception: counted, reported, backed off
        time.sleep(0.03)
    assert agg.redis_errors >= 1 and sum("failed" in line for line in lines) == 1
    assert agg.assembler.pending_steps == 1  # step 3 waits in memory (its entries were read, not acked)
    server.start()
    client = server.client()
    assert drive([agg], lambda: len(aggregates(client, "faulty")) == 1, timeout_s=15)
    (kept,) = aggregates(client, "faulty")
    assert kept.step == 3 and kept.missing_ranks.tolist() == [3]
    assert any("answers again" in line for line in lines)
    after = [step_record("faulty", s, r) for s in range(4, 6) for r in range(4)]
    publish(client, after)
    assert drive([agg], lambda: agg.counters.steps_written == 6, timeout_s=10)
    assert agg.holder and client.get(core.aggregator_key("faulty")) == agg.consumer.encode()
    check_exact(client, "faulty", short + after)
    agg.close()


class LostReplyCommitter(Committer):
    """A committer whose next commit lands in Redis but whose reply is lost on the way back (as when the
    connection breaks during EXEC): Redis is real, only the reply is dropped."""

    lose_next = False

    def _watchable_transaction(self):
        pipe = super()._watchable_transaction()
        execute = pipe.execute

        def landed_but_lost(*args, **kwargs):
            replies = execute(*args, **kwargs)
            if self.lose_next:
                self.lose_next = False
                raise redis.exceptions.ConnectionError("connection lost while reading the EXEC reply")
            return replies

        pipe.execute = landed_but_lost
        return pipe


class LostReply(Aggregator):
    """An aggregator writing through LostReplyCommitter."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.committer = LostReplyCommitter(self.client, self.run, self.consumer, self.options, self._report_error)


def test_a_commit_whose_reply_was_lost_is_not_written_again(redis_url):
    client = core.connect(redis_url)
    agg = LostReply(redis_url, "lost", options(), log=lambda _: None)
    assert drive([agg], lambda: agg.synced)
    agg.committer.lose_next = True
    sent = [step_record("lost", s, r) for s in range(3) for r in range(4)]
    publish(client, sent)
    assert drive([agg], lambda: agg.redis_errors == 1 and agg.counters.steps_written == 3)
    assert drive([agg], lambda: agg.stats()["buffered"] == (0, 0, 0) and agg.commits >= 2)
    check_exact(client, "lost", sent)
    assert len(aggregates(client, "lost")) == 3 and pending(client, "lost") == 0
    agg.close()


def test_writes_refused_by_a_full_redis_cost_one_message_and_lose_nothing(server):
    client = server.client()
    lines: list[str] = []
    agg = aggregator(server.url, "full", lines)
    publish(client, [step_record("full", 0, r) for r in range(4)])
    assert drive([agg], lambda: agg.counters.steps_written == 1)
    sent = [step_record("full", s, r) for s in range(1, 4) for r in range(4)]
    publish(client, sent)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(used // 2))  # every write that may grow memory is refused (OOM)
    for _ in range(20):
        agg.step()
        time.sleep(0.02)
    assert agg.redis_errors >= 1 and sum("failed" in line and "maxmemory" in line for line in lines) == 1, lines
    assert len(aggregates(client, "full")) == 1 and agg.stats()["buffered"][0] == 3  # refused as a whole
    client.config_set("maxmemory", "0")
    assert drive([agg], lambda: len(aggregates(client, "full")) == 4)
    check_exact(client, "full", [step_record("full", 0, r) for r in range(4)] + sent)
    assert pending(client, "full") == 0
    agg.close()


def test_a_whole_job_restart_starts_a_new_epoch_once_most_ranks_restarted_and_loses_nothing(redis_url):
    client = core.connect(redis_url)
    old = [step_record("epochs", s, r, inst=f"old{r}") for s in range(5) for r in range(4) if (s, r) != (4, 3)]
    # the new job's collectors write 10 s after the old ones' last records (the old ones stopped)
    new = [dataclasses.replace(step_record("epochs", s, r, inst=f"new{r}"), time_s=time.time() + 10)
           for s in range(3) for r in range(4)]
    stale = step_record("epochs", 4, 3, inst="old3")
    publish(client, old + new[:4] + [stale] + new[4:])  # old3's step 4 arrives after rank 3 restarted too
    agg = aggregator(redis_url, "epochs", deadline_s=5.0)
    assert drive([agg], lambda: agg.counters.steps_written == 8)
    written = [(e.instance, e.step, e.late) for e in aggregates(client, "epochs")]
    # ranks 0 and 1 restarting are held (2 of 4 is not most); rank 2 makes it most: the epoch is named after it
    assert written == [("old0", s, False) for s in range(5)] + [("new2", s, False) for s in range(3)]
    steps = by_step(aggregates(client, "epochs"))
    assert steps[("old0", 4)][0].missing_ranks.tolist() == [3]  # flushed first, short, long before its deadline
    for s in range(3):  # the held first records of ranks 0 and 1 went into the new epoch: nothing lost
        assert steps[("new2", s)][0].ranks_R.tolist() == [0, 1, 2, 3]
        assert (steps[("new2", s)][0].counts_LE == sum(r.counts_LE for r in new if r.step == s)).all()
    assert agg.counters.epochs == 2 and agg.counters.stale_records == 1 and agg.counters.held_records == 0
    assert pending(client, "epochs") == 0
    assert client.hget(state_key("epochs"), "epoch") == b"new2"
    agg.close()


def test_the_raw_stream_is_trimmed_behind_what_was_consumed_but_not_past_pending_steps(redis_url):
    client = core.connect(redis_url)
    agg = aggregator(redis_url, "trim", keep_raw_s=0.2, deadline_s=2.0)
    waiting = [step_record("trim", 0, r) for r in range(3)]
    publish(client, waiting)
    time.sleep(0.3)
    publish(client, [step_record("trim", s, r) for s in range(1, 4) for r in range(4)])
    assert drive([agg], lambda: agg.counters.steps_written == 3)
    time.sleep(0.3)
    publish(client, [step_record("trim", s, r) for s in range(4, 6) for r in range(4)])
    assert drive([agg], lambda: agg.counters.steps_written == 5)
    time.sleep(1.0)
    agg.step()
    assert client.xlen(core.steps_key("trim")) == 3 + 12 + 8  # step 0 waits: nothing before it may go
    assert drive([agg], lambda: agg.counters.steps_written == 6, timeout_s=6)
    publish(client, [step_record("trim", 9, r) for r in range(4)])
    assert drive([agg], lambda: client.xlen(core.steps_key("trim")) <= 4 + 8, timeout_s=3)
    agg.close()


def test_the_cli_aggregates_every_run_and_picks_up_new_ones(redis_url, capsys):
    client = core.connect(redis_url)
    for run in ("cli-a", "cli-b"):
        publish(client, [step_record(run, s, r) for s in range(3) for r in range(4)])
        client.zadd(core.RUNS_KEY, {run: time.time()})
    stop = threading.Event()
    args = ["--redis", redis_url, "--all", "--deadline-s", "0.3", "--lease-s", "1", "--discover-s", "0.2",
            "--log-every-s", "0.5", "--duration-s", "20"]
    worker = threading.Thread(target=aggregate, args=(build_parser().parse_args(["aggregate", *args]), stop))
    worker.start()
    try:
        assert wait_until(lambda: all(len(aggregates(client, run)) == 3 for run in ("cli-a", "cli-b")))
        publish(client, [step_record("cli-c", s, r) for s in range(2) for r in range(4)])
        client.zadd(core.RUNS_KEY, {"cli-c": time.time()})
        assert wait_until(lambda: len(aggregates(client, "cli-c")) == 2)
    finally:
        stop.set()
        worker.join(10)
    assert not worker.is_alive()
    assert all(client.get(core.aggregator_key(run)) is None for run in ("cli-a", "cli-b", "cli-c"))
    assert main(["aggregate", "--redis", "http://nowhere", "--run", "x"]) == 2
    assert "must start with redis://" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["aggregate", "--redis", redis_url])  # --run or --all is required


def test_an_aggregate_stream_at_the_last_possible_id_is_said_once_and_what_waits_is_bounded(redis_url, monkeypatch):
    from moe_monitor.aggregator import commit

    monkeypatch.setattr(commit, "MAX_KEPT_RECORDS", 3)
    client = core.connect(redis_url)
    client.xadd(core.aggregate_key("exhausted"), {"x": "y"}, id="18446744073709551615-18446744073709551615")
    publish(client, [step_record("exhausted", s, r) for s in range(6) for r in range(4)])
    lines: list[str] = []
    agg = aggregator(redis_url, "exhausted", lines)
    assert drive([agg], lambda: agg.counters.steps_written == 6 and agg.committer.records_given_up == 3)
    assert "holds the last possible id" in agg.last_error and "DEL moe:{exhausted}:agg" in agg.last_error
    assert "3 kept for the next commit; 3 given up" in agg.last_error
    assert sum("holds the last possible id" in line for line in lines) == 1  # said once, not every commit
    client.delete(core.aggregate_key("exhausted"))  # what the message says to do: the kept ones land
    assert drive([agg], lambda: len(aggregates(client, "exhausted")) == 3)
    assert [a.step for a in aggregates(client, "exhausted")] == [3, 4, 5]
    agg.close()


def test_entries_delivered_while_redis_was_stopped_are_read_again(server):
    """A read that timed out while Redis was stopped still runs when Redis resumes: its entries are delivered to
    the aggregator's consumer, whose reply never arrives. They are claimed back after the failed round."""
    client = server.client()
    agg = Aggregator(server.url, "stall", options(timeout_s=0.5, lease_s=5.0), log=lambda _: None)
    publish(client, [step_record("stall", 0, r, world=2) for r in range(2)])
    assert drive([agg], lambda: agg.counters.steps_written == 1)
    publish(client, [step_record("stall", 1, r, world=2) for r in range(2)])  # not read yet
    server.stall()
    try:
        assert not agg.step() and agg.redis_errors == 1  # its XREADGROUP is queued inside the stopped Redis
    finally:
        server.resume()
    delivered = lambda: client.xpending(core.steps_key("stall"), GROUP)["pending"] == 2  # noqa: E731
    assert wait_until(delivered), "the stopped read did not run on resume"
    assert drive([agg], lambda: agg.counters.steps_written == 2, timeout_s=20)
    assert agg.recovered_entries == 2 and pending(client, "stall") == 0
    (last,) = [a for a in aggregates(client, "stall") if a.step == 1]
    assert last.ranks_R.tolist() == [0, 1]
    agg.close()
