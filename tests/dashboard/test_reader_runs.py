"""The run list is read from the moe:runs sorted set only (no SCAN of the keyspace) and trusted in nothing:
entries with an invalid or non-UTF-8 name or a non-finite time are skipped, counted and mentioned on the page."""
from __future__ import annotations

from moe_monitor import core
from moe_monitor.dashboard.sources.redis import read_runs
from tests.support import synthfill
from tests.support.apptest import run_app

HOSTILE = {"bad name!": 2e9, b"\xff\xfe": 2e9 + 1, "infinite": float("inf"), "negative-inf": float("-inf")}


def test_invalid_entries_are_skipped_and_counted(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "good", steps=2)
    client.zadd(core.RUNS_KEY, HOSTILE)
    listing = read_runs(client)
    assert [name for name, _ in listing.runs] == ["good"] and listing.skipped == 4
    assert [name for name, _ in read_runs(client).runs] == ["good"]


def test_the_run_list_never_scans_the_keyspace(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "indexed", steps=1)
    client.set(core.meta_key("orphan"), core.encode_meta(synthfill.make_meta("orphan", 1, 4, gpus=1)))
    client.config_resetstat()
    assert [name for name, _ in read_runs(client).runs] == ["indexed"]
    assert "cmdstat_scan" not in client.info("commandstats")


def test_the_page_selects_a_valid_run_and_says_how_many_were_skipped(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "good", steps=5)
    client.zadd(core.RUNS_KEY, HOSTILE)
    at = run_app(redis_url, monkeypatch)
    assert at.sidebar.selectbox(key="run").value == "good"
    assert not at.error, [e.value for e in at.error]
    notes = [w.value for w in (*at.warning, *at.caption) if "skipped" in w.value and "moe:runs" in w.value]
    assert len(notes) == 1 and "4" in notes[0], notes
    assert any("5 steps in window" in c.value for c in at.caption)


def test_only_hostile_entries_read_as_no_run_yet(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    client.zadd(core.RUNS_KEY, {b"\xff": 1.0, "negative-inf": float("-inf")})
    at = run_app(redis_url, monkeypatch)
    assert not at.error, [e.value for e in at.error]
    assert any("No run yet" in i.value for i in at.info)
    assert any("2" in w.value and "skipped" in w.value for w in (*at.warning, *at.caption))
