"""The command line that serves the dashboard: `streamlit run` of the app inside this package, with the settings
the house needs passed as flags (so an installed wheel serves it the same from any folder, with no
.streamlit/config.toml beside it): loopback only, headless, no usage statistics, uploads up to 256 MiB,
exception types only for viewers (messages and tracebacks go to the server's console), no forced garbage
collection after each run."""
from __future__ import annotations

import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"
LOOPBACK = "127.0.0.1"
MAX_UPLOAD_MIB = 256  # the sidebar's trace upload (st.file_uploader); the server caps every upload

SETTINGS = {
    "server.headless": "true",
    "server.runOnSave": "false",
    "server.maxUploadSize": str(MAX_UPLOAD_MIB),
    "browser.gatherUsageStats": "false",
    "client.showSidebarNavigation": "true",
    "client.toolbarMode": "minimal",
    "client.showErrorDetails": "type",
    "runner.postScriptGC": "false",  # no forced full collection after every run (.streamlit/config.toml says why)
}


def streamlit_command(port: int, address: str = LOOPBACK, extra: dict[str, str] | None = None) -> list[str]:
    """argv of a `python -m streamlit run` serving the app on address:port (the browser is told the same address)."""
    settings = {**SETTINGS, "server.port": str(port), "server.address": address}
    if address not in ("", "0.0.0.0", "::"):  # the address the browser is sent to (all interfaces: streamlit's own)
        settings["browser.serverAddress"] = address
    settings.update(extra or {})
    return [sys.executable, "-m", "streamlit", "run", str(APP), *(f"--{key}={value}" for key, value in settings.items())]
