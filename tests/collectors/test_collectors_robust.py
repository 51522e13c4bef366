"""Never down, never wrong, on the model's side: no hook raises into the forward (a layer it cannot read is
reported and the others go on), ids outside [0, E) are counted as invalid on every device, the counter's
CUDA stream ordering (its logic, with stand-in streams), and the trace file's size cap."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor, MonitorOptions, attach
from moe_monitor.collectors.counter import DeviceCounter, StreamOrder
from moe_monitor.collectors.sinks import TraceFileSink
from moe_monitor.core.health import HealthReport
from tests.support.tiny_models import build


def _health(client, run):
    return json.loads(client.hget(core.health_key(run), "0"))


# ---------------------------------------------------------------------- 1. adapters never raise
def _flat_logits(module, args, output):
    scores, logits = output
    return scores, logits.reshape(-1)          # a router that hands back its logits flattened


def _batched_logits(module, args, output):
    scores, logits = output
    return scores, logits.unsqueeze(0)         # [1, N, E]: topk(dim=1) would pick tokens, not experts


def _capacity_one(module, args, output):
    """A JetMoE gating with expert capacity 1: each expert gets its first slot only, the rest is dropped
    (the model runs fine on it: fewer rows to compute)."""
    order, batch_index, gates, expert_size, logits = output
    keep, start = [], 0
    for size in expert_size:
        keep += [start] if size else []
        start += size
    keep_t = torch.tensor(keep, dtype=torch.int64)
    return order[keep_t], batch_index[keep_t], gates[keep_t], [1 if s else 0 for s in expert_size], logits


def _ids_by_keyword(module, args, kwargs):
    return (), {**kwargs, "input": args[0]}    # down_embed(input=indices): nothing positional


CASES = {
    # name: (family, how layer 0's hooked module is changed, hook kind, layer 0 still countable)
    "llama4 flat logits": ("llama4_text", _flat_logits, "forward", False),
    "llama4 batched logits": ("llama4_text", _batched_logits, "forward", False),
    "jetmoe capacity-limited gating": ("jetmoe", _capacity_one, "forward", False),
    "doge ids by keyword": ("doge", _ids_by_keyword, "pre_kwargs", True),
}


def _tap(module, kind):
    """What layer 1's hooked module really dispatched, read independently of the monitor."""
    seen = []
    if kind == "llama4_text":
        module.register_forward_hook(lambda m, a, out: seen.append(out[1].detach().clone()))
        return lambda: np.bincount(torch.topk(seen[-1], m_top_k(module), dim=1).indices.reshape(-1),
                                   minlength=module.num_experts)
    if kind == "jetmoe":
        module.register_forward_hook(lambda m, a, out: seen.append(list(out[3])))
        return lambda: np.array(seen[-1])
    module.register_forward_pre_hook(lambda m, a, k: seen.append((a[0] if a else k["input"]).detach().clone()),
                                     with_kwargs=True)
    return lambda: np.bincount(seen[-1].reshape(-1), minlength=module.num_embeddings)


def m_top_k(module):
    return module.top_k


@pytest.mark.parametrize("case", list(CASES))
def test_adapter_hooks_never_raise_into_the_forward(case, redis_server, redis_url):
    """Layer 0's hooked module gets an input / output of a shape its adapter does not expect. Under warnings
    as errors, the forward still runs; layer 0 is either read right (doge: ids by keyword) or not counted at
    all and reported (stats() and the published health name the layer); layer 1 is counted exactly."""
    family, change, kind, countable = CASES[case]
    model = build(family)
    run = "hooks-" + case.split()[0]
    monitor = attach(model, redis_url=redis_url, run=run, nvml=False)
    first, second = monitor.layers[0], monitor.layers[1]
    if kind == "forward":
        first.module.register_forward_hook(change, prepend=True)
    else:
        first.module.register_forward_pre_hook(change, prepend=True, with_kwargs=True)
    truth0 = _tap(first.module, family) if countable else None
    truth1 = _tap(second.module, family)
    ids = torch.randint(3, 90, (2, 5), generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning turned into an exception must not reach the model either
        with torch.no_grad():
            model(input_ids=ids)
            model(input_ids=ids)
    counts = monitor.counts()
    stats = monitor.stats()
    monitor.close()
    assert monitor.step == 2
    assert counts[1].tolist() == (2 * truth1()).tolist()
    if countable:
        assert counts[0].tolist() == (2 * truth0()).tolist() and stats["hook_errors"] == 0
        assert stats["last_error"] == ""
        return
    assert counts[0].sum() == 0, "a layer the adapter cannot read is not counted at all"
    assert stats["hook_errors"] == 2 and f"layer {first.name}" in stats["last_error"]
    health = _health(redis_server.client(), run)
    assert f"layer {first.name}" in health["last_error"] and health["hook_errors"] == 2


def test_a_failing_step_hook_is_reported_not_raised(redis_server, redis_url):
    """The top-level step hook: a begin_step that fails is counted and published in the health, not raised."""
    model = build("qwen3_moe")
    monitor = attach(model, redis_url=redis_url, run="stephook", nvml=False)
    monitor.begin_step = None  # any failure inside the step hook
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            model(input_ids=torch.randint(3, 90, (1, 4)))
    stats = monitor.stats()
    monitor.close()
    assert stats["hook_errors"] == 1 and "step start: TypeError" in stats["last_error"]
    assert "step start: TypeError" in _health(redis_server.client(), "stephook")["last_error"]
    assert monitor.counts().sum() == 4 * 2 * len(monitor.layers)  # the layers still counted


# ---------------------------------------------------------------------- 3. invalid ids: one rule
def test_out_of_range_ids_are_counted_as_invalid_never_as_an_expert(redis_server, redis_url):
    """The hook's hot path (counter.record without a mask, what attach() runs) and the engines' record()
    count an id outside [0, E) in the invalid column: never on an expert, on the CPU as on CUDA (one clamp
    into [-1, E] and a put_ that wraps -1 onto column E: no host sync). The sampled rows show -1 there."""
    mon = ExpertLoadMonitor(2, 4, 2, redis_url=redis_url, run="invalid", sample_tokens=4, sample_every=1,
                            nvml=False)
    ids = torch.tensor([[0, 5], [-1, 3], [2, 2], [9, -7]])
    mon.begin_step(tokens=4)
    mon.counter.record(0, ids)          # the hooks' path
    mon.record(1, ids)                  # the engines' path
    mon.end_step("decode")
    mon.begin_step(tokens=1)
    mon.counter.record(0, torch.tensor([[4, 4]]))
    mon.record(1, torch.tensor([[1, 4]]), weights=torch.tensor([[1.0, 0.0]]))  # weight 0: not counted at all
    mon.end_step("decode")
    stats = mon.stats()
    mon.close()
    assert mon.counts().tolist() == [[1, 0, 2, 1], [1, 1, 2, 1]]
    assert mon.invalid_counts().tolist() == [6, 4] and stats["invalid_ids"] == 10
    first, second = [core.decode_step(f) for _, f in redis_server.client().xrange(core.steps_key("invalid"))]
    assert first.counts_LE.tolist() == [[1, 0, 2, 1], [1, 0, 2, 1]] and second.counts_LE[0].sum() == 0
    assert first.sample_ids_LNK[0].tolist() == [[0, -1], [-1, 3], [2, 2], [-1, -1]]
    assert _health(redis_server.client(), "invalid")["invalid_ids"] == 10


def test_invalid_ids_from_a_model_do_not_cost_the_layer(redis_server, redis_url):
    """A real model whose layer 0 dispatches ids -1 and E (as an engine's padding or a bug would): the hook
    sees them (they are put back before the experts run, so the model itself is unaffected); the valid ids
    are counted, the invalid ones in their column, nothing fails."""
    model = build("qwen3_moe")
    monitor = attach(model, sample_tokens=0)
    experts = monitor.layers[0].module
    kept = {}

    def spoil(module, args):
        kept["ids"] = args[1]
        bad = args[1].clone()
        bad[0, 0], bad[1, 1] = -1, 8
        return (args[0], bad, *args[2:])

    experts.register_forward_pre_hook(spoil, prepend=True)
    experts.register_forward_pre_hook(lambda m, a: (a[0], kept["ids"], *a[2:]))  # after the monitor's hook
    with torch.no_grad():
        model(input_ids=torch.randint(3, 90, (1, 4), generator=torch.Generator().manual_seed(0)))
    stats = monitor.stats()
    monitor.close()
    real = np.bincount(kept["ids"].reshape(-1), minlength=8)
    real[int(kept["ids"][0, 0])] -= 1
    real[int(kept["ids"][1, 1])] -= 1
    assert monitor.counts()[0].tolist() == real.tolist()
    assert monitor.invalid_counts().tolist() == [2, 0]
    assert stats["invalid_ids"] == 2 and stats["hook_errors"] == 0 and stats["last_error"] == ""


def test_zero_compute_experts_by_design_are_not_invalid():
    """LongCat's ids >= E are zero-compute experts by design: neither counted nor invalid."""
    model = build("longcat_flash")
    with torch.no_grad():
        model.model.layers[0].mlp.router.e_score_correction_bias[8] = 10.0
    monitor = attach(model, sample_tokens=0)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 90, (2, 5)))
    monitor.close()
    assert monitor.counts().sum(axis=1).tolist() == [10] * len(monitor.layers)
    assert monitor.invalid_counts().sum() == 0 and monitor.stats()["invalid_ids"] == 0


# ---------------------------------------------------------------------- 4. CUDA stream order (logic)
class _Stream:
    """Stands in for torch.cuda.Stream: equality by name, wait_stream() logged."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits for {other.name}")

    def __eq__(self, other):
        return isinstance(other, _Stream) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


def test_step_ops_wait_for_the_stream_of_the_previous_ones():
    """begin_step, the snapshot at end_step and counts() each make the current stream wait for the stream
    the previous of them ran on: a step recorded on a side stream and closed on the default one is copied
    only after its counting, and the next step's counting starts only after the reset (no host sync)."""
    log, current = [], ["side"]
    streams = {name: _Stream(name, log) for name in ("side", "default")}
    counter = DeviceCounter(1, 4, 1, "cpu", sample_tokens=0)
    counter.streams = StreamOrder(lambda: streams[current[0]])
    counter.begin_step(2, None)
    counter.record(0, torch.tensor([[1], [2]]))
    current[0] = "default"
    counter.snapshot(counter.new_slot())
    assert log == ["default waits for side"]
    counter.begin_step(1, None)  # same stream: nothing to wait for
    counter.snapshot(None)
    assert log == ["default waits for side"]
    current[0] = "side"
    counter.begin_step(1, None)
    assert log == ["default waits for side", "side waits for default"]
    current[0] = "default"
    counter.running_total()
    assert log[-1] == "default waits for side"


def test_cpu_counters_need_no_stream_order():
    assert DeviceCounter(1, 4, 1, "cpu").streams is None


# ---------------------------------------------------------------------- 5. trace size cap
def _read_trace(path):
    with open(path, encoding="utf-8") as handle:
        lines = [core.decode_trace_line(line) for line in handle]
    return lines[0], [rec.step for kind, rec in lines if kind == "step"]


def test_trace_file_is_capped_and_rotated_once(tmp_path):
    path = tmp_path / "run.jsonl"
    cap = 20_000
    mon = ExpertLoadMonitor(2, 8, 2, nvml=False, sample_tokens=0, trace_path=str(path), trace_max_bytes=cap,
                            host_slots=400)  # a loop far faster than any model: no step waits for a slot
    for step in range(400):
        mon.record(0, torch.tensor([[step % 8, 1]]))
        mon.end_step("decode")
        if step % 50 == 0:
            mon.publisher._wake.set()  # several batches: the rotation happens between and inside them
    mon.close()
    assert mon.stats()["published_steps"] == 400
    (meta_new, steps_new), (meta_old, steps_old) = _read_trace(path), _read_trace(str(path) + ".1")
    assert meta_new[0] == meta_old[0] == "meta" and meta_new[1].run == mon.run  # each file replays on its own
    assert path.stat().st_size <= cap and (tmp_path / "run.jsonl.1").stat().st_size <= cap
    assert steps_old + steps_new == list(range(steps_old[0], 400))  # the newest steps, in order, no gap
    assert steps_old[0] > 0 and sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", "run.jsonl.1"]


def test_trace_cap_default_and_validation():
    assert MonitorOptions().trace_max_bytes == 1 << 30 and MonitorOptions(trace_max_bytes=None).trace_max_bytes is None
    for bad in (0, -5, 1.5, "1GB", True):
        with pytest.raises(ValueError, match="trace_max_bytes must be a positive integer"):
            MonitorOptions(trace_max_bytes=bad)


class _FullDisk:
    """A trace file on a disk that may be full: writes are buffered and reach the file at flush, which fails
    with ENOSPC while DISK["full"] is set; close flushes first, like a real file (its buffer is lost)."""

    def __init__(self, handle):
        self.handle, self.pending = handle, []

    def write(self, text):
        self.pending.append(text)

    def flush(self):
        if DISK["full"]:
            raise OSError(28, "No space left on device")
        self.handle.write("".join(self.pending))
        self.pending = []
        self.handle.flush()

    def close(self):
        try:
            self.flush()
        finally:
            self.handle.close()

    @property
    def closed(self):
        return self.handle.closed

    def fileno(self):
        return self.handle.fileno()


DISK = {"full": False}


def test_trace_sink_recovers_after_a_full_disk_and_keeps_its_size_honest(tmp_path, monkeypatch):
    """A failed write (ENOSPC) neither breaks the sink for good nor repeats or inflates anything: the
    retried batch lands once, when the disk has room, with no early rotation, and the file replays."""
    from moe_monitor.collectors import sinks

    path = tmp_path / "run.jsonl"
    meta = core.RunMeta(run="full", model_name="m", layer_names=["a"], num_experts=4, top_k=1,
                        hidden_size=1, moe_intermediate_size=1, dtype_bytes=2,
                        layout=core.Layout(1, 1, core.contiguous_layout(1, 4)), world_size=1)
    sink = TraceFileSink(path, meta, max_bytes=64 << 10)
    monkeypatch.setattr(sinks, "open", lambda *a, **k: _FullDisk(open(*a, **k)),  # noqa: SIM115
                        raising=False)
    sink._file = _FullDisk(sink._file)
    records = [core.StepRecord(run="full", rank=0, world_size=1, step=s, time_s=1.0 + s, phase="decode",
                               tokens=1, counts_LE=np.array([[1, 0, 0, 0]], dtype=np.int32)) for s in range(3)]
    DISK["full"] = True
    try:
        for _ in range(200):  # a long outage: the publisher offers the same batch again and again
            with pytest.raises(OSError):
                sink.write(records, [], HealthReport(rank=0))
    finally:
        DISK["full"] = False
    sink.write(records, [], HealthReport(rank=0))
    sink.close()
    assert not (tmp_path / "run.jsonl.1").exists()  # the failed tries did not count towards the cap
    meta_line, steps = _read_trace(path)
    assert meta_line[0] == "meta" and steps == [0, 1, 2]


def test_a_publisher_failure_reaches_the_redis_health_even_beside_a_trace(redis_server, redis_url, tmp_path):
    """A failure outside the sinks (a step that does not decode) is cleared only once a sink that keeps the
    health report (Redis) has carried it, not when the trace file, which keeps no health, lands first."""
    mon = ExpertLoadMonitor(2, 8, 2, nvml=False, sample_tokens=0, redis_url=redis_url, run="decodefail",
                            trace_path=str(tmp_path / "t.jsonl"))
    decode, calls = mon.publisher._decode, []

    def decode_failing_step_0(jobs):  # step 0 fails, and with it the round it is decoded in
        calls.append([job.step for job in jobs])
        if any(job.step == 0 for job in jobs):
            raise RuntimeError("bad step buffer")
        return decode(jobs)

    mon.publisher._decode = decode_failing_step_0
    # every health report the real Redis sink carried (its write returned: the hash got it), kept as it went, so
    # the test never races the next report that overwrites the hash field
    (redis_box,) = [box for box in mon.publisher._outboxes if box.sink.name == "redis"]
    real_write, seen = redis_box.sink.write, []

    def carrying(records, samples, health, **kwargs):
        real_write(records, samples, health, **kwargs)
        seen.append(health.fields())

    redis_box.sink.write = carrying
    for step in range(5):
        mon.record(0, torch.tensor([[step % 8, 1]]))
        mon.end_step("decode")
    client = redis_server.client()
    mon.close()
    carried = [h for h in seen if "decode failed: RuntimeError: bad step buffer" in h["last_error"]]
    assert carried and carried[0]["dropped_steps"] == 1, seen[-3:]
    assert _health(client, "decodefail")["published_steps"] == 4
    assert [0] in calls  # the failing round was decoded again step by step: only step 0 was lost
