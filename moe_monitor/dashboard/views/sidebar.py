"""The sidebar: source (live Redis or trace file), run, phase filter, window size, resolution (full, or the
aggregator's 1 s / 60 s rollups), layer choice and the layout override / upload. Returns a Settings and keeps
it in the session (dashboard.views.session owns the state); pages read it with session.settings(). A new
session's first run draws no widget (their values are taken undrawn); its next run, a second later, draws them.

Nothing secret reaches the browser: the Redis URL field shows REDIS_URL redacted (core.redact). Trace files are
picked from the trace folder (session.trace_root()), never typed; an upload is checked in a child process under
an address-space limit (the server looks at FIRST_LINE_LOOK_BYTES of a JSON-lines upload's first line, no more)
and saved there under a generated name (dashboard.views.uploads: one check at a time, per-session quota,
expiry). The picker offers the folder's recordings and this session's own uploads. Docs: docs/dashboard.md,
docs/traces.md ("Uploads").
"""
from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from moe_monitor.core.layouts import parse_engine_layout_json
from moe_monitor.core.tracefile import sandbox
from moe_monitor.dashboard.views.common import whole_app_next_tick
from moe_monitor.dashboard.views.session import (
    SAMPLE_PREFIX,
    Settings,
    env_redis_url,
    keep_settings,
    own_uploads,
    remember_upload,
    rollup_resolutions,
    runs_at,
    samples_root,
    shown_url,
    trace_root,
    upload_saved_as,
    watched_layers,
)
from moe_monitor.dashboard.views.uploads import is_upload, save_upload, upload_container
from moe_monitor.dashboard.views.uploads import upload_name as upload_name

PER_LAYER = "per layer (busiest layer of each GPU)"
ALL_LAYERS = "all layers (sum)"
TRACE_SUFFIXES = (".jsonl", ".trace", ".json", ".parquet", ".arrows")  # what the upload takes
UPLOAD_CAP_MIB = 256          # largest trace upload (st.file_uploader's max_upload_size; server.maxUploadSize too)
MAX_LISTED = 500              # newest trace files offered in the picker
FIRST_LINE_LOOK_BYTES = 64 << 10  # of an upload's first line, looked at in the server (the child reads the rest)
SIDECAR_SUFFIXES = (".side.jsonl", ".gpu.parquet", ".timings.parquet")  # parts of an .arrows / .parquet trace, not traces
NO_SAMPLE = "(none)"


def sidebar() -> Settings:
    """The settings, kept in the session. A new session's first run draws the header only and takes the widgets'
    values without drawing them, so that the page's first chart draws sooner; a tick later the app runs whole."""
    st.sidebar.header("MoE load monitor")
    if st.session_state.get(_SHOWN):
        cfg = _settings(st.sidebar)
    else:
        st.session_state[_SHOWN] = True
        cfg = _settings(_Unshown())
        with st.sidebar:
            whole_app_next_tick()
    keep_settings(cfg)
    return cfg


_SHOWN = "_sidebar_shown"  # session state: this session has drawn the sidebar's widgets


def _settings(sb) -> Settings:
    """The widgets in sb (the sidebar, or _Unshown: their values undrawn) and the Settings they choose."""
    source = sb.radio("Source", ("Live Redis", "Trace file"), horizontal=True, key="source_kind")
    redis_url, run, trace_path = env_redis_url(), None, ""
    if source == "Live Redis":
        redis_url = _redis_url_field(sb)
        runs, error = runs_at(redis_url)
        if error:
            sb.caption("Redis not reachable (see the page).")
        elif runs:
            names = [name for name, _ in runs]
            run = sb.selectbox("Run", names, key="run", help="Runs newest first (last write time)")
        else:
            sb.caption("No run in this Redis yet.")
    else:
        trace_path = _trace_controls(sb)
    phase = sb.radio("Phase", ("auto", "decode", "prefill", "train", "both"), horizontal=True, key="phase",
                     help="auto: the phase the window spends most of its time in (prefill and decode want "
                          "different layouts); both: every step; train: training iterations (Megatron-Core, "
                          "torchtitan)")
    window_steps = int(sb.number_input("Window (steps)", min_value=10, max_value=5000, value=sandbox.VIEW_STEPS, step=50,
                                       key="window_steps"))
    resolution_s, span_s = _resolution_controls(sb, redis_url, run) if source == "Live Redis" else (0, 0)
    layer_names = [PER_LAYER, ALL_LAYERS] + [f"layer {i}" for i in range(watched_layers())]
    layer_choice = sb.selectbox("GPU load of", layer_names, key="layer_choice",
                                help="A layer finishes when its own busiest GPU finishes: the per-layer view "
                                     "takes each GPU's busiest layer per step and names the straggler per "
                                     "(step, layer). The sum over layers lets hot GPUs of different layers cancel.")
    layer = None if layer_choice in (None, PER_LAYER, ALL_LAYERS) else int(layer_choice.split()[1])
    gpus, per_node, uploaded = _layout_controls(sb)
    return Settings(source="redis" if source == "Live Redis" else "trace", redis_url=redis_url, run=run,
                    trace_path=trace_path, phase=phase, window_steps=window_steps, layer=layer,
                    summed=layer_choice == ALL_LAYERS, gpus=gpus,
                    gpus_per_node=per_node, uploaded_layout=uploaded, resolution_s=resolution_s, span_s=span_s)


class _Unshown:
    """The sidebar's widgets, undrawn: each returns what its widget would (the value kept under its key, else
    its default); the rest draws nothing."""

    def radio(self, label, options, index=0, key=None, **_):
        kept = st.session_state.get(key)
        return kept if kept in options else options[index]

    selectbox = radio

    def number_input(self, label, value=None, key=None, **_):
        return st.session_state.get(key, value)

    def text_input(self, label, value="", key=None, **_):
        return st.session_state.get(key, value)

    def file_uploader(self, *_, **__):
        return None

    def container(self, *_, **__):
        return self

    expander = container

    def header(self, *_, **__):
        return None

    caption = error = header


FULL = "steps (full resolution)"
RESOLUTIONS = {FULL: 0, "1-second rollups": 1, "1-minute rollups": 60}
SPAN_MINUTES = (1, 30, 10)  # 1-second rollups: min, max, default minutes (one row per second)
SPAN_HOURS = (1, 24, 6)     # 1-minute rollups: min, max, default hours (one row per minute)


def _resolution_controls(sb, redis_url: str, run: str | None) -> tuple[int, int]:
    """(rollup resolution in s, span in s): (0, 0) at full resolution. Offered only when the run has rollups (the
    aggregator writes them); the span is minutes of 1-second buckets or hours of 1-minute buckets."""
    have = rollup_resolutions(redis_url, run)
    if not have:
        return 0, 0
    names = [FULL, *(name for name, res in RESOLUTIONS.items() if res in have)]
    if st.session_state.get("resolution") not in (None, *names):
        del st.session_state["resolution"]  # that resolution is gone (another run)
    choice = sb.radio("Resolution", names, key="resolution",
                      help="Full resolution: every step of the window. Rollups (written by the aggregator): "
                           "hours of history, one row per second or minute, each the sum of its steps, with "
                           "the per-step statistics the sum hides beside it.")
    resolution_s = RESOLUTIONS.get(choice or FULL, 0)
    if resolution_s == 1:
        low, high, default = SPAN_MINUTES
        return 1, 60 * int(sb.number_input("Rollup window (minutes)", min_value=low, max_value=high,
                                           value=default, step=1, key="span_minutes"))
    if resolution_s == 60:
        low, high, default = SPAN_HOURS
        return 60, 3600 * int(sb.number_input("Rollup window (hours)", min_value=low, max_value=high,
                                              value=default, step=1, key="span_hours"))
    return 0, 0


def _redis_url_field(sb) -> str:
    """The Redis URL to read. The field starts with REDIS_URL redacted (the widget's value travels to the browser,
    so it must hold no password); while it still holds that text the environment's own URL is used."""
    env_url = env_redis_url()
    shown = shown_url(env_url)
    typed = sb.text_input("Redis URL", value=shown, key="redis_url", type="password",
                          help="Default: the REDIS_URL environment variable, shown with its password as *** (the "
                               "dashboard still uses the real one). Type another URL to read another Redis.")
    typed = (typed or "").strip()
    return env_url if typed == shown else typed


def trace_files(root: Path) -> list[str]:
    """Names of the files in root, newest first (modification time; then by name): regular files only (no
    symlinks, folders or devices), hidden files and the sidecars of columnar traces (SIDECAR_SUFFIXES) left
    out, at most MAX_LISTED. JSON lines, .arrows and .parquet traces alike. Whatever their name: a file that
    is not a trace is reported by the replay itself."""
    found: list[tuple[float, str]] = []
    try:
        entries = list(os.scandir(root))
    except OSError:  # no such folder (yet), or not readable
        return []
    for entry in entries:
        if entry.name.startswith(".") or entry.name.endswith(SIDECAR_SUFFIXES):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                found.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
        except OSError:  # removed while listing
            continue
    found.sort(key=lambda item: (-item[0], item[1]))
    return [name for _, name in found[:MAX_LISTED]]


def first_line_error(data: bytes) -> str:
    """'' when data starts like a trace (its first non-blank line a JSON object with a trace kind), else why
    not. Only the first FIRST_LINE_LOOK_BYTES of that line are looked at (this runs in the server): a longer
    line is left to the check in the child process, which reads up to a whole trace line."""
    return sandbox.first_line_error(data, FIRST_LINE_LOOK_BYTES) or ""


def _trace_controls(sb) -> str:
    """The trace picker (files of the trace folder, newest first) and the upload; returns the chosen name
    (relative to trace_root()) or '' when the folder holds none."""
    root = trace_root()
    picker = sb.container()
    _trace_upload(sb, root)  # before the picker is built: a fresh upload becomes its value
    mine = own_uploads()
    names = [name for name in trace_files(root) if not is_upload(name) or name in mine]
    if st.session_state.get("trace_path") not in (None, *names):
        del st.session_state["trace_path"]  # its file is gone: fall back to the newest
    name = None
    if names:
        name = picker.selectbox("Trace file", names, key="trace_path",
                                help="Recordings in the trace folder and your own uploads, newest first.")
    picker.caption(("" if names else "No trace file here yet. ")
                   + f"Trace folder: `{root}` (set MOE_TRACE_DIR before starting the dashboard to use another; "
                     "record with `collectors.record_trace(...)`, `trace_path=` at attach or `moe-monitor record`, "
                     "or upload below).")
    samples = sorted(n for n in trace_files(samples_root()) if n.endswith(".parquet"))
    sample = picker.selectbox("Or a shipped sample", [NO_SAMPLE, *samples], key="trace_sample",
                              help="Sample traces shipped in traces/samples/ (the demo, real DeepSeek-V3 counts).")
    if sample and sample != NO_SAMPLE:
        return SAMPLE_PREFIX + sample
    return name or ""


def _trace_upload(sb, root: Path) -> None:
    upload = sb.file_uploader(f"Upload a trace (.jsonl, .parquet or .arrows, up to {UPLOAD_CAP_MIB} MiB)",
                              type=[s.lstrip(".") for s in TRACE_SUFFIXES], key="trace_upload",
                              max_upload_size=UPLOAD_CAP_MIB,
                              help="Saved into the trace folder under a new name, then selected.")
    if upload is None:
        return
    kept_as = upload_saved_as(upload.file_id)
    if kept_as:
        sb.caption(f"Uploaded as `{kept_as}`.")
        return
    if upload.size > UPLOAD_CAP_MIB * 2 ** 20:
        sb.error(f"The upload is {upload.size / 2 ** 20:.1f} MiB, above the {UPLOAD_CAP_MIB} MiB cap; copy large "
                 "traces into the trace folder instead.")
        return
    data = upload.getvalue()
    why = first_line_error(data) if upload_container(data) == "jsonl" else ""
    if why:
        sb.error(f"Not saved: the upload is not a trace ({why}). A trace is JSON lines, as "
                 "`collectors.record_trace(...)` or `trace_path=` write them, or a .parquet / .arrows trace.")
        return
    try:
        name = save_upload(root, upload.name, data, own=own_uploads())
    except ValueError as exc:   # it does not open as a trace, or opening it takes more than the check allows
        why = str(exc).removeprefix("the upload: ")
        sb.error(f"Not saved: the upload was refused ({why[:400]}).")
        return
    except OSError as exc:
        sb.error(f"Could not save the upload into the trace folder: {exc.strerror or type(exc).__name__}.")
        return
    remember_upload(upload.file_id, name)
    st.session_state["trace_path"] = name
    sb.caption(f"Uploaded as `{name}` and selected.")


def _layout_controls(sb) -> tuple[int | None, int | None, tuple[tuple[int, ...], ...] | None]:
    box = sb.expander("Layout and topology")
    box.caption("Default: the run's metadata (else contiguous, E/G experts per GPU). 0 = from the run.")
    gpus = int(box.number_input("GPUs", min_value=0, max_value=4096, value=0, step=1, key="gpus_override"))
    per_node = int(box.number_input("GPUs per node", min_value=0, max_value=4096, value=0, step=1,
                                    key="gpus_per_node_override"))
    upload = box.file_uploader('Layout JSON ({"physical_to_logical_map": [[...]]})', type=["json"],
                               key="layout_upload", help="SGLang's or vLLM's map ([layers][slots], -1 for an "
                               "unused slot), or a list per GPU ([layers][GPUs][slots of the GPU])")
    uploaded = None
    if upload is not None:
        try:
            uploaded, listed_gpus, note = read_uploaded_layout(upload.getvalue(), gpus or None)
            gpus = gpus or listed_gpus or 0
            box.caption(f"Using {upload.name}: {note}.")
        except ValueError as exc:
            box.error(str(exc))
    return gpus or None, per_node or None, uploaded


def read_uploaded_layout(data: bytes, gpus: int | None = None
                         ) -> tuple[tuple[tuple[int, ...], ...], int | None, str]:
    """An uploaded layout JSON (core.layouts.parse_engine_layout_json: SGLang's map, vLLM's with -1 for an unused
    slot, or a list per GPU) -> (rows [L][P] with -1 padding, the GPUs a per-GPU list names or None, a note on
    its shape). ValueError when it does not parse, or names other GPUs than `gpus` (the sidebar's, when set)."""
    layout_LP, listed_gpus = parse_engine_layout_json(data)
    if gpus is not None and listed_gpus is not None and gpus != listed_gpus:
        raise ValueError(f"the layout lists {listed_gpus} GPUs, the sidebar says {gpus}")
    rows = tuple(tuple(int(v) for v in row) for row in layout_LP.tolist())
    unused = int((layout_LP < 0).sum())
    note = f"{layout_LP.shape[0]} layers x {layout_LP.shape[1]} slots"
    if listed_gpus is not None:
        note += f" on {listed_gpus} GPUs"
    if unused:
        note += f", {unused} unused (-1)"
    return rows, listed_gpus, note
