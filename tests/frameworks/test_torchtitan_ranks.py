"""The torchtitan collector on two gloo ranks of real torchtitan parallelism on the CPU: FSDP over both ranks
with expert parallelism of degree 2 (the AllToAllTokenDispatcher), each rank's step records numbered with its
torch.distributed rank, exact against that rank's black-box truth (tests/frameworks/torchtitan_support.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from moe_monitor import core
from moe_monitor.demo.localredis import free_port
from tests.frameworks import torchtitan_support as tt


@pytest.mark.parametrize("expert_parallel", [2])
def test_each_rank_publishes_its_own_exact_counts(redis_url, tmp_path, expert_parallel):
    run = f"titan-ep{expert_parallel}"
    mp.spawn(tt.rank_worker, args=(2, expert_parallel, free_port(), redis_url, run, str(tmp_path)), nprocs=2)
    client = core.connect(redis_url)
    steps = [core.decode_step(fields) for _, fields in client.xrange(core.steps_key(run))]
    client.close()
    assert sorted((s.rank, s.step) for s in steps) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(s.world_size, s.phase, s.tokens) for s in steps} == {(2, "train", 2 * 2 * 15)}
    for rank in (0, 1):
        truth = torch.load(tmp_path / f"truth{rank}.pt", weights_only=True)
        assert (truth["rank"], truth["world"], truth["hook_errors"]) == (rank, 2, 0)
        assert truth["parallel"]["ep"] == expert_parallel and truth["parallel"]["dp_shard"] == 2
        assert truth["dispatchers"] == ["AllToAllTokenDispatcher ep_mesh=True"]
        # router ids as DTensors: a shard is counted where it lives, a replica once (by coordinate 0)
        assert truth["replica_rule"] == {"shard": [4, tt.TOP_K], "replicate": [8, tt.TOP_K] if rank == 0 else None}
        mine = sorted((s for s in steps if s.rank == rank), key=lambda s: s.step)
        for step, want_LE in zip(mine, truth["counts"]):
            np.testing.assert_array_equal(step.counts_LE, want_LE.numpy())
    by_rank = [np.stack([s.counts_LE for s in steps if s.rank == rank]) for rank in (0, 1)]
    assert not np.array_equal(by_rank[0], by_rank[1]), "the ranks trained on different tokens"
