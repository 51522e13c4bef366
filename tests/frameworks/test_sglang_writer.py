"""Dumps written by SGLang's own expert-distribution recorder (sglang 0.5.23 on the CPU, two expert-parallel
ranks over gloo: tests/frameworks/sglang_support.py says what is SGLang's code and what is not), read by our
parsing (core/sglang_dumps, core/sglang_records), published by the bridge into a real redis-server and converted
by `moe-monitor convert`. Every count is checked exactly against the top-k ids that were fed to SGLang: logical
counts against the logical ids, physical counts against the physical ids SGLang's static dispatch chose.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.cli import main
from moe_monitor.collectors.sglang import Bridge, BridgeOptions
from moe_monitor.core import tracefile
from moe_monitor.core.loadmodel import balancedness
from moe_monitor.core.sglang_dumps import PassDump, StatDump, parse_name, read_dump
from moe_monitor.core.sglang_records import pass_steps, stat_steps, top_k_of
from moe_monitor.demo.localredis import free_port
from tests.frameworks import sglang_support as sgl

ROOT = Path(__file__).resolve().parents[2]
L, E, K, G, P = sgl.L, sgl.E, sgl.K, sgl.G, sgl.P
MAX_BYTES = 1 << 26
PHASE = {sgl.EXTEND: "prefill", sgl.DECODE: "decode", sgl.IDLE: "unknown"}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[int, dict]]:
    """SGLang's dumps (one process per rank) and each rank's truth {rank: truth dict}."""
    out = tmp_path_factory.mktemp("sglang_dumps")
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", PYTHONWARNINGS="ignore")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.frameworks.sglang_support", str(out), "--rank", str(rank),
                               "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in range(G)]
    logs = [proc.communicate(timeout=600)[0] for proc in procs]
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"
    return out, {rank: torch.load(out / f"truth_rank{rank}.pt", weights_only=True) for rank in range(G)}


def counts_of(ids_LNK: torch.Tensor, width: int) -> np.ndarray:
    """int64 [L, width]: how many ids of each value per layer."""
    return np.stack([np.bincount(ids_LNK[layer].reshape(-1).numpy(), minlength=width) for layer in range(L)])


def dumps_of(folder: Path, rank: int | None) -> list[Path]:
    """The dump files of one rank (None: the stat files), oldest first, by SGLang's names."""
    paths = [p for p in folder.iterdir() if (named := parse_name(p.name)) is not None and named.rank == rank]
    return sorted(paths, key=lambda p: parse_name(p.name).time_s)


def bridge_once(folder: Path, url: str, run: str, **options) -> tuple[int, list[str]]:
    lines: list[str] = []
    opts = BridgeOptions(dump_dir=str(folder), redis_url=url, run=run, poll_s=0.02, **options)
    return Bridge(opts, log=lines.append).run_once(), lines


def xrange(url: str, key: str, decode) -> list:
    client = core.connect(url, timeout_s=2.0)
    return [decode(fields) for _, fields in client.xrange(key)]


# ---------------------------------------------------------------------------------------------- the files
def test_sglang_wrote_every_mode_with_its_own_names_and_types(written):
    out, truth = written
    assert len(dumps_of(out / "stat", None)) == 1 and not dumps_of(out / "stat", 0)  # stat: rank 0 only
    for mode, dumps in (("per_pass", 2), ("per_token", 1)):
        for rank in range(G):
            assert len(dumps_of(out / mode, rank)) == dumps
    stat = torch.load(dumps_of(out / "stat", None)[0], weights_only=True)
    assert set(stat) == {"rank", "logical_count", "average_utilization_rate_over_window"}
    assert (stat["logical_count"].dtype, tuple(stat["logical_count"].shape)) == (torch.int32, (sgl.STAT_BUFFER, L, E))
    token = torch.load(dumps_of(out / "per_token", 1)[0], weights_only=True)
    assert set(token) == {"records", "last_physical_to_logical_map"}
    assert set(token["records"][0]) == {"forward_pass_id", "rank", "gatherer_key", "input_ids", "positions",
                                        "extend_seq_lens", "forward_mode", "topk_ids_of_layer", "misc_objects",
                                        "global_physical_count"}
    assert token["records"][0]["topk_ids_of_layer"].dtype == torch.int32
    assert token["records"][0]["global_physical_count"].dtype == torch.int32
    # the one CPU gap of the recorder itself: the first stat dump (sglang_support.dump retried it)
    assert truth[0]["dump_errors"] == {"stat 0": "AttributeError: module 'torch.cpu' has no attribute 'empty_cache'"}


def test_the_stat_dump_is_the_ring_of_both_ranks_logical_counts(written):
    out, truth = written
    dump = read_dump(dumps_of(out / "stat", None)[0], MAX_BYTES)
    assert isinstance(dump, StatDump) and dump.logical_count_TLE.shape == (sgl.STAT_BUFFER, L, E)
    passes = [sum(counts_of(truth[r]["stat"][0][i]["logical_ids"], E) for r in range(G))
              for i in range(sgl.STAT_PASSES)]
    for row in range(sgl.STAT_BUFFER):  # row r holds the newest pass i with i % buffer == r (ring order)
        newest = max(i for i in range(sgl.STAT_PASSES) if i % sgl.STAT_BUFFER == row)
        np.testing.assert_array_equal(dump.logical_count_TLE[row], passes[newest])
    steps = stat_steps(dump, K)
    assert steps.position_T.tolist() == list(range(sgl.STAT_BUFFER)) and steps.rank == 0
    tokens = [sum(sgl.tokens_of(r, i)[0] for r in range(G)) for i in range(sgl.STAT_PASSES)]
    assert steps.tokens_T.tolist() == [tokens[max(i for i in range(sgl.STAT_PASSES) if i % sgl.STAT_BUFFER == row)]
                                       for row in range(sgl.STAT_BUFFER)]


def test_per_pass_dumps_hold_each_ranks_physical_counts_and_the_layout_in_force(written):
    out, truth = written
    for rank in range(G):
        for number, path in enumerate(dumps_of(out / "per_pass", rank)):
            dump = read_dump(path, MAX_BYTES)
            fed = truth[rank]["per_pass"][number]
            assert isinstance(dump, PassDump) and (dump.rank, dump.mode, dump.num_experts) == (rank, "per_pass", E)
            layout = truth[rank]["layout_b" if number else "layout_a"]
            np.testing.assert_array_equal(dump.layout_LP, layout.numpy())
            assert dump.pass_id_T.tolist() == [p["forward_pass_id"] for p in fed]
            steps = pass_steps(dump, K)
            for t, p in enumerate(fed):
                np.testing.assert_array_equal(dump.physical_count_TLP[t], counts_of(p["physical_ids"], P))
                np.testing.assert_array_equal(steps.counts_TLE[t], counts_of(p["logical_ids"], E))
                assert (layout.gather(1, p["physical_ids"].reshape(L, -1)) == p["logical_ids"].reshape(L, -1)).all()
            assert steps.tokens_T.tolist() == [sgl.tokens_of(rank, i)[0] for i in range(len(fed))]
            assert steps.phase_T == ("unknown",) * len(fed) and top_k_of(dump) is None


def test_per_token_dumps_hold_the_physical_ids_tokens_and_phases(written):
    out, truth = written
    for rank in range(G):
        (path,) = dumps_of(out / "per_token", rank)
        dump = read_dump(path, MAX_BYTES)
        fed = truth[rank]["per_token"][0]
        assert isinstance(dump, PassDump) and (dump.rank, dump.mode) == (rank, "per_token") and top_k_of(dump) == K
        steps = pass_steps(dump, K, sample_tokens=64)
        assert steps.phase_T == tuple(PHASE[p["forward_mode"]] for p in fed)
        assert steps.tokens_T.tolist() == [sgl.tokens_of(rank, i)[0] for i in range(len(fed))]
        for t, p in enumerate(fed):
            num_tokens = sgl.tokens_of(rank, t)[0]
            ids_LNK = dump.topk_ids_T[t]  # SGLang keeps 8 columns (its _TOP_K_NUM), -1 past k
            assert ids_LNK.shape == (L, num_tokens, 8) and (ids_LNK[:, :, K:] == -1).all()
            np.testing.assert_array_equal(ids_LNK[:, :, :K], p["physical_ids"].numpy())
            np.testing.assert_array_equal(dump.physical_count_TLP[t], counts_of(p["physical_ids"], P))
            np.testing.assert_array_equal(steps.counts_TLE[t], counts_of(p["logical_ids"], E))
            if num_tokens:  # every token sampled (64 >= N): the rows are the logical ids fed
                np.testing.assert_array_equal(steps.sample_T[t], p["logical_ids"].numpy())
            else:
                assert steps.sample_T[t] is None


# ---------------------------------------------------------------------------------------------- the bridge
def test_the_bridge_publishes_sglangs_per_pass_dumps_exactly(tmp_path, redis_url, written):
    out, truth = written
    for path in (out / "per_pass").iterdir():
        shutil.copy(path, tmp_path)
    rc, lines = bridge_once(tmp_path, redis_url, "sglw", top_k=K)
    assert rc == 0, lines
    steps = xrange(redis_url, core.steps_key("sglw"), core.decode_step)
    physical = xrange(redis_url, core.physical_key("sglw"), core.decode_physical)
    layouts = xrange(redis_url, core.layouts_key("sglw"), core.decode_layout_record)
    fed = {(rank, p["forward_pass_id"]): p for rank in range(G) for dump in truth[rank]["per_pass"] for p in dump}
    assert len(steps) == len(physical) == len(fed) == G * 7
    for rec in steps:
        np.testing.assert_array_equal(rec.counts_LE, counts_of(fed[(rec.rank, rec.step)]["logical_ids"], E))
        assert rec.world_size == G and rec.tokens == fed[(rec.rank, rec.step)]["logical_ids"].shape[1]
    for rec in physical:
        np.testing.assert_array_equal(rec.counts_LP, counts_of(fed[(rec.rank, rec.step)]["physical_ids"], P))
        assert (rec.gpus, rec.source) == (G, "sglang")
    # the layout in force: SGLang's map before the rebalance from the first pass, the new one from pass 104
    assert [(lay.step, lay.source) for lay in layouts] == [(100, "initial"), (104, "engine")]
    np.testing.assert_array_equal(layouts[0].layout_LP, np.array(sgl.LAYOUT_A))
    np.testing.assert_array_equal(layouts[1].layout_LP, np.array(sgl.LAYOUT_B))
    # SGLang's own balancedness of each pass (--expert-balancedness-report-mode server_log, on rank 0: its GPU
    # loads summed over ranks, (mean + 1e-5) / (max + 1e-5) per layer, the mean over layers) is ours, mean / max
    # of the published physical records' GPU loads, to SGLang's 1e-5
    for dump in truth[0]["per_pass"]:
        for p in dump:
            loads_LG = core.measured_gpu_loads([rec for rec in physical if rec.step == p["forward_pass_id"]])
            assert p["sglang_balancedness"] == pytest.approx(float(balancedness(loads_LG).mean()), abs=1e-5)
    assert len({round(p["sglang_balancedness"], 3) for dump in truth[0]["per_pass"] for p in dump}) > 2


def test_the_bridge_publishes_per_token_and_stat_dumps(tmp_path, redis_url, written):
    out, truth = written
    token_dir, stat_dir = tmp_path / "token", tmp_path / "stat"
    shutil.copytree(out / "per_token", token_dir)
    shutil.copytree(out / "stat", stat_dir)
    rc, lines = bridge_once(token_dir, redis_url, "sglt")  # per_token: k from the ids
    assert rc == 0, lines
    fed = {(rank, p["forward_pass_id"]): p for rank in range(G) for p in truth[rank]["per_token"][0]}
    steps = xrange(redis_url, core.steps_key("sglt"), core.decode_step)
    assert {(rec.rank, rec.step) for rec in steps} == set(fed)
    for rec in steps:
        p = fed[(rec.rank, rec.step)]
        np.testing.assert_array_equal(rec.counts_LE, counts_of(p["logical_ids"], E))
        assert (rec.phase, rec.tokens) == (PHASE[p["forward_mode"]], p["logical_ids"].shape[1])
        if rec.tokens:  # 16 sampled rows at most, each a fed token's logical ids
            rows = {tuple(row) for row in p["logical_ids"].permute(1, 0, 2).reshape(rec.tokens, -1).tolist()}
            sampled = rec.sample_ids_LNK.transpose(1, 0, 2).reshape(rec.sample_ids_LNK.shape[1], -1)
            assert all(tuple(row) in rows for row in sampled.tolist())
    rc, lines = bridge_once(stat_dir, redis_url, "sgls", top_k=K, gpus=G)
    assert rc == 0, lines
    stat = read_dump(dumps_of(stat_dir, None)[0], MAX_BYTES)
    steps = xrange(redis_url, core.steps_key("sgls"), core.decode_step)
    assert len(steps) == sgl.STAT_BUFFER
    for row, rec in enumerate(steps):
        np.testing.assert_array_equal(rec.counts_LE, stat.logical_count_TLE[row])
        assert (rec.rank, rec.world_size) == (0, 1)


# ---------------------------------------------------------------------------------------------- convert
@pytest.mark.parametrize("mode", ["stat", "per_pass", "per_token"])
def test_moe_monitor_convert_reads_each_sglang_dump(tmp_path, written, mode):
    out, truth = written
    path = dumps_of(out / mode, None if mode == "stat" else 1)[0]
    trace = tmp_path / f"{mode}.parquet"
    assert main(["convert", str(path), str(trace), "--top-k", str(K)]) == 0  # moe-monitor's main, in this process
    with tracefile.open_trace(trace) as reader:
        recs = reader.read_steps(0, core.MAX_STEP - 1)
        meta = reader.meta
    assert (meta.num_experts, len(meta.layer_names), meta.top_k) == (E, L, K)
    if mode == "stat":
        expected = read_dump(path, MAX_BYTES).logical_count_TLE
    else:
        expected = np.stack([counts_of(p["logical_ids"], E) for p in truth[1][mode][0]])
        assert [r.step for r in recs] == list(range(len(expected)))  # pass ids from the dump's first
        assert [r.tokens for r in recs] == [sgl.tokens_of(1, i)[0] for i in range(len(expected))]
        np.testing.assert_array_equal(np.array(meta.layout.physical_to_logical_map), np.array(sgl.LAYOUT_A))
    assert len(recs) == len(expected)
    for rec, counts_LE in zip(recs, expected):
        np.testing.assert_array_equal(rec.counts_LE, counts_LE)


# ---------------------------------------------------------------------------------------------- the flags
def test_sglangs_parser_has_the_report_mode_and_refuses_the_old_metrics_flag(written):
    flags = written[1][0]["flags"]
    assert (flags["report_choices"], flags["report_default"]) == (["off", "server_log", "prometheus", "both"], "off")
    assert flags["old_flag_status"] == 2
    assert flags["old_flag_error"].endswith("error: unrecognized arguments: --enable-expert-distribution-metrics")
