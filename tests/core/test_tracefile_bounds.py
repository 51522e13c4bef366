"""Every trace and dump reader bounds what it decodes before it decodes it (core/budget.py): hostile files
that are small on disk and decode to far more (zstd-compressed IPC bodies, Parquet dictionary / RLE columns
of one repeated value, a repeated sample value, deflated or shared-storage .pt dumps, a step with more rows
than its world) are refused with one message naming the bound, and the process that opens them stays small:
each is opened in a child process whose peak resident memory is asserted (its VmHWM where /proc has it: the
resource.getrusage peak of a child also holds its parent's, which built the file). Legitimate
traces keep opening; a budget raised above a file opens it and decodes its batches lazily.

The hostile files (tests/core/hostile_traces.py) are sized against a budget lowered for the child through
MOE_TRACE_MAX_DECODED_MIB, so they build in a second; the same files at the default budget are the ones
the issue measured, only larger.
"""
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
from moe_monitor.core.budget import ENV_VAR, decoded_budget_bytes
from moe_monitor.core.tracefile.sandbox import CHILD_ALLOCATOR
from tests.core import hostile_traces as hostile
from tests.support.synthfill import make_meta

REPO = Path(__file__).resolve().parents[2]
PEAK_LIMIT_MIB = 400
CHILD = r"""
import json, resource, sys
action, path = sys.argv[1], sys.argv[2]
out = {"error": "", "status": 0}
try:
    if action == "open":
        from moe_monitor.core.tracefile import open_trace
        reader = open_trace(path)
        out["steps"] = reader.timeline().num_steps
        reader.close()
    elif action == "page":
        from moe_monitor.core.tracefile import open_trace
        reader = open_trace(path)
        tl = reader.timeline()
        out["records"] = len(reader.read_steps(int(tl.step_T[0]), int(tl.step_T[min(599, tl.num_steps - 1)])))
    elif action == "info":
        from moe_monitor.cli import main
        out["status"] = main(["info", path])
    elif action == "view":  # what a dashboard session's first view of the trace costs (peak above the start)
        from moe_monitor.dashboard.live.replay import RangeReplay
        from moe_monitor.dashboard.sources.trace import TraceSource
        def status(field):
            with open("/proc/self/status") as lines:
                return next(int(line.split()[1]) for line in lines if line.startswith(field)) / 1024
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM starts again from here
        base = status("VmRSS")
        replay = RangeReplay(TraceSource(path), 600)
        replay.show(max(0, replay.size - 600), replay.size - 1)
        out["growth_mib"] = status("VmHWM") - base
    elif action in ("seek", "poll"):  # the trace source under an address-space limit (sys.argv[3] MiB more)
        import resource
        from moe_monitor.dashboard.sources.trace import TraceSource
        source = TraceSource(path)
        with open("/proc/self/status") as lines:
            mapped = next(int(line.split()[1]) for line in lines if line.startswith("VmSize")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (int(sys.argv[3]) << 20), resource.RLIM_INFINITY))
        batch = source.seek(0, 2) if action == "seek" else source.poll(2000)
        out["error"] = batch.last_error if action == "seek" else source.health().error
        out["steps"] = len(batch.steps)
    elif action == "dump":
        from moe_monitor.core.sglang_dumps import read_dump
        out["kind"] = type(read_dump(path, 1 << 30)).__name__
except ValueError as exc:
    out["error"] = str(exc)
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
try:  # this process's own peak: on Linux ru_maxrss also carries the parent's peak across fork and exec
    with open("/proc/self/status") as status:
        out["peak_rss_mib"] = next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
except (OSError, StopIteration):
    pass
print(json.dumps(out))
"""


def in_child(action: str, path: Path, budget_mib: float | None, *extra: str) -> dict:
    """What `action` on path gave in a fresh interpreter (error message, peak RSS in MiB, status; stderr)."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if budget_mib is not None:
        env[ENV_VAR] = str(budget_mib)
    env["PYTHONPATH"] = str(REPO)
    env.update(CHILD_ALLOCATOR)  # allocators an address-space limit bites on, as the upload check runs
    done = subprocess.run([sys.executable, "-c", CHILD, action, str(path), *extra], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    return out


def refused(out: dict, *words: str) -> None:
    """The child's action was refused with one message naming the bound and how to raise it."""
    text = out["error"] or out["stderr"]
    assert text and "\n" not in text.strip(), out
    for word in words:
        assert word in text, (word, text)
    assert out["peak_rss_mib"] < PEAK_LIMIT_MIB, out


BOUND = ("more than the", ENV_VAR, "--max-decoded-mib")


def test_zstd_arrows_is_refused_before_any_batch_is_decoded(tmp_path):
    path = tmp_path / "bomb.arrows"
    counts_bytes = hostile.zstd_arrows(path, batches=4, rows_per_batch=1024)
    assert counts_bytes == 512 << 20 and path.stat().st_size < 1 << 20
    for action in ("open", "info"):
        refused(in_child(action, path, budget_mib=256), "record batches (4) decode to", *BOUND)


def test_zstd_arrows_under_a_raised_budget_decodes_lazily(tmp_path):
    """Above the bound the same file opens; the upload check (open + timeline) decodes only the small
    columns, info decodes the one batch holding its first step."""
    path = tmp_path / "bomb.arrows"
    hostile.zstd_arrows(path, batches=4, rows_per_batch=1024)
    opened = in_child("open", path, budget_mib=1024)
    assert opened["error"] == "" and opened["steps"] == 4096
    assert opened["peak_rss_mib"] < 250, opened
    described = in_child("info", path, budget_mib=1024)
    assert described["status"] == 0 and described["peak_rss_mib"] < PEAK_LIMIT_MIB, described


def test_parquet_of_many_row_groups_of_one_repeated_step_is_refused(tmp_path):
    path = tmp_path / "repeated.parquet"
    rows = hostile.repeated_step_parquet(path, row_groups=4, rows_per_group=600_000)
    assert rows == 2_400_000 and path.stat().st_size < 1 << 20
    refused(in_child("open", path, budget_mib=256), "row groups (4, 2400000 rows) decode to", *BOUND)


def test_a_step_with_more_rows_than_its_world_is_refused(tmp_path):
    path = tmp_path / "one-step.parquet"
    hostile.repeated_step_parquet(path, row_groups=2, rows_per_group=250_000)
    for action in ("open", "info"):
        refused(in_child(action, path, budget_mib=None), "step 0 holds 500000 rows", "world of 1")


def test_a_repeated_parquet_sample_is_counted_at_the_size_its_rows_declare(tmp_path):
    path = tmp_path / "sample.parquet"
    sample_bytes = hostile.big_sample_parquet(path, steps=600, tokens=16384)
    assert sample_bytes == 600 * (512 << 10) and path.stat().st_size < 1 << 20
    for action in ("open", "page"):
        refused(in_child(action, path, budget_mib=256), "with their samples decode to", *BOUND)


def test_a_repeated_parquet_sample_under_a_raised_budget_decodes_once_per_row_group(tmp_path):
    path = tmp_path / "sample.parquet"
    hostile.big_sample_parquet(path, steps=128, tokens=16384)
    out = in_child("page", path, budget_mib=1024)
    assert out["error"] == "" and out["records"] == 128 and out["peak_rss_mib"] < PEAK_LIMIT_MIB, out


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="measures the peak through /proc")
@pytest.mark.parametrize("builder", [hostile.late_sample_parquet, hostile.late_sample_arrows])
def test_a_trace_the_budget_takes_costs_a_view_at_most_the_budget(tmp_path, builder):
    """A sample cost a page about 4.7x the bytes its row declares and was counted 2x (.parquet)
    or 1x (.arrows): 2 rows of 128 MiB samples passed the 1 GiB budget and cost a session 1.2 GB. Counted at
    what reading it costs (columnar.SAMPLE_READ_COST), a file the budget takes costs a view at most the budget,
    measured: 2 rows of 4 MiB are taken, 2 rows of 24 MiB (about 220 MiB to view) refused."""
    budget_mib, seen = 128, set()
    for tokens in (1 << 15, 196_608):  # 2 rows x L 2 x N x K 32 x 2 bytes: 4 MiB, 24 MiB a row
        path = tmp_path / f"late-{tokens}.trace"
        builder(path, heavy_rows=2, tokens=tokens)
        out = in_child("view", path, budget_mib)
        if out["error"]:
            assert "with their samples decode to" in out["error"], out
            seen.add("refused")
        else:
            assert out["growth_mib"] <= budget_mib, out
            seen.add("taken")
    assert seen == {"taken", "refused"}, seen


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="measures the peak through /proc")
def test_a_json_line_that_would_build_far_more_than_its_bytes_is_a_bad_record(tmp_path):
    """A JSON-lines trace with one line of 8 MiB of `[[],[],...]` (well under the line cap) passed the upload
    check and cost each view about 24x its bytes to parse (a 24 MiB line: 770 MB, 14 s). Its brackets are
    counted before it is parsed: one bad record, the view stays small."""
    path = tmp_path / "heavy.jsonl"
    lines = [core.trace_line("meta", {"meta": core.encode_meta(make_meta("b", L, E, 2, world_size=2))})]
    lines += [core.trace_line("step", core.encode_step(rec)) for rec in _records(3, "only")]
    heavy = '{"kind":"step","x":[' + "[]," * ((8 << 20) // 3) + "[]]}"
    path.write_text("\n".join([*lines[:2], heavy, *lines[2:]]) + "\n")
    out = in_child("view", path, None)
    assert out["error"] == "" and out["growth_mib"] < 48, out
    with tracefile.open_trace(path) as reader:
        assert reader.timeline().num_steps == 3 and reader.bad_records == 1
        assert "JSON lists and objects, more than" in reader.last_error


@pytest.mark.parametrize("action", ["seek", "poll"])
def test_a_read_past_the_memory_limit_is_the_readers_one_line_refusal(tmp_path, action):
    """Under an address-space limit a MemoryError escaped the trace source (it caught
    ValueError only). A raised budget takes 2 rows of 64 MiB samples; 96 MiB of address space does not."""
    path = tmp_path / "late.parquet"
    hostile.late_sample_parquet(path, heavy_rows=2, tokens=1 << 19)
    out = in_child(action, path, 4096, "96")
    assert "more memory than this process may take" in out["error"], out
    assert "\n" not in out["error"].strip()


@pytest.mark.parametrize("buffered, budget_mib", [(100, 64), (400, None)])
def test_a_deflated_dump_is_refused_from_its_zip_directory(tmp_path, buffered, budget_mib):
    """(400, the default 1 GiB): 381 MiB of int32 storage, under the budget as bytes, was loaded (a 617 MiB peak)
    before the elements were counted; its storages now count as the elements the check after the load sees."""
    path = tmp_path / "expert_distribution_recorder_1700000000.pt"
    elements = hostile.deflated_stat_dump(path, buffered=buffered)
    assert elements * 4 > (budget_mib or 1024) << 18 and path.stat().st_size < 1 << 20
    refused(in_child("dump", path, budget_mib=budget_mib), "zip entries (7, ", "decode to", *BOUND)


def test_a_dump_whose_records_share_one_storage_is_refused_before_any_copy(tmp_path):
    path = tmp_path / "expert_distribution_recorder_1700000000_0.pt"
    elements = hostile.shared_storage_dump(path, records=200, num_slots=4096)
    assert path.stat().st_size < 4 << 20
    refused(in_child("dump", path, budget_mib=64), f"the {elements} elements of its tensors decode to", *BOUND)


def test_a_dump_holding_itself_or_nested_too_deep_is_refused(tmp_path):
    import torch

    from moe_monitor.core.sglang_dumps import read_dump

    deep: list = []
    for _ in range(100):
        deep = [deep]
    path = tmp_path / "deep.pt"
    torch.save({"logical_count": torch.zeros(2, 3, dtype=torch.int32), "x": deep}, path)
    with pytest.raises(ValueError, match="nested more than 64 deep"):
        read_dump(path, 1 << 30)


def test_legitimate_dumps_still_read(tmp_path):
    import torch

    from moe_monitor.core.sglang_dumps import PassDump, StatDump, read_dump

    stat = tmp_path / "expert_distribution_recorder_1700000000.pt"
    torch.save({"rank": 0, "logical_count": torch.ones((4, 3, 8), dtype=torch.int64)}, stat)
    assert isinstance(read_dump(stat, 1 << 30), StatDump)
    per_pass = tmp_path / "expert_distribution_recorder_1700000000_0.pt"
    layout = torch.arange(8).repeat(3, 1)
    torch.save({"records": [{"forward_pass_id": i, "rank": 0, "global_physical_count": torch.ones(3, 8)}
                            for i in range(5)], "last_physical_to_logical_map": layout}, per_pass)
    dump = read_dump(per_pass, 1 << 30)
    assert isinstance(dump, PassDump) and dump.physical_count_TLP.shape == (5, 3, 8)
    dump.physical_count_TLP[0, 0, 0] = 99  # the parse owns its arrays: the loaded storage is not changed
    assert read_dump(per_pass, 1 << 30).physical_count_TLP[0, 0, 0] == 1


@pytest.mark.parametrize("name", ["demo.parquet", "deepseek_v3_decode_in1000out1000.parquet"])
def test_the_shipped_samples_open_under_the_default_budget(name):
    path = REPO / "moe_monitor" / "traces" / "samples" / name
    with tracefile.open_trace(path) as reader:
        tl = reader.timeline()
        first = reader.read_steps(int(tl.step_T[0]), int(tl.step_T[0]))
    assert tl.num_steps > 0 and first


L, E = 2, 8


def _records(steps: int, instance: str, world: int = 2) -> list[core.StepRecord]:
    return [core.StepRecord(run="b", rank=rank, world_size=world, step=step, time_s=1000.0 + step, phase="decode",
                            tokens=3, counts_LE=np.full((L, E), step, np.int32), instance=instance)
            for step in range(steps) for rank in range(world)]


@pytest.mark.parametrize("suffix", [".parquet", ".arrows"])
def test_a_restarted_collector_repeating_step_ids_is_a_trace(tmp_path, suffix):
    """Two collector instances numbering the same steps (a restart): world rows per instance, accepted."""
    path = tmp_path / f"restart{suffix}"
    writer = tracefile.open_writer(path, make_meta("b", L, E, 2, world_size=2))
    writer.write(_records(5, "first"))
    writer.write(_records(5, "second"))
    writer.close()
    with tracefile.open_trace(path) as reader:
        assert reader.timeline().num_steps == 5 and len(reader.read_steps(0, 4)) == 20


@pytest.mark.parametrize("suffix", [".parquet", ".arrows"])
def test_one_row_more_than_the_world_is_refused(tmp_path, suffix):
    path = tmp_path / f"extra{suffix}"
    writer = tracefile.open_writer(path, make_meta("b", L, E, 2, world_size=2))
    records = _records(3, "only")
    writer.write(records)
    writer.write(records[:1])  # step 0 rank 0 once more: three rows of one instance in a world of 2
    writer.close()
    with pytest.raises(ValueError, match=r"step 0 holds 3 rows from 1 collector instance\(s\) in a world of 2"):
        tracefile.open_trace(path)


def test_the_budget_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert decoded_budget_bytes() == 1 << 30
    monkeypatch.setenv(ENV_VAR, "64")
    assert decoded_budget_bytes() == 64 << 20
    assert decoded_budget_bytes(2.5) == int(2.5 * (1 << 20))
    for bad in ("lots", "0", "-3", "nan"):
        monkeypatch.setenv(ENV_VAR, bad)
        with pytest.raises(ValueError, match="MiB"):
            decoded_budget_bytes()


def test_info_and_convert_take_max_decoded_mib(tmp_path, capsys):
    from moe_monitor.cli import main

    path = tmp_path / "bomb.arrows"
    hostile.zstd_arrows(path, batches=1, rows_per_batch=256)  # 32 MiB of counts
    assert main(["info", str(path), "--max-decoded-mib", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "more than the 16 MiB" in err and len(err.splitlines()) == 1
    assert main(["info", str(path), "--max-decoded-mib", "64"]) == 0
    assert main(["convert", str(path), str(tmp_path / "out.parquet"), "--max-decoded-mib", "16"]) == 2
    assert "more than the 16 MiB" in capsys.readouterr().err


def test_a_json_lines_step_from_more_instances_than_a_trace_holds_is_refused(tmp_path):
    path = tmp_path / "many.jsonl"
    lines = [core.trace_line("meta", {"meta": core.encode_meta(make_meta("b", L, E, 2, world_size=1))})]
    lines += [core.trace_line("step", core.encode_step(rec)) for i in range(65) for rec in _records(1, f"i{i}", 1)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"step 0 holds 65 rows from 65 collector instance\(s\)"):
        tracefile.open_trace(path)
    path.write_text("\n".join(lines[:65]) + "\n")  # 64 instances, one row each: a collector restarted often
    with tracefile.open_trace(path) as reader:
        assert len(reader.read_steps(0, 0)) == 64
