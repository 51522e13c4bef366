"""The aggregator's memory budget. A run whose ranks stall with a wide [L, E] (records of rank 0
only, each step waiting for its deadline) holds at most its share of the budget: the oldest waiting steps are
written early with the ranks they have, and said; another run served by the same process keeps aggregating.
Against a real redis-server; the peak is the process's resident set (VmHWM, reset first), as the issue measured."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.aggregator.options import GROUP
from moe_monitor.aggregator.progress import decode_progress, state_key
from moe_monitor.aggregator.service import serve
from moe_monitor.aggregator.worker import Aggregator
from moe_monitor.core.membudget import format_bytes
from tests.support.aggregates import aggregates, options, publish, rank_record
from tests.support.synthfill import make_meta
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # about 20 s: 100 wide steps through the aggregator

WIDE_L, WIDE_E, WIDE_STEPS = 16, 65_536, 100  # 4 MiB a step as int32: 400 MiB if every step waited
BUDGET = 128 << 20
SLACK = 192 << 20  # beyond the budget: the metadata's JSON (a [16, 65536] layout), one read chunk, its writes


def status_mib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) >> 10
    raise KeyError(key)


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux)
        return True
    except OSError:
        return False


def test_a_stalled_wide_run_stays_within_its_share_and_another_run_keeps_aggregating(redis_url):
    client = core.connect(redis_url)
    client.set(core.meta_key("wide"), core.encode_meta(make_meta("wide", WIDE_L, WIDE_E, gpus=4, world_size=4)))
    zeros = np.zeros((WIDE_L, WIDE_E), dtype=np.int32)
    for first in range(0, WIDE_STEPS, 25):  # rank 0 only: every step waits for ranks 1..3 until its deadline
        publish(client, [rank_record("wide", s, 0, zeros, 4) for s in range(first, first + 25)])
    fine = [rank_record("fine", s, r, np.full((2, 8), s + r, dtype=np.int32), 2) for s in range(50) for r in range(2)]
    publish(client, fine)
    client.zadd(core.RUNS_KEY, {"wide": time.time(), "fine": time.time()})
    stop = threading.Event()
    opts = options(deadline_s=60.0, memory_budget_bytes=BUDGET, block_ms=0, lease_s=5.0)
    if not Path("/proc/self/status").exists() or not reset_peak():
        pytest.skip("needs Linux's /proc/self/status and clear_refs to read the peak resident set")
    base = status_mib("VmRSS")
    try:
        thread = threading.Thread(target=serve, args=(redis_url, None, opts, stop),
                                  kwargs={"discover_s": 0.2, "duration_s": 120.0}, daemon=True)
        thread.start()

        def wide_read() -> bool:
            state = decode_progress(client.hgetall(state_key("wide")))
            return state.counters.steps_written >= WIDE_STEPS - 20 and len(aggregates(client, "fine")) == 50
        assert wait_until(wide_read, 90.0), (decode_progress(client.hgetall(state_key("wide"))).counters,
                                             len(aggregates(client, "fine")))
        peak = status_mib("VmHWM") - base
    finally:
        stop.set()
    thread.join(30)
    wide = decode_progress(client.hgetall(state_key("wide"))).counters
    assert wide.budget_writes >= WIDE_STEPS - 30 and wide.rank_steps_missing >= 3 * (WIDE_STEPS - 30)
    assert all(a.ranks_R.tolist() == [0, 1] for a in aggregates(client, "fine"))  # the other run: whole steps
    assert peak << 20 < BUDGET + SLACK, f"the process grew {peak} MiB"
    print(f"the process grew {peak} MiB at most (budget {format_bytes(BUDGET)}; {WIDE_STEPS} wide steps waiting "
          f"would hold {format_bytes(WIDE_STEPS * WIDE_L * WIDE_E * 4)})")


def test_runs_that_stopped_give_their_share_back(redis_url):
    """The budget is shared by the runs written to lately: a run that stopped keeps 1/IDLE_SHARE of a share, so
    a hundred runs that came and went never leave a live run a hundredth of the budget."""
    from moe_monitor.aggregator.service import IDLE_SHARE, share_budget
    from moe_monitor.aggregator.worker import Aggregator, aggregator_budget

    client = core.connect(redis_url)
    budget = aggregator_budget(BUDGET)
    workers = {name: Aggregator(redis_url, name, options(memory_budget_bytes=BUDGET), client=client, budget=budget)
               for name in ("a", "b", "c", "d")}
    try:
        share_budget(workers, {"a", "b", "c", "d"}, budget.total_bytes)
        assert {w.share_bytes for w in workers.values()} == {BUDGET // 4}
        share_budget(workers, {"d"}, budget.total_bytes)  # a, b and c stopped
        assert workers["d"].share_bytes == BUDGET
        assert [workers[n].share_bytes for n in "abc"] == [BUDGET // IDLE_SHARE] * 3
        share_budget(workers, set(), budget.total_bytes)  # none written to lately: every run an equal share
        assert {w.share_bytes for w in workers.values()} == {BUDGET // 4}
    finally:
        for worker in workers.values():
            worker.close()
        client.close()


def test_a_takeover_of_pending_wide_steps_stays_within_the_budget(redis_url):
    """A dead aggregator left 100 wide entries pending (read, never acknowledged): the one taking over claims
    them page by page and hands the steps the budget writes early to the committer as it goes, as a read does;
    before, it held every step it wrote until the whole claim was done (931 MiB here)."""
    client = core.connect(redis_url)
    client.set(core.meta_key("left"), core.encode_meta(make_meta("left", WIDE_L, WIDE_E, gpus=4, world_size=4)))
    zeros = np.zeros((WIDE_L, WIDE_E), dtype=np.int32)
    for first in range(0, WIDE_STEPS, 25):
        publish(client, [rank_record("left", s, 0, zeros, 4) for s in range(first, first + 25)])
    client.xgroup_create(core.steps_key("left"), GROUP, id="0")
    delivered = client.xreadgroup(GROUP, "dead", {core.steps_key("left"): ">"}, count=WIDE_STEPS)
    assert len(delivered[0][1]) == WIDE_STEPS and client.xpending(core.steps_key("left"), GROUP)["pending"] == WIDE_STEPS
    del delivered
    client.zadd(core.RUNS_KEY, {"left": time.time()})
    if not Path("/proc/self/status").exists() or not reset_peak():
        pytest.skip("needs Linux's /proc/self/status and clear_refs to read the peak resident set")
    base = status_mib("VmRSS")
    worker = Aggregator(redis_url, "left", options(deadline_s=60.0, memory_budget_bytes=BUDGET // 2, block_ms=0,
                                                   lease_s=30.0))  # the wide run's share in the test above
    try:
        assert worker.step()  # the lease, and the takeover: every pending entry claimed
        peak = status_mib("VmHWM") - base
        wide = worker.assembler.counters
        assert worker.synced and wide.budget_writes >= WIDE_STEPS - 40  # written early, with the ranks they had
        assert client.xpending(core.steps_key("left"), GROUP)["pending"] <= WIDE_STEPS - wide.budget_writes
    finally:
        worker.close()
    assert peak << 20 < BUDGET + SLACK, f"the process grew {peak} MiB"
    print(f"the takeover grew the process {peak} MiB at most (budget {format_bytes(BUDGET // 2)})")
