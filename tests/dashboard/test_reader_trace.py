"""Trace files: regular files only (never a device or a FIFO, never blocking), lines read under a size cap
(a longer line is one bad record, skipped without being held in memory), and the dashboard opens only files
inside the trace folder, refusing anything else with one message that does not say whether it exists."""
from __future__ import annotations

import contextlib
import os
import threading
import time
import tracemalloc

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources import trace as trace_source
from moe_monitor.dashboard.sources.trace import TraceSource, trace_file_in
from tests.support import synthfill
from tests.support.apptest import run_app


def _lines(steps: int = 3) -> list[str]:
    lines = [core.trace_line("meta", {"meta": core.encode_meta(synthfill.make_meta("t", 2, 8, gpus=2))})]
    for step in range(steps):
        rec = core.StepRecord(run="t", rank=0, world_size=1, step=step, time_s=100.0 + step, phase="decode",
                              tokens=4, counts_LE=np.full((2, 8), step, dtype=np.int32))
        lines.append(core.trace_line("step", core.encode_step(rec)))
    return lines


def _poll_with_deadline(source: TraceSource, seconds: float = 5.0):
    done: list = []
    thread = threading.Thread(target=lambda: done.append(source.poll(10)), daemon=True)
    thread.start()
    thread.join(seconds)
    return thread, done


def test_a_device_is_refused_without_reading_it():
    started = time.monotonic()
    source = TraceSource("/dev/zero")
    batch = source.poll(10)
    assert time.monotonic() - started < 1.0 and batch.steps == []
    health = source.health()
    assert not health.reachable and "regular file" in health.error


def test_a_fifo_never_blocks_the_session(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    source = TraceSource(str(fifo))
    try:
        thread, done = _poll_with_deadline(source)
        assert not thread.is_alive(), "poll blocked on a FIFO"
        assert done[0].steps == [] and "regular file" in source.health().error
    finally:
        with contextlib.suppress(OSError):  # release a poll stuck in open() (the code before the fix)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_line_over_the_cap_is_one_bad_record_and_is_never_held(tmp_path):
    lines = _lines(3)
    path = tmp_path / "long.jsonl"
    with open(path, "w") as handle:
        handle.write(lines[0] + "\n" + lines[1] + "\n")
        handle.write('{"kind": "step", "pad": "' + "x" * (40 << 20) + '"}\n')  # 40 MiB, over the 32 MiB cap
        handle.write(lines[2] + "\n" + lines[3] + "\n")
    watched = WatchedRun(TraceSource(str(path)), window_steps=10)
    tracemalloc.start()
    try:
        while True:
            tick = watched.tick()
            if not tick.more:
                break
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert watched.window.size == 3 and watched.bad_records == 1, watched.last_error
    assert "longer than" in watched.last_error
    assert peak < 8 << 20, peak


def test_a_long_line_still_being_written_is_skipped_across_polls(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_source, "MAX_LINE_BYTES", 1000)
    lines = _lines(2)
    path = tmp_path / "growing.jsonl"
    path.write_text(lines[0] + "\n" + lines[1] + "\n" + "y" * 1500)
    source = TraceSource(str(path), stall_s=3600)
    watched = WatchedRun(source, window_steps=10)
    watched.tick()
    assert watched.window.size == 1 and watched.bad_records == 1
    with open(path, "a") as handle:
        handle.write("z" * 3000 + "\n" + lines[2] + "\n")
    watched.tick()
    assert watched.window.size == 2 and watched.bad_records == 1


@pytest.mark.parametrize("chunk", [16, 1 << 20])
def test_the_cap_is_exact_whatever_the_chunk_size(tmp_path, monkeypatch, chunk):
    lines = _lines(3)
    longest = max(len(line) + 1 for line in lines[1:])  # step lines, with their newline
    path = tmp_path / "exact.jsonl"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(trace_source, "CHUNK_BYTES", chunk)
    for cap, taken in ((longest, 3), (longest - 1, 0)):
        monkeypatch.setattr(trace_source, "MAX_LINE_BYTES", cap)
        watched = WatchedRun(TraceSource(str(path)), window_steps=10)
        watched.tick()
        shown = 0 if watched.window is None else watched.window.size
        assert shown == taken and watched.bad_records == 4 - taken - (len(lines[0]) + 1 <= cap), cap


def test_one_poll_reads_a_bounded_number_of_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_source, "TICK_BYTES_BUDGET", 2000)
    lines = _lines(20)
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n")
    source = TraceSource(str(path))
    first = source.poll(1000)
    assert first.more and 0 < len(first.steps) < 20
    taken = len(first.steps)
    while True:
        batch = source.poll(1000)
        taken += len(batch.steps)
        if not batch.more:
            break
    assert taken == 20 and source.finished


def test_names_are_taken_inside_the_trace_folder_only(tmp_path):
    root = tmp_path / "traces"
    (root / "sub").mkdir(parents=True)
    (root / "a.jsonl").write_text("")
    (root / "sub" / "b.jsonl").write_text("")
    outside = tmp_path / "secret.jsonl"
    outside.write_text("")
    (root / "link.jsonl").symlink_to(outside)
    assert trace_file_in(root, "a.jsonl") == root / "a.jsonl"
    assert trace_file_in(root, "sub/b.jsonl") == root / "sub" / "b.jsonl"
    assert trace_file_in(root, str(root / "a.jsonl")) == root / "a.jsonl"
    assert trace_file_in(root, "missing.jsonl") == root / "missing.jsonl"  # inside: its poll says it is missing
    messages = set()
    for name in (str(outside), "../secret.jsonl", "link.jsonl", "/etc/passwd", "/no/such/file", "../nope.jsonl",
                 "sub/../../secret.jsonl", "", "."):
        with pytest.raises(ValueError) as info:
            trace_file_in(root, name)
        messages.add(str(info.value))
    assert len(messages) == 1, messages


def _replay(monkeypatch, root, name):
    monkeypatch.setenv("MOE_TRACE_DIR", str(root))
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    at.sidebar.radio(key="source_kind").set_value("Trace file").run()
    at.sidebar.selectbox(key="trace_path").set_value(name).run()
    assert not at.exception, at.exception
    return at


def test_the_page_replays_a_name_in_the_folder_and_offers_nothing_else(tmp_path, monkeypatch):
    """Trace files are picked from the trace folder, never typed: the page offers the folder's regular files
    only (not a file outside it, not a symlink leading out, not a device), and replays the one picked.
    Names that do reach the source some other way are refused alike (test_names_are_taken_inside_...)."""
    root = tmp_path / "traces"
    root.mkdir()
    (root / "run.jsonl").write_text("\n".join(_lines(4)) + "\n")
    outside = tmp_path / "outside.jsonl"
    outside.write_text("\n".join(_lines(4)) + "\n")
    (root / "escape.jsonl").symlink_to(outside)
    (root / "zero.jsonl").symlink_to("/dev/zero")
    at = _replay(monkeypatch, root, "run.jsonl")
    assert list(at.sidebar.selectbox(key="trace_path").options) == ["run.jsonl"]
    assert not at.error and any("4 steps in window" in c.value for c in at.caption)
