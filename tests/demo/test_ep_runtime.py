"""The CPU expert-parallel runtime (demo/ep): N real processes over torch.distributed (gloo), the tiny
transformers DeepSeek-V3's own routers, all_to_all_single dispatch and combine, the collectors publishing to a
real redis-server.

Each rank's logits are compared with a single-process forward of the same model (same seed, transformers'
eager experts) on the same tokens, before and after a layout switch. Tolerance: the EP path runs each
(source rank, expert) GEMM on the rows, in the row order, that the single-process loop uses and adds the
weighted expert outputs in its (ascending expert) order, so without replicas the logits are bit-identical on
this machine (max |diff| 0). With replicas a token's expert runs on one of its replicas (token index modulo the
replica count), so an expert's rows are split over several GEMMs of fewer rows, and float32 GEMM kernels block
(hence round) differently for different row counts: a few ulps per layer, 2.7e-7 at most in the logits here.
rtol = atol = 1e-6 allows that and nothing more: one token sent to a wrong expert moves logits by ~1e-2.
The counts are compared exactly (the routing is the same: rounding of 1e-7 flips no top-k choice here).
"""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import redis
import torch

from moe_monitor import core, planner
from moe_monitor.cli import main as cli_main
from moe_monitor.collectors import attach
from moe_monitor.core import loadmodel
from moe_monitor.core.keys import layout_request_status_key
from moe_monitor.core.request_status import decode_request_status
from moe_monitor.demo.ep import EPConfig, launch
from moe_monitor.demo.ep.placement import Placement, plan_moves
from moe_monitor.demo.ep.worker import make_traffic
from moe_monitor.demo.model import build_model

pytestmark = pytest.mark.subprocess  # the EP ranks: spawned processes (demo/ep/launch.py)

NUM_LAYERS, NUM_EXPERTS = 4, 256


def _reference(cfg: EPConfig, outputs: list[dict]) -> tuple[float, list[list[np.ndarray]]]:
    """Single-process forward of every rank's tokens of every step: (max |logits diff|, per rank per step the
    attach() counts int64 [L, E] of that forward); asserts the tokens are the ones the rank's traffic draws."""
    model = build_model(cfg.moe_layers, cfg.seed)
    model.set_experts_implementation("eager")
    monitor = attach(model, sample_tokens=0, nvml=False)
    worst = 0.0
    counts: list[list[np.ndarray]] = []
    try:
        for rank, out in enumerate(outputs):
            traffic = make_traffic(model, cfg, rank)
            per_step = []
            for step in range(out["tokens"].shape[0]):
                traffic.apply(step * cfg.step_period_s)
                tokens = traffic.prompts(cfg.batch, cfg.seq_len)
                assert torch.equal(tokens, out["tokens"][step])
                before = monitor.counts()
                with torch.inference_mode():
                    logits = model(input_ids=tokens, use_cache=False).logits
                per_step.append(monitor.counts() - before)
                worst = max(worst, float((logits - out["logits"][step]).abs().max()))
                torch.testing.assert_close(out["logits"][step], logits, rtol=1e-6, atol=1e-6)
            counts.append(per_step)
    finally:
        monitor.close()
    return worst, counts


def _published(url: str, run: str):
    client = redis.Redis.from_url(url)
    steps = [core.decode_step(f) for _, f in client.xrange(core.steps_key(run))]
    timings = [core.decode_timing(f) for _, f in client.xrange(core.timings_key(run))]
    layouts = [core.decode_layout_record(f) for _, f in client.xrange(core.layouts_key(run))]
    meta = core.decode_meta(client.get(core.meta_key(run)))
    client.close()
    return steps, timings, layouts, meta


def _check_published(url: str, cfg: EPConfig, results: list[dict], ref_counts) -> None:
    steps, timings, _, meta = _published(url, cfg.run)
    ranks = cfg.ranks
    assert meta.world_size == ranks and meta.layout.gpus == ranks
    num_steps = results[0]["steps"]
    assert {(rec.rank, rec.step) for rec in steps} == {(r, s) for r in range(ranks) for s in range(num_steps)}
    assert all(rec.world_size == ranks and rec.scope == "rank" for rec in steps)
    for rec in steps:  # each rank's counts of each step: the single-process attach() counts of its tokens
        np.testing.assert_array_equal(rec.counts_LE, ref_counts[rec.rank][rec.step])
    summed = sum(rec.counts_LE.astype(np.int64) for rec in steps)
    np.testing.assert_array_equal(summed, sum(sum(per_step) for per_step in ref_counts))
    # timings: one record per step and rank, every phase of every layer measured, phases within the layer
    assert {(t.rank, t.step) for t in timings} == {(r, s) for r in range(ranks) for s in range(num_steps)}
    for t in timings:
        d, c, b, layer = (a.astype(np.float64) for a in t.arrays())
        assert t.world_size == ranks and d.shape == (NUM_LAYERS,)
        assert all(np.isfinite(a).all() and (a >= 0).all() for a in (d, c, b, layer))
        assert (d + c + b <= layer + 1e-5).all(), (d, c, b, layer)
        assert (d > 0).all() and (c > 0).all() and (b > 0).all()


def _run(cfg: EPConfig, tmp_path):
    results = launch(cfg, tmp_path, timeout_s=900)
    outputs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(cfg.ranks)]
    return results, outputs


def test_two_ranks_equal_single_process(redis_url, tmp_path):
    cfg = EPConfig(ranks=2, steps=5, redis_url=redis_url, run="ep-two", save_outputs=True, nvml=False)
    results, outputs = _run(cfg, tmp_path)
    worst, ref_counts = _reference(cfg, outputs)
    print(f"max |EP - single-process| logits: {worst:.3g}")
    _check_published(redis_url, cfg, results, ref_counts)
    assert all(r["applied"] == [] for r in results)


def _replica_layout(seed: int, ranks: int, redundant: int) -> np.ndarray:
    """A planner layout with redundant replicas for skewed random counts, int64 [L, E + redundant]."""
    rng = np.random.default_rng(seed)
    counts_LE = rng.zipf(1.3, size=(NUM_LAYERS, NUM_EXPERTS)).clip(max=10_000).astype(np.float64)
    layout_LP = np.asarray(planner.plan(counts_LE, gpus=ranks, redundant=redundant).layout_LP, dtype=np.int64)
    assert (loadmodel.replica_counts(layout_LP, NUM_EXPERTS) > 1).any()
    return layout_LP


APPLY_SECRET = "ep-runtime-test-secret-0123456789"


def _secret_file(tmp_path) -> str:
    path = tmp_path / "apply.key"
    path.write_text(APPLY_SECRET + "\n")
    path.chmod(0o600)
    return str(path)


def _launch_in_thread(cfg: EPConfig, tmp_path) -> tuple[threading.Thread, dict]:
    """launch(cfg) on a thread (started): box["results"] once it returns, box["error"] if it raised."""
    box: dict = {}

    def run() -> None:
        try:
            box["results"] = launch(cfg, tmp_path, timeout_s=900)
        except BaseException as exc:  # reported by the main thread
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def _with_unused(layout_LP: np.ndarray) -> np.ndarray:
    """layout_LP with the last replica of each replicated expert emptied (-1, vLLM's unused slot)."""
    out = layout_LP.copy()
    for row in out:
        for expert in np.flatnonzero(loadmodel.replica_counts(row[None], NUM_EXPERTS)[0] > 1):
            row[np.flatnonzero(row == expert)[-1]] = -1
    return out


@pytest.mark.parametrize("kind", ["full", "unused"])
def test_four_ranks_replicas_and_live_apply(redis_url, tmp_path, kind):
    """A layout applied live through the CLI: a planner's (every slot holds an expert), or one with unused slots
    (-1), which every rank applies the same way: an unused slot holds no weights and serves no token."""
    initial = _replica_layout(1, 4, 32)
    target = _replica_layout(2, 4, 32) if kind == "full" else _with_unused(_replica_layout(2, 4, 32))
    assert (target < 0).any() == (kind == "unused")
    secret_file = _secret_file(tmp_path)
    cfg = EPConfig(ranks=4, layout=initial.tolist(), steps=80, sync_every=2, stop_after_apply_steps=3,
                   min_step_interval_s=0.2, redis_url=redis_url, run=f"ep-four-{kind}", save_outputs=True, nvml=False,
                   apply_secret_file=secret_file)
    layout_file = tmp_path / "target.json"
    layout_file.write_text(json.dumps({"physical_to_logical_map": target.tolist()}))
    thread, box = _launch_in_thread(cfg, tmp_path)
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 600
    while thread.is_alive() and time.monotonic() < deadline:  # wait for step 2 of the run, then apply
        last = client.xrevrange(core.steps_key(cfg.run), count=1)
        if last and core.decode_step(last[0][1]).step >= 2:
            break
        time.sleep(0.1)
    assert cli_main(["apply", "--redis", redis_url, "--run", cfg.run, "--layout", str(layout_file),
                     "--secret-file", secret_file]) == 0
    thread.join(900)
    client.close()
    assert "error" not in box, box.get("error")
    results = box["results"]
    outputs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(cfg.ranks)]

    applied = [[{k: x[k] for k in ("from_step", "moves", "bytes_moved")} for x in r["applied"]] for r in results]
    assert all(a == applied[0] for a in applied)  # every rank switched at the same step
    assert len(applied[0]) == 1
    from_step = applied[0][0]["from_step"]
    expected_moves = plan_moves(Placement(initial, 4, NUM_EXPERTS), Placement(target, 4, NUM_EXPERTS))
    assert applied[0][0]["moves"] == len(expected_moves) > 0
    assert sum(r["applied"][0]["received"] for r in results) == len(expected_moves)
    assert sum(r["applied"][0]["sent"] for r in results) == len(expected_moves)
    assert applied[0][0]["bytes_moved"] == len(expected_moves) * 3 * 64 * 32 * 4
    assert all(np.array_equal(np.asarray(r["layout_LP"]), target) for r in results)
    assert 0 < from_step < results[0]["steps"] and results[0]["steps"] == from_step + cfg.stop_after_apply_steps

    worst, ref_counts = _reference(cfg, outputs)  # every step, before and after the switch
    print(f"max |EP - single-process| logits: {worst:.3g}; switched at step {from_step}, "
          f"{len(expected_moves)} expert copies")
    _check_published(redis_url, cfg, results, ref_counts)
    _, _, layouts, _ = _published(redis_url, cfg.run)
    client = redis.Redis.from_url(redis_url)
    requested = [core.decode_layout_record(f) for _, f in client.xrange(core.layout_requests_key(cfg.run))]
    statuses = [decode_request_status(f) for _, f in client.xrange(layout_request_status_key(cfg.run))]
    client.close()
    assert [(s.verdict, s.step) for s in statuses] == [("applied", from_step)]
    marked = [rec for rec in layouts if rec.instance == results[0]["instance"]]
    assert len(requested) == 1 and requested[0].source == "apply" and requested[0].step <= from_step
    assert len(layouts) == len(marked), "a request must never show as a layout change"
    assert len(marked) == 1 and marked[0].source == "apply" and marked[0].step == from_step
    assert marked[0].gpus == 4
    np.testing.assert_array_equal(marked[0].validate(NUM_EXPERTS, unused=True).layout_LP, target)


def test_apply_cli_refuses_bad_input(redis_url, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MOE_APPLY_SECRET", raising=False)
    monkeypatch.delenv("MOE_APPLY_SECRET_FILE", raising=False)
    secret = ["--secret-file", _secret_file(tmp_path)]
    missing = tmp_path / "none.json"
    assert cli_main(["apply", "--redis", redis_url, "--run", "no-such-run", "--layout", str(missing), *secret]) == 2
    layout_file = tmp_path / "l.json"
    layout_file.write_text('{"physical_to_logical_map": [[0, 1], [1, 0]]}')
    assert cli_main(["apply", "--redis", redis_url, "--run", "no-such-run", "--layout", str(layout_file),
                     *secret]) == 2
    assert cli_main(["apply", "--redis", redis_url, "--run", "no-such-run", "--layout", str(layout_file)]) == 2
    short = tmp_path / "short.key"
    short.write_text("hunter2")
    short.chmod(0o600)
    assert cli_main(["apply", "--redis", redis_url, "--run", "r", "--layout", str(layout_file), "--secret-file",
                     str(short)]) == 2
    shared = tmp_path / "shared.key"
    shared.write_text(APPLY_SECRET)
    shared.chmod(0o644)
    assert cli_main(["apply", "--redis", redis_url, "--run", "r", "--layout", str(layout_file), "--secret-file",
                     str(shared)]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "no metadata" in err and "no apply secret" in err
    assert "shorter than 32 bytes" in err and "hunter2" not in err
    assert "open to others (mode 644)" in err and APPLY_SECRET not in err


def test_runtime_refuses_and_reports_bad_requests_then_applies_a_good_one(redis_url, tmp_path):
    """2 ranks, the apply secret from a file and at most 200 slots a rank. Unsigned, expired, another run's and
    a 65,536-slot request (the one that took each rank from 0.41 to 1.50 GB) are refused, each reported on the
    status stream with its reason; then a good request (moe-monitor apply --wait-s) is applied and reported."""
    from moe_monitor.core.layout_requests import encode_layout_request, sign_request

    secret_file = _secret_file(tmp_path)
    cfg = EPConfig(ranks=2, steps=400, sync_every=2, stop_after_apply_steps=2, min_step_interval_s=0.05,
                   batch=1, seq_len=8, redis_url=redis_url, run="ep-guard", nvml=False, timing=False,
                   apply_secret_file=secret_file, max_slots_per_rank=200)
    thread, box = _launch_in_thread(cfg, tmp_path)
    client = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 600
        while thread.is_alive() and time.monotonic() < deadline:  # the watcher starts before step 0
            last = client.xrevrange(core.steps_key(cfg.run), count=1)
            if last and core.decode_step(last[0][1]).step >= 2:
                break
            time.sleep(0.1)
        secret, now = APPLY_SECRET.encode(), time.time()
        reverse = np.tile(np.arange(NUM_EXPERTS, dtype=np.int32)[::-1], (NUM_LAYERS, 1))
        huge = np.zeros((NUM_LAYERS, 65_536), dtype=np.int32)
        huge[:, :NUM_EXPERTS] = np.arange(NUM_EXPERTS)

        def record(layout, run=cfg.run, time_s=now):
            return core.LayoutRecord(run=run, step=2, time_s=time_s, layout_LP=layout, gpus=2,
                                     source="apply", instance="test")

        bad = {
            "refused: bad signature": core.encode_layout_record(record(reverse)),
            "refused: expired": encode_layout_request(sign_request(record(reverse, time_s=now - 60), secret, 5)),
            "refused: another run": encode_layout_request(sign_request(record(reverse, run="ep-other"), secret)),
            "refused: too large": encode_layout_request(sign_request(record(huge), secret)),
        }
        ids = {verdict: client.xadd(core.layout_requests_key(cfg.run), fields).decode()
               for verdict, fields in bad.items()}
        layout_file = tmp_path / "reverse.json"
        layout_file.write_text(json.dumps({"physical_to_logical_map": reverse.tolist()}))
        assert cli_main(["apply", "--redis", redis_url, "--run", cfg.run, "--layout", str(layout_file),
                         "--secret-file", secret_file, "--wait-s", "300"]) == 0
        thread.join(900)
        assert "error" not in box, box.get("error")
        statuses = {s.request_id: s for s in (decode_request_status(f) for _, f in
                                              client.xrange(layout_request_status_key(cfg.run)))}
    finally:
        client.close()
    for verdict, request_id in ids.items():
        assert statuses[request_id].verdict == verdict, statuses[request_id]
    (applied,) = [s for s in statuses.values() if s.verdict == "applied"]
    results = box["results"]
    assert len(statuses) == len(ids) + 1
    assert [a["from_step"] for a in results[0]["applied"]] == [applied.step]
    assert all(np.array_equal(np.asarray(r["layout_LP"]), reverse) for r in results)
    print({verdict: statuses[i].describe() for verdict, i in ids.items()}, applied.describe())


def test_grouped_experts_equal_the_per_group_gemms():
    """The demo's grouped path (two grouped GEMMs per layer) computes what the exact per-(source, expert) path
    does, within float32 rounding; a row naming an expert the rank lacks is refused."""
    from moe_monitor.demo.ep.store import ExpertStore

    gen = torch.Generator().manual_seed(0)
    hidden, ffn = 64, 32
    held = (1, 3, 4, 7)
    store = ExpertStore([{e: (torch.randn(2 * ffn, hidden, generator=gen) / 8, torch.randn(hidden, ffn, generator=gen) / 8)
                          for e in held}], hidden, ffn)
    rows = 200
    x_RH = torch.randn(rows, hidden, generator=gen)
    experts_R = torch.tensor(held)[torch.randint(0, len(held), (rows,), generator=gen)]
    src_R = torch.randint(0, 4, (rows,), generator=gen)
    kpos_R = torch.randint(0, 8, (rows,), generator=gen)
    exact = store.compute(0, x_RH, experts_R, kpos_R, src_R)
    torch.testing.assert_close(store.compute_grouped(0, x_RH, experts_R), exact, rtol=1e-5, atol=1e-5)
    assert store.compute_grouped(0, x_RH[:0], experts_R[:0]).shape == (0, hidden)
    with pytest.raises(KeyError):
        store.compute_grouped(0, x_RH[:2], torch.tensor([1, 2]))


def test_grouped_experts_stack_once_and_read_only_active_experts():
    """The grouped path stacks a layer's weights once (the store's per-expert weights become views of the stack,
    so packing an expert for a move gives the same floats), and rows of one expert out of many give what that
    expert's FFN alone gives."""
    from moe_monitor.demo.ep.store import ExpertStore

    gen = torch.Generator().manual_seed(1)
    hidden, ffn = 32, 16
    weights = {e: (torch.randn(2 * ffn, hidden, generator=gen) / 8, torch.randn(hidden, ffn, generator=gen) / 8)
               for e in range(6)}
    store = ExpertStore([dict(weights)], hidden, ffn)
    packed = {e: store.pack(0, e) for e in weights}
    x_RH = torch.randn(5, hidden, generator=gen)
    only = torch.full((5,), 4)
    got = store.compute_grouped(0, x_RH, only)
    ids_G, gate_up_GHI, _ = store.stacked(0)
    assert store.stacked(0)[1] is gate_up_GHI and ids_G.tolist() == list(range(6))
    stack = (gate_up_GHI.data_ptr(), gate_up_GHI.data_ptr() + gate_up_GHI.numel() * gate_up_GHI.element_size())
    assert all(stack[0] <= store.weights_L[0][e][0].data_ptr() < stack[1] for e in weights)
    for e in weights:
        torch.testing.assert_close(store.pack(0, e), packed[e], rtol=0, atol=0)
    gate_up, down = weights[4]
    gate, up = torch.nn.functional.linear(x_RH, gate_up).chunk(2, dim=-1)
    torch.testing.assert_close(got, torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, down),
                               rtol=1e-5, atol=1e-5)


def test_model_dimensions_shapes_and_serial_compute(redis_url, tmp_path):
    """A run of its own dimensions (16 experts, top-2, a fixed popularity: experts 2..7 never routed), step shapes
    cycled (decode 3 x 1, prefill 1 x 8) and the ranks taking turns in the expert compute: the metadata declares
    the dimensions, each step has its shape and phase, and the grouped experts give the single-process logits
    within float rounding."""
    shapes = ((3, 1), (1, 8))
    cfg = EPConfig(ranks=2, steps=4, moe_layers=2, redis_url=redis_url, run="ep-dims", save_outputs=True, nvml=False,
                   grouped_experts=True, serial_compute=True, hidden_size=96, moe_intermediate_size=48, num_experts=16,
                   top_k=2, expert_log_pop=tuple([0.4] * 2 + [-20.0] * 6 + [0.0] * 8), shapes=shapes, strength=1.0)
    results, outputs = _run(cfg, tmp_path)
    model = build_model(2, cfg.seed, 96, 48, 16, 2)
    model.set_experts_implementation("eager")
    for rank, out in enumerate(outputs):
        traffic = make_traffic(model, cfg, rank)
        for step in range(cfg.steps):
            traffic.apply(step * cfg.step_period_s)
            tokens = traffic.prompts(*shapes[step % 2])
            assert torch.equal(tokens, out["tokens"][step])
            with torch.inference_mode():
                logits = model(input_ids=tokens, use_cache=False).logits
            torch.testing.assert_close(out["logits"][step], logits, rtol=1e-5, atol=1e-5)
    steps, timings, _, meta = _published(redis_url, cfg.run)
    assert (meta.hidden_size, meta.moe_intermediate_size, meta.num_experts, meta.top_k) == (96, 48, 16, 2)
    assert (meta.dtype_bytes, meta.act_dtype_bytes, meta.expert_matrices) == (4, 4, 3)
    assert {(rec.step, rec.phase, rec.tokens) for rec in steps} == {
        (s, "decode" if s % 2 == 0 else "prefill", 3 if s % 2 == 0 else 8) for s in range(cfg.steps)}
    assert sum(rec.counts_LE[:, 2:8].sum() for rec in steps) == 0
    assert len(timings) == 2 * cfg.steps and all((t.compute_s_L > 0).all() for t in timings)
    assert results[0]["steps"] == cfg.steps
