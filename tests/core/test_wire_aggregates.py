"""Aggregated steps and rollups on the wire: round trips, and one ValueError for every malformed entry."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor import core


def _aggregate(**change) -> core.AggregateRecord:
    rng = np.random.default_rng(0)
    base = dict(run="agg", step=41, time_s=1.7e9, phase="decode", world_size=12,
                counts_LE=rng.integers(0, 5000, size=(58, 256)).astype(np.int64),
                ranks_R=np.array([0, 1, 2, 5, 11]), tokens_R=np.array([64, 64, 0, 63, 64]),
                dropped_R=np.array([0, 3, 0, 0, 2**40]), instance="e-1")
    base.update(change)
    return core.AggregateRecord(**base)


def test_aggregate_round_trip_names_missing_ranks_and_keeps_int64_sums():
    rec = _aggregate(counts_LE=np.full((2, 3), 2**40, dtype=np.int64), late=True, scope="dp-group")
    fields = core.encode_aggregate(rec)
    assert fields["ct"] == "i8" and len(fields["ranks"]) == 2
    back = core.decode_aggregate(fields)
    assert back.step == 41 and back.late and back.scope == "dp-group" and back.tokens == 255
    assert back.ranks_R.tolist() == [0, 1, 2, 5, 11] and back.missing_ranks.tolist() == [3, 4, 6, 7, 8, 9, 10]
    assert back.dropped_R.tolist() == [0, 3, 0, 0, 2**40] and (back.counts_LE == 2**40).all()


@pytest.mark.parametrize("mutate, message", [
    (lambda f: f.update(v=9), "aggregate version 9"),
    (lambda f: f.update(ranks=b"\x00\x00"), "names no rank"),
    (lambda f: f.update(ranks=b"\xff\xff"), "beyond the world size"),
    (lambda f: f.update(ranks=b"\xff"), "expected 2"),
    (lambda f: f.update(counts=f["counts"][:-3]), "not a zstd frame|decompress|declare|bytes"),
    (lambda f: f.update(tokens=b"\x01\x02"), "bytes, expected"),
    (lambda f: f.update(phase="warmup"), "unknown phase"),
    (lambda f: f.update(world=0), "below 1"),
])
def test_malformed_aggregates_raise_one_value_error(mutate, message):
    fields = core.encode_aggregate(_aggregate())
    mutate(fields)
    with pytest.raises(ValueError, match=message):
        core.decode_aggregate(fields)


def test_encode_aggregate_refuses_what_the_reader_would():
    with pytest.raises(ValueError, match="ascending"):
        core.encode_aggregate(_aggregate(ranks_R=np.array([0, 0, 2, 5, 11])))
    with pytest.raises(ValueError, match="same length"):
        core.encode_aggregate(_aggregate(tokens_R=np.array([1])))


def _rollup(start_s=1_700_000_040, resolution_s=60, **change) -> core.RollupRecord:
    eta = np.array([[0.5, 0.9], [1.0, 0.95]])
    base = dict(run="agg", resolution_s=resolution_s, start_s=start_s, steps=2, tokens=1024,
                steps_by_phase=np.array([0, 2, 0, 0, 0]), counts_LE=np.arange(6, dtype=np.int64).reshape(2, 3),
                gpus=8, eta_hist_B=core.eta_histogram(eta), max_load_sum=300.0, mean_load_sum=200.0,
                max_load_peak=220.0, missing_rank_steps=1)
    base.update(change)
    return core.RollupRecord(**base)


def test_rollup_round_trip_and_quantiles_of_the_histogram():
    back = core.decode_rollup(core.encode_rollup(_rollup()))
    assert back.steps == 2 and back.counts_LE.tolist() == [[0, 1, 2], [3, 4, 5]] and back.gpus == 8
    assert back.eta_hist_B.sum() == 4 and back.eta_quantile(0.5) == pytest.approx(0.91)
    assert back.eta_quantile(0.0) == pytest.approx(0.51) and back.eta_quantile(1.0) == 1.0
    merged = core.merge_rollups([back, _rollup(start_s=1_700_000_100)], 3600, 1_699_999_200)
    assert merged.steps == 4 and merged.eta_hist_B.sum() == 8 and merged.counts_LE[1, 2] == 10
    assert merged.max_load_sum == 600.0 and merged.max_load_peak == 220.0 and merged.missing_rank_steps == 2


def test_a_rollup_written_before_the_train_phase_reads_with_no_train_steps():
    old = core.encode_rollup(_rollup(steps_by_phase=np.array([0, 2, 0, 0])))  # 4 phases, as written before "train"
    back = core.decode_rollup(old)
    assert back.steps_by_phase.tolist() == [0, 2, 0, 0, 0] and core.PHASES[-1] == "train"
    train = core.decode_rollup(core.encode_rollup(_rollup(steps_by_phase=np.array([0, 0, 0, 0, 2]))))
    assert train.steps_by_phase[core.PHASES.index("train")] == 2
    with pytest.raises(ValueError, match="steps per phase|expected|cells"):
        core.decode_rollup(core.encode_rollup(_rollup(steps_by_phase=np.array([0, 2, 0]))))


@pytest.mark.parametrize("mutate, message", [
    (lambda f: f.update(res=7), "resolution 7"),
    (lambda f: f.update(start=1_700_000_041), "multiple of 60"),
    (lambda f: f.update(steps=3), "add up to 2"),
    (lambda f: f.update(maxsum="nan"), "finite"),
    (lambda f: f.update(eta=b"\x00"), "bytes, expected"),
])
def test_malformed_rollups_raise_one_value_error(mutate, message):
    fields = core.encode_rollup(_rollup())
    mutate(fields)
    with pytest.raises(ValueError, match=message):
        core.decode_rollup(fields)
