"""Sources against a real redis-server and real trace files: incremental reads, bad records counted,
an unreachable Redis reported fast, trace replay in chunks."""
import socket
import time

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource, read_runs
from moe_monitor.dashboard.sources.trace import TraceSource
from tests.support import synthfill


def test_incremental_reads_sum_ranks_and_count_bad_records(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    totals = synthfill.fill(client, "inc", steps=12, world_size=2)
    synthfill.add_bad_entry(client, "inc")
    watched = WatchedRun(RedisSource(client, redis_url, "inc", window_steps=50), window_steps=50)
    first = watched.tick()
    assert (first.steps_in, first.bad) == (24, 1) and watched.bad_records == 1
    assert "counts has 3 bytes" in watched.last_error
    view = watched.window.view("both", [list(range(16))] * 4, 4)
    np.testing.assert_array_equal(view.counts_sum_LE, sum(totals))
    assert list(view.ranks_T) == [2] * 12
    assert watched.tick().steps_in == 0  # nothing new: nothing re-read
    for rank in (0, 1):  # both ranks: a step short of one waits for the assembler's deadline
        rec = core.StepRecord(run="inc", rank=rank, world_size=2, step=12, time_s=time.time(), phase="decode",
                              tokens=3, counts_LE=np.ones((4, 16), dtype=np.int32), dropped_steps=7 - 7 * rank)
        client.xadd(core.steps_key("inc"), core.encode_step(rec))
    assert watched.tick().steps_in == 2
    assert watched.window.size == 13 and watched.dropped_steps == 7
    assert [name for name, _ in read_runs(client).runs] == ["inc"]


def test_first_poll_reads_only_the_window_backlog(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "tail", steps=40)
    watched = WatchedRun(RedisSource(client, redis_url, "tail", window_steps=10), window_steps=10)
    assert watched.tick().steps_in == 10
    assert list(watched.window.view("both", [list(range(16))] * 4, 4).step_T) == list(range(30, 40))


def test_a_backlog_of_large_records_is_handed_over_in_decoded_pieces(redis_url, monkeypatch):
    from moe_monitor.dashboard.sources import streams

    client = core.connect(redis_url, timeout_s=2.0)
    sums = synthfill.fill(client, "pieces", steps=12, num_layers=8, num_experts=64)
    monkeypatch.setattr(streams, "DECODED_BUDGET_BYTES", 5 * 8 * 64 * 4)  # five records' counts a poll
    watched = WatchedRun(RedisSource(client, redis_url, "pieces", window_steps=10), window_steps=10)
    taken = []
    while True:
        tick = watched.tick()
        taken.append(tick.steps_in)
        if not tick.more:
            break
    assert taken == [4, 4, 2] and watched.bad_records == 0  # each piece within the budget: wire bytes count too
    view = watched.window.view("both", [list(range(64))] * 8, 4)
    assert list(view.step_T) == list(range(2, 12))
    np.testing.assert_array_equal(view.counts_sum_LE, sum(sums[2:]))


def test_count_cap_per_tick(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "cap", steps=1)
    watched = WatchedRun(RedisSource(client, redis_url, "cap", window_steps=100), window_steps=100,
                      max_entries_per_tick=4)
    watched.tick()
    synthfill.fill(client, "cap", steps=10, seed=3, meta=False)
    tick = watched.tick()
    assert tick.steps_in == 4 and tick.more


def test_unreachable_redis_is_reported_not_raised():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    source = RedisSource(core.connect(url, timeout_s=0.3, retries=0), url, "gone", window_steps=5)
    started = time.monotonic()
    batch = source.poll(10)
    assert time.monotonic() - started < 3
    health = source.health()
    assert not health.reachable and batch.steps == []
    assert "hunter2" not in health.where and "***" in health.where and health.error


def test_trace_source_replays_in_chunks_and_skips_bad_lines(tmp_path):
    meta = synthfill.make_meta("tr", 2, 8, gpus=2)
    lines = [core.trace_line("meta", {"meta": core.encode_meta(meta)})]
    rng = np.random.default_rng(0)
    for step in range(6):
        rec = core.StepRecord(run="tr", rank=0, world_size=1, step=step, time_s=100.0 + step, phase="decode",
                              tokens=8, counts_LE=rng.integers(0, 5, size=(2, 8)).astype(np.int32))
        lines.append(core.trace_line("step", core.encode_step(rec)))
    lines.insert(3, '{"kind": "step", "v": 1}')
    lines.insert(4, "not json")
    gpu = core.GpuSample(rank=0, host="h", time_s=100.0, status="unavailable", reason="no driver")
    lines.append(core.trace_line("gpu", core.encode_gpu_sample(gpu)))
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    watched = WatchedRun(TraceSource(str(path)), window_steps=100, max_entries_per_tick=4)
    first = watched.tick()
    assert first.steps_in == 4 and first.more and watched.bad_records == 2
    not_json_at = sum(len(line) + 1 for line in lines[:4])  # the error names where the bad line starts
    assert watched.last_error.startswith(f"trace line at byte {not_json_at}:"), watched.last_error
    assert watched.source.meta().num_experts == 8
    second = watched.tick()
    assert second.steps_in == 2 and not second.more and watched.source.finished
    assert watched.window.size == 6 and ("h", 0) in watched.gpus.unavailable
    with open(path, "a") as handle:
        handle.write(lines[1][:20])  # a line still being written is left for later
    assert watched.tick().steps_in == 0 and watched.bad_records == 2


def test_missing_trace_file_is_unreachable(tmp_path):
    source = TraceSource(str(tmp_path / "nope.jsonl"))
    assert source.poll(5).steps == [] and not source.health().reachable


def test_a_redis_error_mid_poll_loses_no_step(redis_url):
    """Steps are read first, then one pipeline; when Redis answers that pipeline with an error (here
    WRONGTYPE on the health key), the steps already read are read again by the next poll, not lost."""
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "mid", steps=6)
    source = RedisSource(client, redis_url, "mid", window_steps=50)
    watched = WatchedRun(source, window_steps=50)
    assert watched.tick().steps_in == 6
    synthfill.fill(client, "mid", steps=4, first_step=6)
    client.delete(core.health_key("mid"))
    client.set(core.health_key("mid"), b"not a hash")            # the backlog case below reads it too
    assert watched.tick().steps_in == 0 and not source.health().reachable
    client.delete(core.health_key("mid"))
    assert watched.tick().steps_in == 4
    assert list(watched.window.view("both", [list(range(16))] * 4, 4).step_T) == list(range(10))
    fresh = RedisSource(client, redis_url, "mid", window_steps=50)  # the first poll, paging the backlog
    client.set(core.health_key("mid"), b"not a hash")
    assert fresh.poll(1000).steps == []
    client.delete(core.health_key("mid"))
    assert sorted(rec.step for rec in fresh.poll(1000).steps) == list(range(10))


def test_a_health_hash_with_too_many_fields_is_not_read(redis_url):
    """A health hash far beyond any real world size is not pulled into the dashboard (one bad record)."""
    from moe_monitor.dashboard.sources.redis import MAX_HEALTH_RANKS

    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "wide", steps=3)
    client.hset(core.health_key("wide"), mapping={str(r): "{}" for r in range(MAX_HEALTH_RANKS + 1)})
    source = RedisSource(client, redis_url, "wide", window_steps=10)
    batch = source.poll(100)
    assert len(batch.steps) == 3 and batch.bad_records == 1 and "not read" in batch.last_error
    assert source.health().reachable and source.health().collectors == {}
    assert source.poll(100).bad_records == 0  # counted once, not at every poll


def test_a_poll_takes_every_rank_s_nvml_samples_of_four_seconds(redis_url):
    """64 ranks sampling NVML every 0.25 s write 1,024 samples in 4 s: a poll takes them all (a page of
    GPU_PER_RANK a rank, not a fixed 600 that falls further behind at every poll)."""
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "nvml-many", steps=4, world_size=64)
    source = RedisSource(client, redis_url, "nvml-many", window_steps=50)
    source.poll(10_000)  # the metadata, the steps and the backlog of samples (none yet)

    def write(count: int) -> None:
        pipe = client.pipeline(transaction=False)
        for i in range(count):
            sample = core.GpuSample(rank=i % 64, host=f"h{i % 64 // 8}", time_s=time.time(), status="ok",
                                    gpus=[{"index": i % 8, "sm_clock_mhz": 1980.0}])
            pipe.xadd(core.gpu_key("nvml-many"), core.encode_gpu_sample(sample))
        pipe.execute()

    write(1024)
    assert len(source.poll(10_000).gpu_samples) == 1024
    write(1500)  # more than a page: the rest comes with the next poll, none lost
    assert len(source.poll(10_000).gpu_samples) + len(source.poll(10_000).gpu_samples) == 1500
