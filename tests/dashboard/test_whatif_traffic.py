"""Cross-node traffic from the token's own rank (kept per sampled row by the SampleRing), with the
home-node lower bound beside it, on hand-made rows where the two differ."""
import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.samples import SampleRing
from moe_monitor.dashboard.whatif import score as whatif_score
from moe_monitor.dashboard.whatif import traffic as whatif_traffic

# 12 experts, 4 GPUs x 3 slots, 2 nodes: GPUs 0-1 = node 0 (experts 0-5), GPUs 2-3 = node 1 (experts 6-11)
LAYOUT = np.arange(12)[None]
HIDDEN, DTYPE_BYTES = 10, 2


def _rec(step, rank, rows_NK, world=4):
    sample = np.asarray(rows_NK, dtype=np.int16)[None]                  # one layer: [1, N, K]
    counts = np.bincount(sample[sample >= 0], minlength=12)[None].astype(np.int32)
    return core.StepRecord(run="r", rank=rank, world_size=world, step=step, time_s=float(step), phase="decode",
                           tokens=sample.shape[1], counts_LE=counts, sample_ids_LNK=sample)


def _data(world=4):
    ring = SampleRing(capacity=4)
    recs = [_rec(0, 2, [[0, 1, 3]], world),          # experts all on node 0, token sampled on rank 2 (node 1)
            _rec(0, 3, [[6, 9, -1]], world),         # experts on node 1, token on rank 3 (node 1)
            _rec(1, 0, [[7, 8, 2]], world)]          # two experts on node 1, one on node 0; token on rank 0
    for rec in recs:
        ring.add(rec)
    steps = np.array([0, 1])
    counts = np.stack([sum(r.counts_LE for r in recs if r.step == s) for s in steps])
    return whatif_score.fit_and_score_windows(counts, steps, steps.astype(float), [2, 1], ring.sampled, score_steps=2, fit=1,
                             hold_out=False)


def test_sample_ring_keeps_the_source_rank_of_every_row():
    data = _data()
    assert data.samples.ids_LNK.shape == (1, 3, 3)
    assert data.samples.rank_N.tolist() == [2, 3, 0] and data.samples.world_size == 4
    assert data.samples.tail(2).rank_N.tolist() == [3, 0]


def test_cross_node_share_and_bytes_from_the_source_rank():
    data = _data()
    gpu_N, note = whatif_traffic.source_gpus(data.samples.rank_N, data.samples.world_size, 4)
    assert gpu_N.tolist() == [2, 3, 0] and "own rank" in note
    out = whatif_traffic.traffic_summary(data.samples.ids_LNK, LAYOUT, 12, 4, 2, HIDDEN, DTYPE_BYTES, tokens_per_step=8,
                                         source_gpu_N=gpu_N)
    # pairs: 8; from the source rank 3 + 0 + 2 = 5 leave the token's node; home-node bound: 0 + 0 + 1 = 1
    assert out["cross_node_rule"] == "source rank"
    assert out["cross_node_share"] == pytest.approx(5 / 8)
    assert out["cross_node_share_lower_bound"] == pytest.approx(1 / 8)
    per_pair_token = 2 * 8 * HIDDEN * DTYPE_BYTES / 3                   # bytes per sampled token
    assert out["cross_node_bytes_per_step_layer"] == pytest.approx(per_pair_token * 8 * 5 / 8)
    assert out["cross_node_bytes_lower_bound"] == pytest.approx(per_pair_token * 8 * 1 / 8)
    labels = [row["metric"] for row in whatif_traffic.traffic_table(out, out)]
    assert any("from the token's rank" in m for m in labels) and any("lower bound" in m for m in labels)


def test_ranks_not_one_to_one_fall_back_to_the_home_node_and_say_so():
    data = _data(world=2)
    gpu_N, note = whatif_traffic.source_gpus(data.samples.rank_N, data.samples.world_size, 4)
    assert gpu_N is None and "lower bound" in note and "2 rank(s)" in note
    out = whatif_traffic.traffic_summary(data.samples.ids_LNK, LAYOUT, 12, 4, 2, HIDDEN, DTYPE_BYTES, 8, source_gpu_N=gpu_N)
    assert out["cross_node_rule"] == "home node" and out["cross_node_share"] == pytest.approx(1 / 8)
    labels = [row["metric"] for row in whatif_traffic.traffic_table(out, out)]
    assert "cross-node share of (token, expert) pairs, lower bound (home node)" in labels
