"""The SGLang bridge publishes each per_pass forward pass's global_physical_count as a PhysicalRecord (stream
moe:{R}:physical) beside its step record, against a real redis-server. Dumps are written with torch.save in
the structure SGLang's recorder writes ({"records": [{"forward_pass_id", "rank", "gatherer_key",
"global_physical_count" int32 [L, P]}, ...], "last_physical_to_logical_map" [L, P]}), from the real
DeepSeek-V3 counts in tests/data split over ranks and passes."""
from __future__ import annotations

import numpy as np
import torch

from moe_monitor import core
from tests.collectors.test_sglang_bridge import (  # noqa: F401 (real: a fixture)
    GPUS,
    T0,
    K,
    bridge_once,
    real,
    save_per_pass,
    split_exact,
    steps_of,
    to_physical,
)


def physical_of(url: str, run: str) -> list[core.PhysicalRecord]:
    client = core.connect(url, timeout_s=2.0)
    return [core.decode_physical(fields) for _, fields in client.xrange(core.physical_key(run))]


def write_dump(folder, counts_LE, layout_LP, first_pass: int, passes: int, time_s: float, seed: int) -> dict:
    """One per_pass dump per rank; returns the physical counts written {(rank, pass id): int64 [L, P]}."""
    rng = np.random.default_rng(seed)
    pieces = split_exact(counts_LE, GPUS * passes, rng).reshape(GPUS, passes, *counts_LE.shape)
    written = {}
    for rank in range(GPUS):
        pass_ids = list(range(first_pass, first_pass + passes))
        physical = [to_physical(pieces[rank, t], layout_LP, rng) for t in range(passes)]
        save_per_pass(folder, time_s + rank * 1e-3, rank, pass_ids, physical, layout_LP)
        written.update({(rank, pid): physical[t] for t, pid in enumerate(pass_ids)})
    return written


def test_per_pass_physical_counts_are_published_exactly(tmp_path, redis_url, real):  # noqa: F811
    written = write_dump(tmp_path, real["prefill"], real["layout_a"], first_pass=100, passes=2, time_s=T0, seed=3)
    written.update(write_dump(tmp_path, real["decode"], real["layout_b"], first_pass=102, passes=2, time_s=T0 + 10,
                              seed=4))
    rc, lines = bridge_once(tmp_path, redis_url, "ppphys", top_k=K)
    assert rc == 0, lines
    physical = physical_of(redis_url, "ppphys")
    steps = steps_of(redis_url, "ppphys")
    assert len(physical) == len(steps) == len(written) == 2 * GPUS * 2
    assert {(rec.rank, rec.step) for rec in physical} == {(rec.rank, rec.step) for rec in steps} == set(written)
    times = {(rec.rank, rec.step): rec.time_s for rec in steps}
    for rec in physical:
        assert (rec.source, rec.gpus, rec.instance) == ("sglang", GPUS, steps[0].instance)
        assert rec.counts_LP.shape == (61, 256 + 32) and rec.time_s == times[(rec.rank, rec.step)]
        np.testing.assert_array_equal(rec.counts_LP, written[(rec.rank, rec.step)])
    # a step's ranks summed, per GPU: the tokens each GPU served, which sum to the step's logical counts
    step_100 = [rec for rec in physical if rec.step == 100]
    measured_LG = core.measured_gpu_loads(step_100)
    logical = sum(rec.counts_LE.astype(np.int64) for rec in steps if rec.step == 100)
    np.testing.assert_array_equal(measured_LG.sum(axis=1), logical.sum(axis=1))


def test_a_bad_dump_is_refused_and_the_others_publish(tmp_path, redis_url, real):  # noqa: F811
    layout_LP = real["layout_a"]
    bad = np.zeros(layout_LP.shape, dtype=np.int64)
    bad[5, 7] = -3
    path = tmp_path / f"expert_distribution_recorder_{T0}_0.pt"
    torch.save({"records": [{"forward_pass_id": 7, "rank": 0, "gatherer_key": "primary",
                             "global_physical_count": torch.tensor(bad, dtype=torch.int32)}],
                "last_physical_to_logical_map": torch.tensor(layout_LP)}, path)
    good = write_dump(tmp_path, real["prefill"], layout_LP, first_pass=8, passes=1, time_s=T0 + 5, seed=5)
    rc, lines = bridge_once(tmp_path, redis_url, "ppbad", top_k=K, gpus=GPUS)
    assert rc == 0, lines
    assert sum(line.startswith("refused") and "negative" in line for line in lines) == 1, lines
    physical = physical_of(redis_url, "ppbad")
    assert {(rec.rank, rec.step) for rec in physical} == set(good)
    for rec in physical:
        np.testing.assert_array_equal(rec.counts_LP, good[(rec.rank, rec.step)])
