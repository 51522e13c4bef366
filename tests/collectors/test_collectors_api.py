"""The collector's contract: generate() steps and phases, padding, compile, the generic API, Redis."""
from __future__ import annotations

import socket
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor, attach
from tests.support.tiny_models import build

warnings.filterwarnings("ignore", category=UserWarning)


def _steps(client, run):
    return [core.decode_step(fields) for _, fields in client.xrange(core.steps_key(run))]


def _routed_ids(model):
    """Record the exact ids every experts module receives (an independent tap for the tests)."""
    seen = []
    for module in model.modules():
        if type(module).__name__.endswith("Experts"):
            module.register_forward_pre_hook(lambda m, a: seen.append(a[1].clone()))
    return seen


def test_generate_prefill_then_decode_round_trip(redis_server, redis_url):
    model = build("qwen3_moe")
    taps = _routed_ids(model)
    monitor = attach(model, redis_url=redis_url, run="gen", sample_tokens=4, sample_every=2)
    prompt = torch.randint(3, 90, (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                       min_new_tokens=4, do_sample=False, pad_token_id=0)
    monitor.close()
    records = _steps(redis_server.client(), "gen")
    assert [r.step for r in records] == [0, 1, 2, 3]
    assert [r.phase for r in records] == ["prefill", "decode", "decode", "decode"]
    assert [r.tokens for r in records] == [15, 3, 3, 3]
    layers = len(monitor.layer_names)
    for i, rec in enumerate(records):  # each step's counts are that step's own routing, per layer
        for layer in range(layers):
            ids = taps[i * layers + layer]
            assert rec.counts_LE[layer].tolist() == np.bincount(ids.reshape(-1), minlength=8).tolist()
        if i % 2 == 0:  # one step in sample_every=2 carries sampled rows
            assert rec.sample_ids_LNK.shape == (layers, min(4, rec.tokens), 2)
            ids0 = taps[i * layers].reshape(-1, 2)
            stride = max(1, ids0.shape[0] // 4)
            assert rec.sample_ids_LNK[0].tolist() == ids0[stride // 2::stride][:4].tolist()
        else:
            assert rec.sample_ids_LNK is None
        assert rec.dropped_steps == 0 and rec.world_size == 1 and rec.rank == 0
    total = sum(r.counts_LE.astype(np.int64) for r in records)
    assert np.array_equal(total, monitor.counts())
    meta = core.decode_meta(redis_server.client().get(core.meta_key("gen")))
    assert meta.layer_names == monitor.layer_names and meta.num_experts == 8 and meta.top_k == 2
    assert meta.layout.physical_to_logical_map == core.contiguous_layout(layers, 8)
    assert meta.hidden_size == 32 and meta.moe_intermediate_size == 16 and meta.dtype_bytes == 4


def test_padding_tokens_are_not_counted():
    model = build("mixtral")
    monitor = attach(model, sample_tokens=8)
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding: 4 pad tokens in row 0
    taps = _routed_ids(model)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    real = mask.reshape(-1).bool()
    for layer, tap in enumerate(taps):
        expected = np.bincount(tap[real].reshape(-1), minlength=8)
        assert monitor.counts()[layer].tolist() == expected.tolist()
    assert monitor.counts().sum(axis=1).tolist() == [8 * 2] * len(taps)
    monitor.close()


def test_sampled_rows_exclude_padding(redis_server, redis_url):
    model = build("olmoe")
    monitor = attach(model, redis_url=redis_url, run="pad", sample_tokens=12, sample_every=1)
    ids = torch.randint(3, 90, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    monitor.close()
    (rec,) = _steps(redis_server.client(), "pad")
    assert rec.tokens == 7
    assert rec.sample_ids_LNK.shape == (len(monitor.layer_names), 7, 2)  # the 7 real tokens, no padding row
    assert (rec.sample_ids_LNK >= 0).all()


@pytest.mark.slow  # torch.compile: the first compiled call takes tens of seconds
def test_torch_compile_attached_before_compiling(tmp_path):
    """Same counts as eager, and no recompilation from step to step (the hooks read no per-step Python
    value inside the graph: sampling offsets live in a device tensor)."""
    import torch._dynamo.utils as dynamo_utils
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(2))
    eager = build("qwen3_moe")
    expected = attach(eager)
    compiled_model = build("qwen3_moe")
    monitor = attach(compiled_model, sample_tokens=4, sample_every=2, trace_path=str(tmp_path / "c.jsonl"))
    compiled = torch.compile(compiled_model)
    with torch.no_grad():
        eager(input_ids=ids)
        compiled(input_ids=ids)  # a sampled step and an unsampled one: the two variants of the graph
        compiled(input_ids=ids)
        frames_after_warmup = dynamo_utils.counters["frames"]["total"]
        for _ in range(6):
            compiled(input_ids=ids)
    assert monitor.step == 8
    assert np.array_equal(monitor.counts(), 8 * expected.counts())
    assert monitor.stats()["last_error"] == ""
    assert dynamo_utils.counters["frames"]["total"] == frames_after_warmup, "the hooks made dynamo recompile"
    monitor.close()
    with open(tmp_path / "c.jsonl", encoding="utf-8") as trace:
        lines = [core.parse_trace_line(line) for line in trace]
    records = [core.decode_step(f) for kind, f in lines if kind == "step"]
    assert len(records) == 8
    for rec in records:  # sampled rows from inside the compiled graph: real ids of that very step
        if rec.step % 2:
            assert rec.sample_ids_LNK is None
            continue
        assert rec.sample_ids_LNK.shape == (len(monitor.layer_names), 4, 2)
        for layer, rows in enumerate(rec.sample_ids_LNK):
            assert (rec.counts_LE[layer][rows.reshape(-1)] > 0).all()


def test_generic_api_for_engines(redis_server, redis_url):
    mon = ExpertLoadMonitor(num_layers=3, num_experts=6, top_k=2, redis_url=redis_url, run="engine",
                            gpus=3, sample_tokens=2, sample_every=1)
    ids = torch.tensor([[0, 1], [1, 5], [5, 7], [-1, 2]])  # 7 and -1 are out of range: not counted
    weights = torch.tensor([[0.5, 0.5], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])  # (1, slot 1) has weight 0
    mon.record(0, ids)
    mon.record(2, ids, weights)
    assert mon.end_step(phase="decode", tokens=4) == 0
    mon.record(1, torch.tensor([[3, 4]]))
    mon.end_step()
    mon.close()
    assert mon.counts().tolist() == [[1, 2, 1, 0, 0, 2], [0, 0, 0, 1, 1, 0], [1, 2, 1, 0, 0, 1]]
    first, second = _steps(redis_server.client(), "engine")
    assert (first.phase, first.tokens, second.phase, second.tokens) == ("decode", 4, "unknown", 1)
    with pytest.raises(ValueError, match="layer 3"):
        mon.record(3, ids)
    with pytest.raises(ValueError, match=r"\[tokens, k\]"):
        mon.record(0, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="phase"):
        mon.end_step(phase="warmup")


def test_password_url_and_ranks_from_environment(tmp_path, monkeypatch):
    from moe_monitor.demo.localredis import RedisServer
    server = RedisServer(tmp_path, password="s3cret")
    try:
        monkeypatch.setenv("RANK", "2")
        monkeypatch.setenv("WORLD_SIZE", "4")
        mon = ExpertLoadMonitor(1, 4, 1, redis_url=server.url, run="auth", gpus=4, nvml=False)
        mon.record(0, torch.tensor([[3], [3]]))
        mon.end_step("prefill")
        mon.close()
        (rec,) = _steps(server.client(), "auth")
        assert (rec.rank, rec.world_size, rec.counts_LE.tolist()) == (2, 4, [[0, 0, 0, 2]])
    finally:
        server.stop()


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again: nothing listens there


def test_refused_redis_drops_oldest_and_counts_them():
    model = build("qwen3_moe")
    monitor = attach(model, redis_url=f"redis://127.0.0.1:{_dead_port()}/0", run="down", queue_steps=5,
                     host_slots=4)
    with torch.no_grad():
        for _ in range(21):
            model(input_ids=torch.randint(3, 90, (1, 4)))
    deadline = time.monotonic() + 10
    while "ConnectionError" not in monitor.stats()["last_error"] and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = monitor.stats()
    assert stats["steps"] == 21 and "ConnectionError" in stats["last_error"]
    assert stats["queued_steps"] <= 5 and stats["dropped_steps"] >= 21 - 5 - 4
    t0 = time.perf_counter()
    monitor.close(timeout_s=0.5)
    assert time.perf_counter() - t0 < 5.0
    assert monitor.stats()["dropped_steps"] == 21
    assert monitor.counts().sum() == 21 * 4 * 2 * len(monitor.layer_names)  # counting itself lost nothing


class Blackhole:
    """A TCP server that accepts connections and never answers: a Redis that hangs."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        for conn in self.conns:
            conn.close()
        self.sock.close()


def test_hanging_redis_never_blocks_the_forward():
    """The publisher is stuck for 20 s in a read that never returns; the model's steps go on regardless.
    Had a step waited on Redis even once, the loop below could not finish before that timeout."""
    hole = Blackhole()
    timeout_s = 20.0
    model = build("qwen3_moe")
    try:
        monitor = attach(model, redis_url=f"redis://127.0.0.1:{hole.port}/0", run="hang",
                         redis_timeout_s=timeout_s)
        with torch.no_grad():
            model(input_ids=torch.randint(3, 90, (1, 4)))
            deadline = time.monotonic() + 5
            while not hole.conns and time.monotonic() < deadline:
                time.sleep(0.02)
            assert hole.conns, "the publisher never reached the hanging server"
            time.sleep(0.2)  # it has sent its first batch and now waits for a reply that never comes
            start = time.monotonic()
            for _ in range(19):
                model(input_ids=torch.randint(3, 90, (1, 4)))
        elapsed = time.monotonic() - start
        assert elapsed < timeout_s, f"20 steps took {elapsed:.1f} s: a step waited on Redis"
        assert monitor.stats()["published_steps"] == 0 and monitor.step == 20
        t0 = time.monotonic()
        monitor.close(timeout_s=0.5)
        assert time.monotonic() - t0 < timeout_s / 2, "close() waited for the hung Redis"
        assert monitor.stats()["dropped_steps"] == 20
    finally:
        hole.close()


def test_buffered_steps_survive_a_redis_restart(tmp_path):
    from moe_monitor.demo.localredis import RedisServer
    server = RedisServer(tmp_path)
    port = server.port
    mon = ExpertLoadMonitor(1, 2, 1, redis_url=server.url, run="restart", queue_steps=100, nvml=False)
    server.stop()
    for _ in range(5):
        mon.record(0, torch.tensor([[1]]))
        mon.end_step("decode")
    deadline = time.monotonic() + 10  # the publisher decodes the steps and fails to reach Redis
    while (mon.stats()["queued_steps"] < 5 or not mon.stats()["last_error"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mon.stats()["queued_steps"] == 5 and mon.stats()["published_steps"] == 0
    import subprocess
    server.proc = subprocess.Popen(server.proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while mon.stats()["queued_steps"] and time.monotonic() < deadline:
            time.sleep(0.1)
        mon.close()
        records = _steps(server.client(), "restart")
        assert [r.step for r in records] == [0, 1, 2, 3, 4] and server.port == port
        assert server.client().get(core.meta_key("restart")) is not None  # metadata written again
    finally:
        server.stop()


def test_options_by_object_and_by_name():
    """MonitorOptions holds the knobs; names passed to attach()/ExpertLoadMonitor override its fields."""
    from moe_monitor.collectors import MonitorOptions
    opts = MonitorOptions(sample_tokens=4, gpus=2, nvml=False)
    layout = [[1, 0, 3, 2]]
    mon = ExpertLoadMonitor(1, 4, 2, options=opts, gpus=4, physical_to_logical_map=layout)
    layout[0][0] = 3  # the monitor keeps its own copy
    assert mon.counter.sample_tokens == 4 and mon.meta.layout.gpus == 4
    assert mon.meta.layout.physical_to_logical_map == [[1, 0, 3, 2]] and mon.publisher is None
    mon.close()
    monitor = attach(build("qwen3_moe"), options=opts, sample_tokens=0)
    assert monitor.counter.sample_tokens == 0 and monitor.meta.layout.gpus == 2
    monitor.close()
    assert opts.sample_tokens == 4  # the options object is unchanged (frozen)


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown monitor option\(s\) sample_token;.*sample_tokens.*trace_path"):
        ExpertLoadMonitor(1, 4, 1, sample_token=3)
    with pytest.raises(TypeError, match="sample_token;"):
        attach(build("qwen3_moe"), sample_token=3)
    with pytest.raises(TypeError, match="options must be a MonitorOptions"):
        ExpertLoadMonitor(1, 4, 1, options={"gpus": 4})


@pytest.mark.parametrize(("name", "value", "message"), [
    ("sample_tokens", -1, "sample_tokens must be an integer >= 0, got -1"),
    ("sample_every", 0, "sample_every must be an integer >= 1, got 0"),
    ("queue_steps", 2.5, "queue_steps must be an integer >= 1, got 2.5"),
    ("host_slots", 0, "host_slots must be an integer >= 1"),
    ("memory_budget_bytes", 0, "memory_budget_bytes must be an integer >= 1"),
    ("gpus", 0, "gpus must be a positive integer"),
    ("nodes", 3, "gpus=8 must be a multiple of nodes=3"),
    ("nvml", "yes", "nvml must be True or False"),
    ("nvml_interval_s", 0, "nvml_interval_s must be a positive number of seconds"),
    ("redis_timeout_s", float("nan"), "redis_timeout_s must be a positive number of seconds"),
    ("publish_interval_s", -0.25, "publish_interval_s must be a positive number of seconds"),
    ("publish_interval_s", float("inf"), "publish_interval_s must be a positive number of seconds"),
    ("trace_path", "", "trace_path must be a file path"),
    ("trace_max_bytes", 0, "trace_max_bytes must be a positive integer"),
    ("physical_to_logical_map", [[0, 1.5]], r"physical_to_logical_map must be a list of rows of integer"),
])
def test_bad_options_say_what_is_expected(name, value, message):
    from moe_monitor.collectors import MonitorOptions
    extra = {"gpus": 8} if name == "nodes" else {}
    with pytest.raises(ValueError, match=message):
        MonitorOptions(**{name: value, **extra})
    with pytest.raises(ValueError, match=message):
        ExpertLoadMonitor(1, 8, 1, **{name: value, **extra})


def test_layout_that_does_not_fit_the_model_is_refused():
    with pytest.raises(ValueError, match="every expert 0..3 needs a slot"):
        ExpertLoadMonitor(1, 4, 1, gpus=2, physical_to_logical_map=[[0, 1, 2, 2]])


def test_the_publish_interval_and_host_slots_reach_the_publisher(redis_url):
    with ExpertLoadMonitor(1, 4, 1, redis_url=redis_url, run="interval", nvml=False, publish_interval_s=7.5,
                           host_slots=6) as mon:
        assert mon.publisher is not None and mon.publisher._flush_interval_s == 7.5
        assert mon.publisher._wake_at == 3 and len(mon._free_slots) == 6
