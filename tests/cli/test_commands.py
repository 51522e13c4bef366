"""Every `moe-monitor` subcommand in this process (tests/support/cli.py): its --help, the error convention of the
long-running ones (one `error: ...` line, exit status 2, before anything starts), and `apply` end to end against
the tests' own redis-server, also as the real `python -m moe_monitor apply`."""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.cli import build_parser
from moe_monitor.core.layout_requests import decode_layout_request, judge_request
from tests.support import synthfill
from tests.support.cli import BOTH, in_process

SUBCOMMANDS = next(a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
SECRET = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_says_its_help(name):
    done = in_process(name, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: moe-monitor {name}"), done.stderr


@pytest.mark.parametrize("args, words", [
    (["dashboard", "--memory-budget", "lots"], "--memory-budget 'lots'"),
    (["demo", "--engine", "nope"], "invalid choice: 'nope'"),
    (["export", "--memory-budget", "lots", "--port", "1"], "--memory-budget 'lots'"),
    (["aggregate", "--redis", "http://nowhere", "--run", "x"], "must start with redis://"),
    (["sglang", "--redis", "http://x", "--run", "r", "--dump-dir", "nowhere"], "must start with redis://"),
    (["routed", "--server", "http://127.0.0.1:9", "--redis", "redis://127.0.0.1:1/0", "--run", "r"],
     "--num-experts"),
    (["apply", "--redis", "redis://127.0.0.1:1/0", "--run", "r", "--layout", "nowhere.json"], "no apply secret"),
])
def test_a_service_refuses_bad_flags_with_one_line_before_it_starts(monkeypatch, args, words):
    monkeypatch.delenv("MOE_APPLY_SECRET", raising=False)
    monkeypatch.delenv("MOE_APPLY_SECRET_FILE", raising=False)
    done = in_process(*args)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: ") and words in done.stderr, done.stderr


@pytest.mark.parametrize("cli", BOTH)
def test_apply_sends_a_signed_request_at_the_runs_next_step(redis_server, redis_url, tmp_path, cli):
    client = redis_server.client()
    synthfill.fill(client, "live", steps=12, num_layers=2, num_experts=8, gpus=2)
    layout_LP = np.tile(np.r_[np.arange(8), [0, 1]], (2, 1))  # 2 layers, 10 slots: experts 0 and 1 twice
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"physical_to_logical_map": layout_LP.tolist()}))
    secret = tmp_path / "apply.key"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    done = cli("apply", "--redis", redis_url, "--run", "live", "--layout", layout, "--secret-file", secret)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("apply: layout [2 x 10] requested for run 'live' at step 12"), done.stdout
    (_, fields), = client.xrange(core.layout_requests_key("live"))
    request = decode_layout_request(fields)
    assert (request.record.step, request.record.num_layers, request.record.num_slots) == (12, 2, 10)
    assert judge_request(request, "live", SECRET.encode(), time.time()).ok
    assert not client.exists(core.layouts_key("live"))  # a request, not a change
