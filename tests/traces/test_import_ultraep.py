"""moe-monitor convert of an UltraEP load trace (ultra_ep_trace_v1), made as UltraEP's load profiler makes it
(tests/support/ultraep_writer.py: the manifest, np.savez chunks of int32 pre/post loads): exact logical counts per
microbatch, exact physical-slot counts in the trace's physical sidecar, a trace that replays into a real
redis-server, and bad traces refused with one error line each."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core import tracefile
from moe_monitor.core.tracefile.side import physical_sidecar, read_physical
from moe_monitor.traces.convert import convert
from tests.support.ultraep_writer import LoadProfileWriter, quota_post, write_trace

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [1, 2, 3, 5]  # Megatron's 1-based layer numbers, one of them dense
EP, MASTERS, REDUNDANT, MICROBATCHES = 4, 4, 2, 9
BUDGET = 1 << 30


def cli(*args):
    """moe-monitor in its own process (what a user runs)."""
    return subprocess.run([sys.executable, "-m", "moe_monitor", *map(str, args)], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)


def cli_here(capsys, *args) -> tuple[int, str]:
    """moe-monitor's main in this process: (exit status, stderr)."""
    from moe_monitor.cli import main
    capsys.readouterr()
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


def trace(tmp_path: Path, seed: int = 0, microbatches: int = MICROBATCHES, **writer_args):
    """(folder, writer, pre int32 [T, L, E], post int32 [T, L, P]) of a closed trace; 5 records a chunk so that
    chunks split microbatches."""
    writer_args.setdefault("flush_interval", 5)
    out = tmp_path / "ultra_ep_traces"
    writer, pre, post = write_trace(out, np.random.default_rng(seed), microbatches, LAYERS, EP, MASTERS, REDUNDANT,
                                    **writer_args)
    return out, writer, pre, post


def manifest_of(writer: LoadProfileWriter) -> Path:
    return writer.out / f"{writer.trace_id}.manifest.json"


@pytest.mark.parametrize("suffix", [".parquet", ".arrows"])
@pytest.mark.parametrize("name_the", ["folder", "manifest"])
def test_a_trace_converts_to_its_exact_logical_and_physical_counts(tmp_path, suffix, name_the):
    folder, writer, pre_TLE, post_TLP = trace(tmp_path)
    assert writer.chunk_id == -(-MICROBATCHES * len(LAYERS) // 5)  # several chunks, as the profiler flushes
    out = tmp_path / f"uep{suffix}"
    assert convert(str(folder if name_the == "folder" else manifest_of(writer)), str(out)) == MICROBATCHES
    with tracefile.open_trace(out) as reader:
        recs = reader.read_steps(0, core.MAX_STEP - 1)
        meta = reader.meta
    assert [r.step for r in recs] == list(range(MICROBATCHES))  # the microbatch ids are the step ids
    for t, rec in enumerate(recs):
        np.testing.assert_array_equal(rec.counts_LE, pre_TLE[t])
    assert meta.layer_names == [f"layer{i}" for i in LAYERS] and meta.num_experts == EP * MASTERS
    assert meta.run == writer.trace_id and meta.extra["trace_id"] == writer.trace_id
    # the layout is the masters': logical e on GPU e // M, as UltraEP's init_master_placement puts it
    assert meta.layout.gpus == EP and meta.layout.physical_to_logical_map[0] == list(range(EP * MASTERS))
    phys = read_physical(out, meta.run, BUDGET)
    assert phys.bad_records == 0 and [p.step for p in phys.records] == list(range(MICROBATCHES))
    for t, rec in enumerate(phys.records):
        np.testing.assert_array_equal(rec.counts_LP, post_TLP[t])
        assert (rec.gpus, rec.source, rec.time_s) == (EP, "runtime", recs[t].time_s)
        per_gpu_LG = post_TLP[t].reshape(len(LAYERS), EP, MASTERS + REDUNDANT).sum(axis=2)
        np.testing.assert_array_equal(core.measured_gpu_loads([rec]), per_gpu_LG)


def test_record_interval_keeps_the_recorded_microbatch_ids(tmp_path):
    folder, _, pre_TLE, _ = trace(tmp_path, microbatches=10, record_interval=3)
    out = tmp_path / "uep.parquet"
    assert convert(str(folder), str(out)) == 4
    with tracefile.open_trace(out) as reader:
        recs = reader.read_steps(0, core.MAX_STEP - 1)
    assert [r.step for r in recs] == [0, 3, 6, 9]
    for t, rec in enumerate(recs):
        np.testing.assert_array_equal(rec.counts_LE, pre_TLE[t])


def test_a_trace_still_being_written_reads_its_complete_microbatches(tmp_path):
    """The manifest says chunks 0 until close; the chunks on disk are read, a microbatch cut by the last flush
    is left out and counted."""
    out = tmp_path / "live"
    writer = LoadProfileWriter(out, EP, max(LAYERS), MASTERS, REDUNDANT, flush_interval=5)
    rng = np.random.default_rng(3)
    truth = []
    for _ in range(4):  # 16 records: 3 chunks of 5 flushed, 1 still in memory; microbatch 3 is cut
        rows = []
        for layer in LAYERS:
            pre = rng.integers(0, 50, EP * MASTERS).astype(np.int32)
            writer.record(layer, pre, quota_post(pre, EP, MASTERS, REDUNDANT))
            rows.append(pre)
        truth.append(np.stack(rows))
    assert json.loads(manifest_of(writer).read_text())["chunks"] == 0 and writer.chunk_id == 3
    dst = tmp_path / "live.parquet"
    assert convert(str(out), str(dst)) == 3
    with tracefile.open_trace(dst) as reader:
        recs = reader.read_steps(0, core.MAX_STEP - 1)
        assert reader.meta.extra["incomplete_microbatches"] == 1
    assert [r.step for r in recs] == [0, 1, 2]
    for t, rec in enumerate(recs):
        np.testing.assert_array_equal(rec.counts_LE, truth[t])


def test_the_converted_trace_replays_and_converts_on_with_its_physical_counts(redis_server, redis_url, tmp_path):
    folder, writer, pre_TLE, post_TLP = trace(tmp_path, seed=1)
    out = tmp_path / "uep.parquet"
    done = cli("convert", folder, out, "--run", "uep", "--top-k", 2)
    assert done.returncode == 0, done.stderr
    assert physical_sidecar(out).name == "uep.physical.parquet" and physical_sidecar(out).is_file()
    done = cli("replay", "--trace", out, "--redis", redis_url, "--run", "uep-again", "--speed", 1000)
    assert done.returncode == 0, done.stderr
    client = redis_server.client()
    recs = sorted((core.decode_step(f) for _, f in client.xrange(core.steps_key("uep-again"))), key=lambda r: r.step)
    assert len(recs) == MICROBATCHES
    for t, rec in enumerate(recs):
        np.testing.assert_array_equal(rec.counts_LE, pre_TLE[t])
        assert rec.tokens == (int(pre_TLE[t].sum(axis=1).max()) + 1) // 2  # busiest layer / k
    replayed = sorted((core.decode_physical(f) for _, f in client.xrange(core.physical_key("uep-again"))),
                      key=lambda r: r.step)
    assert [r.step for r in replayed] == [r.step for r in recs]  # each with its step, as the engine wrote them
    for t, rec in enumerate(replayed):
        np.testing.assert_array_equal(rec.counts_LP, post_TLP[t])
        assert rec.run == "uep-again" and rec.instance == recs[t].instance
    again = tmp_path / "again.arrows"
    done = cli("convert", out, again)
    assert done.returncode == 0, done.stderr
    phys = read_physical(again, "uep", BUDGET)
    assert len(phys.records) == MICROBATCHES
    for t, rec in enumerate(phys.records):
        np.testing.assert_array_equal(rec.counts_LP, post_TLP[t])


def _rewrite_chunk(folder: Path, chunk: int, **changes) -> None:
    path = next(folder.glob(f"*.chunk{chunk:06d}.npz"))
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    arrays.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del arrays[key]
    with path.open("wb") as handle:
        np.savez(handle, **arrays)


def _chunk_meta(folder: Path, **changes) -> np.ndarray:
    with np.load(next(folder.glob("*.chunk000000.npz")), allow_pickle=False) as data:
        meta = json.loads(str(data["metadata"].item()))
    return np.asarray(json.dumps({**meta, **changes}))


def _edit_manifest(folder: Path, **changes) -> None:
    path = next(folder.glob("*.manifest.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _pre(folder: Path) -> np.ndarray:
    with np.load(next(folder.glob("*.chunk000000.npz")), allow_pickle=False) as data:
        return data["pre_logical_loads"]


def _objects(folder: Path) -> None:
    path = next(folder.glob("*.chunk000000.npz"))
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    arrays["pre_logical_loads"] = np.array([{"a": 1}] * 5, dtype=object)
    with path.open("wb") as handle:
        np.savez(handle, **arrays)


BAD = {
    "not ultraep": (lambda f: _edit_manifest(f, schema="something_else"), "not an UltraEP manifest"),
    "sizes disagree": (lambda f: _edit_manifest(f, num_global_physical_experts=EP * (MASTERS + REDUNDANT) + 1),
                       "sizes disagree"),
    "trace_id": (lambda f: _edit_manifest(f, trace_id="other"), "does not name this manifest"),
    "missing chunk": (lambda f: next(f.glob("*.chunk000001.npz")).unlink(), "chunk 1 of 8 is missing"),
    "no chunk": (lambda f: ([p.unlink() for p in f.glob("*.npz")], _edit_manifest(f, chunks=0)), "has no chunk"),
    "wrong width": (lambda f: _rewrite_chunk(f, 0, pre_logical_loads=np.zeros((5, EP * MASTERS + 1), np.int32)),
                    "pre_logical_loads is int32 [5, 17], expected integers [5, 16]"),
    "float loads": (lambda f: _rewrite_chunk(f, 0, post_physical_loads=np.full((5, EP * (MASTERS + REDUNDANT)), np.nan)),
                    "expected integers"),
    "negative": (lambda f: _rewrite_chunk(f, 2, pre_logical_loads=-_pre(f)), "negative loads"),
    "missing member": (lambda f: _rewrite_chunk(f, 0, post_physical_loads=None), "lacks the array 'post_physical_loads'"),
    "objects": (_objects, "holds Python objects"),
    "truncated": (lambda f: next(f.glob("*.chunk000003.npz")).write_bytes(
        next(f.glob("*.chunk000003.npz")).read_bytes()[:300]), "not a readable .npz"),
    "another trace's chunk": (lambda f: _rewrite_chunk(f, 0, metadata=_chunk_meta(f, trace_id="epg0_gr0_r0_1")),
                              "names another trace"),
    "two traces": (lambda f: (f / "epg1_gr0_r0_5.manifest.json").write_text("{}"), "holds 2 UltraEP traces"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_trace_is_one_error_line(tmp_path, capsys, case):
    folder, _, _, _ = trace(tmp_path)
    spoil, why = BAD[case]
    spoil(folder)
    status, err = cli_here(capsys, "convert", folder, tmp_path / "x.parquet")
    assert status == 2 and err.startswith("error:"), err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err, err
    assert why in err, err
    assert not (tmp_path / "x.parquet").exists() and not physical_sidecar(tmp_path / "x.parquet").exists()


def test_the_budget_refuses_the_trace_before_reading_an_array(tmp_path, capsys):
    folder, _, _, _ = trace(tmp_path)
    import zipfile
    declared = sum(i.file_size for p in folder.glob("*.npz") for i in zipfile.ZipFile(p).infolist())
    status, err = cli_here(capsys, "convert", folder, tmp_path / "x.parquet", "--max-decoded-mib",
                           (2 * declared - 1) / (1 << 20))
    assert status == 2 and "more than the" in err, err
    status, err = cli_here(capsys, "convert", folder, tmp_path / "x.parquet", "--max-decoded-mib",
                           (2 * declared) / (1 << 20))
    assert status == 0, err


def test_gpus_other_than_the_ep_size_is_refused(tmp_path, capsys):
    folder, _, _, _ = trace(tmp_path)
    status, err = cli_here(capsys, "convert", folder, tmp_path / "x.parquet", "--gpus", 2)
    assert status == 2 and f"ep_size, {EP}" in err, err


def test_the_physical_sidecar_is_bounded_and_checks_every_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from moe_monitor.core.tracefile.side import physical_schema, write_physical
    folder, _, _, post_TLP = trace(tmp_path)
    out = tmp_path / "uep.parquet"
    convert(str(folder), str(out))
    rows = MICROBATCHES * post_TLP[0].size * 4  # the counts alone
    with pytest.raises(ValueError, match="uep.physical.parquet: its rows decode to"):
        read_physical(out, "uep", rows)
    assert len(read_physical(out, "uep", 2 * rows).records) == MICROBATCHES
    # a row core.decode_physical would refuse (a negative count) is skipped and counted, the others read
    good = core.PhysicalRecord(run="uep", step=0, rank=0, time_s=1.0, counts_LP=post_TLP[0], gpus=EP)
    write_physical(out, [good])
    table = pq.read_table(physical_sidecar(out))
    bad = post_TLP[1].copy()
    bad[0, 0] = -1
    extra = pa.table({**{name: table.column(name) for name in ("rank", "time_s", "instance", "source")},
                      "step": pa.array([1], pa.int64()),
                      "counts": pa.array([bad.tobytes()], table.schema.field("counts").type)}).select(table.schema.names)
    pq.write_table(pa.concat_tables([table, extra.cast(table.schema)]), physical_sidecar(out))
    found = read_physical(out, "uep", BUDGET)
    assert [r.step for r in found.records] == [0] and found.bad_records == 1 and "negative" in found.last_error
    # another table at the sidecar's name is one error naming it
    pq.write_table(pa.table({"x": [1]}), physical_sidecar(out))
    with pytest.raises(ValueError, match="uep.physical.parquet: not a physical-counts table"):
        read_physical(out, "uep", BUDGET)
    assert physical_schema(2, 8, 4).field("counts").type.byte_width == 2 * 8 * 4
