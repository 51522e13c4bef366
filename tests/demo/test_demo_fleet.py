"""make demo-fleet's deployment: ranks of the real tiny DeepSeek-V3 in node processes, in lockstep, each rank's
own rows counted by its own collector, summed by the real aggregator: every step complete, every layer's
count equal to the rank's tokens x top-8, the dashboard reading the aggregate."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from tests.support.waiting import wait_until

RANKS, PER_PROCESS, SEQS, PROMPT, STEPS = 4, 2, 3, 5, 23


@pytest.mark.subprocess
def test_the_fleet_publishes_every_rank_of_every_step_and_the_aggregator_sums_them(redis_url):
    # a step is written once all its ranks are in: the deadline is far past any stall of a loaded machine (node
    # processes a few seconds apart would otherwise get a step written short and its late ranks folded in after)
    aggregator = subprocess.Popen([sys.executable, "-m", "moe_monitor", "aggregate", "--redis", redis_url, "--run",
                                   "fleet", "--log-every-s", "60", "--deadline-s", "120"], stderr=subprocess.DEVNULL)
    try:
        fleet = subprocess.run([sys.executable, "-m", "moe_monitor.demo.fleet", "--redis", redis_url, "--run", "fleet",
                                "--ranks", str(RANKS), "--ranks-per-process", str(PER_PROCESS), "--seqs-per-rank",
                                str(SEQS), "--prompt-len", str(PROMPT), "--new-tokens", "4", "--steps", str(STEPS),
                                "--seconds", "200"], capture_output=True, text=True, timeout=240)
        assert fleet.returncode == 0, fleet.stderr[-2000:]
        client = core.connect(redis_url, timeout_s=2.0)
        meta = core.decode_meta(client.get(core.meta_key("fleet")))  # priced as the model it stands in for
        assert (meta.hidden_size, meta.dtype_bytes, meta.gpu_profile) == (7168, 1, "H100 SXM")
        state_key = core.aggregator_key("fleet") + ":state"

        def written() -> int:
            raw = client.hget(state_key, "steps_written")
            return int(raw) if raw else 0

        per_node = [int(line.split(": ")[2].split()[0]) for line in fleet.stdout.splitlines()
                    if line.startswith("demo.fleet: ranks ")]
        steps = STEPS
        # the whole stdout as one string (a tuple's repr is cut short): a missing summary line shows what came
        assert per_node == [STEPS] * (RANKS // PER_PROCESS), f"stdout:\n{fleet.stdout}\nstderr tail:\n{fleet.stderr[-3000:]}"
        assert wait_until(lambda: written() == steps, timeout_s=180)
        watched = WatchedRun(RedisSource(client, redis_url, "fleet", 600), 600)  # while the aggregator holds the run
        for _ in range(3):
            watched.tick()
        assert watched.feed == "aggregate" and watched.bad_records == 0
        assert watched.window is not None and watched.window.size == steps
    finally:
        aggregator.terminate()
        aggregator.wait(30)
    aggregates = [core.decode_aggregate(fields) for _, fields in client.xrange(core.aggregate_key("fleet"))]
    assert [a.step for a in aggregates] == list(range(steps))  # each step once, none late, none missing
    for agg in aggregates:
        assert agg.ranks_R.tolist() == list(range(RANKS)) and agg.world_size == RANKS
        per_rank = SEQS * (PROMPT if agg.phase == "prefill" else 1)
        assert agg.tokens_R.tolist() == [per_rank] * RANKS
        np.testing.assert_array_equal(agg.counts_LE.sum(axis=1), RANKS * per_rank * 8)  # top-8 of every token
    assert {a.phase for a in aggregates} == {"prefill", "decode"}
