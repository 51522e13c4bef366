"""`moe-monitor demo --engine ep` turns Apply on for its own run only: one fresh secret, in a private file read by
both the EP runtime and the dashboard, never on a command line."""
import argparse
import os
import stat
from pathlib import Path

from moe_monitor.core.apply_secret import SECRET_FILE_ENV, load_secret
from moe_monitor.dashboard.sources.apply_gate import RUNS_ENV
from moe_monitor.demo.embedded import apply_setting, engine_command


def test_the_ep_demo_shares_a_private_secret_file_with_its_dashboard():
    path, env = apply_setting("demo-ep")
    assert env == {RUNS_ENV: "demo-ep", SECRET_FILE_ENV: path}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(load_secret(path)) >= 32
    args = argparse.Namespace(engine="ep", ranks=4, run="demo-ep", seconds=0)
    cmd = engine_command(args, "redis://127.0.0.1:1/0", path)
    assert cmd[cmd.index("--apply-secret-file") + 1] == path
    secret = Path(path).read_text().strip()
    assert not any(secret in part for part in cmd)  # the secret itself is not in argv
    other, _ = apply_setting("demo-ep")
    assert load_secret(other) != load_secret(path)  # a fresh secret each demo
