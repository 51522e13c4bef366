"""Layer timings (core.TimingRecord) in every trace container: an EP-like run recorded by TraceFileSink into
.arrows and JSON lines, converted to .parquet (and back to .arrows), reads back bit for bit (NaN = not
measured kept, a NaN payload too) through TraceReader.read_timings, TraceSource.poll / seek and the replay
window the Time page reads; record / replay / info on the command line; a damaged timings table or line is
one message and the steps still read; a trace from before timings opens as before."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moe_monitor import cli, core
from moe_monitor.collectors.sinks import TraceFileSink
from moe_monitor.core import tracefile
from moe_monitor.core.tracefile.side import (
    META_TIMING_ROWS,
    TIMING_ARRAYS,
    timing_batch,
    timing_schema,
    timings_sidecar,
)
from moe_monitor.dashboard.live.replay import RangeReplay
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.base import Batch
from moe_monitor.dashboard.sources.trace import TraceSource
from moe_monitor.traces.convert import convert
from tests.support import synthfill

L, E, G, R, STEPS = 3, 8, 2, 4, 24
RUN, INSTANCE = "ep", "ep-inst"
SAMPLES = Path(__file__).resolve().parents[2] / "moe_monitor" / "traces" / "samples"
PAYLOAD_NAN = np.array([0x7FC0_0123], dtype=np.uint32).view(np.float32)[0]  # a quiet NaN with a payload


def meta() -> core.RunMeta:
    return synthfill.make_meta(RUN, L, E, G, world_size=R, started_s=1.7e9)


def steps() -> list[core.StepRecord]:
    rng = np.random.default_rng(1)
    return [core.StepRecord(run=RUN, rank=r, world_size=R, step=s, time_s=1.7e9 + s * 0.05 + r * 1e-3,
                            phase=("prefill", "decode")[s % 2], tokens=int(rng.integers(1, 99)),
                            counts_LE=rng.integers(0, 30, (L, E)).astype(np.int32), instance=INSTANCE)
            for s in range(STEPS) for r in range(R)]


def timings() -> list[core.TimingRecord]:
    """Every (step, rank) but step 11 (timed nothing) and step 7 rank 2 (lost); NaN where not measured: a
    dispatch layer per row, every combine of every fifth step, rank 3's first compute layer; one NaN payload."""
    out = []
    for s in range(STEPS):
        for r in range(R):
            if s == 11 or (s, r) == (7, 2):
                continue
            base = (np.arange(1, L + 1, dtype=np.float32) * 1e-4 * (1 + s % 3) + np.float32(r * 1e-5)).astype(np.float32)
            dispatch, compute, combine = base.copy(), 3 * base, 0.5 * base
            dispatch[(s + r) % L] = np.nan
            if s % 5 == 0:
                combine[:] = np.nan
            if r == 3:
                compute[0] = np.nan
            layer = (dispatch + compute + np.nan_to_num(combine) + np.float32(2e-5)).astype(np.float32)
            if (s, r) == (3, 1):
                layer[2] = PAYLOAD_NAN
            out.append(core.TimingRecord(run=RUN, rank=r, world_size=R, step=s, time_s=1.7e9 + s * 0.05 + r * 1e-3,
                                         dispatch_s_L=dispatch, compute_s_L=compute.astype(np.float32),
                                         combine_s_L=combine.astype(np.float32), layer_s_L=layer, instance=INSTANCE))
    return out


def record(path: Path) -> None:
    """What the collector's sink writes for an EP run: steps and their timings, a few steps per batch."""
    sink = TraceFileSink(path, meta())
    recs, times = steps(), timings()
    for first in range(0, STEPS, 4):
        sink.write([x for x in recs if first <= x.step < first + 4], [], {},
                   timings=[t for t in times if first <= t.step < first + 4])
    sink.close()


def key(t: core.TimingRecord) -> tuple:
    return (t.run, t.step, t.rank, t.world_size, t.time_s, t.instance, *(np.asarray(a).tobytes() for a in t.arrays()))


def want(first: int = 0, last: int = STEPS) -> list[tuple]:
    return [key(t) for t in timings() if first <= t.step <= last]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """rec.arrows and rec.jsonl recorded by the sink, each converted to .parquet, the .parquet back to .arrows."""
    root = tmp_path_factory.mktemp("timed")
    record(root / "rec.arrows")
    record(root / "rec.jsonl")
    assert convert(str(root / "rec.arrows"), str(root / "a.parquet")) == STEPS
    assert convert(str(root / "rec.jsonl"), str(root / "j.parquet")) == STEPS
    assert convert(str(root / "a.parquet"), str(root / "back.arrows")) == STEPS
    return root


CONTAINERS = ["rec.arrows", "rec.jsonl", "a.parquet", "j.parquet", "back.arrows"]


@pytest.mark.parametrize("name", CONTAINERS)
def test_timings_round_trip_exactly_through_every_container(recorded, name):
    with tracefile.open_trace(recorded / name) as reader:
        got = reader.read_timings(0, 1 << 40)
        assert [key(t) for t in got] == want() and reader.timing_rows() == len(want())
        assert np.isnan(got[0].combine_s_L).all() and np.isnan(got[0].dispatch_s_L[0])
        payload = next(t for t in got if (t.step, t.rank) == (3, 1)).layer_s_L[2]
        assert np.array(payload).view(np.uint32) == np.array(PAYLOAD_NAN).view(np.uint32)  # the NaN's bits
        assert [key(t) for t in reader.read_timings(6, 8)] == want(6, 8)
        assert reader.read_timings(11, 11) == [] and reader.read_timings(100, 200) == []
        assert reader.read_timings(9, 8) == []
        assert len(reader.read_steps(0, 99)) == STEPS * R and reader.bad_records == 0, reader.last_error


def test_parquet_keeps_them_in_a_sidecar_counted_in_the_trace(recorded):
    side = timings_sidecar(recorded / "a.parquet")
    assert side.name == "a.timings.parquet" and side.is_file()
    table = pq.read_table(side)
    assert table.schema.equals(timing_schema(L), check_metadata=True)
    assert table.num_rows == len(want()) and table.schema.field("layer_s_L").type == pa.binary(L * 4)
    assert pq.ParquetFile(recorded / "a.parquet").metadata.metadata[META_TIMING_ROWS] == str(len(want())).encode()


@pytest.mark.parametrize("name", CONTAINERS)
def test_trace_source_poll_and_seek_carry_every_rank(recorded, name):
    source = TraceSource(name, root=recorded)
    batch = source.seek(5, 9)
    assert [key(t) for t in batch.timings] == want(5, 9) and batch.bad_records == 0, batch.last_error
    assert {t.rank for t in batch.timings if t.step == 8} == set(range(R))
    assert source.seek(11, 11).timings == [] and len(source.seek(11, 11).steps) == R
    polled = []
    for _ in range(50):
        polled += source.poll(10).timings
        if source.finished:
            break
    assert sorted(key(t) for t in polled) == want()


class SeekFeed:
    """A Source handing a WatchedRun one seek() batch of a trace: what the replay window does (RangeReplay)."""

    def __init__(self, source: TraceSource, first: int, last: int):
        self.source, self.batch = source, source.seek(first, last)

    def poll(self, max_entries: int) -> Batch:
        batch, self.batch = self.batch, Batch()
        return batch

    def meta(self):
        return self.source.meta()

    def health(self):
        return self.source.health()


def live_view(recorded: Path):
    """The timings a live dashboard held for the run: its JSON lines read as they came."""
    live = WatchedRun(TraceSource("rec.jsonl", root=recorded), window_steps=64)
    for _ in range(20):
        live.tick()
    assert live.bad_records == 0, live.last_error
    return live.timings.aligned(np.arange(STEPS))


def assert_same_view(shown, seen) -> None:
    assert shown.num_ranks == R and shown.any and not shown.has_T[11] and shown.has_T.sum() == STEPS - 1
    for phase in ("dispatch_TRL", "compute_TRL", "combine_TRL", "layer_TRL"):
        np.testing.assert_array_equal(getattr(shown, phase).view(np.uint32), getattr(seen, phase).view(np.uint32))
    assert np.isnan(shown.layer_TRL[7, 2]).all()  # the lost rank: not measured


@pytest.mark.parametrize("name", ["a.parquet", "rec.arrows", "rec.jsonl"])
def test_the_time_page_of_a_seek_sees_what_it_saw_live(recorded, name):
    watched = WatchedRun(SeekFeed(TraceSource(name, root=recorded), 0, STEPS - 1), window_steps=64)
    watched.tick()
    assert watched.bad_records == 0, watched.last_error
    assert_same_view(watched.timings.aligned(np.arange(STEPS)), live_view(recorded))


def test_the_replay_window_sees_what_it_saw_live(recorded):
    replay = RangeReplay(TraceSource("a.parquet", root=recorded), max_steps=64).show(0, STEPS - 1)
    assert_same_view(replay.timings.aligned(np.arange(STEPS)), live_view(recorded))


def test_info_counts_timing_rows(recorded, capsys):
    for name in ("a.parquet", "rec.arrows", "rec.jsonl"):
        assert cli.main(["info", str(recorded / name)]) == 0
        assert f"layer timing rows {len(want())}," in capsys.readouterr().out


def test_convert_keeps_timings_of_steps_without_a_step_record(tmp_path):
    path = tmp_path / "t.jsonl"
    record(path)
    extra = core.TimingRecord(run=RUN, rank=0, world_size=R, step=500, time_s=1.8e9, dispatch_s_L=np.zeros(L, np.float32),
                              compute_s_L=np.ones(L, np.float32), combine_s_L=np.zeros(L, np.float32),
                              layer_s_L=np.full(L, 2.0, np.float32), instance=INSTANCE)
    with open(path, "a") as handle:
        handle.write(core.trace_line("timing", core.encode_timing(extra)) + "\n")
    convert(str(path), str(tmp_path / "t.parquet"))
    got = tracefile.open_trace(tmp_path / "t.parquet").read_timings(0, 1 << 40)
    assert [key(t) for t in got] == want() + [key(extra)]


# ------------------------------------------------------------------------------------------ damage
def copy_parquet(recorded: Path, tmp_path: Path) -> Path:
    for name in ("a.parquet", "a.gpu.parquet", "a.timings.parquet"):
        if (recorded / name).exists():
            (tmp_path / name).write_bytes((recorded / name).read_bytes())
    return tmp_path / "a.parquet"


@pytest.mark.parametrize("damage,why", [
    ("cut", "a.timings.parquet"),
    ("missing", "is missing"),
    ("another", "the trace wrote"),
])
def test_a_damaged_timings_table_is_one_message_and_the_steps_read(recorded, tmp_path, damage, why):
    path = copy_parquet(recorded, tmp_path)
    side = timings_sidecar(path)
    if damage == "cut":
        side.write_bytes(side.read_bytes()[:-100])
    elif damage == "missing":
        side.unlink()
    else:  # a sidecar of another trace of that name: fewer rows than this trace wrote
        writer = pq.ParquetWriter(side, timing_schema(L))
        writer.write_batch(timing_batch(timings()[:5], timing_schema(L)))
        writer.close()
    reader = tracefile.open_trace(path)
    assert reader.read_timings(0, 99) == [] and reader.bad_records == 1
    assert why in reader.last_error and "the steps read without them" in reader.last_error
    assert len(reader.read_steps(0, 99)) == STEPS * R and reader.bad_records == 1  # one message, once
    batch = TraceSource("a.parquet", root=tmp_path).seek(0, 5)
    assert len(batch.steps) == 6 * R and batch.timings == [] and batch.bad_records == 1 and why in batch.last_error


def test_a_timings_sidecar_over_the_decoded_bound_is_one_message_and_the_steps_read(recorded, tmp_path,
                                                                                      monkeypatch):
    from moe_monitor.core.tracefile import side as timings_module

    path = copy_parquet(recorded, tmp_path)
    monkeypatch.setattr(timings_module, "decoded_budget_bytes", lambda: 1024)  # the sidecar's rows decode to more
    reader = tracefile.open_trace(path)
    assert reader.read_timings(0, 99) == [] and reader.bad_records == 1
    assert "timing rows decode to" in reader.last_error and "MOE_TRACE_MAX_DECODED_MIB" in reader.last_error
    assert len(reader.read_steps(0, 99)) == STEPS * R


def test_a_bad_timing_row_is_one_bad_record(recorded, tmp_path):
    path = copy_parquet(recorded, tmp_path)
    side = timings_sidecar(path)
    table = pq.read_table(side)
    layer = np.frombuffer(table["layer_s_L"].combine_chunks().buffers()[1], np.float32).copy()
    layer[L * 4] = -1.0  # row 4: a negative time
    column = pa.FixedSizeBinaryArray.from_buffers(pa.binary(L * 4), table.num_rows, [None, pa.py_buffer(layer)])
    table = table.set_column(table.schema.get_field_index("layer_s_L"), table.schema.field("layer_s_L"), column)
    pq.write_table(table, side)
    reader = tracefile.open_trace(path)
    got = reader.read_timings(0, 99)
    assert [key(t) for t in got] == want()[:4] + want()[5:]
    assert reader.bad_records == 1 and "layer times must be NaN" in reader.last_error


@pytest.mark.parametrize("name", ["rec.arrows", "rec.jsonl"])
def test_bad_timing_lines_are_bad_records_once(recorded, tmp_path, name):
    path = tmp_path / name
    for src in recorded.glob(name + "*"):
        (tmp_path / src.name).write_bytes(src.read_bytes())
    lines_of = Path(str(path) + ".side.jsonl") if name.endswith(".arrows") else path
    wrong_l = core.TimingRecord(run=RUN, rank=0, world_size=R, step=4, time_s=1.7e9, dispatch_s_L=np.zeros(L + 1, np.float32),
                                compute_s_L=np.zeros(L + 1, np.float32), combine_s_L=np.zeros(L + 1, np.float32),
                                layer_s_L=np.zeros(L + 1, np.float32))
    with open(lines_of, "a") as handle:
        handle.write('{"kind":"timing","v":1,"step":5,"dispatch_b64":"not base64!"}\n')  # does not decode
        handle.write(core.trace_line("timing", core.encode_timing(wrong_l)) + "\n")       # 4 layers, the run has 3
        handle.write('{"kind":"timing","step":6,' + "x" * 50)                             # cut short
    reader = tracefile.open_trace(path)
    assert len(reader.read_steps(0, 99)) == STEPS * R
    got = reader.read_timings(0, 99)
    assert [key(t) for t in got] == want() and reader.bad_records == 3
    assert "timing line at byte" in reader.last_error
    assert [key(t) for t in reader.read_timings(0, 99)] == want() and reader.bad_records == 3  # counted once
    batch = TraceSource(name, root=tmp_path).seek(3, 5)
    assert [key(t) for t in batch.timings] == want(3, 5) and batch.bad_records == 2  # steps 4 and 5's bad lines


# ------------------------------------------------------------------------------------------ old traces
def test_a_trace_from_before_timings_opens_as_before(tmp_path):
    sample = SAMPLES / "demo.parquet"
    assert META_TIMING_ROWS not in (pq.ParquetFile(sample).metadata.metadata or {})  # written before timings
    with tracefile.open_trace(sample) as reader:
        tl = reader.timeline()
        assert tl.num_steps > 0 and reader.read_timings(0, 1 << 40) == [] and reader.timing_rows() == 0
        assert reader.info().timings == 0 and reader.bad_records == 0
    batch = TraceSource(str(sample)).seek(int(tl.step_T[0]), int(tl.step_T[5]))
    assert batch.steps and batch.timings == [] and batch.bad_records == 0
    # a trace written now without timings: no sidecar, a stale one of that name removed
    path = tmp_path / "plain.parquet"
    timings_sidecar(path).write_bytes(b"left from an earlier trace")
    writer = tracefile.open_writer(path, meta())
    writer.write(steps())
    writer.close()
    assert not timings_sidecar(path).exists()
    reader = tracefile.open_trace(path)
    assert reader.read_timings(0, 99) == [] and reader.bad_records == 0


def test_a_writer_refuses_timings_a_reader_would(tmp_path):
    writer = tracefile.open_writer(tmp_path / "x.parquet", meta())
    bad = timings()[0]
    with pytest.raises(ValueError, match="the trace holds \\[3\\]"):
        writer.write([], (), [core.TimingRecord(**{**bad.__dict__, "layer_s_L": np.zeros(L + 1, np.float32)})])
    with pytest.raises(ValueError, match="compute times"):
        writer.write([], (), [core.TimingRecord(**{**bad.__dict__, "compute_s_L": np.full(L, -1, np.float32)})])
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    assert tuple(f"{phase}_s_L" for phase in core.TIMING_PHASES) == TIMING_ARRAYS


# ------------------------------------------------------------------------------------------ record, replay
def test_record_and_replay_carry_timings(redis_server, redis_url, tmp_path):
    client = redis_server.client()
    synthfill.fill(client, "live", steps=12, num_layers=L, world_size=2, instance="i0")
    layer = np.array([1e-3, np.nan, 2e-3], np.float32)
    sent = [core.TimingRecord(run="live", rank=r, world_size=2, step=s, time_s=1.7e9 + s, dispatch_s_L=layer / 4,
                              compute_s_L=layer / 2, combine_s_L=np.full(L, np.nan, np.float32), layer_s_L=layer + s,
                              instance="i0") for s in range(12) for r in range(2)]
    for rec in sent:
        client.xadd(core.timings_key("live"), core.encode_timing(rec))
    out = tmp_path / "rec.parquet"
    assert cli.main(["record", "--redis", redis_url, "--run", "live", "--out", str(out), "--steps", "12"]) == 0
    got = tracefile.open_trace(out).read_timings(0, 99)
    assert [key(t) for t in got] == [key(t) for t in sent]
    assert cli.main(["replay", "--trace", str(out), "--redis", redis_url, "--run", "again", "--speed", "1000"]) == 0
    replayed = [core.decode_timing(f) for _, f in client.xrange(core.timings_key("again"))]
    assert [(t.step, t.rank) for t in replayed] == [(t.step, t.rank) for t in sent]
    np.testing.assert_array_equal(np.stack([t.layer_s_L for t in replayed]), np.stack([t.layer_s_L for t in sent]))
    steps_instance = {core.decode_step(f).instance for _, f in client.xrange(core.steps_key("again"))}
    assert {t.instance for t in replayed} == steps_instance  # the replayed run's collector, not the recorded one
