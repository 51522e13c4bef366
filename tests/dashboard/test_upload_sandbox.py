"""The dashboard's trace upload: every upload is opened in a child process under an address-space limit
before it is kept (core/tracefile/sandbox.py), so a file that decodes to gigabytes costs the server nothing
and is refused with one message; uploads are bounded in number and bytes and expire; a session's picker offers
the recordings and its own uploads only, so its default trace is never another session's upload. Real files
(pyarrow, the real readers), the real app in Streamlit's AppTest, real child processes."""
from __future__ import annotations

import os
import time

import pytest

from moe_monitor.core.budget import ENV_VAR
from moe_monitor.core.tracefile.sandbox import check_in_child
from moe_monitor.dashboard.views import uploads
from tests.core import hostile_traces as hostile
from tests.dashboard.test_sidebar_traces import steps_caption, trace_app, trace_text


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A trace folder with two recordings (old.jsonl, then new.jsonl, the newest)."""
    root = tmp_path / "traces"
    root.mkdir()
    for age, (name, steps) in enumerate([("new.jsonl", 5), ("old.jsonl", 9)]):
        (root / name).write_text(trace_text(steps))
        os.utime(root / name, (time.time() - 1000 - 100 * age,) * 2)
    monkeypatch.setenv("MOE_TRACE_DIR", str(root))
    monkeypatch.delenv(ENV_VAR, raising=False)
    return root


def upload(at, name: str, data: bytes):
    at.sidebar.file_uploader(key="trace_upload").upload(name, data, "application/octet-stream").run()
    assert not at.exception, at.exception
    return at


def refusals(at) -> list[str]:
    return [e.value for e in at.sidebar.error if e.value.startswith("Not saved")]


def test_a_decompression_bomb_upload_is_refused_with_one_message(folder, tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.arrows"
    hostile.zstd_arrows(bomb, batches=4, rows_per_batch=1024)  # 512 MiB of counts in under 1 MB
    monkeypatch.setenv(ENV_VAR, "256")
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    upload(at, "bomb.arrows", bomb.read_bytes())
    (message,) = refusals(at)
    assert "decode to 512" in message and "more than the 256" in message and ENV_VAR in message, message
    assert str(folder) not in message and ".part" not in message
    assert set(os.listdir(folder)) == before  # not even the hidden temporary file
    assert at.sidebar.selectbox(key="trace_path").value == "new.jsonl"


def test_an_upload_that_blows_the_address_space_limit_is_refused(folder, tmp_path, monkeypatch):
    """Under a budget raised above it, the file opens, but reading its first step decodes a 256 MiB batch:
    more than the child may map, so the child (not the server) runs out of memory and the upload is refused."""
    bomb = tmp_path / "bomb.arrows"
    hostile.zstd_arrows(bomb, batches=2, rows_per_batch=2048)
    monkeypatch.setenv(ENV_VAR, "4096")
    monkeypatch.setattr(uploads, "UPLOAD_ADDRESS_MIB", 128)
    at = trace_app(monkeypatch)
    before = set(os.listdir(folder))
    upload(at, "bomb.arrows", bomb.read_bytes())
    (message,) = refusals(at)
    assert "needs more than 128 MiB of memory" in message, message
    assert set(os.listdir(folder)) == before


@pytest.mark.parametrize("builder", ["repeated", "sample"])
def test_hostile_parquet_uploads_are_refused(folder, tmp_path, monkeypatch, builder):
    path = tmp_path / "hostile.parquet"
    if builder == "repeated":
        hostile.repeated_step_parquet(path, row_groups=1, rows_per_group=100_000)
        expected = "step 0 holds 100000 rows"
    else:
        hostile.big_sample_parquet(path, steps=600, tokens=16384)
        expected = "with their samples decode to"
        monkeypatch.setenv(ENV_VAR, "256")
    at = trace_app(monkeypatch)
    upload(at, "t.parquet", path.read_bytes())
    (message,) = refusals(at)
    assert expected in message, message


def test_the_check_takes_good_traces_and_says_why_for_others(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(trace_text(4))
    assert check_in_child(good) == ""
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 64)
    assert "not a Parquet trace" in check_in_child(bad)


@pytest.mark.parametrize("builder", [hostile.late_sample_parquet, hostile.late_sample_arrows])
def test_the_check_reads_what_a_sessions_first_view_reads(tmp_path, monkeypatch, builder):
    """The check read the timeline and the first step, the page the first 600 steps. A trace
    whose first step has no sample and whose next two hold 64 MiB each (a budget raised to take them) opened
    in the check; reading its view in the child now needs more than the child may take, and it is refused."""
    path = tmp_path / "late.trace"
    builder(path, heavy_rows=2, tokens=1 << 19)
    monkeypatch.setenv(ENV_VAR, "4096")
    why = check_in_child(path, 128 << 20)  # a MemoryError, or pyarrow aborting the child: refused either way
    assert why.startswith("opening it") and "128 MiB of memory" in why, why
    small = tmp_path / "small.trace"
    builder(small, heavy_rows=2, tokens=1 << 12)  # the same shape with 512 KiB samples: kept
    assert check_in_child(small, 128 << 20) == ""


def _save(root, text_steps: int = 3, name: str = "t.jsonl", own: set[str] | None = None) -> str:
    """Save an upload as one session does (own: the session's uploads so far; the new one is added)."""
    own = set() if own is None else own
    saved = uploads.save_upload(root, name, trace_text(text_steps).encode(), own=own)
    own.add(saved)
    return saved


def test_uploads_beyond_the_file_quota_replace_the_sessions_oldest(folder, monkeypatch):
    monkeypatch.setattr(uploads, "UPLOAD_MAX_FILES", 2)
    mine: set[str] = set()
    first = _save(folder, own=mine)
    os.utime(folder / first, (time.time() - 30,) * 2)
    second = _save(folder, own=mine)
    os.utime(folder / second, (time.time() - 20,) * 2)
    third = _save(folder, own=mine)
    assert sorted(n for n in os.listdir(folder) if uploads.is_upload(n)) == sorted([second, third])
    assert {"new.jsonl", "old.jsonl"} <= set(os.listdir(folder))  # recordings are never deleted


def test_uploads_beyond_the_byte_quota_replace_the_sessions_oldest(folder, monkeypatch):
    size = len(trace_text(3).encode())
    monkeypatch.setattr(uploads, "UPLOAD_QUOTA_BYTES", int(size * 2.5))
    mine: set[str] = set()
    first = _save(folder, own=mine)
    os.utime(folder / first, (time.time() - 30,) * 2)
    second = _save(folder, own=mine)
    os.utime(folder / second, (time.time() - 20,) * 2)
    third = _save(folder, own=mine)
    assert sorted(n for n in os.listdir(folder) if uploads.is_upload(n)) == sorted([second, third])
    with pytest.raises(ValueError, match="larger than the"):
        uploads.save_upload(folder, "big.jsonl", trace_text(200).encode(), own=mine)


def test_one_sessions_uploads_never_delete_anothers(folder, monkeypatch):
    """32 uploads of one session deleted another's. Each session now replaces only its own
    oldest; when the folder holds all it may, a new upload is refused and nothing of another session goes."""
    monkeypatch.setattr(uploads, "UPLOAD_MAX_FILES", 2)
    monkeypatch.setattr(uploads, "FOLDER_MAX_FILES", 4)
    theirs: set[str] = set()
    kept = _save(folder, own=theirs)
    mine: set[str] = set()
    for _ in range(5):
        _save(folder, own=mine)
    names = {n for n in os.listdir(folder) if uploads.is_upload(n)}
    assert kept in names and len(names) == 3, names  # theirs, and the newest 2 of mine
    third: set[str] = set()
    _save(folder, own=third)
    with pytest.raises(ValueError, match="the trace folder holds 4 uploads"):
        _save(folder, own=set())  # a fourth session: the folder is full, nobody's upload is deleted
    assert kept in os.listdir(folder) and len({n for n in os.listdir(folder) if uploads.is_upload(n)}) == 4


def test_an_upload_the_folder_refuses_deletes_none_of_the_sessions_own(folder, monkeypatch):
    """A session at its own quota whose new upload the full folder refuses keeps its oldest upload: deletions are
    decided first and made only once the new one fits the folder too."""
    monkeypatch.setattr(uploads, "UPLOAD_MAX_FILES", 2)
    monkeypatch.setattr(uploads, "FOLDER_MAX_FILES", 4)
    theirs: set[str] = set()
    _save(folder, own=theirs)
    _save(folder, own=theirs)
    mine: set[str] = set()
    _save(folder, own=mine)
    _save(folder, own=mine)  # at its own quota: a third would replace the first
    before = {n for n in os.listdir(folder) if uploads.is_upload(n)}
    monkeypatch.setattr(uploads, "FOLDER_MAX_FILES", 3)  # the folder is full even with that one gone
    with pytest.raises(ValueError, match="the trace folder holds"):
        _save(folder, own=mine)
    assert {n for n in os.listdir(folder) if uploads.is_upload(n)} == before


def test_a_sessions_uploads_in_the_app_never_delete_another_sessions(folder, monkeypatch):
    monkeypatch.setattr(uploads, "UPLOAD_MAX_FILES", 2)
    theirs = trace_app(monkeypatch)
    upload(theirs, "theirs.jsonl", trace_text(4).encode())
    (kept,) = [n for n in os.listdir(folder) if uploads.is_upload(n)]
    mine = trace_app(monkeypatch)
    for steps in (5, 6, 7):
        upload(mine, f"mine{steps}.jsonl", trace_text(steps).encode())
        assert not refusals(mine)
    names = {n for n in os.listdir(folder) if uploads.is_upload(n)}
    assert kept in names and len(names) == 3, names
    theirs.run()
    assert theirs.sidebar.selectbox(key="trace_path").value == kept


def test_old_uploads_and_half_written_ones_expire(folder):
    old = _save(folder)
    day_ago = time.time() - uploads.UPLOAD_MAX_AGE_S - 60
    os.utime(folder / old, (day_ago,) * 2)
    os.utime(folder / "old.jsonl", (day_ago,) * 2)  # a recording as old: kept
    part = folder / ".upload-20240101-000000-abcdef01-x.jsonl.part"
    part.write_text("half")
    os.utime(part, (time.time() - uploads.PART_MAX_AGE_S - 60,) * 2)
    fresh = _save(folder)
    names = set(os.listdir(folder))
    assert old not in names and part.name not in names and fresh in names and "old.jsonl" in names


def test_a_sessions_default_is_its_own_upload_or_the_newest_recording(folder, monkeypatch):
    mine = trace_app(monkeypatch)
    upload(mine, "mine.jsonl", trace_text(11).encode())
    (saved,) = [n for n in os.listdir(folder) if uploads.is_upload(n)]
    assert mine.sidebar.selectbox(key="trace_path").value == saved and "11 steps in window" in steps_caption(mine)
    other = trace_app(monkeypatch)  # another browser session, same folder: the upload is the newest file there
    picker = other.sidebar.selectbox(key="trace_path")
    assert saved not in picker.options and picker.value == "new.jsonl"
    assert other.session_state["settings"].trace_path == "new.jsonl"
    mine.run()
    assert mine.sidebar.selectbox(key="trace_path").options[0] == saved


def _checks_running() -> list[int]:
    """Process ids of this process's children that are checking an upload (the sandbox module)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmd:
                command = cmd.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"moe_monitor.core.tracefile.sandbox" in command:
            found.append(int(entry.name))
    return found


def _environ(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as env:
            return {item.split(b"=", 1)[0].decode() for item in env.read().split(b"\0") if item}
    except OSError:
        return set()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the checks from /proc")
def test_checks_run_one_at_a_time_with_nothing_secret_in_their_environment(folder, monkeypatch):
    """Four checks ran at once (2.42 GB), each child with the server's Redis URL and apply
    secret. Three sessions upload at the same moment: one child at a time, each without those variables."""
    import threading

    from moe_monitor.core.apply_secret import SECRET_ENV, SECRET_FILE_ENV

    monkeypatch.setenv("REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    monkeypatch.setenv(SECRET_ENV, "s" * 40)
    monkeypatch.setenv(SECRET_FILE_ENV, str(folder / "secret"))
    saved: list[str] = []
    errors: list[BaseException] = []

    def one(steps: int) -> None:
        try:
            saved.append(uploads.save_upload(folder, f"t{steps}.jsonl", trace_text(steps).encode()))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(steps,)) for steps in (3, 4, 5)]
    for thread in threads:
        thread.start()
    most, seen_env = 0, []
    while any(thread.is_alive() for thread in threads):  # sample the running checks until every upload is done
        running = _checks_running()
        most = max(most, len(running))
        seen_env += [_environ(pid) for pid in running]
        next(thread for thread in threads if thread.is_alive() or thread is threads[-1]).join(0.01)
    for thread in threads:
        thread.join()
    assert not errors and len(saved) == 3, errors
    assert seen_env, "no check was seen running"
    assert most == 1, most  # UPLOAD_CHECKS_AT_ONCE
    for names in seen_env:
        assert not names & {"REDIS_URL", SECRET_ENV, SECRET_FILE_ENV}, sorted(names)
