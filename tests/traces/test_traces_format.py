"""Columnar traces (traces/): every record kind round-trips through both containers and the JSON-lines import;
a recording cut short opens to its prefix; hostile files give one ValueError or bad records, never a crash or
a large allocation; read_steps ranges; the timeline's balancedness is the dashboard's own analysis."""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moe_monitor import core
from moe_monitor.core import tracefile
from moe_monitor.core.tracefile.schema import META_SHAPE, schema_metadata, step_schema
from moe_monitor.core.tracefile.writers import StreamEncoder
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.trace import TraceSource
from tests.support.synthfill import make_meta

L, E, G = 2, 8, 2
NEW_LP = np.array([[2, 3, 0, 1, 4, 5, 6, 7]] * L)


def records(steps: int = 40, world: int = 2, seed: int = 0) -> list[core.StepRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        for rank in range(world):
            sample = rng.integers(-1, E, (L, 3, 2)).astype(np.int16) if step % 3 == 0 else None
            out.append(core.StepRecord(run="tr", rank=rank, world_size=world, step=step, time_s=1000.0 + step,
                                       phase=("prefill", "decode")[step % 2], tokens=int(rng.integers(1, 50)),
                                       counts_LE=rng.integers(0, 20, (L, E)).astype(np.int32), dropped_steps=step // 10,
                                       sample_ids_LNK=sample, instance=f"inst-{step // 25}",
                                       scope="dp-group" if rank else "rank"))
    return out


def layout() -> core.LayoutRecord:
    return core.LayoutRecord(run="tr", step=20, time_s=1020.0, layout_LP=NEW_LP, gpus=G, source="engine")


def gpu() -> list[core.GpuSample]:
    ok = core.GpuSample(rank=0, host="h", time_s=1005.0, status="ok",
                        gpus=[{"index": 0, "name": "H200", "memory_used_bytes": 5, "power_usage_w": 300.5}])
    return [ok, core.GpuSample(rank=1, host="h", time_s=1030.0, status="unavailable", reason="no driver")]


def write(path, recs=None, with_layout=True) -> list[core.StepRecord]:
    recs = records() if recs is None else recs
    writer = tracefile.open_writer(path, make_meta("tr", L, E, G, world_size=2))
    writer.write(recs[:40], gpu()[:1])
    if with_layout:
        writer.add_layouts([layout()])
    writer.write(recs[40:], gpu()[1:])
    writer.close()
    return recs


def jsonl(path, recs) -> None:
    lines = [core.trace_line("meta", {"meta": core.encode_meta(make_meta("tr", L, E, G, world_size=2))})]
    lines += [core.trace_line("step", core.encode_step(r)) for r in recs[:40]]
    lines += [core.trace_line("gpu", core.encode_gpu_sample(gpu()[0])), core.trace_line("layout", core.encode_layout_record(layout()))]
    lines += [core.trace_line("step", core.encode_step(r)) for r in recs[40:]]
    lines += [core.trace_line("gpu", core.encode_gpu_sample(gpu()[1]))]
    path.write_text("\n".join(lines) + "\n")


def same(a: core.StepRecord, b: core.StepRecord) -> bool:
    return (a.step, a.rank, a.world_size, a.time_s, a.phase, a.tokens, a.dropped_steps, a.instance, a.scope) == (
        b.step, b.rank, b.world_size, b.time_s, b.phase, b.tokens, b.dropped_steps, b.instance, b.scope) \
        and np.array_equal(a.counts_LE, b.counts_LE) and (
        (a.sample_ids_LNK is None and b.sample_ids_LNK is None) or np.array_equal(a.sample_ids_LNK, b.sample_ids_LNK))


@pytest.mark.parametrize("name", ["t.parquet", "t.arrows", "t.jsonl"])
def test_every_record_kind_round_trips(tmp_path, name):
    path = tmp_path / name
    recs = records()
    jsonl(path, recs) if name.endswith(".jsonl") else write(path, recs)
    with tracefile.open_trace(path) as reader:
        # every field round-trips; started_s is the writer's own clock (make_meta stamps the time it is called)
        want = make_meta("tr", L, E, G, world_size=2)
        assert dataclasses.replace(reader.meta, started_s=want.started_s) == want
        got = reader.read_steps(0, 39)
        assert len(got) == len(recs) and all(same(a, b) for a, b in zip(got, recs))
        assert [(r.step, r.source) for r in reader.layouts] == [(20, "engine")]
        np.testing.assert_array_equal(reader.layouts[0].layout_LP, NEW_LP)
        samples = reader.gpu_samples()
        assert [s.status for s in samples] == ["ok", "unavailable"] and samples[0].gpus[0]["name"] == "H200"
        assert [s.time_s for s in reader.gpu_samples(1000, 1010)] == [1005.0]
        tl = reader.timeline()
        assert list(tl.step_T) == list(range(40)) and list(tl.rebalance_steps) == [20]
        assert list(tl.phase_T[:2]) == ["prefill", "decode"] and tl.time_s_T[3] == 1003.0
        assert list(tl.tokens_T) == [recs[2 * s].tokens + recs[2 * s + 1].tokens for s in range(40)]
        assert reader.bad_records == 0, reader.last_error


@pytest.mark.parametrize("name", ["t.parquet", "t.arrows", "t.jsonl"])
def test_read_steps_ranges(tmp_path, name):
    path = tmp_path / name
    recs = records()
    jsonl(path, recs) if name.endswith(".jsonl") else write(path, recs)
    reader = tracefile.open_trace(path)
    assert [(r.step, r.rank) for r in reader.read_steps(5, 6)] == [(5, 0), (5, 1), (6, 0), (6, 1)]
    assert reader.read_steps(39, 1000)[-1].step == 39 and reader.read_steps(100, 200) == []
    assert reader.read_steps(7, 6) == [] and len(reader.read_steps(-5, 0)) == 2


def test_timeline_balancedness_is_the_dashboards_analysis(tmp_path):
    path = tmp_path / "t.parquet"
    recs = [dataclasses.replace(r, instance="one") for r in records()]  # one collector: one window
    write(path, recs)
    source = TraceSource(str(path))
    watched = WatchedRun(source, window_steps=64)
    for _ in range(5):
        watched.tick()
    window = watched.window
    layout_ = resolve_layout(source.meta(), window.num_layers, window.num_experts, watched.world_size,
                             changes=watched.layouts.changes, at_step=window.newest_step)
    snap = analyse(window, layout_, "both")
    with np.errstate(all="ignore"):
        want_T = np.nanmean(snap.eta_TL, axis=1)
    got = source.timeline()
    assert list(got.step_T) == list(snap.view.step_T)
    np.testing.assert_allclose(got.balancedness_T, want_T, rtol=1e-6)
    for name in ("t.arrows", "t.jsonl"):
        other = tmp_path / name
        write(other, recs) if name.endswith(".arrows") else jsonl(other, recs)
        np.testing.assert_allclose(tracefile.open_trace(other).timeline().balancedness_T, want_T, rtol=1e-6)


def test_a_recording_cut_short_opens_to_its_prefix(tmp_path):
    path = tmp_path / "t.arrows"
    recs = records()
    enc = StreamEncoder(make_meta("tr", L, E, G, world_size=2))
    data = enc.header() + b"".join(enc.chunk(recs[i:i + 10]) for i in range(0, 80, 10))
    for cut in (len(data) - 7, len(data) - 300, len(enc.header()) + 50):
        path.write_bytes(data[:cut])
        reader = tracefile.open_trace(path)
        steps = reader.timeline().step_T
        assert reader.truncated and "cut short" in reader.last_error
        assert len(steps) < 40 and list(steps) == list(range(len(steps)))
        assert all(same(a, b) for a, b in zip(reader.read_steps(0, 39), recs))


def _parquet(path, table_or_schema, rows=None):
    schema = table_or_schema
    table = pa.table({f.name: pa.array(rows[f.name] if rows else [], f.type) for f in schema}, schema=schema)
    pq.write_table(table, path)


@pytest.mark.parametrize("name", ["t.parquet", "t.arrows"])
def test_hostile_files_give_one_error_or_bad_records(tmp_path, name):
    meta = make_meta("tr", L, E, G)
    path = tmp_path / name

    def put(schema, batch=None):
        if name.endswith(".parquet"):
            pq.write_table(pa.Table.from_batches([batch] if batch else [], schema=schema), path)
        else:
            with pa.ipc.new_stream(str(path), schema) as w:
                if batch is not None:
                    w.write_batch(batch)

    # not a trace at all, a huge L x E claimed in the metadata, a schema lacking columns
    put(pa.schema([("x", pa.int64())]))
    with pytest.raises(ValueError, match="not a MoE trace"):
        tracefile.open_trace(path)
    huge = schema_metadata(meta, [])
    huge[META_SHAPE] = b"1024,65536"
    put(step_schema(L, E, huge))
    with pytest.raises(ValueError, match="does not match"):
        tracefile.open_trace(path)
    huge_meta = dict(huge)
    huge_meta[b"moe.run_meta"] = huge_meta[b"moe.run_meta"].replace(b'"num_experts":8', b'"num_experts":99999999')
    put(step_schema(L, E, huge_meta))
    with pytest.raises(ValueError):
        tracefile.open_trace(path)
    wrong = step_schema(L, E, schema_metadata(meta, []))
    wrong = wrong.set(wrong.get_field_index("counts"), pa.field("counts", pa.binary(12)))
    put(wrong)
    with pytest.raises(ValueError, match="counts"):
        tracefile.open_trace(path)
    # rows breaking the bounds: counted as bad records, the good rows read
    schema = step_schema(L, E, schema_metadata(meta, []))
    good = records(4, world=1)
    batch = tracefile.schema.step_batch(good, schema, tracefile.schema.LayoutSchedule(meta))
    counts = np.stack([r.counts_LE for r in good]).copy()
    counts[1, 0, 0] = -3
    cols = {n: batch.column(n) for n in schema.names}
    cols["counts"] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(L * E * 4), 4, [None, pa.py_buffer(counts.tobytes())])
    cols["time_s"] = pa.array([1.0, 2.0, float("nan"), 4.0])
    cols["rank"] = pa.array([0, 0, 0, 5], pa.int32())
    put(schema, pa.RecordBatch.from_arrays([cols[n] for n in schema.names], schema=schema))
    reader = tracefile.open_trace(path)
    assert [r.step for r in reader.read_steps(0, 10)] == [0]
    assert reader.bad_records == 3 and reader.last_error
    assert list(reader.timeline().step_T) == [0, 1]  # the timeline checks all but the counts


def test_not_a_trace_and_garbage(tmp_path):
    for content in (b"PAR1garbage", b"\xff\xff\xff\xffgarbage", b"\x00\x01binary", b""):
        path = tmp_path / "x.bin"
        path.write_bytes(content)
        with pytest.raises(ValueError):
            tracefile.open_trace(path)
    with pytest.raises(ValueError, match="no such|No such"):
        tracefile.open_trace(tmp_path / "missing.parquet")


def test_traces_imports_neither_the_ui_nor_torch():
    from tests.test_layering import _walk
    imported, loaded = _walk("moe_monitor.core,moe_monitor.traces")
    assert imported >= 15, imported
    assert not loaded & {"torch", "streamlit", "plotly", "pynvml"}, sorted(loaded & {"torch", "streamlit", "plotly"})
