"""score and diagnose in time: the predicted MoE-layer time beside the token figures when the model's dimensions
and a GPU profile are known (flags, a profile JSON, the run's metadata), one line saying why not otherwise."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.cli import main
from moe_monitor.core.costmodel import ModelDims, TimeModel, verdict
from moe_monitor.core.dispatch import DispatchModel
from moe_monitor.core.hardware import GPU_PROFILES
from moe_monitor.traces.publish import RunPublisher
from tests.support.livesteps import RANKS, E, G, L, counts_steps

DSV3 = ["--hidden", 7168, "--moe-intermediate", 2048, "--weight-bytes", 1, "--act-bytes", 2]


def cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def decode_counts(path: Path) -> tuple[Path, np.ndarray]:
    """4 GPUs x 4 experts, 8 tokens per GPU every step: GPU 0 spreads them over 4 experts, the others over 1."""
    counts = np.zeros((6, 2, 16))
    counts[:, :, 0:4] = 2
    counts[:, :, [4, 8, 12]] = 8
    path.write_text(json.dumps({"logical_count": counts.tolist()}))
    return path, counts


def test_time_figures_match_the_cost_model(tmp_path, capsys):
    src, counts = decode_counts(tmp_path / "c.json")
    rc, out, err = cli(capsys, "score", "--load", src, "--gpus", 4, "--gpu-profile", "H100 SXM", *DSV3, "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["per_step_imbalance"]["max"] == pytest.approx(1.0)              # tokens: perfectly even
    model = TimeModel(ModelDims(7168, 2048, 3, 1.0, 2.0), GPU_PROFILES["H100 SXM"], gpus=4, nodes=1)
    slots = DispatchModel(np.tile(np.arange(16), (2, 1)), 16, 4).slot_loads(counts)
    want = verdict(model.gpu_times(slots), ridge_tokens=model.ridge_tokens)
    t = got["time"]
    assert t["available"] and t["gpu_profile"] == "H100 SXM" and (t["gpus"], t["nodes"], t["steps"]) == (4, 1, 6)
    assert t["moe_s_per_step"] == pytest.approx(want.moe_s) and t["lost_s_per_step"] == pytest.approx(want.lost_s)
    assert t["lost_share"] == pytest.approx(want.lost_share) and t["lost_share"] > 0.3
    assert (t["straggler_gpu"], t["cause"]) == (0, "active experts") and t["memory_bound_share"] == 1.0
    assert t["predicted_for"].startswith("H100 SXM, hidden 7168 x expert 2048")
    rc, out, err = cli(capsys, "score", "--load", src, "--gpus", 4, "--gpu-profile", "H100 SXM", *DSV3)
    assert rc == 0, err
    assert "per-step imbalance" in out and "time, predicted for H100 SXM" in out
    assert "lost waiting for the busiest GPU" in out and "GPU 0 (active experts)" in out


@pytest.mark.parametrize("flags, missing", [
    ([], ["no model dimensions", "no GPU profile"]),
    (["--gpu-profile", "H200"], ["no model dimensions"]),
    (DSV3, ["no GPU profile"]),
])
def test_without_dimensions_or_profile_the_json_says_why(tmp_path, capsys, flags, missing):
    src, _ = decode_counts(tmp_path / "c.json")
    rc, out, err = cli(capsys, "score", "--load", src, "--gpus", 4, *flags, "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["time"]["available"] is False and got["time"]["missing"] == missing
    assert got["time"]["reason"] == ", ".join(missing) and got["per_step_imbalance"]["max"] == pytest.approx(1.0)
    rc, out, err = cli(capsys, "score", "--load", src, "--gpus", 4, *flags)
    lines = [line for line in out.splitlines() if line.startswith("time")]
    assert rc == 0 and lines == [lines[0]] and lines[0].startswith(f"time: unavailable ({', '.join(missing)})")


def test_a_profile_json_and_nodes(tmp_path, capsys):
    src, _ = decode_counts(tmp_path / "c.json")
    h100 = GPU_PROFILES["H100 SXM"]
    fitted = dataclasses.replace(h100, hbm_share=h100.hbm_share * 0.5, name="my H100", source="calibrated")
    (tmp_path / "p.json").write_text(fitted.to_json())
    rc, out, err = cli(capsys, "score", "--load", src, "--gpus", 4, "--gpu-profile", tmp_path / "p.json", *DSV3,
                       "--nodes", 2, "--json")
    assert rc == 0, err
    slow = json.loads(out)["time"]
    assert (slow["gpu_profile"], slow["profile_source"], slow["nodes"]) == ("my H100", "calibrated", 2)
    rc, out, err = cli(capsys, "score", "--load", src, "--gpus", 4, "--gpu-profile", "H100 SXM", *DSV3, "--json")
    fast = json.loads(out)["time"]
    assert fast["nodes"] == 1 and slow["moe_s_per_step"] > 1.5 * fast["moe_s_per_step"]   # half the bandwidth


@pytest.mark.parametrize("flags, words", [
    (["--gpu-profile", "TPU v5"], "no GPU profile 'TPU v5'"),
    (["--gpu-profile", "absent.json"], "absent.json"),
    (["--gpu-profile", "H100 SXM", "--hidden", 0, "--moe-intermediate", 8], "--hidden must be positive"),
    (["--gpu-profile", "H100 SXM", *DSV3, "--nodes", 3], "multiple of nodes"),
])
def test_bad_time_flags_are_one_error_line(tmp_path, capsys, flags, words):
    src, _ = decode_counts(tmp_path / "c.json")
    (tmp_path / "bad.json").write_text("{}")
    rc, out, err = cli(capsys, "score", "--load", src, "--gpus", 4, *flags)
    assert rc == 2 and out == "" and err.count("\n") == 1 and words in err, err


def test_bad_profile_file(tmp_path, capsys):
    src, _ = decode_counts(tmp_path / "c.json")
    (tmp_path / "bad.json").write_text('{"name": "x"}')
    rc, _, err = cli(capsys, "score", "--load", src, "--gpus", 4, "--gpu-profile", tmp_path / "bad.json", *DSV3)
    assert rc == 2 and "GPU profile" in err


def _publish(url: str, run: str, gpu_profile: str) -> None:
    meta = core.RunMeta(run=run, model_name="m", layer_names=[f"l{i}" for i in range(L)], num_experts=E,
                        top_k=2, hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=1, world_size=RANKS,
                        layout=core.Layout(G, 1, core.contiguous_layout(L, E)), act_dtype_bytes=2,
                        gpu_profile=gpu_profile)
    writer = RunPublisher(url, meta)
    try:
        for step, per_rank in enumerate(counts_steps(12, seed=2)):
            writer.publish([core.StepRecord(run=run, rank=r, world_size=RANKS, step=step, time_s=1.0 + step,
                                            phase="decode", tokens=64, counts_LE=per_rank[r].astype(np.int32))
                            for r in range(RANKS)], [], now_s=1.0 + step)
    finally:
        writer.close()


def test_a_live_run_without_a_declared_profile_takes_its_nvml_name(redis_url, capsys):
    _publish(redis_url, "nvml", "")
    rc, out, err = cli(capsys, "score", "--redis", redis_url, "--run", "nvml", "--json")
    assert rc == 0 and json.loads(out)["time"]["missing"] == ["no GPU profile"], err
    sample = core.GpuSample(rank=0, host="h", time_s=2.0, status="ok",
                            gpus=[{"index": 0, "name": "NVIDIA H100 80GB HBM3"}])
    core.connect(redis_url).xadd(core.gpu_key("nvml"), core.encode_gpu_sample(sample))
    rc, out, err = cli(capsys, "score", "--redis", redis_url, "--run", "nvml", "--json")
    assert rc == 0 and json.loads(out)["time"]["gpu_profile"] == "H100 SXM", err


def test_a_live_run_prices_itself_from_its_metadata(redis_url, capsys):
    """A run whose metadata declares its dimensions and GPU profile needs no flag."""
    _publish(redis_url, "timed", "H200")
    rc, out, err = cli(capsys, "score", "--redis", redis_url, "--run", "timed", "--json")
    assert rc == 0, err
    t = json.loads(out)["time"]
    assert t["available"] and t["gpu_profile"] == "H200" and "fp8 weights" in t["predicted_for"]
    assert t["moe_s_per_step"] > t["lost_s_per_step"] > 0
    rc, out, err = cli(capsys, "score", "--redis", redis_url, "--run", "timed", "--gpu-profile", "B200", "--json")
    assert rc == 0 and json.loads(out)["time"]["gpu_profile"] == "B200", err               # the flag wins
    rc, out, err = cli(capsys, "diagnose", "--redis", redis_url, "--run", "timed", "--every", 4, "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["time"]["gpu_profile"] == "H200" and got["time"]["steps"] == 12 and got["candidates"]
    rc, out, err = cli(capsys, "diagnose", "--redis", redis_url, "--run", "timed", "--every", 4)
    assert rc == 0 and "\ntime of the layout in force, predicted for H200" in out, err


def test_diagnose_without_a_profile_says_so(tmp_path, capsys):
    src = tmp_path / "c.json"
    src.write_text(json.dumps({"logical_count": counts_steps(20).sum(1).tolist()}))
    rc, out, err = cli(capsys, "diagnose", "--trace", src, "--gpus", G, "--every", 5, "--json")
    assert rc == 0, err
    assert json.loads(out)["time"]["missing"] == ["no model dimensions", "no GPU profile"]
    rc, out, err = cli(capsys, "diagnose", "--trace", src, "--gpus", G, "--every", 5, "--gpu-profile", "A100",
                       "--hidden", 64, "--moe-intermediate", 32, "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["time"]["gpu_profile"] == "A100 SXM" and got["time"]["available"]
    rc, out, err = cli(capsys, "diagnose", "--trace", src, "--gpus", G, "--every", 5)
    assert rc == 0 and out.rstrip().endswith("time of the layout in force: unavailable (no model dimensions, "
                                             "no GPU profile): token figures only; give --hidden H "
                                             "--moe-intermediate I (or counts whose run metadata has them); give "
                                             "--gpu-profile NAME (H100 SXM, H200, B200, MI300X, A100 SXM, L40S) "
                                             "or a profile JSON"), out
