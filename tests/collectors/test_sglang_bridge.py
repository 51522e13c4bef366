"""The SGLang bridge (moe-monitor sglang): SGLang's expert-distribution dumps in, our step and layout
records out, against a real redis-server.

Dumps are written with torch.save in the structures SGLang's recorder writes (stat, per_pass, per_token);
their counts are the real DeepSeek-V3 counts in tests/data/sglang_deepseek_v3, split exactly into forward
passes and ranks, on real-looking layouts with 32 redundant slots planned by planner.plan from the same
counts. Checks are exact: every published step's logical counts equal the dump's.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors.sglang import Bridge, BridgeOptions
from moe_monitor.collectors.sglang import state as bridge_state
from moe_monitor.collectors.sglang.stepids import StepIds
from moe_monitor.core.sglang_dumps import parse_name, phase_of
from moe_monitor.core.sglang_records import logical_counts, sampled_rows
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from moe_monitor.demo.localredis import free_port
from moe_monitor.planner import plan
from tests.support.redisfaults import FaultyRedis
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "sglang_deepseek_v3"
T0 = 1_750_000_000.0  # dump times (unix s)
K = 8                 # DeepSeek-V3 top-k
GPUS = 4              # ranks writing per_pass dumps in these tests


# ---------------------------------------------------------------------------------------------- real data
def real_counts(name: str) -> np.ndarray:
    """int64 [61, 256] logical counts of one real workload (layers 0-2 dense: zero)."""
    return np.asarray(json.loads((DATA / f"{name}.json").read_text())["logical_count"], dtype=np.int64)


def split_exact(total: np.ndarray, parts: int, rng: np.random.Generator) -> np.ndarray:
    """int64 [parts, *total.shape] that sum exactly to total (sequential binomial splits)."""
    left = total.astype(np.int64).copy()
    pieces = []
    for i in range(parts - 1):
        piece = rng.binomial(left, 1.0 / (parts - i))
        pieces.append(piece)
        left = left - piece
    pieces.append(left)
    return np.stack(pieces)


def to_physical(logical_LE: np.ndarray, layout_LP: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """int64 [L, P]: each expert's count split over its replicas, as SGLang counts per physical slot."""
    num_layers, num_slots = layout_LP.shape
    replica_LP = np.zeros_like(layout_LP)
    replicas_LE = np.zeros_like(logical_LE)
    for l in range(num_layers):
        for p in range(num_slots):
            e = layout_LP[l, p]
            replica_LP[l, p] = replicas_LE[l, e]
            replicas_LE[l, e] += 1
    left_LE = logical_LE.copy()
    physical_LP = np.zeros(layout_LP.shape, dtype=np.int64)
    rows_LP = np.broadcast_to(np.arange(num_layers)[:, None], layout_LP.shape)
    for j in range(int(replicas_LE.max())):
        at = replica_LP == j
        layer, expert = rows_LP[at], layout_LP[at]
        share = rng.binomial(left_LE[layer, expert], 1.0 / (replicas_LE[layer, expert] - j))
        physical_LP[at] = share
        left_LE[layer, expert] -= share
    assert not left_LE.any()
    return physical_LP


@pytest.fixture(scope="module")
def real():
    """Two real workloads and layouts with 32 redundant slots on GPUS GPUs planned from them."""
    prefill, decode = real_counts("prefill_in1024"), real_counts("decode_in1000out1000")
    return {"prefill": prefill, "decode": decode,
            "layout_a": plan(prefill, GPUS, 32).layout_LP.astype(np.int64),
            "layout_b": plan(decode, GPUS, 32).layout_LP.astype(np.int64)}


# ---------------------------------------------------------------------------------------------- dump writers
def save_per_pass(folder: Path, time_s: float, rank: int, pass_ids, physical_TLP, layout_LP, extra=None) -> Path:
    """A per_pass dump of one rank, as SGLang writes it."""
    records = []
    for t, pass_id in enumerate(pass_ids):
        rec = {"forward_pass_id": int(pass_id), "rank": rank, "gatherer_key": "primary",
               "global_physical_count": torch.tensor(physical_TLP[t], dtype=torch.int32)}
        rec.update((extra or [{}] * len(pass_ids))[t])
        records.append(rec)
    path = folder / f"expert_distribution_recorder_{time_s}_{rank}.pt"
    torch.save({"records": records, "last_physical_to_logical_map": torch.tensor(layout_LP)}, path)
    return path


def save_stat(folder: Path, time_s: float, logical_TLE, dtype=torch.int32) -> Path:
    path = folder / f"expert_distribution_recorder_{time_s}.pt"
    torch.save({"rank": 0, "logical_count": torch.tensor(logical_TLE, dtype=dtype),
                "average_utilization_rate_over_window": None}, path)
    return path


def per_pass_dump(folder: Path, counts_LE, layout_LP, first_pass: int, passes: int, time_s: float, seed: int):
    """Write one dump: counts_LE split over GPUS ranks x passes, each on layout_LP. Returns the expected
    logical counts {(rank, pass id): [L, E]}."""
    rng = np.random.default_rng(seed)
    pieces = split_exact(counts_LE, GPUS * passes, rng).reshape(GPUS, passes, *counts_LE.shape)
    expected = {}
    for rank in range(GPUS):
        pass_ids = list(range(first_pass, first_pass + passes))
        physical = [to_physical(pieces[rank, t], layout_LP, rng) for t in range(passes)]
        save_per_pass(folder, time_s + rank * 1e-3, rank, pass_ids, physical, layout_LP)
        expected.update({(rank, pid): pieces[rank, t] for t, pid in enumerate(pass_ids)})
    return expected


# ---------------------------------------------------------------------------------------------- reading back
def steps_of(url: str, run: str) -> list[core.StepRecord]:
    client = core.connect(url, timeout_s=2.0)
    return [core.decode_step(fields) for _, fields in client.xrange(core.steps_key(run))]


def layouts_of(url: str, run: str) -> list[core.LayoutRecord]:
    client = core.connect(url, timeout_s=2.0)
    return [core.decode_layout_record(fields) for _, fields in client.xrange(core.layouts_key(run))]


def meta_of(url: str, run: str) -> core.RunMeta:
    return core.decode_meta(core.connect(url, timeout_s=2.0).get(core.meta_key(run)))


def bridge_once(folder: Path, url: str, run: str, **options) -> tuple[int, list[str]]:
    lines: list[str] = []
    opts = BridgeOptions(dump_dir=str(folder), redis_url=url, run=run, poll_s=0.02, **options)
    return Bridge(opts, log=lines.append).run_once(), lines


def tokens_of(counts_LE: np.ndarray, k: int = K) -> int:
    """Tokens of a step: its busiest layer's count sum / k, halves rounded up."""
    return int((counts_LE.sum(axis=1).max() + k // 2) // k)


# ---------------------------------------------------------------------------------------------- per_pass
def test_per_pass_counts_steps_and_layout_changes(tmp_path, redis_url, real):
    first = per_pass_dump(tmp_path, real["prefill"], real["layout_a"], first_pass=100, passes=3, time_s=T0, seed=1)
    second = per_pass_dump(tmp_path, real["decode"], real["layout_b"], first_pass=103, passes=3, time_s=T0 + 10,
                           seed=2)
    rc, lines = bridge_once(tmp_path, redis_url, "pp", top_k=K)
    assert rc == 0, lines
    records = steps_of(redis_url, "pp")
    expected = {**first, **second}
    assert len(records) == len(expected) == 2 * GPUS * 3
    for rec in records:  # SGLang's pass ids are the step ids of a fresh run
        np.testing.assert_array_equal(rec.counts_LE, expected[(rec.rank, rec.step)])
        assert rec.world_size == GPUS and rec.phase == "unknown"  # per_pass records carry no forward mode
        assert rec.tokens == tokens_of(expected[(rec.rank, rec.step)])
        assert rec.sample_ids_LNK is None
    assert len({rec.instance for rec in records}) == 1
    for rank in range(GPUS):  # each rank's steps in order, their times increasing
        mine = [rec for rec in records if rec.rank == rank]
        assert [rec.step for rec in mine] == list(range(100, 106))
        assert all(a.time_s < b.time_s for a, b in zip(mine, mine[1:]))
    meta = meta_of(redis_url, "pp")
    assert (len(meta.layer_names), meta.num_experts, meta.top_k) == (61, 256, K)
    assert meta.layout.gpus == GPUS and meta.world_size == GPUS  # the ranks that wrote dumps
    np.testing.assert_array_equal(meta.layout.physical_to_logical_map, real["layout_a"])
    initial, change = layouts_of(redis_url, "pp")
    assert (initial.source, initial.step, change.source, change.step) == ("initial", 100, "engine", 103)
    np.testing.assert_array_equal(initial.layout_LP, real["layout_a"])
    np.testing.assert_array_equal(change.layout_LP, real["layout_b"])
    assert change.gpus == GPUS and change.instance == records[0].instance
    change.validate(256, num_layers=61)
    assert sum("layout change" in line for line in lines) == 1  # said once, with the file that showed it


# ---------------------------------------------------------------------------------------------- per_token
def routed_ids(counts_LE: np.ndarray, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """int64 [L, N, K] logical ids: K distinct experts per token, drawn in proportion to the real counts
    (Gumbel top-k); -1 in the dense layers (no expert chosen there)."""
    num_layers, num_experts = counts_LE.shape
    ids = np.full((num_layers, tokens, K), -1, dtype=np.int64)
    for l in range(num_layers):
        if counts_LE[l].sum() == 0:
            continue
        scores = np.log(counts_LE[l] + 1.0) + rng.gumbel(size=(tokens, num_experts))
        ids[l] = np.argsort(-scores, axis=1)[:, :K]
    return ids


def to_physical_ids(ids_LNK: np.ndarray, layout_LP: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each logical id -> one of its expert's physical slots, at random (SGLang's dispatch)."""
    out = np.full(ids_LNK.shape, -1, dtype=np.int64)
    for l in range(ids_LNK.shape[0]):
        for n in range(ids_LNK.shape[1]):
            for k in range(ids_LNK.shape[2]):
                e = ids_LNK[l, n, k]
                if e >= 0:
                    out[l, n, k] = rng.choice(np.flatnonzero(layout_LP[l] == e))
    return out


def test_per_token_tokens_phases_and_sampled_rows(tmp_path, redis_url, real):
    rng = np.random.default_rng(3)
    layout_LP = real["layout_a"]
    modes, sizes = [1, 2, 3, 4], [40, 8, 24, 0]  # ForwardMode EXTEND, DECODE, MIXED, IDLE (an empty DP rank)
    expected = {}
    for rank in range(2):
        records = []
        for t, (mode, size) in enumerate(zip(modes, sizes)):
            logical = routed_ids(real["decode"], size, rng)
            physical = to_physical_ids(logical, layout_LP, rng)
            count_LP = np.stack([np.bincount(row[row >= 0], minlength=layout_LP.shape[1]) for row in
                                 physical.reshape(61, -1)])
            records.append({"forward_pass_id": 7 + t, "rank": rank, "gatherer_key": "primary",
                            "input_ids": list(range(size)), "positions": list(range(size)),
                            "extend_seq_lens": [size] if mode == 1 else None, "forward_mode": mode,
                            "topk_ids_of_layer": torch.tensor(physical, dtype=torch.int32), "misc_objects": [],
                            "global_physical_count": torch.tensor(count_LP, dtype=torch.int32)})
            expected[(rank, 7 + t)] = logical
        torch.save({"records": records, "last_physical_to_logical_map": torch.tensor(layout_LP)},
                   tmp_path / f"expert_distribution_recorder_{T0 + rank * 1e-3}_{rank}.pt")
    rc, lines = bridge_once(tmp_path, redis_url, "pt")  # no --top-k: per_token ids show k
    assert rc == 0, lines
    records = steps_of(redis_url, "pt")
    assert len(records) == 8
    for rec in records:
        logical = expected[(rec.rank, rec.step)]
        size = logical.shape[1]
        counts = np.stack([np.bincount(row[row >= 0], minlength=256) for row in logical.reshape(61, -1)])
        np.testing.assert_array_equal(rec.counts_LE, counts)
        assert rec.tokens == size and rec.world_size == 2
        assert rec.phase == {1: "prefill", 2: "decode", 3: "mixed", 4: "unknown"}[modes[rec.step - 7]]
        if size == 0:
            assert rec.sample_ids_LNK is None and not rec.counts_LE.any()
            continue
        picked = np.linspace(0, size, min(size, 16), endpoint=False).astype(int)  # evenly over the batch
        np.testing.assert_array_equal(rec.sample_ids_LNK, logical[:, picked, :])
    meta = meta_of(redis_url, "pt")
    assert meta.top_k == K and meta.sample_tokens_per_layer == 16 and meta.layout.gpus == 2


def test_sampled_rows_drop_the_padding_columns_past_k():
    layout_LP = np.array([[0, 1, 2, 3, 0, 1]])
    ids = np.array([[[5, 2, -1, -1], [4, 3, -1, -1], [0, -1, -1, -1]]])  # SGLang pads K' = 4 for k = 2
    np.testing.assert_array_equal(sampled_rows(ids, layout_LP, top_k=2), [[[1, 2], [0, 3], [0, -1]]])
    np.testing.assert_array_equal(sampled_rows(ids, layout_LP, top_k=2, sample_tokens=2), [[[1, 2], [0, 3]]])
    assert sampled_rows(np.zeros((1, 0, 4), dtype=np.int64), layout_LP, top_k=2) is None


def test_logical_counts_sum_the_replicas(real):
    rng = np.random.default_rng(4)
    logical = split_exact(real["prefill"], 3, rng)
    physical = np.stack([to_physical(piece, real["layout_a"], rng) for piece in logical])
    np.testing.assert_array_equal(logical_counts(physical, real["layout_a"], 256), logical)


# ---------------------------------------------------------------------------------------------- stat
def test_stat_ring_rows_and_the_top_k_it_needs(tmp_path, redis_url, real):
    rng = np.random.default_rng(5)
    pieces = split_exact(real["decode"], 5, rng)
    ring = np.zeros((6, 61, 256), dtype=np.int64)
    filled = [2, 3, 4, 5, 0]  # the ring wrapped: rows out of time order; row 1 never written
    ring[filled] = pieces
    save_stat(tmp_path, T0, ring)
    rc, lines = bridge_once(tmp_path, redis_url, "st")  # stat dumps do not say k
    assert rc == 2 and "--top-k" in lines[-1], lines
    assert steps_of(redis_url, "st") == []
    assert not core.connect(redis_url).exists(bridge_state.seen_key("st"))  # not marked read: read once k is given
    rc, lines = bridge_once(tmp_path, redis_url, "st", top_k=K)
    assert rc == 0, lines
    records = steps_of(redis_url, "st")
    assert [rec.step for rec in records] == [0, 1, 2, 3, 4]
    for rec, row in zip(records, sorted(filled)):  # buffer order
        np.testing.assert_array_equal(rec.counts_LE, ring[row])
        assert (rec.rank, rec.world_size, rec.phase) == (0, 1, "unknown")
        assert rec.tokens == tokens_of(ring[row])
    meta = meta_of(redis_url, "st")
    assert meta.layout.gpus == core.default_gpus(256)
    assert meta.layout.physical_to_logical_map == core.contiguous_layout(61, 256)
    assert layouts_of(redis_url, "st") == []  # stat dumps hold no layout: nothing is invented


# ---------------------------------------------------------------------------------------------- restarts
def test_restart_never_publishes_a_dump_twice(tmp_path, redis_url, real):
    per_pass_dump(tmp_path, real["prefill"], real["layout_a"], first_pass=0, passes=2, time_s=T0, seed=6)
    assert bridge_once(tmp_path, redis_url, "rs", top_k=K)[0] == 0
    first = steps_of(redis_url, "rs")
    assert len(first) == GPUS * 2
    rc, lines = bridge_once(tmp_path, redis_url, "rs", top_k=K)  # a restarted bridge, same folder
    assert rc == 0 and any("already read" in line for line in lines), lines
    assert len(steps_of(redis_url, "rs")) == len(first)
    assert not any(line.startswith("published") for line in lines)
    # the server goes on (pass ids 2, 3), then restarts (pass ids from 0 again): steps stay monotonic
    per_pass_dump(tmp_path, real["decode"], real["layout_a"], first_pass=2, passes=2, time_s=T0 + 10, seed=7)
    per_pass_dump(tmp_path, real["decode"], real["layout_a"], first_pass=0, passes=2, time_s=T0 + 20, seed=8)
    assert bridge_once(tmp_path, redis_url, "rs", top_k=K)[0] == 0
    records = steps_of(redis_url, "rs")
    assert len(records) == GPUS * 6 and len({rec.instance for rec in records}) == 1
    for rank in range(GPUS):
        assert [rec.step for rec in records if rec.rank == rank] == [0, 1, 2, 3, 4, 5]
    assert len(layouts_of(redis_url, "rs")) == 1  # the same map throughout: one initial record
    assert len({(rec.rank, rec.step) for rec in records}) == len(records)
    core.connect(redis_url).set(bridge_state.state_key("rs"), json.dumps({"ids": 5}))  # a hand-edited state
    rc, lines = bridge_once(tmp_path, redis_url, "rs", top_k=K)
    assert rc == 0 and any("malformed" in line for line in lines), lines
    assert len(steps_of(redis_url, "rs")) == len(records)  # what was read stays read


def test_step_ids_across_server_restarts_and_lagging_ranks():
    ids = StepIds()
    np.testing.assert_array_equal(ids.for_passes(0, np.array([5, 6, 7])), [5, 6, 7])
    np.testing.assert_array_equal(ids.for_passes(1, np.array([5, 6, 7])), [5, 6, 7])  # same passes, same steps
    np.testing.assert_array_equal(ids.for_passes(0, np.array([0, 1])), [8, 9])   # rank 0: the server restarted
    np.testing.assert_array_equal(ids.for_passes(1, np.array([0, 1])), [8, 9])   # rank 1 joins that epoch
    np.testing.assert_array_equal(ids.for_rows(2), [10, 11])                       # stat rows: the next ids
    np.testing.assert_array_equal(ids.for_passes(0, np.array([2])), [12])        # passes after stat: after them
    again = StepIds.from_json(json.loads(json.dumps(ids.to_json())))
    np.testing.assert_array_equal(again.for_passes(1, np.array([2])), [12])
    times = StepIds().times("0", 100.0, np.array([0, 1, 2, 3]), default_span_s=8.0)
    np.testing.assert_allclose(times, [94.0, 96.0, 98.0, 100.0])


def test_names_and_forward_modes():
    assert parse_name("expert_distribution_recorder_1750000000.123456_3.pt").rank == 3
    assert parse_name("expert_distribution_recorder_1750000000.5.pt").rank is None
    assert parse_name("expert_distribution_recorder_x.pt") is None
    assert parse_name("other.pt") is None
    assert [phase_of(m) for m in (1, 2, 3, 4, 5, None, "DECODE", "ForwardMode.EXTEND", True)] == [
        "prefill", "decode", "mixed", "unknown", "unknown", "unknown", "decode", "prefill", "unknown"]


# ---------------------------------------------------------------------------------------------- bad files
class Payload:
    """Unpickling this would call os.mkdir(marker): weights_only loading must refuse it unrun."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_bad_files_are_refused_once_and_the_others_published(tmp_path, redis_url, real):
    folder = tmp_path / "dumps"
    folder.mkdir()
    good = per_pass_dump(folder, real["prefill"], real["layout_a"], first_pass=0, passes=2, time_s=T0, seed=9)
    raw = (folder / f"expert_distribution_recorder_{T0}_0.pt").read_bytes()
    bad = {
        f"expert_distribution_recorder_{T0 + 1}.pt": "truncated or corrupt",
        f"expert_distribution_recorder_{T0 + 2}.pt": "holds a pickled object",
        f"expert_distribution_recorder_{T0 + 3}.pt": "NaN",
        f"expert_distribution_recorder_{T0 + 4}.pt": "negative",
        f"expert_distribution_recorder_{T0 + 5}_0.pt": "global_physical_count is (61, 100)",
        f"expert_distribution_recorder_{T0 + 6}.pt": "over the",  # oversize
        f"expert_distribution_recorder_{T0 + 7}.pt": "neither",  # a tensor file that is no dump
        f"expert_distribution_recorder_{T0 + 8}.pt": "not a torch tensor file",  # garbage
    }
    names = list(bad)
    (folder / names[0]).write_bytes(raw[: len(raw) // 2])
    marker = tmp_path / "pickle-ran"
    torch.save({"records": [Payload(str(marker))], "last_physical_to_logical_map": torch.zeros(1)},
               folder / names[1])
    nan = torch.tensor(real["prefill"][None], dtype=torch.float32)
    nan[0, 5, 7] = float("nan")
    torch.save({"rank": 0, "logical_count": nan}, folder / names[2])
    save_stat(folder, T0 + 4, -real["prefill"][None])
    save_per_pass(folder, T0 + 5, 0, [9], [np.zeros((61, 100), dtype=np.int64)], real["layout_a"])
    (folder / names[5]).write_bytes(b"\0" * (len(raw) * 3))
    torch.save({"counts": torch.ones(3)}, folder / names[6])
    (folder / names[7]).write_bytes(b"not a dump at all")
    lines: list[str] = []
    opts = BridgeOptions(dump_dir=str(folder), redis_url=redis_url, run="bad", poll_s=0.01, top_k=K,
                         max_file_bytes=len(raw) * 2)
    bridge = Bridge(opts, log=lines.append)
    for _ in range(5):
        assert bridge.poll()
    bridge.close()
    assert not marker.exists()  # the pickled payload never ran
    refused = [line for line in lines if line.startswith("refused")]
    assert len(refused) == len(bad), "\n".join(lines)
    for name, why in bad.items():
        mine = [line for line in refused if name in line]
        assert len(mine) == 1 and why in mine[0], (name, mine)
        assert "\n" not in mine[0]
    records = steps_of(redis_url, "bad")
    assert sorted((rec.rank, rec.step) for rec in records) == sorted(good)
    rc, again = bridge_once(folder, redis_url, "bad", top_k=K, max_file_bytes=len(raw) * 2)  # restarted
    assert rc == 0 and not any(line.startswith("refused") for line in again), again
    assert any(f"{len(bad)} refused before" in line for line in again), again
    assert len(steps_of(redis_url, "bad")) == len(records)


def test_redis_down_then_back(tmp_path, real):
    redis_proc = FaultyRedis(tmp_path)
    try:
        lines: list[str] = []
        folder = tmp_path / "dumps"
        folder.mkdir()
        bridge = Bridge(BridgeOptions(dump_dir=str(folder), redis_url=redis_proc.url, run="down", top_k=K,
                                      redis_timeout_s=0.5), log=lines.append)
        assert bridge.poll()
        redis_proc.kill()
        expected = per_pass_dump(folder, real["prefill"], real["layout_a"], 0, 2, T0, seed=10)
        rounds = [bridge.poll() for _ in range(5)]  # complete at the second listing, then Redis is needed
        assert rounds[-3:] == [False] * 3 and sum("unreachable" in line for line in lines) == 1, lines
        redis_proc.start()  # back, empty
        assert bridge.poll()
        assert sum("reachable again" in line for line in lines) == 1, lines
        records = steps_of(redis_proc.url, "down")
        assert sorted((rec.rank, rec.step) for rec in records) == sorted(expected)
        assert meta_of(redis_proc.url, "down").num_experts == 256
        redis_proc.restart()  # gone again, back empty between two dumps: the metadata and layout come back
        more = per_pass_dump(folder, real["prefill"], real["layout_a"], 2, 1, T0 + 10, seed=13)
        assert wait_until(lambda: bridge.poll() and len(steps_of(redis_proc.url, "down")) == len(more), 60)
        assert meta_of(redis_proc.url, "down").num_experts == 256
        (layout,) = layouts_of(redis_proc.url, "down")
        assert layout.step == 0 and layout.source == "initial"
        np.testing.assert_array_equal(layout.layout_LP, real["layout_a"])
        bridge.close()
    finally:
        redis_proc.kill()


# ---------------------------------------------------------------------------------------------- --server
class FakeSglang:
    """A stdlib HTTP server with SGLang's three recorder endpoints; each dump writes the next queued per_pass
    dump (one file per rank) into the folder, or files with no records when the queue is empty."""

    def __init__(self, folder: Path, queue: list, layout_LP: np.ndarray, port: int = 0):
        self.folder, self.queue, self.layout_LP, self.calls = folder, list(queue), layout_LP, []
        self.recording = False
        self.passes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                action = self.path.strip("/").split("_")[0]
                owner.calls.append(action)
                if action == "start":
                    owner.recording = True
                elif action == "stop":
                    owner.recording = False
                elif action == "dump":
                    owner.dump()
                else:
                    self.send_error(404)
                    return
                body = b"ok\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def dump(self):
        now = time.time()
        if self.queue:
            counts_LE, layout_LP, seed = self.queue.pop(0)
            per_pass_dump(self.folder, counts_LE, layout_LP, self.passes, 2, now, seed)
            self.passes += 2
        else:
            for rank in range(GPUS):
                torch.save({"records": [], "last_physical_to_logical_map": torch.tensor(self.layout_LP)},
                           self.folder / f"expert_distribution_recorder_{now + rank * 1e-3}_{rank}.pt")

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.subprocess  # the CLI's interpreter imports collectors (torch, transformers): ~10 s
def test_cli_drives_the_server_start_dump_stop(tmp_path, redis_url, real):
    folder = tmp_path / "recorder"
    folder.mkdir()
    layout_LP = real["layout_a"]
    pieces = split_exact(real["prefill"], 3, np.random.default_rng(11))
    server = FakeSglang(folder, [(pieces[i], layout_LP, 20 + i) for i in range(3)], layout_LP)
    expected = {}
    for i in range(3):  # what the dumps will hold (the same seeds per_pass_dump uses)
        sub = np.random.default_rng(20 + i)
        split = split_exact(pieces[i], GPUS * 2, sub).reshape(GPUS, 2, 61, 256)
        expected.update({(rank, 2 * i + t): split[rank, t] for rank in range(GPUS) for t in range(2)})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "moe_monitor", "sglang", "--dump-dir", str(folder), "--redis", redis_url, "--run", "srv",
         "--server", server.url, "--every", "0.3", "--poll", "0.1", "--top-k", str(K), "--gpus", str(GPUS),
         "--ep-dispatch-algorithm", "lp"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: len(steps_of(redis_url, "srv")) >= len(expected), 30), "not published in time"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert proc.returncode == 0, stderr
    assert server.calls[0] == "start" and server.calls[-2:] == ["dump", "stop"], server.calls
    assert server.calls.count("start") == 1
    records = steps_of(redis_url, "srv")
    assert len(records) == len(expected), stderr
    for rec in records:
        np.testing.assert_array_equal(rec.counts_LE, expected[(rec.rank, rec.step)])
    assert "recording started" in stderr and "Traceback" not in stderr
    seen = core.connect(redis_url).hgetall(bridge_state.seen_key("srv"))
    statuses = {json.loads(v)["status"] for v in seen.values()}
    assert statuses == {"published", "empty"}  # the dumps after the queue ran dry held no passes
    assert core.decode_meta(core.connect(redis_url).get(core.meta_key("srv"))).dispatch == "lp"  # the server's flag


def test_server_down_is_one_line_then_retried(tmp_path, redis_url, real):
    folder = tmp_path / "recorder"
    folder.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rc, lines = bridge_once(folder, redis_url, "once-down", server_url=url, top_k=K, server_timeout_s=1.0)
    assert rc == 1 and sum("unreachable" in line for line in lines) == 1, lines
    lines = []
    opts = BridgeOptions(dump_dir=str(folder), redis_url=redis_url, run="down-up", server_url=url, every_s=0.15,
                         poll_s=0.05, top_k=K, server_timeout_s=1.0)
    bridge = Bridge(opts, log=lines.append)
    stop = threading.Event()
    worker = threading.Thread(target=bridge.run, args=(stop,))
    worker.start()
    server = None
    try:
        time.sleep(0.8)  # several periods without a server
        server = FakeSglang(folder, [(real["prefill"], real["layout_a"], 30)], real["layout_a"], port=port)
        assert wait_until(lambda: len(steps_of(redis_url, "down-up")) == GPUS * 2, 30)
    finally:
        stop.set()
        worker.join(30)
        if server is not None:
            server.close()
    assert sum("unreachable" in line for line in lines) == 1, lines
    assert sum("answers again" in line for line in lines) == 1, lines
    assert server is not None and server.calls[0] == "start" and server.calls[-1] == "stop"


# ---------------------------------------------------------------------------------------------- the dashboard
def test_dashboard_reads_the_bridged_run(tmp_path, redis_url, real):
    expected = per_pass_dump(tmp_path, real["prefill"], real["layout_a"], first_pass=0, passes=3, time_s=T0, seed=12)
    assert bridge_once(tmp_path, redis_url, "dash", top_k=K, model_name="deepseek-ai/DeepSeek-V3")[0] == 0
    client = core.connect(redis_url, timeout_s=2.0)
    watched = WatchedRun(RedisSource(client, redis_url, "dash", window_steps=50), window_steps=50)
    for _ in range(10):
        watched.tick()
        if watched.steps_read == len(expected):
            break
    assert watched.steps_read == len(expected) and watched.bad_records == 0, watched.last_error
    meta = watched.source.meta()
    layout = resolve_layout(meta, 61, 256, watched.world_size)
    assert layout.origin == "run metadata" and layout.layout_LP.shape == (61, 288) and layout.gpus == GPUS
    snapshot = analyse(watched.window, layout, "both")
    assert snapshot is not None and snapshot.view.num_steps == 3
    step_tokens = {step: sum(tokens_of(c) for (r, s), c in expected.items() if s == step) for step in range(3)}
    assert snapshot.view.tokens_T.tolist() == [step_tokens[s] for s in range(3)]
    assert int(snapshot.view.tokens_T.sum()) == sum(tokens_of(c) for c in expected.values())
    np.testing.assert_array_equal(snapshot.view.counts_sum_LE, real["prefill"])
    assert snapshot.loads_TG.shape == (3, GPUS)


# ---------------------------------------------------------------------------------------------- same-batch ranks
def test_same_batch_ranks_count_each_token_once(tmp_path, redis_url, real):
    """Without DP attention every rank routes the whole batch: each rank's per_pass file repeats the same passes
    and stat's all_reduce counts each token once per rank. --same-batch-ranks G publishes each token once."""
    rng = np.random.default_rng(11)
    passes = split_exact(real["prefill"], 3, rng)
    physical = [to_physical(p, real["layout_a"], rng) for p in passes]
    pass_dir, stat_dir = tmp_path / "per_pass", tmp_path / "stat"
    pass_dir.mkdir(), stat_dir.mkdir()
    for rank in range(GPUS):  # the same passes, as every rank of a same-batch group records them
        save_per_pass(pass_dir, T0 + rank * 1e-3, rank, [7, 8, 9], physical, real["layout_a"])
    rc, lines = bridge_once(pass_dir, redis_url, "same-pp", top_k=K, same_batch_ranks=GPUS)
    assert rc == 0, lines
    records = steps_of(redis_url, "same-pp")
    assert [(rec.rank, rec.step) for rec in records] == [(0, 7), (0, 8), (0, 9)]
    for rec, expected in zip(records, passes):
        np.testing.assert_array_equal(rec.counts_LE, expected)
        assert (rec.world_size, rec.scope) == (1, "dp-group")
    meta = meta_of(redis_url, "same-pp")
    assert (meta.world_size, meta.layout.gpus) == (1, GPUS)
    assert sum("not read" in line for line in lines) == 0  # files left unread are not refusals
    state = core.connect(redis_url).hgetall(bridge_state.seen_key("same-pp"))
    assert len(state) == GPUS  # every file remembered: the other ranks' are never read again

    ring = np.zeros((4, 61, 256), dtype=np.int64)
    ring[:3] = passes
    save_stat(stat_dir, T0, ring * GPUS)  # stat's all_reduce over GPUS ranks that routed one batch
    rc, lines = bridge_once(stat_dir, redis_url, "same-st", top_k=K, same_batch_ranks=GPUS)
    assert rc == 0, lines
    stat_records = steps_of(redis_url, "same-st")
    assert len(stat_records) == 3
    for rec, expected in zip(stat_records, passes):
        np.testing.assert_array_equal(rec.counts_LE, expected)
    odd = tmp_path / "odd"
    odd.mkdir()
    save_stat(odd, T0, ring * GPUS)
    bad = ring * GPUS
    bad[0, 5, 3] += 1  # a count that GPUS ranks routing one batch cannot have summed to
    save_stat(odd, T0 + 1, bad)
    rc, lines = bridge_once(odd, redis_url, "same-odd", top_k=K, same_batch_ranks=GPUS)
    refused = [line for line in lines if line.startswith("refused")]
    assert len(refused) == 1 and "not all multiples of 4" in refused[0], lines
    assert len(steps_of(redis_url, "same-odd")) == 3  # the good file's rows: nothing else lost
