"""moe-monitor record|replay|convert|info: record a run from a real redis-server, replay it into another run name (equal counts),
convert JSON lines / SGLang dumps / logical_count JSON, info, bad input as one `error:` line; the shipped
samples open and replay. In this process (tests/support/cli.py); record + replay and convert + info also as the
real `python -m moe_monitor`."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.core import tracefile
from tests.collectors.test_sglang_bridge import DATA, save_per_pass, save_stat
from tests.support import synthfill
from tests.support.cli import BOTH, ROOT, child
from tests.support.cli import in_process as cli

SAMPLES = ROOT / "moe_monitor" / "traces" / "samples"


def run_counts(client, run: str) -> dict[int, np.ndarray]:
    """Step (renumbered from 0) -> counts summed over ranks, from a run's stream."""
    recs = [core.decode_step(f) for _, f in client.xrange(core.steps_key(run))]
    first = min(r.step for r in recs)
    out: dict[int, np.ndarray] = {}
    for r in recs:
        out[r.step - first] = out.get(r.step - first, 0) + r.counts_LE.astype(np.int64)
    return out


@pytest.mark.parametrize("suffix, cli", [
    pytest.param(".parquet", cli, id="parquet"), pytest.param(".arrows", cli, id="arrows"),
    pytest.param(".parquet", child, id="parquet-child", marks=pytest.mark.subprocess),
])
def test_record_then_replay_gives_the_same_counts(redis_server, redis_url, tmp_path, suffix, cli):
    client = redis_server.client()
    totals = synthfill.fill(client, "live", steps=30, world_size=2, gpu_status="unavailable")
    out = tmp_path / f"rec{suffix}"
    done = cli("record", "--redis", redis_url, "--run", "live", "--out", out, "--steps", 30)
    assert done.returncode == 0, done.stderr
    reader = tracefile.open_trace(out)
    assert reader.timeline().num_steps == 30 and len(reader.gpu_samples()) == 1
    assert not np.isnan(reader.timeline().balancedness_T).any()
    done = cli("replay", "--trace", out, "--redis", redis_url, "--run", "again", "--speed", 1000)
    assert done.returncode == 0, done.stderr
    replayed = run_counts(client, "again")
    assert sorted(replayed) == list(range(30))
    for step, total in enumerate(totals):
        np.testing.assert_array_equal(replayed[step], total)
    meta = core.decode_meta(client.get(core.meta_key("again")))
    assert meta.run == "again" and client.zscore(core.RUNS_KEY, "again") is not None


def test_replay_loops_with_a_new_instance_and_continuing_steps(redis_server, redis_url, tmp_path):
    path = tmp_path / "t.parquet"
    from moe_monitor.traces.convert import convert
    convert(str(DATA / "decode_in1000out1000.json"), str(path), run="x", phase="decode")
    done = cli("replay", "--trace", path, "--redis", redis_url, "--run", "looped", "--speed", 1000, "--loop",
               "--max-loops", 3)
    assert done.returncode == 0, done.stderr
    recs = [core.decode_step(f) for _, f in redis_server.client().xrange(core.steps_key("looped"))]
    assert [r.step for r in recs] == [0, 1, 2] and len({r.instance for r in recs}) == 3


@pytest.mark.parametrize("cli", BOTH)
def test_convert_jsonl_to_parquet_is_equal_content(tmp_path, cli):
    from tests.traces.test_traces_format import jsonl, records, same
    src, dst = tmp_path / "t.jsonl", tmp_path / "t.parquet"
    recs = records()
    jsonl(src, recs)
    done = cli("convert", src, dst)
    assert done.returncode == 0, done.stderr
    a, b = tracefile.open_trace(src), tracefile.open_trace(dst)
    assert a.meta == b.meta and [r.step for r in a.layouts] == [r.step for r in b.layouts]
    assert all(same(x, y) for x, y in zip(a.read_steps(0, 99), b.read_steps(0, 99)))
    assert len(b.read_steps(0, 99)) == len(recs)
    assert [s.time_s for s in a.gpu_samples()] == [s.time_s for s in b.gpu_samples()]
    assert (tmp_path / "t.gpu.parquet").exists()
    np.testing.assert_allclose(a.timeline().balancedness_T, b.timeline().balancedness_T)
    info = cli("info", dst)
    assert info.returncode == 0 and "steps 40 (0..39), ranks 2" in info.stdout and "layout records 1" in info.stdout


def test_convert_sglang_dumps(tmp_path):
    rng = np.random.default_rng(0)
    layout_LP = np.tile(np.r_[np.arange(8), [0, 1]], (3, 1))  # 3 layers, 8 experts, 10 slots (0 and 1 twice)
    physical = rng.integers(0, 9, (4, 3, 10))
    path = save_per_pass(tmp_path, 1_750_000_000.0, 2, [7, 8, 9, 10], physical, layout_LP)
    out = tmp_path / "pass.parquet"
    done = cli("convert", path, out, "--gpus", 2)
    assert done.returncode == 0, done.stderr
    reader = tracefile.open_trace(out)
    got = reader.read_steps(0, 99)
    assert [r.step for r in got] == [0, 1, 2, 3] and {r.rank for r in got} == {2}
    want = np.zeros((4, 3, 8), dtype=np.int64)
    for p in range(10):
        want[:, :, layout_LP[0, p]] += physical[:, :, p]
    np.testing.assert_array_equal(np.stack([r.counts_LE for r in got]), want)
    assert reader.meta.layout.physical_to_logical_map == layout_LP.tolist()
    stat = save_stat(tmp_path, 1_750_000_001.0, rng.integers(0, 5, (3, 2, 8)))
    done = cli("convert", stat, tmp_path / "stat.arrows")
    assert done.returncode == 0, done.stderr
    assert tracefile.open_trace(tmp_path / "stat.arrows").timeline().num_steps == 3
    json_path = tmp_path / "lc.json"
    json_path.write_text(json.dumps({"logical_count": rng.integers(0, 9, (5, 2, 8)).tolist()}))
    assert cli("convert", json_path, tmp_path / "lc.parquet").returncode == 0
    assert tracefile.open_trace(tmp_path / "lc.parquet").timeline().num_steps == 5


@pytest.mark.parametrize("args,why", [
    (("info", "nowhere.parquet"), "nowhere.parquet"),
    (("convert", ROOT / "README.md", "x.parquet"), "README.md"),
    (("convert", "x.jsonl", "x.csv"), ".parquet"),
    (("replay", "--trace", "traces/samples/demo.parquet", "--redis", "http://x", "--run", "r"), "redis://"),
    (("replay", "--trace", "traces/samples/demo.parquet", "--redis", "redis://127.0.0.1:1/0", "--run", "bad name"), "run name"),
])
def test_bad_input_is_one_error_line(args, why):
    done = cli(*args)
    assert done.returncode == 2 and done.stderr.startswith("error:") and len(done.stderr.strip().splitlines()) == 1
    assert why in done.stderr, done.stderr


def test_a_bad_pt_file_is_one_error_line(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"records": "nope"}, path)
    done = cli("convert", path, tmp_path / "x.parquet")
    assert done.returncode == 2 and done.stderr.startswith("error:")


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.glob("*.parquet") if not p.name.endswith(".gpu.parquet")))
def test_shipped_samples_open_and_replay(redis_server, redis_url, name):
    reader = tracefile.open_trace(SAMPLES / name)
    tl = reader.timeline()
    assert tl.num_steps >= 1 and reader.bad_records == 0
    assert np.isfinite(tl.balancedness_T).all() and (tl.balancedness_T < 1).all()
    assert (SAMPLES / name).stat().st_size < 2 << 20
    done = cli("replay", "--trace", SAMPLES / name, "--redis", redis_url, "--run", "sample-replay", "--speed", 1000)
    assert done.returncode == 0, done.stderr
    assert redis_server.client().xlen(core.steps_key("sample-replay")) == len(reader.read_steps(0, 1 << 40))


def test_record_of_an_aggregated_run_writes_one_row_per_step_with_late_ranks_folded_in(redis_server, redis_url,
                                                                                        tmp_path):
    client = redis_server.client()
    totals = synthfill.fill(client, "aggd", steps=30, world_size=2)
    by_step: dict[int, list[core.StepRecord]] = {}
    for _, fields in client.xrange(core.steps_key("aggd")):
        rec = core.decode_step(fields)
        by_step.setdefault(rec.step, []).append(rec)

    def aggregate(recs: list[core.StepRecord], late: bool = False) -> core.AggregateRecord:
        recs = sorted(recs, key=lambda r: r.rank)
        return core.AggregateRecord(
            run="aggd", step=recs[0].step, time_s=max(r.time_s for r in recs), phase=recs[0].phase, world_size=2,
            counts_LE=sum(r.counts_LE.astype(np.int64) for r in recs), ranks_R=np.array([r.rank for r in recs]),
            tokens_R=np.array([r.tokens for r in recs]), dropped_R=np.array([r.dropped_steps for r in recs]),
            instance="epoch-1", late=late)

    for step in sorted(by_step):
        if step == 5:  # rank 1 of step 5 came after the aggregator's deadline: a late entry folds it in
            client.xadd(core.aggregate_key("aggd"), core.encode_aggregate(aggregate([r for r in by_step[5]
                                                                                     if r.rank == 0])))
            client.xadd(core.aggregate_key("aggd"), core.encode_aggregate(aggregate([r for r in by_step[5]
                                                                                     if r.rank == 1], late=True)))
        else:
            client.xadd(core.aggregate_key("aggd"), core.encode_aggregate(aggregate(by_step[step])))
    client.set(core.aggregator_key("aggd"), "an-aggregator", px=120_000)  # it holds the run: readers take its stream
    out = tmp_path / "agg.parquet"
    done = cli("record", "--redis", redis_url, "--run", "aggd", "--out", out, "--steps", 30)
    assert done.returncode == 0, done.stderr
    reader = tracefile.open_trace(out)
    rows = reader.read_steps(0, 10**6)
    assert [r.step for r in rows] == list(range(30)) and {r.rank for r in rows} == {0}  # one row per step
    for row in rows:
        np.testing.assert_array_equal(row.counts_LE, totals[row.step])
    assert not np.isnan(reader.timeline().balancedness_T).any()
