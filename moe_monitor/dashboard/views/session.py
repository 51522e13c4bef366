"""Streamlit glue: the cached Redis client, the sidebar's settings and the WatchedRun kept per session.

The Redis client is made once per URL (core.clientcache.shared_client: at most 16 kept for the whole server, the
least recently used closed first, so typed URLs cannot pile up sockets) with explicit timeouts; the WatchedRun (source +
window) lives in st.session_state so every page and every fragment rerun continues from the last id seen (a new
session's live run starts from another session's copy when the server holds one: dashboard.live.seeds).
At a rollup resolution (hours of history) a RollupRun rides on that WatchedRun, also kept in the session.
This module owns the session-state entries the live pages share ("settings", "watched_run", "rollup_run") and
the session's own trace uploads ("own_uploads": the only uploads its trace picker offers, so that a session's
default trace is its own upload or the newest recording, never another session's upload); widgets keep their
own keys, and the What-if page keeps its edit state in dashboard.views.whatif.controls.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from moe_monitor import core
from moe_monitor.core.clientcache import shared_client
from moe_monitor.core.redaction import scrub
from moe_monitor.dashboard.analytics.levels import SILENT_S
from moe_monitor.dashboard.live.rollups import RollupRun
from moe_monitor.dashboard.live.seeds import SEEDS
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource, RunListing, read_runs
from moe_monitor.dashboard.sources.rollups import RollupSource, available_resolutions
from moe_monitor.dashboard.sources.trace import TraceSource

REDIS_TIMEOUT_S = 0.5
REDIS_RETRIES = 1
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
STALE_AFTER_S = SILENT_S.bad  # a run silent this long stopped writing (the Overview colours the same rule)
REFRESH_S = 1.0
RESOLVED_PHASE = "resolved_phase"  # session key: the phase filter the last tick applied ("auto" resolved)


@dataclass(frozen=True)
class Settings:
    """What the sidebar chose. source: 'redis' or 'trace'; layer: one layer's load, or None for all layers:
    summed over layers when summed, else the per-layer view (each GPU's busiest layer); gpus /
    gpus_per_node None = from the run; uploaded_layout: physical_to_logical_map rows from a layout JSON.
    resolution_s: 0 = full resolution (the last window_steps steps), else the rollup buckets' seconds (1 or 60)
    over the newest span_s seconds (a live Redis run whose aggregator writes rollups)."""

    source: str = "redis"
    redis_url: str = DEFAULT_REDIS_URL
    run: str | None = None
    trace_path: str = ""
    phase: str = "auto"
    window_steps: int = 600
    layer: int | None = None
    summed: bool = False
    gpus: int | None = None
    gpus_per_node: int | None = None
    uploaded_layout: tuple | None = None
    resolution_s: int = 0
    span_s: int = 0

    def monitor_key(self) -> tuple:
        where = (self.redis_url, self.run) if self.source == "redis" else (self.trace_path,)
        return (self.source, *where, self.window_steps)

    @property
    def rolled_up(self) -> bool:
        """Whether the pages show rollup buckets (a live Redis run at a rollup resolution)."""
        return self.source == "redis" and self.resolution_s > 0 and self.span_s >= self.resolution_s


def env_redis_url() -> str:
    return os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)


def redis_client(url: str):
    """One client per URL for the whole server (a bounded cache), failing fast: REDIS_TIMEOUT_S per operation,
    one retry. ValueError (redacted) for a URL that is not one."""
    return shared_client(url, timeout_s=REDIS_TIMEOUT_S, retries=REDIS_RETRIES)


def shown_url(url: str) -> str:
    """The URL as a page may show it: redacted, never its password (core.redact turns a URL it cannot parse
    into a placeholder itself)."""
    return core.redact(url)


def safe_text(text: str, url: str) -> str:
    """text with url shown redacted and its secrets (password, a lone user info, ?password=) replaced by '***',
    wherever they appear (core.redaction.scrub)."""
    return scrub(text, url)


def _run_listing(url: str) -> tuple[RunListing, str]:
    """The runs of moe:runs at url (dashboard.sources.redis.read_runs) and an error message ('' when Redis
    answered), remembered in the session for skipped_runs(). Messages never hold the password."""
    listing, error = RunListing([], 0), ""
    try:
        client = redis_client(url)
    except ValueError as exc:  # core.redisurl's words, already redacted: scheme, port, options, database
        error = safe_text(str(exc), url)
    else:
        try:
            listing = read_runs(client)
        except core.REDIS_ERRORS as exc:
            error = safe_text(f"{type(exc).__name__}: {exc}", url)
    st.session_state["run_listing"] = (url, listing.skipped)
    return listing, error


def runs_at(url: str) -> tuple[list[tuple[str, float]], str]:
    """(runs newest first, error message '' when Redis answered). Messages never hold the password. Entries of
    moe:runs that are not valid runs are left out; skipped_runs(url) says how many."""
    listing, error = _run_listing(url)
    return listing.runs, error


def skipped_runs(url: str) -> int:
    """Entries of moe:runs that runs_at(url) left out (invalid or non-UTF-8 name, non-finite time), as of
    this session's latest listing of url (listing it now when there is none)."""
    held = st.session_state.get("run_listing")
    if held is not None and held[0] == url:
        return int(held[1])
    return _run_listing(url)[0].skipped


SAMPLE_PREFIX = "samples/"  # a trace_path naming a shipped sample (traces/samples/); a picked name has no "/"


def samples_root() -> Path:
    """The shipped sample traces (traces/samples/ of this checkout)."""
    return Path(__file__).resolve().parents[2] / "traces" / "samples"


def trace_root() -> Path:
    """The folder the dashboard may replay trace files from: MOE_TRACE_DIR, else ./recordings (resolved). The
    trace field and uploads only ever name files inside it: watched_run_for() takes a relative name inside it
    and refuses anything outside (dashboard.sources.trace.trace_file_in)."""
    return Path(os.environ.get("MOE_TRACE_DIR") or "recordings").resolve()


_OWN_UPLOADS = "own_uploads"  # session entry: upload file id -> the name it was saved under in the trace folder


def remember_upload(file_id: str, name: str) -> None:
    """This session uploaded the trace now named `name` (the uploader's file_id: saved once per file)."""
    st.session_state.setdefault(_OWN_UPLOADS, {})[file_id] = name


def upload_saved_as(file_id: str) -> str:
    """The name this session's upload file_id was saved under ('' when it was not)."""
    return st.session_state.get(_OWN_UPLOADS, {}).get(file_id, "")


def own_uploads() -> set[str]:
    """Names of the trace files this session uploaded (in the trace folder, unless expired since)."""
    return set(st.session_state.get(_OWN_UPLOADS, {}).values())


def keep_settings(cfg: Settings) -> None:
    """The sidebar's choices for this rerun, read by every page through settings()."""
    st.session_state["settings"] = cfg


def settings() -> Settings:
    """This session's settings (the sidebar's last choices; REDIS_URL defaults before the first run)."""
    return st.session_state.get("settings") or Settings(redis_url=env_redis_url())


def watched_layers() -> int:
    """MoE layers of the run this session watches; 0 before its first step."""
    held = st.session_state.get("watched_run")
    window = held[1].window if held else None
    return window.num_layers if window is not None else 0


def watched_run_for(cfg: Settings) -> WatchedRun | None:
    """The session's WatchedRun for these settings (a new one when source, run or window size changed);
    None when there is nothing to watch yet (no run chosen, no trace path). A trace path is a name inside
    trace_root() (or a path under it); anything else gives a source that reports, with one message that
    does not say whether the path exists, that only files in the trace folder are read."""
    key = cfg.monitor_key()
    held = st.session_state.get("watched_run")
    if held is not None and held[0] == key:
        return held[1]
    if cfg.source == "redis":
        if not cfg.run:
            return None
        seeded = SEEDS.take(key)  # another session's copy of this run, polling on from where it stands
        if seeded is not None:
            st.session_state["watched_run"] = (key, seeded)
            return seeded
        source = RedisSource(redis_client(cfg.redis_url), cfg.redis_url, cfg.run, cfg.window_steps)
    else:
        if not cfg.trace_path:
            return None
        if cfg.trace_path.startswith(SAMPLE_PREFIX):
            source = TraceSource(cfg.trace_path[len(SAMPLE_PREFIX):], root=samples_root())
        else:
            source = TraceSource(cfg.trace_path, root=trace_root())
    watched = WatchedRun(source, cfg.window_steps)
    st.session_state["watched_run"] = (key, watched)
    return watched


def rollup_resolutions(url: str, run: str | None) -> tuple[int, ...]:
    """The rollup resolutions (seconds) the run has in the Redis at url; () when none, or Redis did not answer."""
    if not run:
        return ()
    try:
        return available_resolutions(redis_client(url), run)
    except (ValueError, *core.REDIS_ERRORS):
        return ()


def rollup_run_for(cfg: Settings, live: WatchedRun) -> RollupRun | None:
    """The session's RollupRun for these settings, riding on `live` (a new one when the run, the live run, the
    resolution or the span changed); None at full resolution."""
    if not cfg.rolled_up or cfg.run is None:
        return None
    key = (cfg.monitor_key(), cfg.resolution_s, cfg.span_s, id(live))
    held = st.session_state.get("rollup_run")
    if held is not None and held[0] == key:
        return held[1]
    source = RollupSource(redis_client(cfg.redis_url), cfg.run, cfg.resolution_s, cfg.span_s)
    rolled = RollupRun(live, source)
    st.session_state["rollup_run"] = (key, rolled)
    return rolled
