"""Importers count what they build from the declared shape, JSON by its worst case; the
Megatron importer checks its metadata with the readers' bounds and detects its files from their first bytes.
Each input is small and generated (tests/traces/hostile_inputs.py); each test failed on the code before."""
from __future__ import annotations

import json

import numpy as np
import pytest

from moe_monitor.core.budget import MIB
from moe_monitor.core.jsonbudget import json_cost
from moe_monitor.traces.convert import convert
from moe_monitor.traces.megatron_tokens import looks_like_megatron_tokens
from tests.traces import hostile_inputs as hostile

BUDGET = 64 * MIB


def refused(src, tmp_path, budget=BUDGET, **kw) -> str:
    with pytest.raises(ValueError) as caught:
        convert(str(src), str(tmp_path / "out.parquet"), max_decoded_bytes=budget, **kw)
    assert not (tmp_path / "out.parquet").exists()
    return str(caught.value)


def test_ultraep_is_counted_by_its_records_not_its_deflated_bytes(tmp_path):
    manifest = hostile.ultraep_uint8(tmp_path / "u", records=1_000_000)
    assert manifest.parent.joinpath("hostile.chunk000000.npz").stat().st_size < 200_000
    msg = refused(manifest, tmp_path)
    assert "1000000 records" in msg and "decode to" in msg, msg


def test_megatron_counts_layers_x_experts_x_iterations(tmp_path):
    folder = hostile.megatron_wide_then_short(tmp_path / "m", width=65536, short=100)
    assert sum(p.stat().st_size for p in folder.iterdir()) < 300_000
    msg = refused(folder, tmp_path)
    assert "101 (iteration, rank) records of 16 layers x 65536 experts" in msg and "decode to" in msg, msg


def test_tensorrt_llm_tensors_sharing_one_buffer_are_refused(tmp_path):
    folder = hostile.trtllm_shared_buffer(tmp_path / "t", tensors=1600, experts=65536)
    msg = refused(folder, tmp_path)
    assert "share bytes" in msg, msg


def test_a_safetensors_header_of_empty_lists_is_counted_at_its_worst_case(tmp_path):
    size = BUDGET // 20  # under the 16 B a byte counted before; json.loads builds about 25 B a byte
    folder = hostile.trtllm_empty_lists_header(tmp_path / "h", size)
    assert json_cost(b"[]," * (size // 3)) > BUDGET
    msg = refused(folder, tmp_path)
    assert "safetensors header" in msg and "decode to" in msg, msg


def test_a_logical_count_json_of_empty_lists_is_refused_before_it_is_parsed(tmp_path):
    path = hostile.logical_count_of_empty_lists(tmp_path / "lc.json", BUDGET // 20)
    msg = refused(path, tmp_path)
    assert "logical_count JSON" in msg and "decode to" in msg, msg


def test_the_planner_counts_loader_has_the_same_budget(tmp_path, monkeypatch):
    from moe_monitor.planner.io import load_counts, load_trace_steps
    monkeypatch.setenv("MOE_TRACE_MAX_DECODED_MIB", "8")
    path = hostile.logical_count_of_empty_lists(tmp_path / "lc.json", 8 * MIB // 20)
    for load in (load_counts, load_trace_steps):
        with pytest.raises(ValueError, match="decode to"):
            load(path)


def test_a_counts_file_of_many_rows_is_checked_without_a_list_of_every_row(tmp_path, monkeypatch):
    from moe_monitor.planner.io import load_counts
    rows = [[1, 2, 3, 4]] * 20_000 + [[1, 2, "x", 4]]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"logical_count": rows}))
    with pytest.raises(ValueError, match=r"found str 'x' at \[20000\]\[2\]"):
        load_counts(path)
    path.write_text(json.dumps({"logical_count": [[[1, 2]] * 3] * 5}))
    assert load_counts(path).shape == (5, 3, 2)


def test_megatron_ranks_past_the_readers_world_are_refused_before_writing(tmp_path):
    folder = hostile.megatron_ranks(tmp_path / "m", [0, 999999])
    msg = refused(folder, tmp_path)
    assert "rank 999999" in msg and "65536" in msg, msg


def test_megatron_files_are_detected_from_their_first_bytes(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    wide = 40_000  # a first line of about 120 KB: over any bound on one line
    (folder / "rank0.jsonl").write_text(
        json.dumps({"iter": 1, "block": "decoder", "layer": 0, "tpe": [[1] * wide]}) + "\n")
    assert (folder / "rank0.jsonl").stat().st_size > 64 << 10
    assert looks_like_megatron_tokens(str(folder))
    assert convert(str(folder), str(tmp_path / "out.parquet"), max_decoded_bytes=BUDGET) == 1
    (folder / "rank0.jsonl").write_text('{"kind": "meta", "iter": 1, "block": 1, "layer": 1, "tpe": 1}\n')
    assert not looks_like_megatron_tokens(str(folder))


def test_the_vllm_load_window_converts_and_is_described(tmp_path, capsys):
    from moe_monitor.cli import main
    from moe_monitor.core.tracefile import open_trace
    counts = np.random.default_rng(0).integers(0, 100, size=(5, 3, 8))
    path = hostile.eplb_window(tmp_path / "global_expert_load_window_i0.safetensors", counts)
    assert convert(str(path), str(tmp_path / "w.parquet"), gpus=4) == 5
    with open_trace(tmp_path / "w.parquet") as reader:
        got = [rec.counts_LE for rec in reader.read_steps(0, 4)]
    np.testing.assert_array_equal(np.stack(got), counts)
    assert main(["info", str(path), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["kind"] == "vLLM EPLB load window" and described["steps"] == 5, described
    assert (described["layers"], described["experts"]) == (3, 8)


@pytest.mark.parametrize("make,kind", [
    (lambda p: hostile.megatron_ranks(p / "m", [0, 1]), "Megatron tokens_per_expert"),
    (lambda p: hostile.ultraep_uint8(p / "u", records=6), "UltraEP load trace"),
    (lambda p: (p / "lc.json").write_text(json.dumps({"logical_count": [[[1, 2], [3, 4]]] * 3})) and p / "lc.json",
     "SGLang logical_count JSON"),
])
def test_info_describes_what_convert_reads(tmp_path, capsys, make, kind):
    from moe_monitor.cli import main
    path = make(tmp_path)
    assert main(["info", str(path), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["kind"] == kind and described["steps"] >= 1 and "becomes" in described, described


def test_info_describes_sglang_dumps_and_a_tensorrt_llm_folder(tmp_path, capsys):
    """The two kinds left out above: SGLang's recorder dumps (.pt, weights-only) and a TensorRT-LLM statistic
    folder; each is described with its shape and steps, as `convert` would read it."""
    import torch

    from moe_monitor.cli import main
    from tests.collectors.test_sglang_bridge import save_stat
    from tests.traces.test_import_trtllm import ITERS, LAYERS, SLOTS, folder

    logical_TLE = np.random.default_rng(0).integers(0, 9, size=(4, 3, 8))
    stat = save_stat(tmp_path, 1.0, logical_TLE, dtype=torch.int32)
    assert main(["info", str(stat), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert "SGLang" in described["kind"] and described["steps"] == 4, described
    assert (described["layers"], described["experts"]) == (3, 8) and "becomes" in described, described
    trt, _, _ = folder(tmp_path)
    assert main(["info", str(trt), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert "TensorRT-LLM" in described["kind"] and described["steps"] == ITERS, described
    assert (described["layers"], described["experts"]) == (len(LAYERS), SLOTS), described
