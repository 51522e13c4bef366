"""The fault suite's short version (bench.harness.faults), through the real code paths: 32 simulated ranks at 20 steps/s
publishing through the collectors' Publisher and RedisSink (bench.harness.ranks), the aggregator as its CLI, the
dashboard's reader (WatchedRun over RedisSource), against a private redis-server, while three faults happen one
after another, each once the previous one recovered: the aggregator SIGKILLed while it commits and restarted
(a 2 s lease), the aggregator's lease stolen and given back, Redis SIGSTOPped for 3 s, a rolling restart of 17 of
the 32 ranks (every rank that stays up keeps counting); then, on a Redis of its own, another run whose ranks
stall with a [16, 65536] shape beside it, one `--all` aggregator with a memory budget for both. Every rank-step the
writers saw land reaches the aggregate stream, and after each fault the aggregate and the page are current again.
Waits are for conditions, with deadlines far past what a loaded 2-core machine needs; nothing is timed. Nothing may
be lost: entries delivered to the aggregator by a read whose reply the stall swallowed are read again (the
aggregator claims its own pending entries back after a failed round)."""
from __future__ import annotations

import pytest

from bench.harness import faults

pytestmark = pytest.mark.subprocess  # the aggregator CLI, killed and restarted


def test_aggregator_kill_lease_theft_and_redis_stall_lose_nothing_and_recover(tmp_path):
    lines: list[str] = []
    suite = faults.run_suite([2, 3, 5, 7], ranks=32, steps_per_s=20.0, stall_s=3.0, lease_s=2.0, exporter=False,
                             tmp=tmp_path, echo=lines.append)
    faults.print_table(suite, echo=lines.append)
    log = "\n".join(lines)
    (tmp_path / "faults.log").write_text(log)
    assert [row.outcome.fault for row in suite.rows] == [2, 3, 5, 7], log
    for row in suite.rows:
        t = row.tally
        assert t is not None and t.written > 0, (row.outcome.fault, log)
        # nothing lost, nothing counted twice, nothing read that no writer reported
        assert (t.lost, t.extra, t.twice) == (0, 0, 0), (row.outcome.fault, t, log)
        assert t.read == t.written, (row.outcome.fault, t)
        assert not row.outcome.problems, (row.outcome.fault, row.outcome.problems, log)
        assert all(s is not None for s in row.recovery.values()), (row.outcome.fault, row.recovery, log)
        assert row.page.feeds and row.page.feeds[-1][0] == "aggregate", (row.outcome.fault, row.page.lines())
    # the rows cover every step of the run, in order, without overlap
    assert suite.rows[0].lo == 0
    assert all(a.hi == b.lo for a, b in zip(suite.rows, suite.rows[1:]))
    by_fault = {row.outcome.fault: row for row in suite.rows}
    # the theft: the page fell back to summing the per-rank steps, said why, and went back to the aggregate
    theft = by_fault[3].page
    assert [feed for feed, _ in theft.feeds][-2:] == ["steps", "aggregate"], theft.lines()
    assert any(n.kind == "stall_note" and "thief" in n.text for n in theft.notes), theft.lines()
    # the stall: the page said Redis was unreachable
    assert any(n.kind == "health error" for n in by_fault[5].page.notes), by_fault[5].page.lines()
    assert "lease taken over" in by_fault[2].recovery
    assert suite.stranded == 0, log  # no entry left unacknowledged in a pending list
    rolling = by_fault[7].outcome
    assert len(rolling.kept_ranks) * 2 < 32 and any("stayed up: written" in f for f in rolling.facts), log


def test_a_stalled_wide_run_leaves_the_aggregator_within_its_budget_and_the_other_run_going(tmp_path):
    lines: list[str] = []
    suite = faults.run_suite([8], ranks=32, steps_per_s=20.0, stall_s=5.0, lease_s=2.0, exporter=False,
                             tmp=tmp_path, echo=lines.append)
    faults.print_table(suite, echo=lines.append)
    log = "\n".join(lines)
    (row,) = suite.rows
    assert row.tally is not None and row.tally.lost == 0 and row.tally.read == row.tally.written, log
    assert not row.outcome.problems and all(s is not None for s in row.recovery.values()), log
    assert any("before their deadline to stay within the budget" in f for f in row.outcome.facts), log
