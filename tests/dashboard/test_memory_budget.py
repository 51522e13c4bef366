"""One memory budget per process (core.membudget): step windows, sample rings and timing rings reserve what they
keep before allocating it, get less (and say so) when the budget is short, and give it back when dropped; the
dashboard's data layer reading 600 tiny all-zero records of L=800 x E=1000 stays within its budget (measured in a
child process: its VmHWM, tests.support.memprobe.peak_rss_bytes)."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.dashboard.live import sizing
from moe_monitor.dashboard.live.samples import SampleRing
from moe_monitor.dashboard.live.timings import TimingRing
from moe_monitor.dashboard.live.window import StepWindow
from tests.support import memprobe
from tests.support.assembled import add_rank

MIB = 1 << 20


def _budget(nbytes: int) -> membudget.MemoryBudget:
    return membudget.MemoryBudget(nbytes)


def _rec(step: int, counts, rank: int = 0, world: int = 1, phase: str = "decode") -> core.StepRecord:
    return core.StepRecord(run="mb", rank=rank, world_size=world, step=step, time_s=1000.0 + step, phase=phase,
                           tokens=int(np.sum(counts)), counts_LE=np.asarray(counts, dtype=np.int32))


# ------------------------------------------------------------------------------------------ the budget itself
@pytest.mark.parametrize("text, nbytes", [("2GiB", 2 << 30), ("512 MiB", 512 * MIB), ("1.5G", 1_500_000_000),
                                          ("800000000", 800_000_000), ("64mib", 64 * MIB)])
def test_sizes_parse_in_the_units_people_write(text, nbytes):
    assert membudget.parse_bytes(text) == nbytes


@pytest.mark.parametrize("bad", ["", "lots", "2 GB of RAM", "-1GiB", "1KiB", "3PiB"])
def test_a_size_that_is_not_one_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="memory budget"):
        membudget.parse_bytes(bad)


def test_reservations_add_up_shrink_grow_and_release_once():
    budget = _budget(100)
    a = budget.try_reserve(60)
    assert a is not None and budget.reserved_bytes == 60 and budget.available_bytes == 40
    assert budget.try_reserve(41) is None and budget.reserved_bytes == 60
    assert not a.resize_to(101) and a.nbytes == 60
    assert a.resize_to(100) and budget.available_bytes == 0
    assert a.resize_to(10) and budget.reserved_bytes == 10
    a.release()
    a.release()
    assert budget.reserved_bytes == 0


def test_rows_are_granted_as_far_as_they_fit():
    budget = _budget(1000)
    held, rows = budget.reserve_rows(100, 20, fixed_bytes=250)
    assert rows == 7 and held.nbytes == 950
    assert budget.reserve_rows(100, 5) is None  # 50 bytes left: not one row
    held.release()
    assert budget.reserve_rows(100, 5)[1] == 5


def test_a_holder_gives_its_bytes_back_when_garbage_collected():
    budget = _budget(64 * MIB)
    window = StepWindow(100, 4, 16, budget=budget)
    assert budget.reserved_bytes == window.reserved_bytes > 100 * 4 * 16 * 4
    del window
    gc.collect()
    assert budget.reserved_bytes == 0


def test_a_copy_of_a_window_holds_its_own_bytes_or_is_refused():
    """A paused page deep-copies its window (dashboard.live.pause): the copy is memory too."""
    import copy

    L, E = 4, 16
    budget = _budget(StepWindow.fixed_bytes(L, E) * 2 + 20 * StepWindow.step_bytes(L, E))
    window = StepWindow(10, L, E, budget=budget)
    add_rank(window, _rec(0, np.ones((L, E))))
    frozen = copy.deepcopy(window)
    assert frozen.budget is budget and budget.reserved_bytes == 2 * window.reserved_bytes
    assert frozen.view("both", core.contiguous_layout(L, E), 2, now_s=1e9).num_steps == 1
    with pytest.raises(ValueError, match="a copy needs .* the dashboard's memory budget"):
        copy.deepcopy(window)
    del frozen
    gc.collect()
    assert budget.reserved_bytes == window.reserved_bytes


def test_reservations_from_many_threads_never_exceed_the_budget():
    budget = _budget(1000)
    granted: list = []

    def take():
        for _ in range(200):
            held = budget.try_reserve(7)
            if held is not None:
                granted.append(held)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(granted) == 1000 // 7 and budget.reserved_bytes == 7 * (1000 // 7)


def test_the_process_budget_comes_from_the_environment_and_using_overrides_it(monkeypatch):
    monkeypatch.setattr(membudget, "_process_budget", None)
    monkeypatch.setenv(membudget.ENV_VAR, "3GiB")
    assert membudget.process_budget().total_bytes == 3 << 30 and membudget.current() is membudget.process_budget()
    mine = _budget(32 * MIB)
    with membudget.using(mine):
        assert membudget.current() is mine
        assert StepWindow(4, 2, 8).budget is mine
    assert membudget.current() is membudget.process_budget()
    monkeypatch.setattr(membudget, "_process_budget", None)
    monkeypatch.setenv(membudget.ENV_VAR, "a lot")
    with pytest.raises(ValueError, match=membudget.ENV_VAR):
        membudget.process_budget()
    monkeypatch.setattr(membudget, "_process_budget", None)  # the next test builds it from a clean environment


def test_the_dashboard_command_takes_the_budget_and_refuses_one_that_is_not_a_size():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    help_text = subprocess.run([sys.executable, "-m", "moe_monitor", "dashboard", "--help"], cwd=root,
                               capture_output=True, text=True, timeout=60).stdout
    assert "--memory-budget" in help_text and membudget.ENV_VAR in help_text
    bad = subprocess.run([sys.executable, "-m", "moe_monitor", "dashboard", "--memory-budget", "lots"], cwd=root,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --memory-budget 'lots'")


# ------------------------------------------------------------------------------------------ the step window
def test_a_window_the_budget_cannot_hold_is_narrowed_and_says_so():
    L, E = 8, 64
    limit_bytes = StepWindow.fixed_bytes(L, E) + 37 * StepWindow.step_bytes(L, E) + 100
    budget = _budget(limit_bytes)
    window = StepWindow(600, L, E, budget=budget)
    assert window.capacity == 37 and window.asked_capacity == 600
    assert window.budget_note == (f"window narrowed to 37 of 600 steps: the dashboard's memory budget "
                                  f"({limit_bytes / 1024:.1f} KiB, set MOE_MONITOR_MEMORY_BUDGET / --memory-budget to "
                                  "raise it) is shared by every session")
    assert budget.reserved_bytes <= budget.total_bytes
    full = StepWindow(10, L, E, budget=_budget(64 * MIB))
    assert full.capacity == 10 and full.budget_note == ""


def test_a_narrowed_window_keeps_the_newest_steps_and_every_reader_works():
    L, E, gpus = 2, 8, 4
    budget = _budget(StepWindow.fixed_bytes(L, E) + 5 * StepWindow.step_bytes(L, E))
    window = StepWindow(50, L, E, budget=budget)
    assert window.capacity == 5
    rng = np.random.default_rng(0)
    for step in range(12):
        add_rank(window, _rec(step, rng.integers(0, 9, size=(L, E)), phase="prefill" if step % 2 else "decode"))
    layout = core.contiguous_layout(L, E)
    view = window.view("both", layout, gpus, now_s=1e9)
    assert view.step_T.tolist() == [7, 8, 9, 10, 11] and view.loads_TLG.shape == (5, L, gpus)
    assert window.sum_counts(view.slots_T).tolist() == view.counts_sum_LE.tolist()
    assert window.view("decode", layout, gpus, now_s=1e9).step_T.tolist() == [8, 10]
    assert window.reserved_bytes <= budget.total_bytes  # the loads' real size replaced the guess


def test_a_window_that_cannot_hold_one_step_is_refused_with_the_budget_named():
    budget = _budget(MIB)
    with pytest.raises(ValueError, match=r"needs .* for one step and the dashboard's memory budget \(1\.0 MiB"):
        StepWindow(10, 100, 1000, budget=budget)
    assert budget.reserved_bytes == 0


def test_sessions_share_one_budget_and_a_closed_window_makes_room():
    L, E = 4, 64
    budget = _budget(StepWindow.fixed_bytes(L, E) * 2 + 150 * StepWindow.step_bytes(L, E))
    first = StepWindow(100, L, E, budget=budget)
    second = StepWindow(100, L, E, budget=budget)
    assert first.capacity == 100 and second.capacity < 100 and "narrowed" in second.budget_note
    first.close()
    second.close()
    assert budget.reserved_bytes == 0
    assert StepWindow(100, L, E, budget=budget).capacity == 100


def test_widening_to_int64_is_reserved_or_refused_before_anything_changes():
    L, E = 1, 2
    big = 2**31 - 1
    roomy = StepWindow(4, L, E, budget=_budget(64 * MIB))
    add_rank(roomy, _rec(0, [[big, 1]], rank=0, world=2))
    add_rank(roomy, _rec(0, [[big, 1]], rank=1, world=2))
    assert roomy.counts_CLE.dtype == np.int64
    tight_budget = _budget(StepWindow.fixed_bytes(L, E) + 4 * StepWindow.step_bytes(L, E))
    tight = StepWindow(4, L, E, budget=tight_budget)
    add_rank(tight, _rec(0, [[big, 1]], rank=0, world=2))
    tight_budget.try_reserve(tight_budget.available_bytes)  # another session takes the rest
    with pytest.raises(ValueError, match="outgrow int32 .* more than the dashboard's memory budget"):
        add_rank(tight, _rec(0, [[big, 1]], rank=1, world=2))
    assert tight.counts_CLE.dtype == np.int32 and tight.ranks_C[0] == 1


def test_loads_on_more_gpus_than_the_budget_holds_are_refused_with_a_message():
    L, E = 1, 4
    budget = _budget(StepWindow.fixed_bytes(L, E) + 3 * StepWindow.step_bytes(L, E))
    window = StepWindow(3, L, E, budget=budget)
    add_rank(window, _rec(0, [[1, 2, 3, 4]]))
    wide = [[p % E for p in range(4096)]]  # 4096 slots on 4096 GPUs: loads far wider than the counts
    with pytest.raises(ValueError, match="GPU loads of this window"):
        window.view("both", wide, 4096, now_s=1e9)
    assert window.view("both", core.contiguous_layout(L, E), 2, now_s=1e9).num_steps == 1


def test_loads_are_computed_a_chunk_of_rows_at_a_time(monkeypatch):
    """The same loads whatever the chunk (one row at a time here), so a tick never copies the whole ring."""
    from moe_monitor.dashboard.live import window as window_module

    L, E, gpus = 3, 16, 4
    rng = np.random.default_rng(1)
    records = [_rec(step, rng.integers(0, 50, size=(L, E))) for step in range(9)]
    whole = StepWindow(9, L, E, budget=_budget(64 * MIB))
    for rec in records:
        add_rank(whole, rec)
    expected = whole.view("both", core.contiguous_layout(L, E), gpus, now_s=1e9).loads_TLG
    monkeypatch.setattr(window_module, "CHUNK_BYTES", 1)
    chunked = StepWindow(9, L, E, budget=_budget(64 * MIB))
    for rec in records:
        add_rank(chunked, rec)
    np.testing.assert_array_equal(chunked.view("both", core.contiguous_layout(L, E), gpus, now_s=1e9).loads_TLG,
                                  expected)


# ------------------------------------------------------------------------------------------ the rings
def test_a_sample_ring_reserves_as_it_fills_and_keeps_what_the_budget_allows():
    budget = _budget(2 * MIB)
    ring = SampleRing(capacity=100, budget=budget)
    assert ring.reserved_bytes == 0
    sample = np.zeros((4, 16384, 8), dtype=np.int16)  # 1 MiB a step
    for step in range(6):
        ring.add(core.StepRecord(run="mb", rank=0, world_size=1, step=step, time_s=1.0, phase="decode", tokens=1,
                                 counts_LE=np.zeros((4, 8), dtype=np.int32), sample_ids_LNK=sample))
    assert ring.nbytes <= ring.reserved_bytes <= budget.total_bytes
    assert len(ring) == 2 and ring.rows([4, 5]).shape == (4, 2 * 16384, 8)
    assert "sampled routing rows" in ring.budget_note and "memory budget" in ring.budget_note
    ring.close()
    assert budget.reserved_bytes == 0


def test_a_timing_ring_the_budget_cannot_hold_refuses_its_records():
    budget = _budget(MIB)
    ring = TimingRing(600, budget=budget)
    layers = 64
    rec = core.TimingRecord(run="mb", rank=0, world_size=8, step=0, time_s=1.0,
                            dispatch_s_L=np.full(layers, 1e-3, np.float32), compute_s_L=np.full(layers, 1e-3, np.float32),
                            combine_s_L=np.full(layers, 1e-3, np.float32), layer_s_L=np.full(layers, 3e-3, np.float32))
    with pytest.raises(ValueError, match="timings of 600 steps x 8 ranks x 64 layers need .* memory budget"):
        ring.add(rec)
    assert ring.records == 0 and budget.reserved_bytes == 0
    roomy = TimingRing(600, budget=_budget(64 * MIB))
    roomy.add(rec)
    assert roomy.records == 1 and roomy.reserved_bytes == 600 * 8 * (64 * 16 + 1)


# ------------------------------------------------------------------------------------------ sizing a new window
def test_a_new_windows_steps_count_the_records_its_first_poll_decodes():
    L, E = 8, 64
    one = StepWindow.step_bytes(L, E) + 4 * sizing.decoded_bytes(L, E)
    budget = _budget(StepWindow.fixed_bytes(L, E) + 10 * one)
    steps, note = sizing.budgeted_steps(600, L, E, records_per_step=4, budget=budget)
    assert steps == 10 and note.startswith("window narrowed to 10 of 600 steps: the dashboard's memory budget")
    assert sizing.budgeted_steps(5, L, E, 4, budget) == (5, "")
    with pytest.raises(ValueError, match="one step of \\[8, 64\\] counts from 4 ranks needs"):
        sizing.budgeted_steps(600, L, E, 4, _budget(16 << 10))
    with sizing.first_poll(10, L, E, 4, budget):
        assert budget.reserved_bytes == 10 * 4 * sizing.decoded_bytes(L, E)
    assert budget.reserved_bytes == 0
    assert sizing.entries_per_tick(800, 1000) == sizing.DECODE_BYTES_PER_TICK // (800 * 1000 * 4)
    assert sizing.entries_per_tick(2, 8) == sizing.MAX_ENTRIES_PER_TICK


# ------------------------------------------------------------------------------------------ the finding, measured
@pytest.mark.subprocess
def test_600_tiny_records_of_800_by_1000_stay_within_the_dashboards_budget(redis_url):
    """The finding: 600 all-zero compact records (~150 B each in Redis) asked a window of 1.9 GB and a session
    took 1.0-1.5 GB. Under a 512 MiB budget the session's window holds what fits, says so, and the process's
    peak resident memory stays below the budget plus the interpreter and one poll's temporaries."""
    client = core.connect(redis_url, timeout_s=5.0)
    record_bytes = memprobe.fill_zero_records(client, "zeros")
    assert record_bytes < 400
    budget = 512 * MIB
    out = memprobe.run_child("dashboard", redis_url, "zeros", 600, budget)
    assert 1 <= out["window_steps"] < 600
    assert out["note"].startswith(f"window narrowed to {out['window_steps']} of 600 steps: the dashboard's memory "
                                  f"budget (512.0 MiB, set MOE_MONITOR_MEMORY_BUDGET / --memory-budget to raise it)")
    assert out["phases"] == {"both": True, "prefill": True, "decode": True}
    assert out["reserved_bytes"] <= budget
    assert out["peak_rss_bytes"] < budget + 256 * MIB, out


@pytest.mark.subprocess
def test_a_session_that_does_not_size_its_source_stays_within_the_budget_too(redis_url):
    """The Redis source hands a new run's backlog (window x ranks records, 1.9 GB decoded here) over in pieces of
    streams.DECODED_BUDGET_BYTES, so even a session that sizes nothing stays within the budget."""
    client = core.connect(redis_url, timeout_s=5.0)
    memprobe.fill_zero_records(client, "zeros")
    budget = 512 * MIB
    out = memprobe.run_child("dashboard-unsized", redis_url, "zeros", 600, budget)
    assert "narrowed" in out["note"]
    assert out["peak_rss_bytes"] < budget + 256 * MIB, out


def test_the_page_says_when_the_budget_narrowed_the_window(redis_url, monkeypatch):
    from tests.support import synthfill
    from tests.support.apptest import run_app

    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "narrow", steps=30, num_layers=4, num_experts=16)  # the only run: the page picks it
    # a budget that holds a few steps of [4, 16] only, for the app's process
    monkeypatch.setattr(membudget, "_process_budget", membudget.MemoryBudget(64 * 1024))
    at = run_app(redis_url, monkeypatch)
    notes = [i.value for i in at.info if "Memory budget" in i.value]
    assert notes and "window narrowed to" in notes[0] and "of 600 steps" in notes[0], [i.value for i in at.info]
