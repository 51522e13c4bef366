"""The dashboard's TraceSource over the three containers (poll forward as if live, timeline, seek) and the
collector recording .arrows through attach() on a tiny real model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors import attach
from moe_monitor.core import tracefile
from moe_monitor.dashboard.sources.trace import TraceSource
from tests.support.tiny_models import build
from tests.traces.test_traces_format import jsonl, records, same, write


@pytest.mark.parametrize("name", ["t.parquet", "t.arrows", "t.jsonl"])
def test_seek_and_timeline_on_every_container(tmp_path, name):
    path = tmp_path / name
    recs = records()
    jsonl(path, recs) if name.endswith(".jsonl") else write(path, recs)
    source = TraceSource(name, root=tmp_path)
    tl = source.timeline()
    assert isinstance(tl, tracefile.Timeline) and list(tl.step_T) == list(range(40))
    batch = source.seek(22, 24)
    assert [(r.step, r.rank) for r in batch.steps] == [(s, k) for s in (22, 23, 24) for k in (0, 1)]
    assert all(same(a, b) for a, b in zip(batch.steps, recs[44:50]))
    assert [r.step for r in batch.layouts] == [20]        # in force over the range, from before it
    assert source.seek(3, 4).layouts == [] and batch.bad_records == 0
    assert [s.time_s for s in source.seek(0, 10).gpu_samples] == [1005.0]
    assert source.meta() is not None and source.meta().num_experts == 8
    # the forward replay is unchanged by seeking: every step once, in order
    seen = []
    for _ in range(10):
        seen += [(r.step, r.rank) for r in source.poll(16).steps]
    assert seen == [(r.step, r.rank) for r in recs] and source.finished


def test_seek_outside_the_folder_and_a_broken_file_are_reported(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    source = TraceSource("bad.parquet", root=tmp_path)
    batch = source.seek(0, 5)
    assert batch.bad_records == 1 and "bad.parquet" in batch.last_error
    assert source.poll(10).steps == [] and source.health().error
    with pytest.raises(ValueError, match="trace folder"):
        TraceSource("../x.parquet", root=tmp_path).timeline()


def test_the_collector_writes_arrows_through_attach(tmp_path):
    path = tmp_path / "live.arrows"
    model = build("olmoe")
    monitor = attach(model, trace_path=str(path))
    with torch.no_grad():
        for n in (5, 3, 1):
            model(input_ids=torch.randint(3, 90, (2, n)))
    counts = monitor.counts()
    monitor.close()
    reader = tracefile.open_trace(path)
    assert reader.meta.layer_names == monitor.layer_names and reader.bad_records == 0
    got = reader.read_steps(0, 10)
    assert [r.step for r in got] == [0, 1, 2] and [r.tokens for r in got] == [10, 6, 2]
    np.testing.assert_array_equal(sum(r.counts_LE.astype(np.int64) for r in got), counts)
    assert reader.gpu_samples()  # the NVML status rides in the side file
    assert np.isfinite(reader.timeline().balancedness_T).all()


def test_arrows_recording_rotates_and_recovers_like_jsonl(tmp_path):
    from moe_monitor.core.tracefile.writers import ArrowRecorder
    from tests.support.synthfill import make_meta
    path = tmp_path / "r.arrows"
    recs = records(40, world=1)
    rec = ArrowRecorder(path, make_meta("tr", 2, 8, 2), max_bytes=6000)
    for i in range(0, 40, 4):
        rec.write(recs[i:i + 4], [])
    rec.close()
    new, old = tracefile.open_trace(path), tracefile.open_trace(str(path) + ".1")
    steps = list(old.timeline().step_T) + list(new.timeline().step_T)
    assert steps == list(range(steps[0], 40)) and path.stat().st_size <= 6000
    # a failed write (the file closed under it) is retried: the file is cut back to its last whole chunk
    rec = ArrowRecorder(path, make_meta("tr", 2, 8, 2))
    rec.write(recs[:4], [])
    with open(path, "ab") as handle:
        handle.write(b"\xff\xff\xff\xff\x10\x00")  # what a write cut by a full disk leaves
    rec._file.close()
    rec.write(recs[4:8], [])
    rec.close()
    reader = tracefile.open_trace(path)
    assert list(reader.timeline().step_T) == list(range(8)) and not reader.truncated
    assert all(same(a, b) for a, b in zip(reader.read_steps(0, 7), recs[:8]))
    assert isinstance(reader.read_steps(0, 0)[0], core.StepRecord)


@pytest.mark.parametrize("name", ["t.parquet", "t.arrows", "t.jsonl"])
def test_a_vllm_layout_with_unused_slots_is_read_from_every_container(tmp_path, name):
    """An engine rebalance whose map leaves slots unused (vLLM's -1) is a layout change in every container, and
    the aggregator's layout book keeps it (an unused slot serves no token)."""
    from moe_monitor.aggregator.layoutbook import LayoutBook
    from tests.traces import test_traces_format as fmt

    L, E, G = fmt.L, fmt.E, fmt.G
    unused_LP = np.tile(np.array([0, 1, 2, 3, -1, 4, 5, 6, 7, -1], dtype=np.int32), (L, 1))  # 5 slots a GPU
    rec = core.LayoutRecord(run="tr", step=20, time_s=1020.0, layout_LP=unused_LP, gpus=G, source="engine")
    recs = fmt.records()
    path = tmp_path / name
    if name.endswith(".jsonl"):
        lines = [core.trace_line("meta", {"meta": core.encode_meta(fmt.make_meta("tr", L, E, G, world_size=2))})]
        lines += [core.trace_line("step", core.encode_step(r)) for r in recs[:40]]
        lines += [core.trace_line("layout", core.encode_layout_record(rec))]
        lines += [core.trace_line("step", core.encode_step(r)) for r in recs[40:]]
        path.write_text("\n".join(lines) + "\n")
    else:
        writer = tracefile.open_writer(path, fmt.make_meta("tr", L, E, G, world_size=2))
        writer.write(recs[:40], [])
        writer.add_layouts([rec])
        writer.write(recs[40:], [])
        writer.close()
    batch = TraceSource(name, root=tmp_path).seek(22, 24)
    assert batch.bad_records == 0, batch.last_error
    (got,) = batch.layouts
    np.testing.assert_array_equal(got.layout_LP, unused_LP)
    book = LayoutBook()
    book.add("epoch", 20, got.layout_LP, G)
    ((at_T, kept_LP, gpus),) = book.layouts("epoch", np.array([21, 22]), L, E, world=2)
    assert at_T.tolist() == [0, 1] and gpus == G
    np.testing.assert_array_equal(kept_LP, unused_LP)  # kept, not the contiguous default
