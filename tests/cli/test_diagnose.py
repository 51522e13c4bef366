"""moe-monitor diagnose: the real command on the shipped sample, on a counts file, and on a live run published
into the session's own redis-server with the real writer (traces.publish.RunPublisher, the replay command's)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.cli import main
from moe_monitor.planner.diagnose import CANDIDATES, diagnose
from moe_monitor.planner.io import load_trace_steps
from moe_monitor.traces.publish import RunPublisher
from tests.support.cli import child
from tests.support.livesteps import RANKS, E, G, L, counts_steps, publish

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "moe_monitor" / "traces" / "samples" / "demo.parquet"


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main(["diagnose", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_sample_trace_json_matches_planner():
    r = child("diagnose", "--trace", SAMPLE, "--every", 60, "--redundant", 32, "--json")  # the real command
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["steps"] == 180 and got["gpus"] == 32 and got["redundant"] == 32
    assert [c["name"] for c in got["candidates"]] == list(CANDIDATES)
    assert "layout in force: contiguous (P = E)" not in got["notes"]          # the trace's own layout
    want = diagnose(load_trace_steps(SAMPLE), np.tile(np.arange(256), (4, 1)), 32, 32, every=60).to_json()
    for a, b in zip(got["candidates"], want["candidates"]):
        assert a == pytest.approx(b)
    assert got["verdict"]["replan_pays"] == want["verdict"]["replan_pays"]
    assert got["rank_persistence"] == pytest.approx(want["rank_persistence"])


def test_sample_trace_text(capsys):
    rc, out, err = run(capsys, "--trace", SAMPLE, "--every", 60)
    assert rc == 0, err
    assert out.startswith("180 steps, windows of 60 steps, 32 GPUs")
    assert "note: the re-plans get no redundant slots" in out and "\nverdict: re-planning " in out
    for name in CANDIDATES:
        assert f"\n{name} " in out


def test_max_moves_flag(tmp_path, capsys):
    """--max-moves K reaches the repair and advisor candidates: no change copies more than K experts."""
    src = tmp_path / "c.json"
    src.write_text(json.dumps({"logical_count": counts_steps(40).sum(1).tolist()}))
    rc, out, err = run(capsys, "--trace", src, "--gpus", G, "--every", 10, "--redundant", 4, "--max-moves", 2,
                       "--json")
    assert rc == 0, err
    got = json.loads(out)
    by = {c["name"]: c for c in got["candidates"]}
    assert got["max_moves"] == 2 and "lp_borderline" in got["verdict"]
    for name in ("ours_repair", "ours_repair_lp", "advisor", "advisor_lp"):
        assert by[name]["moves"] <= 2 * by[name]["changes"]
    rc, out, err = run(capsys, "--trace", src, "--gpus", G, "--every", 10, "--max-moves", 2)
    assert rc == 0, err
    assert "repairs within 2 copies per change" in out
    rc, _, err = run(capsys, "--trace", src, "--gpus", G, "--every", 10, "--max-moves", -1)
    assert rc == 2 and "--max-moves" in err


def test_live_run_equals_its_counts_file(redis_url, tmp_path, capsys):
    counts = counts_steps(40)
    publish(redis_url, "diag", counts)
    rc, out, err = run(capsys, "--redis", redis_url, "--run", "diag", "--every", 10, "--redundant", 4, "--json")
    assert rc == 0, err
    live = json.loads(out)
    src = tmp_path / "c.json"
    src.write_text(json.dumps({"logical_count": counts.sum(1).tolist()}))          # ranks summed per step
    rc, out, err = run(capsys, "--trace", src, "--gpus", G, "--every", 10, "--redundant", 4, "--json")
    assert rc == 0, err
    offline = json.loads(out)
    assert live["steps"] == 40 and live["notes"][0] == "live run diag: steps 0..39"
    for a, b in zip(live["candidates"], offline["candidates"]):
        assert a == pytest.approx(b)
    assert live["rank_persistence"] == pytest.approx(offline["rank_persistence"])
    assert live["hot_persistence"] == offline["hot_persistence"]
    rc, out, err = run(capsys, "--redis", redis_url, "--run", "diag", "--steps", 25, "--every", 10, "--json")
    assert rc == 0, err
    assert json.loads(out)["steps"] == 25                                           # the newest 25 steps


def test_live_run_missing_and_redis_down(redis_url, capsys):
    rc, _, err = run(capsys, "--redis", redis_url, "--run", "nobody")
    assert rc == 2 and err.startswith("error: ") and "no metadata" in err and err.count("\n") == 1
    rc, _, err = run(capsys, "--redis", "redis://127.0.0.1:1/0", "--run", "diag")
    assert rc == 2 and err.startswith("error: Redis") and err.count("\n") == 1


@pytest.mark.parametrize("args, words", [
    (["--every", 500], "more than --every"),
    (["--gpus", 3], "do not split evenly"),
    (["--run", "x"], "--redis URL and --run NAME go together"),
])
def test_bad_flags(capsys, args, words):
    rc, _, err = run(capsys, "--trace", SAMPLE, *args)
    assert rc == 2 and words in err and err.count("\n") == 1, err


def test_counts_file_needs_gpus(tmp_path, capsys):
    src = tmp_path / "c.json"
    src.write_text(json.dumps({"logical_count": counts_steps(20).sum(1).tolist()}))
    rc, _, err = run(capsys, "--trace", src)
    assert rc == 2 and "--gpus" in err
    src.write_text('{"logical_count": [[[1, NaN]]]}')
    rc, _, err = run(capsys, "--trace", src, "--gpus", 2)
    assert rc == 2 and "finite" in err


def test_live_run_leaves_out_a_step_not_every_rank_wrote(redis_url, capsys):
    counts = counts_steps(21)
    publish(redis_url, "part", counts[:20])
    meta_less = counts[20:, :1]                                                     # rank 0 of step 20 only
    writer = RunPublisher(redis_url, core.decode_meta(core.connect(redis_url).get(core.meta_key("part"))))
    writer.publish([core.StepRecord(run="part", rank=0, world_size=RANKS, step=20, time_s=30.0, phase="decode",
                                    tokens=64, counts_LE=meta_less[0, 0].astype(np.int32))])
    writer.close()
    rc, out, err = run(capsys, "--redis", redis_url, "--run", "part", "--every", 10, "--json")
    assert rc == 0, err
    assert json.loads(out)["steps"] == 20


def test_live_run_takes_the_layout_in_force_at_its_first_step(redis_url, tmp_path, capsys):
    """A layout change at step 0 (expert 0 replicated on every GPU) is the layout in force; one at step 30 is
    inside the window: noted, not followed. The figures equal diagnose --layout on the counts file."""
    rng = np.random.default_rng(5)
    first = np.stack([np.concatenate([rng.permutation(E), np.zeros(G, dtype=int)]) for _ in range(L)])
    later = np.tile(np.concatenate([np.arange(E), np.ones(G, dtype=int)]), (L, 1))
    counts = counts_steps(40, seed=2)
    publish(redis_url, "moved", counts, changes={0: first, 30: later})
    rc, out, err = run(capsys, "--redis", redis_url, "--run", "moved", "--every", 10, "--json")
    assert rc == 0, err
    live = json.loads(out)
    assert live["redundant"] == G and any("1 layout change(s) inside the window" in n for n in live["notes"])
    src = tmp_path / "c.json"
    src.write_text(json.dumps({"logical_count": counts.sum(1).tolist()}))
    lay = tmp_path / "l.json"
    lay.write_text(json.dumps({"physical_to_logical_map": first.tolist()}))
    rc, out, err = run(capsys, "--trace", src, "--gpus", G, "--layout", lay, "--every", 10, "--json")
    assert rc == 0, err
    for a, b in zip(live["candidates"], json.loads(out)["candidates"]):
        assert a == pytest.approx(b)
