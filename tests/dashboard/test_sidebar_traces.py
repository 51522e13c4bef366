"""The trace source takes no free path: the sidebar lists the trace files of the trace folder (MOE_TRACE_DIR),
newest first and by name only, and an upload is saved there under a generated name and selected. Real files,
the real app in Streamlit's AppTest."""
from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.views import sidebar as sidebar_module
from tests.support import synthfill
from tests.support.apptest import run_app

NAME = re.compile(r"^upload-\d{8}-\d{6}-[0-9a-f]{8}(-[A-Za-z0-9_-]+)?\.jsonl$")


def trace_text(steps: int) -> str:
    """A 2-layer, 8-expert, 2-GPU trace of `steps` decode steps; GPU 0 is the straggler (balancedness 0.6)."""
    lines = [core.trace_line("meta", {"meta": core.encode_meta(synthfill.make_meta("tr", 2, 8, gpus=2))})]
    for step in range(steps):
        counts = np.zeros((2, 8), dtype=np.int32)
        counts[:, 0], counts[:, 5] = 10, 2
        rec = core.StepRecord(run="tr", rank=0, world_size=1, step=step, time_s=1000.0 + step, phase="decode",
                              tokens=6, counts_LE=counts)
        lines.append(core.trace_line("step", core.encode_step(rec)))
    return "\n".join(lines) + "\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The trace folder with three traces (oldest to newest: old, mid, new) and an older text file, and things
    the picker must skip: a hidden file, a folder named like a trace, a symlink to a trace outside the folder."""
    root = tmp_path / "traces"
    root.mkdir()
    for age, (name, steps) in enumerate([("new.jsonl", 5), ("mid.trace", 7), ("old.json", 9), ("notes.txt", 0)]):
        (root / name).write_text(trace_text(steps) if steps else "not a trace\n")
        os.utime(root / name, (time.time() - 1000 - 100 * age,) * 2)
    (root / ".hidden.jsonl").write_text(trace_text(3))
    (root / "dir.jsonl").mkdir()
    outside = tmp_path / "outside.jsonl"
    outside.write_text(trace_text(4))
    (root / "link.jsonl").symlink_to(outside)
    monkeypatch.setenv("MOE_TRACE_DIR", str(root))
    return root


def trace_app(monkeypatch):
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    at.sidebar.radio(key="source_kind").set_value("Trace file").run()
    assert not at.exception, at.exception
    return at


def steps_caption(at) -> str:
    return next(c.value for c in at.caption if "steps in window" in c.value)


def test_the_picker_lists_the_folder_newest_first_by_name(folder, monkeypatch):
    at = trace_app(monkeypatch)
    assert not [w for w in at.sidebar.text_input if w.key == "trace_path"]  # no free path field
    picker = at.sidebar.selectbox(key="trace_path")
    assert picker.options == ["new.jsonl", "mid.trace", "old.json", "notes.txt"]
    assert picker.value == "new.jsonl" and at.session_state["settings"].trace_path == "new.jsonl"
    note = next(c.value for c in at.sidebar.caption if "Trace folder" in c.value)
    assert str(folder) in note and "MOE_TRACE_DIR" in note
    assert "5 steps in window" in steps_caption(at)
    at.sidebar.selectbox(key="trace_path").set_value("old.json").run()
    assert not at.exception, at.exception
    assert at.session_state["settings"].trace_path == "old.json"  # relative to the trace folder
    assert "9 steps in window" in steps_caption(at)
    assert next(m.value for m in at.metric if m.label.startswith("balancedness now")) == f"{6 / 10:.3f}"
    at.sidebar.selectbox(key="trace_path").set_value("notes.txt").run()  # a file that is not a trace: the replay says so, the page stays up
    assert not at.exception, at.exception
    assert at.session_state["settings"].trace_path == "notes.txt"
    assert [w.value for w in at.warning if "bad record" in w.value]


def test_an_empty_folder_says_where_traces_go(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_TRACE_DIR", str(tmp_path / "not-yet"))
    at = trace_app(monkeypatch)
    assert not [s for s in at.sidebar.selectbox if s.key == "trace_path"]
    note = next(c.value for c in at.sidebar.caption if "Trace folder" in c.value)
    assert "No trace file here yet" in note and str(tmp_path / "not-yet") in note
    assert at.session_state["settings"].trace_path == ""


@pytest.mark.parametrize("client_name", ["../../escape.jsonl", "..\\..\\escape.jsonl", "/etc/passwd.jsonl",
                                         ".hidden.jsonl", "a b/c?d*e.jsonl", "x" * 300 + ".jsonl"])
def test_an_upload_is_saved_in_the_folder_under_a_generated_name_and_selected(folder, tmp_path, monkeypatch,
                                                                              client_name):
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    outside_before = set(os.listdir(tmp_path))
    text = trace_text(11)
    at.sidebar.file_uploader(key="trace_upload").upload(client_name, text.encode(), "application/json").run()
    assert not at.exception, at.exception
    (saved,) = set(os.listdir(folder)) - before
    assert NAME.match(saved) and ".." not in saved and len(saved) < 100, saved
    assert set(os.listdir(tmp_path)) == outside_before  # nothing written outside the folder
    assert (folder / saved).read_text() == text
    assert at.sidebar.selectbox(key="trace_path").value == saved
    assert at.sidebar.selectbox(key="trace_path").options[0] == saved  # the newest
    assert at.session_state["settings"].trace_path == saved
    assert "11 steps in window" in steps_caption(at)
    at.run()  # the uploader still holds the file: it is not saved again
    assert set(os.listdir(folder)) - before == {saved}
    at.sidebar.selectbox(key="trace_path").set_value("mid.trace").run()  # and the user may pick another
    assert at.session_state["settings"].trace_path == "mid.trace" and "7 steps in window" in steps_caption(at)


@pytest.mark.parametrize("content,why", [(b"hello\n", "not JSON"), (b'{"a": 1}\n', "not a trace line"),
                                         (b"\n\n", "empty"), (b"\x89PNG\r\n\x1a\n", "not JSON")])
def test_an_upload_that_is_not_a_trace_is_not_saved(folder, monkeypatch, content, why):
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    at.sidebar.file_uploader(key="trace_upload").upload("t.jsonl", content, "application/json").run()
    assert not at.exception, at.exception
    assert set(os.listdir(folder)) == before
    assert any(why in e.value and "Not saved" in e.value for e in at.sidebar.error)
    assert at.sidebar.selectbox(key="trace_path").value == "new.jsonl"


def test_an_upload_above_the_cap_is_refused(folder, monkeypatch):
    monkeypatch.setattr(sidebar_module, "UPLOAD_CAP_MIB", 1)
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    big = trace_text(3).encode() + b"\n" * (3 * 2 ** 19)  # 1.5 MiB
    at.sidebar.file_uploader(key="trace_upload").upload("big.jsonl", big, "application/json").run()
    assert not at.exception, at.exception
    assert set(os.listdir(folder)) == before
    assert any("above the 1 MiB cap" in e.value for e in at.sidebar.error)


def test_the_upload_widget_caps_the_size():
    assert sidebar_module.UPLOAD_CAP_MIB == 256
    import streamlit as st
    assert st.config.get_option("server.maxUploadSize") >= sidebar_module.UPLOAD_CAP_MIB


def test_upload_names_keep_nothing_of_a_path():
    for client in ["../../a.jsonl", "..\\b.trace", "/abs/c.json", "...", "", "d.e.f.jsonl", "\u00e9t\u00e9.jsonl"]:
        name = sidebar_module.upload_name(client, now_s=0)
        assert NAME.match(name) and "/" not in name and "\\" not in name and ".." not in name, (client, name)
    assert sidebar_module.upload_name("my-trace.jsonl", now_s=0).startswith("upload-19700101-000000-")
    assert sidebar_module.upload_name("my-trace.jsonl", now_s=0).endswith("-my-trace.jsonl")


@pytest.mark.parametrize("suffix", [".parquet", ".arrows"])
def test_a_columnar_upload_is_opened_saved_under_its_container_and_selected(folder, tmp_path, monkeypatch, suffix):
    """A .parquet or .arrows trace is opened (timeline too) before it is kept, and saved under its container's
    extension whatever the client called it."""
    from moe_monitor.cli import main as traces_main
    from moe_monitor.core.tracefile import open_trace

    src = tmp_path / "src.jsonl"
    src.write_text(trace_text(9))
    out = tmp_path / f"converted{suffix}"
    assert traces_main(["convert", str(src), str(out)]) == 0
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    misnamed = "whatever.arrows" if suffix == ".parquet" else "whatever.parquet"   # the bytes decide, not the name
    at.sidebar.file_uploader(key="trace_upload").upload(misnamed, out.read_bytes(), "application/octet-stream").run()
    assert not at.exception, at.exception
    (saved,) = set(os.listdir(folder)) - before
    assert saved.endswith(suffix) and saved.startswith("upload-"), saved
    assert open_trace(folder / saved).timeline().step_T.size == 9
    assert at.sidebar.selectbox(key="trace_path").value == saved
    assert "9 steps in window" in steps_caption(at)


@pytest.mark.parametrize("content", [b"PAR1" + b"\0" * 64, b"\xff\xff\xff\xff" + b"garbage" * 8])
def test_a_columnar_upload_that_does_not_open_is_not_saved(folder, monkeypatch, content):
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    at.sidebar.file_uploader(key="trace_upload").upload("t.parquet", content, "application/octet-stream").run()
    assert not at.exception, at.exception
    assert set(os.listdir(folder)) == before   # not even the hidden temporary file
    assert any("Not saved" in e.value for e in at.sidebar.error)


PEAK_CHILD = r"""
import json, sys
n = int(sys.argv[1])
data = b"[" + b"[]," * n + b"[]]"  # one line, no newline: a JSON list of n + 1 empty lists
from moe_monitor.dashboard.views.sidebar import first_line_error

def status(field):
    with open("/proc/self/status") as s:
        return next(int(line.split()[1]) for line in s if line.startswith(field)) / 1024

with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak (VmHWM) starts again from now
before = status("VmRSS")
why = first_line_error(data)
print(json.dumps({"why": why, "peak_growth_mib": status("VmHWM") - before}))
"""


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="measures the peak through /proc")
def test_the_servers_look_at_a_first_line_is_bounded():
    """The server parsed an upload's whole first line (250 MiB of `[[],[],...]`: 6.8 GB,
    32 s). It now looks at FIRST_LINE_LOOK_BYTES of it and leaves a longer line to the child. Here 8 MiB of
    `[[],...]`, measured in a fresh interpreter: parsed, it costs about 220 MiB."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", PEAK_CHILD, str((8 << 20) // 3)], cwd=repo, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(repo)))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["why"] == "" and out["peak_growth_mib"] < 16, out  # undecided here: the child answers


def test_a_first_line_longer_than_a_trace_line_is_refused_by_the_check(tmp_path):
    """Left to the child, a first line over core.MAX_TRACE_LINE_BYTES is refused there without parsing it (the
    JSON-lines reader skipped it as one bad record, and the upload was kept as an empty trace)."""
    from moe_monitor.core.tracefile.sandbox import check_in_child

    path = tmp_path / "long.jsonl"
    with open(path, "wb") as handle:
        handle.write(b"[" + b"[]," * ((core.MAX_TRACE_LINE_BYTES + 3) // 3) + b"[]]")
    why = check_in_child(path)
    assert "first line is longer than" in why, why


def test_an_upload_whose_first_line_is_long_is_checked_in_the_child(folder, monkeypatch):
    """A first line past the server's look: the child says whether it is a trace line. A long list is not;
    a run's metadata holding a wide layout (over 64 KiB) is, and the trace is kept."""
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    at.sidebar.file_uploader(key="trace_upload").upload("t.jsonl", b"[" + b"[]," * 40_000 + b"[]]",
                                                        "application/json").run()
    assert not at.exception, at.exception
    assert set(os.listdir(folder)) == before
    assert any("Not saved" in e.value and "first line is not a trace line" in e.value for e in at.sidebar.error)
    wide = synthfill.make_meta("wide", 64, 512, gpus=8)
    lines = [core.trace_line("meta", {"meta": core.encode_meta(wide)})]
    assert len(lines[0]) > sidebar_module.FIRST_LINE_LOOK_BYTES
    rec = core.StepRecord(run="wide", rank=0, world_size=1, step=0, time_s=1000.0, phase="decode", tokens=6,
                          counts_LE=np.ones((64, 512), dtype=np.int32))
    lines.append(core.trace_line("step", core.encode_step(rec)))
    at.sidebar.file_uploader(key="trace_upload").upload("wide.jsonl", ("\n".join(lines) + "\n").encode(),
                                                        "application/json").run()
    assert not at.exception, at.exception
    (saved,) = set(os.listdir(folder)) - before
    assert at.sidebar.selectbox(key="trace_path").value == saved
