"""States a user meets, through AppTest against a real redis-server: no Redis, no run yet, a run that
stopped, bad records (multi-rank wire-level fill), a layout override and a trace file replayed."""
import socket
import time

import numpy as np

from moe_monitor import core
from tests.support import synthfill
from tests.support.apptest import run_app


def test_no_redis_reachable_names_the_redacted_url(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    at = run_app(f"redis://:s3cret@127.0.0.1:{port}/0", monkeypatch)
    assert len(at.error) == 1
    message = at.error[0].value
    assert f"redis://:***@127.0.0.1:{port}/0" in message and "s3cret" not in message
    assert "REDIS_URL" in message and "redis-server" in message


def test_no_run_yet(redis_url, monkeypatch):
    at = run_app(redis_url, monkeypatch)
    assert not at.error and any("No run yet" in i.value for i in at.info)


def test_stopped_run_and_bad_records_are_shown(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "old", steps=20, world_size=2, time0_s=time.time() - 3600)
    synthfill.add_bad_entry(client, "old")
    at = run_app(redis_url, monkeypatch)
    warnings = [w.value for w in at.warning]
    assert any("stopped writing" in w and "last seen" in w for w in warnings), warnings
    assert any("Skipped 1 bad record" in w and "counts has 3 bytes" in w for w in warnings), warnings
    assert next(m.value for m in at.metric if m.label.startswith("bad records")) == "1"
    assert any("20 steps in window" in c.value for c in at.caption)


def test_layout_override_changes_gpus(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "lay", steps=10, num_experts=16, gpus=4)
    at = run_app(redis_url, monkeypatch)
    assert any("4 GPUs on 1 node(s)" in c.value for c in at.caption)
    at.sidebar.number_input(key="gpus_override").set_value(8).run()
    at.sidebar.number_input(key="gpus_per_node_override").set_value(2).run()
    assert not at.exception, at.exception
    assert any("8 GPUs on 4 node(s), 2 slots/GPU" in c.value for c in at.caption), [c.value for c in at.caption]
    at.sidebar.number_input(key="gpus_override").set_value(5).run()
    assert any("do not split evenly over 5 GPUs" in e.value for e in at.error)


def test_trace_file_source(tmp_path, monkeypatch):
    meta = synthfill.make_meta("tr", 2, 8, gpus=2)
    lines = [core.trace_line("meta", {"meta": core.encode_meta(meta)})]
    for step in range(12):
        counts = np.zeros((2, 8), dtype=np.int32)
        counts[:, 0] = 10  # expert 0 lives on GPU 0: GPU 0 is the straggler
        counts[:, 5] = 2
        rec = core.StepRecord(run="tr", rank=0, world_size=1, step=step, time_s=1000.0 + step, phase="decode",
                              tokens=6, counts_LE=counts)
        lines.append(core.trace_line("step", core.encode_step(rec)))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("MOE_TRACE_DIR", str(tmp_path))  # the trace folder: names are taken inside it
    at = run_app("redis://127.0.0.1:1/0", monkeypatch)
    at.sidebar.radio(key="source_kind").set_value("Trace file").run()
    at.sidebar.selectbox(key="trace_path").set_value(path.name).run()
    assert not at.exception, at.exception
    assert next(m.value for m in at.metric if m.label.startswith("balancedness now")) == f"{6 / 10:.3f}"
    assert any("Busiest GPU over the window: GPU 0 (node 0)" in md.value for md in at.markdown)
    assert any("replay finished" in md.value for md in at.markdown)
