"""Megatron-LM's tokens_per_expert JSON lines, written as its ActivationLogger.save_tpe writes them, become one
phase-train step per iteration and rank, experts placed by the rank's expert-parallel index; bad lines are one
ValueError each, and a file over the decoded-bytes budget is refused before it is read."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.traces.megatron_tokens import looks_like_megatron_tokens, read_megatron_tokens

BUDGET = 1 << 30


def save_tpe(save_dir: Path, rank: int, iteration: int, decoder: dict[int, list[list[int]]],
             mtp: dict[tuple[int, int], list[list[int]]] | None = None) -> Path:
    """What megatron/training/activation_logging.py ActivationLogger.save_tpe does (Megatron-LM main): append one
    line per decoder layer (sorted), then one per MTP layer, to {save}/tokens_per_expert/rank{r}.jsonl."""
    folder = save_dir / "tokens_per_expert"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"iter": iteration, "block": "decoder", "layer": layer, "tpe": micro}) + "\n"
             for layer, micro in sorted(decoder.items())]
    lines += [json.dumps({"iter": iteration, "block": "mtp", "mtp_idx": idx, "layer": layer, "tpe": micro}) + "\n"
              for (idx, layer), micro in sorted((mtp or {}).items())]
    path = folder / f"rank{rank}.jsonl"
    with open(path, "a") as handle:
        handle.writelines(lines)
    return path


def _steps(path, gpus=None, **kw):
    meta, chunks = read_megatron_tokens(str(path), None, gpus, BUDGET, **kw)
    return meta, [rec for chunk in chunks for rec in chunk]


def _ep2_run(tmp_path: Path) -> Path:
    """Two expert-parallel ranks, 4 local experts each, MoE decoder layers 1 and 3 and one MTP layer, saved at
    iterations 10 and 20 with two micro-batches each."""
    for it in (10, 20):
        for rank in (0, 1):
            base = it + 100 * rank
            save_tpe(tmp_path, rank, it,
                     {1: [[base, 1, 2, 3], [1, 1, 1, 1]], 3: [[0, base, 0, 0], [5, 0, 0, 0]]},
                     {(0, 0): [[2, 2, 2, base]]})
    return tmp_path / "tokens_per_expert"


def test_a_tokens_per_expert_folder_is_one_train_step_per_iteration_and_rank(tmp_path):
    folder = _ep2_run(tmp_path)
    assert looks_like_megatron_tokens(str(folder)) and looks_like_megatron_tokens(str(folder / "rank1.jsonl"))
    meta, steps = _steps(folder, top_k=2)
    assert (meta.num_experts, meta.world_size, meta.layout.gpus, meta.top_k) == (8, 2, 2, 2)
    assert meta.layer_names == ["decoder.layers.1", "decoder.layers.3", "mtp.0.layers.0"]
    assert meta.run == f"{tmp_path.name}-tokens-per-expert"
    assert [(s.step, s.rank) for s in steps] == [(10, 0), (10, 1), (20, 0), (20, 1)]
    assert {(s.phase, s.world_size) for s in steps} == {("train", 2)}
    rank1_it20 = steps[3].counts_LE
    assert rank1_it20.tolist() == [[0, 0, 0, 0, 121, 2, 3, 4], [0, 0, 0, 0, 5, 120, 0, 0],
                                   [0, 0, 0, 0, 2, 2, 2, 120]]
    assert steps[0].counts_LE[:, 4:].sum() == 0  # rank 0 holds experts 0-3
    assert steps[0].tokens == (10 + 1 + 2 + 3 + 4) // 2  # the busiest layer (decoder 1: 20 routed) / top-k
    for rec in steps:
        core.encode_step(rec)  # every record is a valid step record


def test_one_rank_file_and_data_parallel_ranks(tmp_path):
    folder = _ep2_run(tmp_path)
    meta, steps = _steps(folder / "rank1.jsonl")
    assert (meta.num_experts, meta.world_size, meta.layout.gpus) == (4, 2, 1)
    assert [(s.step, s.rank) for s in steps] == [(10, 1), (20, 1)]
    assert steps[1].counts_LE[0].tolist() == [121, 2, 3, 4]
    meta, steps = _steps(folder / "rank1.jsonl", gpus=2)  # that rank's experts in an 8-expert run
    assert meta.num_experts == 8 and steps[1].counts_LE[0].tolist() == [0, 0, 0, 0, 121, 2, 3, 4]
    meta, steps = _steps(folder, gpus=1)  # data parallel: every rank holds every expert
    assert meta.num_experts == 4 and steps[0].counts_LE[0].tolist() == [11, 2, 3, 4]
    assert steps[1].counts_LE[0].tolist() == [111, 2, 3, 4]


def test_a_resumed_run_s_repeated_iteration_replaces_the_earlier_lines(tmp_path):
    save_tpe(tmp_path, 0, 5, {0: [[1, 2]]})
    save_tpe(tmp_path, 0, 6, {0: [[3, 4]]})
    path = save_tpe(tmp_path, 0, 6, {0: [[7, 7], [1, 0]]})  # resumed from iteration 5
    _, steps = _steps(path)
    assert [(s.step, s.counts_LE.tolist()) for s in steps] == [(5, [[1, 2]]), (6, [[8, 7]])]


def test_other_files_do_not_look_like_tokens_per_expert(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"kind": "meta", "meta": {}}) + "\n")
    other = tmp_path / "rank0.json"
    other.write_text(json.dumps({"iter": 1, "block": "decoder", "layer": 0, "tpe": [[1]]}))
    assert not looks_like_megatron_tokens(str(trace)) and not looks_like_megatron_tokens(str(other))
    assert not looks_like_megatron_tokens(str(tmp_path)) and not looks_like_megatron_tokens(str(tmp_path / "none"))


BAD_LINES = [
    ("not json", "is not JSON"),
    ('[1, 2]', "not a tokens_per_expert record"),
    ('{"iter": 1, "block": "decoder", "layer": 0}', "not a tokens_per_expert record"),
    ('{"iter": -1, "block": "decoder", "layer": 0, "tpe": [[1]]}', "iter must be"),
    ('{"iter": 1.5, "block": "decoder", "layer": 0, "tpe": [[1]]}', "iter must be"),
    ('{"iter": 1, "block": "encoder", "layer": 0, "tpe": [[1]]}', "block must be"),
    ('{"iter": 1, "block": "decoder", "layer": true, "tpe": [[1]]}', "layer must be"),
    ('{"iter": 1, "block": "mtp", "mtp_idx": "a", "layer": 0, "tpe": [[1]]}', "mtp_idx must be"),
    ('{"iter": 1, "block": "decoder", "layer": 0, "tpe": [1, 2]}', "tpe must be a list"),
    ('{"iter": 1, "block": "decoder", "layer": 0, "tpe": [[1, 2], [3]]}', "different numbers of experts"),
    ('{"iter": 1, "block": "decoder", "layer": 0, "tpe": [[]]}', "lists 0 experts"),
    ('{"iter": 1, "block": "decoder", "layer": 0, "tpe": [[1, -2]]}', "counts must be whole numbers"),
    ('{"iter": 1, "block": "decoder", "layer": 0, "tpe": [[1, 2.5]]}', "counts must be whole numbers"),
    ('{"iter": 1, "block": "decoder", "layer": 1, "tpe": [[1, 2, 3]]}', "3 experts, earlier lines had 2"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_a_bad_line_is_one_error_naming_the_file_and_line(tmp_path, line, message):
    path = save_tpe(tmp_path, 3, 1, {0: [[1, 2]]})
    with open(path, "a") as handle:
        handle.write(line + "\n")
    with pytest.raises(ValueError, match=message) as err:
        _steps(path)
    assert "rank3.jsonl line 2" in str(err.value) and "\n" not in str(err.value)


def test_bad_folders_and_arguments(tmp_path):
    with pytest.raises(ValueError, match="no rank<r>.jsonl"):
        _steps(tmp_path)
    path = save_tpe(tmp_path, 0, 1, {0: [[1, 2]]})
    save_tpe(tmp_path, 1, 1, {0: [[1, 2, 3]]})
    with pytest.raises(ValueError, match="disagree on the number of local experts"):
        _steps(path.parent)
    with pytest.raises(ValueError, match="gpus"):
        _steps(path, gpus=0)
    with pytest.raises(ValueError, match="top_k"):
        _steps(path, top_k=0)
    empty = save_tpe(tmp_path / "e", 0, 1, {0: []})
    with pytest.raises(ValueError, match="no tokens_per_expert record with any expert"):
        _steps(empty)


def test_a_file_over_the_decoded_bytes_budget_is_refused_before_it_is_read(tmp_path):
    path = save_tpe(tmp_path, 0, 1, {layer: [[1] * 64] * 8 for layer in range(16)})
    with pytest.raises(ValueError, match="MOE_TRACE_MAX_DECODED_MIB"):
        read_megatron_tokens(str(path), None, None, path.stat().st_size)
    meta, chunks = read_megatron_tokens(str(path), "mine", None, 16 * path.stat().st_size)
    assert meta.run == "mine" and np.asarray([r.counts_LE for c in chunks for r in c]).sum() == 16 * 64 * 8


def test_convert_turns_the_folder_into_a_trace_of_train_steps(tmp_path):
    from moe_monitor.core.tracefile import open_trace
    from moe_monitor.traces.convert import convert

    folder = _ep2_run(tmp_path)
    out = tmp_path / "megatron.parquet"
    assert convert(str(folder), str(out), top_k=2) == 2  # steps (iterations 10 and 20), each of 2 ranks
    reader = open_trace(str(out), BUDGET)
    timeline = reader.timeline()
    assert timeline.step_T.tolist() == [10, 20] and set(timeline.phase_T) == {"train"}
    records = reader.read_steps(10, 20)
    assert sum(int(rec.counts_LE.sum()) for rec in records) == sum(int(s.counts_LE.sum()) for s in _steps(folder)[1])
