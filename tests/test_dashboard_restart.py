"""Collector restarts under the same run name and gaps in the stream, against a real redis-server."""
import time

import numpy as np

import redisconn
import wire
from dashboard.monitor import Monitor
from dashboard.redis_source import RedisSource
from tests import synthfill

P2L = [list(range(16))] * 4


def test_restart_under_the_same_run_name_starts_a_new_window(redis_url):
    client = redisconn.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    synthfill.fill(client, "rs", steps=30, instance="old", time0_s=t0)
    monitor = Monitor(RedisSource(client, redis_url, "rs", window_steps=50), window_steps=50)
    monitor.tick()
    assert monitor.window.size == 30 and monitor.restart_note == ""
    new = synthfill.fill(client, "rs", steps=5, instance="new", time0_s=t0 + 30)  # step ids restart at 0
    monitor.tick()
    assert monitor.bad_records == 0, monitor.last_error
    view = monitor.window.view("both", P2L, 4)
    assert list(view.step_T) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(view.counts_sum_LE, sum(new))
    assert "collector restarted at" in monitor.restart_note and monitor.restarts == 1
    # a late record of the old collector is skipped, not counted as bad
    synthfill.fill(client, "rs", steps=1, instance="old", first_step=30, time0_s=t0 + 3, meta=False)
    synthfill.fill(client, "rs", steps=1, instance="new", first_step=5, time0_s=t0 + 31, meta=False)
    monitor.tick()
    assert monitor.bad_records == 0 and monitor.skipped_old_records == 1
    assert list(monitor.window.view("both", P2L, 4).step_T) == [0, 1, 2, 3, 4, 5]


def test_restart_is_shown_on_the_page(redis_url, monkeypatch):
    from tests.test_dashboard_states import run_app

    client = redisconn.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    synthfill.fill(client, "rp", steps=30, instance="old", time0_s=t0)
    synthfill.fill(client, "rp", steps=6, instance="new", time0_s=t0 + 30, meta=False)
    at = run_app(redis_url, monkeypatch)
    assert any("collector restarted at" in c.value and "6 steps in window" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    assert not any("bad record" in w.value for w in at.warning)
