"""record_trace(): dump what a run's Redis streams hold now into a JSON-lines trace file (core.trace_line),
for a run collected elsewhere. A monitor records its own trace while it runs with trace_path= (sinks.py)."""
from __future__ import annotations

import os
from typing import cast

from moe_monitor import core

_Entries = list[tuple[bytes, dict[bytes, bytes]]]  # XRANGE's reply from a client that does not decode
_RAW_FIELDS = (b"counts", b"sample", b"map", *(name.encode() for name in core.TIMING_PHASES))  # binary fields (base64)


def record_trace(redis_url: str, run: str, path: str | os.PathLike[str], batch: int = 500) -> int:
    """Copy run's metadata, layout changes, step stream and GPU stream from Redis into a trace file (layouts
    first: a replay knows them before the steps they apply to). Returns steps written."""
    client = core.connect(redis_url, timeout_s=5.0)
    try:
        return _copy_run(client, run, path, batch)
    finally:
        client.close()


def _copy_run(client: core.Client, run: str, path: str | os.PathLike[str], batch: int) -> int:
    meta_json = cast("bytes | None", client.get(core.meta_key(run)))
    if meta_json is None:
        raise ValueError(f"run {run!r} has no metadata in Redis")
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write(core.trace_line("meta", {"meta": meta_json.decode()}) + "\n")
        for key, kind in ((core.layouts_key(run), "layout"), (core.steps_key(run), "step"), (core.gpu_key(run), "gpu"),
                          (core.timings_key(run), "timing")):
            last = "-"
            while True:
                entries = cast(_Entries, client.xrange(key, min=last, max="+", count=batch))
                if not entries:
                    break
                for _, fields in entries:
                    clean = {k.decode(): (v if k in _RAW_FIELDS else v.decode()) for k, v in fields.items()}
                    out.write(core.trace_line(kind, clean) + "\n")
                    written += kind == "step"
                last = "(" + entries[-1][0].decode()  # exclusive: after the last entry written
    return written
