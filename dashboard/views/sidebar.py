"""The sidebar: source (live Redis or trace file), run, phase filter, window size, layer choice and the
layout override / upload. Returns a Settings and keeps it in the session (dashboard.views.session owns the
session state); pages read it with session.settings()."""
from __future__ import annotations

import streamlit as st

import wire
from dashboard.views.session import Settings, env_redis_url, keep_settings, runs_at, watched_layers

PER_LAYER = "per layer (busiest layer of each GPU)"
ALL_LAYERS = "all layers (sum)"


def sidebar() -> Settings:
    sb = st.sidebar
    sb.header("MoE load monitor")
    source = sb.radio("Source", ("Live Redis", "Trace file"), horizontal=True, key="source_kind")
    redis_url, run, trace_path = env_redis_url(), None, ""
    if source == "Live Redis":
        redis_url = sb.text_input("Redis URL", value=env_redis_url(), key="redis_url", type="password",
                                  help="Default from the REDIS_URL environment variable; hidden because it may "
                                       "hold a password (messages show it redacted)").strip()
        runs, error = runs_at(redis_url)
        if error:
            sb.caption("Redis not reachable (see the page).")
        elif runs:
            names = [name for name, _ in runs]
            run = sb.selectbox("Run", names, key="run", help="Runs newest first (last write time)")
        else:
            sb.caption("No run in this Redis yet.")
    else:
        trace_path = sb.text_input("Trace file (JSON lines)", key="trace_path").strip()
    phase = sb.radio("Phase", ("both", "prefill", "decode"), horizontal=True, key="phase")
    window_steps = int(sb.number_input("Window (steps)", min_value=10, max_value=5000, value=600, step=50,
                                       key="window_steps"))
    layer_names = [PER_LAYER, ALL_LAYERS] + [f"layer {i}" for i in range(watched_layers())]
    layer_choice = sb.selectbox("GPU load of", layer_names, key="layer_choice",
                                help="A layer finishes when its own busiest GPU finishes: the per-layer view "
                                     "takes each GPU's busiest layer per step and names the straggler per "
                                     "(step, layer). The sum over layers lets hot GPUs of different layers cancel.")
    layer = None if layer_choice in (None, PER_LAYER, ALL_LAYERS) else int(layer_choice.split()[1])
    gpus, per_node, uploaded = _layout_controls(sb)
    cfg = Settings(source="redis" if source == "Live Redis" else "trace", redis_url=redis_url, run=run,
                   trace_path=trace_path, phase=phase, window_steps=window_steps, layer=layer,
                   summed=layer_choice == ALL_LAYERS, gpus=gpus,
                   gpus_per_node=per_node, uploaded_layout=uploaded)
    keep_settings(cfg)
    return cfg


def _layout_controls(sb) -> tuple[int | None, int | None, tuple[tuple[int, ...], ...] | None]:
    with sb.expander("Layout and topology"):
        st.caption("Default: the run's metadata (else contiguous, E/G experts per GPU). 0 = from the run.")
        gpus = int(st.number_input("GPUs", min_value=0, max_value=4096, value=0, step=1, key="gpus_override"))
        per_node = int(st.number_input("GPUs per node", min_value=0, max_value=4096, value=0, step=1,
                                       key="gpus_per_node_override"))
        upload = st.file_uploader('Layout JSON ({"physical_to_logical_map": [[...]]})', type=["json"],
                                  key="layout_upload")
        uploaded = None
        if upload is not None:
            try:
                uploaded = tuple(tuple(row) for row in wire.parse_layout_json(upload.getvalue()))
                st.caption(f"Using {upload.name}: {len(uploaded)} layers x {len(uploaded[0])} slots.")
            except ValueError as exc:
                st.error(str(exc))
    return gpus or None, per_node or None, uploaded
