"""serving() yields a server of its own: when another process takes the free port first and answers there, the
next try takes another port."""
from __future__ import annotations

import http.server
import itertools
import os
import sys
import threading
import urllib.request
from functools import partial

from moe_monitor.demo import localredis
from tests.support import browserkit
from tests.support.browserkit import PORT, serving


def test_a_port_answered_by_another_process_is_passed_over(tmp_path, monkeypatch):
    for whose in ("squatter", "child"):  # what each server serves: /_stcore/health, and /whose says whose it is
        (tmp_path / whose / "_stcore").mkdir(parents=True)
        (tmp_path / whose / "_stcore" / "health").write_text("ok")
        (tmp_path / whose / "whose").write_text(whose)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "squatter"))
    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    taken = squatter.server_address[1]
    real_free_port = localredis.free_port
    ports = itertools.chain([taken], iter(real_free_port, None))  # the first "free" port answers already
    monkeypatch.setattr(localredis, "free_port", lambda: next(ports))
    tries = []
    real_wait = browserkit.wait_own_http
    monkeypatch.setattr(browserkit, "wait_own_http", lambda *a: tries.append(a[1]) or real_wait(*a))
    try:
        args = ["-m", "http.server", PORT, "--bind", "127.0.0.1"]
        with serving(args, tmp_path / "server.log", dict(os.environ), ready_s=60, program=sys.executable,
                     cwd=tmp_path / "child") as url:
            assert tries[0] == taken and len(tries) == 2
            assert not url.endswith(f":{taken}")
            with urllib.request.urlopen(f"{url}/whose", timeout=10) as reply:
                assert reply.read() == b"child"
    finally:
        squatter.shutdown()
        squatter.server_close()
