"""moe-monitor convert of a TensorRT-LLM EXPERT_STATISTIC_PATH folder, made as TensorRT-LLM's ExpertStatistic makes
it (tests/support/trtllm_writer.py: torch.bincount per "{iter}_{layer}", safetensors.torch.save_file per rank,
meta_info.json from rank 0): exact counts (ranks summed) at the iterations' step ids, a trace that replays into a
real redis-server, and bad folders refused with one error line each."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from moe_monitor import core
from moe_monitor.core import tracefile
from moe_monitor.core.sglang_records import tokens_from_counts
from moe_monitor.traces.convert import convert
from moe_monitor.traces.trtllm import CELL_BYTES, HEADER_BYTE_COST
from tests.support.trtllm_writer import random_ids, write_statistic

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [3, 4, 6]  # the model's MoE layer indices (a dense first layers' model)
SLOTS, TOP_K, RANKS, ITERS, START = 16, 4, 4, 5, 50


def cli(*args):
    """moe-monitor in its own process (what a user runs)."""
    return subprocess.run([sys.executable, "-m", "moe_monitor", *map(str, args)], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)


def cli_here(capsys, *args) -> tuple[int, str]:
    """moe-monitor's main in this process (the same parser and error convention, without a start-up each):
    (exit status, stderr)."""
    from moe_monitor.cli import main
    capsys.readouterr()
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


def folder(tmp_path: Path, seed: int = 0, **writer_args) -> tuple[Path, np.ndarray, list]:
    ids = random_ids(np.random.default_rng(seed), RANKS, ITERS, len(LAYERS), SLOTS, TOP_K)
    path = tmp_path / "expert_statistic"
    return path, write_statistic(path, ids, LAYERS, SLOTS, START, **writer_args), ids


@pytest.mark.parametrize("suffix", [".parquet", ".arrows"])
@pytest.mark.parametrize("variant", [{}, {"counts_dtype": torch.int32}, {"dump_dispatch": True, "ep_size": 2, "raw": True}],
                         ids=["int64", "int32-older", "dispatch-dump"])
def test_a_statistic_folder_converts_to_its_exact_counts(tmp_path, suffix, variant):
    path, truth_TLE, ids = folder(tmp_path, **variant)
    out = tmp_path / f"trt{suffix}"
    assert convert(str(path), str(out)) == ITERS
    with tracefile.open_trace(out) as reader:
        recs = reader.read_steps(0, core.MAX_STEP - 1)
        meta = reader.meta
    assert [r.step for r in recs] == list(range(START, START + ITERS))  # the iterations are the step ids
    for t, rec in enumerate(recs):
        np.testing.assert_array_equal(rec.counts_LE, truth_TLE[t])  # every rank's file summed, key by key
        assert (rec.rank, rec.world_size, rec.phase) == (0, 1, "unknown")
    assert meta.layer_names == [f"layer{i}" for i in LAYERS] and (meta.num_experts, meta.top_k) == (SLOTS, TOP_K)
    if variant.get("dump_dispatch"):  # rank{r}_numtokens.json: tokens of each rank summed, exactly
        assert meta.layout.gpus == 2  # meta_info's ep_size
        assert [r.tokens for r in recs] == [sum(len(ids[r][t][0]) for r in range(RANKS)) for t in range(ITERS)]
    else:
        assert meta.layout.gpus == RANKS  # one GPU per rank file
        assert [r.tokens for r in recs] == tokens_from_counts(truth_TLE, TOP_K).tolist()


def test_the_converted_statistic_replays_into_redis(redis_server, redis_url, tmp_path):
    path, truth_TLE, _ = folder(tmp_path, seed=1)
    out = tmp_path / "trt.parquet"
    done = cli("convert", path, out, "--run", "trt", "--gpus", 2)
    assert done.returncode == 0, done.stderr
    assert f"{ITERS} steps" in done.stdout
    info = cli("info", out, "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["steps"] == ITERS and json.loads(info.stdout)["gpus"] == 2
    done = cli("replay", "--trace", out, "--redis", redis_url, "--run", "trt-again", "--speed", 1000)
    assert done.returncode == 0, done.stderr
    client = redis_server.client()
    recs = [core.decode_step(f) for _, f in client.xrange(core.steps_key("trt-again"))]
    assert len(recs) == ITERS
    for t, rec in enumerate(sorted(recs, key=lambda r: r.step)):
        np.testing.assert_array_equal(rec.counts_LE, truth_TLE[t])
    meta = core.decode_meta(client.get(core.meta_key("trt-again")))
    assert meta.layer_names == [f"layer{i}" for i in LAYERS] and meta.layout.gpus == 2


def _rewrite(path: Path, name: str, tensors: dict) -> None:
    safetensors.torch.save_file(tensors, str(path / name))


def _cut(path: Path, keep_bytes: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep_bytes])


def _huge_header(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])


BAD = {
    "no meta_info.json": (lambda p: (p / "meta_info.json").unlink(), "lacks meta_info.json"),
    "meta_info null": (lambda p: (p / "meta_info.json").write_text("null"), "not an object"),
    "meta_info k above E": (lambda p: (p / "meta_info.json").write_text('{"num_experts": 16, "num_experts_per_token": 17}'),
                            "num_experts_per_token"),
    "no rank file": (lambda p: [f.unlink() for f in p.glob("rank*.safetensors")], "no rank<r>.safetensors"),
    "wrong shape": (lambda p: _rewrite(p, "rank1.safetensors", {"50_3": torch.zeros(SLOTS + 1, dtype=torch.int64)}),
                    "shape [17]"),
    "negative count": (lambda p: _rewrite(p, "rank1.safetensors", {"50_3": -torch.ones(SLOTS, dtype=torch.int64)}),
                       "negative"),
    "NaN count": (lambda p: _rewrite(p, "rank1.safetensors", {"50_3": torch.full((SLOTS,), float("nan"))}),
                  "whole numbers"),
    "not a count dtype": (lambda p: _rewrite(p, "rank1.safetensors", {"50_3": torch.zeros(SLOTS, dtype=torch.bool)}),
                          "not a count dtype"),
    "bad key": (lambda p: _rewrite(p, "rank1.safetensors", {"layer3": torch.zeros(SLOTS, dtype=torch.int64)}),
                "not an \"{iter}_{layer}\" key"),
    "iteration lacks a layer": (lambda p: [_rewrite(p, f"rank{r}.safetensors", {"50_3": torch.zeros(SLOTS, dtype=torch.int64),
                                                                               "51_4": torch.zeros(SLOTS, dtype=torch.int64)})
                                           for r in range(RANKS)], "iteration 50 lacks layer 4"),
    "truncated tensors": (lambda p: _cut(p / "rank2.safetensors", (p / "rank2.safetensors").stat().st_size - 9),
                          "truncated"),
    "truncated header": (lambda p: _cut(p / "rank0.safetensors", 5), "truncated"),
    "huge header": (lambda p: _huge_header(p / "rank0.safetensors"), "declares a 1099511627776-byte header"),
    "header not JSON": (lambda p: (p / "rank0.safetensors").write_bytes(struct.pack("<Q", 4) + b"{no}"), "not JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_folder_is_one_error_line(tmp_path, capsys, case):
    path, _, _ = folder(tmp_path)
    spoil, why = BAD[case]
    spoil(path)
    status, err = cli_here(capsys, "convert", path, tmp_path / "x.parquet")
    assert status == 2 and err.startswith("error:"), err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err, err
    assert why in err, err
    assert not (tmp_path / "x.parquet").exists()


def test_the_budget_refuses_the_folder_before_reading_a_tensor(tmp_path, capsys):
    slots = 512  # tensors well above their headers' parsing cost
    ids = random_ids(np.random.default_rng(2), RANKS, ITERS, len(LAYERS), slots, TOP_K)
    path = tmp_path / "big"
    write_statistic(path, ids, LAYERS, slots, START)
    headers = sum(struct.unpack("<Q", p.read_bytes()[:8])[0] for p in path.glob("rank*.safetensors"))
    # int64 tensors + the [T, L, E] built of them (the sums and convert's step records)
    declared = RANKS * ITERS * len(LAYERS) * slots * 8 + ITERS * len(LAYERS) * slots * CELL_BYTES
    assert HEADER_BYTE_COST * headers < declared

    def run(budget_bytes: int) -> tuple[int, str]:
        return cli_here(capsys, "convert", path, tmp_path / "x.parquet", "--max-decoded-mib", budget_bytes / (1 << 20))

    status, err = run(HEADER_BYTE_COST * headers - 1)
    assert status == 2 and "its safetensors headers" in err and "MOE_TRACE_MAX_DECODED_MIB" in err, err
    status, err = run(declared - 1)
    assert status == 2 and "its tensors and the" in err and "built of them" in err, err
    status, err = run(declared)
    assert status == 0, err


def test_a_folder_of_neither_kind_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    status, err = cli_here(capsys, "convert", tmp_path / "empty", tmp_path / "x.parquet")
    assert status == 2 and "holds none of them" in err and "Megatron" in err, err
