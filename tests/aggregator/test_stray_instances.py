"""Records under new collector instance ids that stop at once (strays) never silence the
collectors that keep writing, for the Assembler (the aggregator's and the reader's) and for the dashboard's
reader over a real redis-server; a new epoch whose retired instances keep writing is undone."""
from __future__ import annotations

import time

import numpy as np

from moe_monitor import core
from moe_monitor.core.assembly import Assembler
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from tests.support import synthfill

L, E, WORLD, RATE = 2, 8, 4, 10.0


def rec(step: int, rank: int, inst: str, t: float) -> core.StepRecord:
    counts = np.full((L, E), step + 1, dtype=np.int32)
    return core.StepRecord(run="r", rank=rank, world_size=WORLD, step=step, time_s=t, phase="decode", tokens=1,
                           counts_LE=counts, instance=inst)


class Stream:
    """Entries with stream ids, fed to an Assembler at the arrival times of a 10 steps/s run."""

    def __init__(self):
        self.assembler = Assembler("r", deadline_s=1.0)
        self.n = 0
        self.steps: dict[int, set[int]] = {}  # step -> ranks written (on time or late)

    def feed(self, records: list[core.StepRecord], now_s: float) -> None:
        entries = []
        for r in records:
            self.n += 1
            entries.append((f"{self.n}-0".encode(), r))
        out = self.assembler.add(entries, now_s)
        out.extend(self.assembler.due(now_s))
        for emitted in out.emitted:
            self.steps.setdefault(emitted.record.step, set()).update(emitted.record.ranks_R.tolist())

    def run_steps(self, first: int, last: int, t0: float, ranks=range(WORLD), inst="a") -> float:
        t = t0
        for step in range(first, last + 1):
            t = t0 + (step - first + 1) / RATE
            self.feed([rec(step, r, f"{inst}{r}", t) for r in ranks], t)
        return t


def test_stray_records_of_most_ranks_leave_every_honest_record_counted():
    s = Stream()
    t = s.run_steps(0, 9, 100.0)
    s.feed([rec(0, r, f"stray{r}", t) for r in range(3)], t)  # ranks 0, 1, 2 "restarted", then nothing more
    t = s.run_steps(10, 39, t)  # 30 more steps x 4 ranks: 120 honest records
    s.feed([], t + 10)  # every deadline passed
    a = s.assembler
    assert all(s.steps.get(step) == set(range(WORLD)) for step in range(10, 40)), {
        k: v for k, v in s.steps.items() if k >= 10 and v != set(range(WORLD))}
    assert a.counters.stale_records == 0 and a.counters.epochs == 1 and a.last_step == 39
    assert a.instance_of_rank == {r: f"a{r}" for r in range(WORLD)}
    assert a.held_count == 0 and a.counters.held_records == 3  # the strays' records: given up, counted


def test_one_stray_record_never_silences_that_ranks_collector():
    s = Stream()
    t = s.run_steps(0, 9, 100.0)
    s.feed([rec(0, 2, "stray2", t)], t)
    t = s.run_steps(10, 39, t)
    s.feed([], t + 10)
    assert all(2 in s.steps.get(step, ()) for step in range(10, 40))
    assert s.assembler.counters.stale_records == 0


def test_a_new_epoch_opened_during_a_pause_is_undone_when_the_collectors_go_on():
    s = Stream()
    t = s.run_steps(0, 9, 100.0)
    t += 30.0  # the job pauses 30 s (a checkpoint); strays of 3 ranks arrive meanwhile
    s.feed([rec(0, r, f"stray{r}", t) for r in range(3)], t)
    assert s.assembler.counters.epochs == 2  # it did look like most ranks restarted
    t = s.run_steps(10, 39, t)
    s.feed([], t + 10)
    a = s.assembler
    assert a.counters.epochs_undone == 1 and a.epoch == "a0" and a.instance_of_rank == {r: f"a{r}" for r in range(4)}
    assert a.counters.instance_conflicts >= 1
    assert all(s.steps.get(step) == set(range(WORLD)) for step in range(11, 40))


def test_the_page_follows_the_honest_collectors_past_stray_records(redis_url):
    """The dashboard's reader (per-rank feed, its in-process Assembler) over a real Redis: world 4 at 10
    steps/s, strays for ranks 0, 1, 2 at step 0, the real collectors keep writing: the page's newest step goes on."""
    client, watched, t0 = watched_run(redis_url, "st", time.time() - 60)
    write_strays(client, "st", t0 + 1.0)
    fill_ranks(client, "st", 30, 10, t0 + 1.0)
    while watched.tick().more:
        pass
    view = watched.window.view("both", synthfill_layout(), 4)
    assert view.step_T[-1] == 39 and watched.restarts == 0, watched.last_error
    assert watched.skipped_old_records == 0
    assert all(watched.window.ranks_C[slot] == WORLD for slot in watched.window.ordered_slots()[-30:])


def watched_run(redis_url: str, run: str, t0: float):
    """(client, the dashboard's reader of `run`, t0) after 10 steps of every rank written from t0 and read once."""
    client = core.connect(redis_url, timeout_s=2.0)
    fill_ranks(client, run, 10, 0, t0, meta=True)
    watched = WatchedRun(RedisSource(client, redis_url, run, window_steps=100), window_steps=100, deadline_s=0.0)
    watched.tick()
    return client, watched, t0


def synthfill_layout():
    return [list(range(16))] * 4


def write_strays(client, run: str, time_s: float) -> None:
    """One record at step 0 for each of ranks 0, 1, 2 under new instance ids stray<rank>, and nothing more."""
    for rank in range(3):
        synthfill.fill(client, run, steps=1, world_size=WORLD, ranks=[rank], instance=f"stray{rank}",
                       time0_s=time_s, meta=False)


def fill_ranks(client, run: str, steps: int, first_step: int, time0_s: float, meta: bool = False) -> None:
    """`steps` steps of every rank, each rank from its own collector instance a<rank>."""
    for rank in range(WORLD):
        synthfill.fill(client, run, steps=steps, world_size=WORLD, ranks=[rank], instance=f"a{rank}",
                       first_step=first_step, time0_s=time0_s, meta=meta and rank == 0)


def test_the_page_goes_back_to_the_collectors_that_kept_writing_after_an_undone_epoch(redis_url):
    """The collectors pause 30 s; strays of 3 of 4 ranks arrive meanwhile and open a new epoch; the collectors
    go on: the reader's epoch is undone and the page shows their steps again."""
    client, watched, t0 = watched_run(redis_url, "su", time.time() - 120)
    write_strays(client, "su", t0 + 31.0)
    watched.tick()
    assert watched.restarts == 1  # it did look like most ranks restarted
    fill_ranks(client, "su", 20, 10, t0 + 31.1)
    while watched.tick().more:
        pass
    view = watched.window.view("both", synthfill_layout(), 4)
    assert view.step_T[-1] == 29, watched.last_error
    assert all(watched.window.ranks_C[slot] == WORLD for slot in watched.window.ordered_slots()[-19:])


def test_a_restarted_rank_one_step_behind_the_others_loses_none_of_its_steps():
    """A rank restarted with step ids from the shared clock whose first step is one behind the others' newest:
    held for one record, then it rejoins, and the record held meanwhile goes into its step (still assembling)."""
    s = Stream()
    t = s.run_steps(0, 9, 100.0)
    s.feed([rec(10, r, f"a{r}", t + 0.1) for r in (0, 1, 2)] + [rec(11, r, f"a{r}", t + 0.2) for r in (0, 1, 2)],
           t + 0.2)
    s.feed([rec(10, 3, "b3", t + 3.0), rec(11, 3, "b3", t + 3.1)], t + 3.1)  # rank 3 back after 3 s
    s.feed([rec(12, r, f"a{r}" if r < 3 else "b3", t + 3.2) for r in range(WORLD)], t + 3.2)
    s.feed([], t + 10)
    assert all(s.steps.get(step) == set(range(WORLD)) for step in (10, 11, 12)), s.steps
    assert s.assembler.counters.held_records == 0


def test_the_page_says_a_conflict_of_instances_once(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    fill_ranks(client, "sc", 10, 0, t0, meta=True)
    watched = WatchedRun(RedisSource(client, redis_url, "sc", window_steps=100), window_steps=100, deadline_s=0.0)
    watched.tick()
    synthfill.fill(client, "sc", steps=1, world_size=WORLD, ranks=[1], instance="stray1", time0_s=t0 + 1.0,
                   meta=False)
    fill_ranks(client, "sc", 5, 10, t0 + 1.0)
    watched.tick()
    assert "both write" in watched.last_error and "stray1" in watched.last_error
    assert watched.bad_records == 0
