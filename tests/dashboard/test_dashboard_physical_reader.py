"""The dashboard's reader of moe:{R}:physical (sources.physical, live.physical) against a real redis-server:
steps summed over their ranks, a malformed entry, a repeat or another shape is one bad record and loses nothing
else, the ring keeps the newest steps, a stream emptied under the reader is read again from its start."""
from __future__ import annotations

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.live.physical import MeasuredFeed, MeasuredRing


def _rec(step: int, rank: int, counts, gpus: int = 2) -> core.PhysicalRecord:
    return core.PhysicalRecord(run="rd", step=step, rank=rank, time_s=1.7e9, counts_LP=np.asarray(counts),
                               gpus=gpus, instance="i", source="sglang")


def _add(client, rec) -> None:
    client.xadd(core.physical_key("rd"), core.encode_physical(rec))


def test_reader_sums_ranks_and_skips_bad_entries(redis_server):
    client = redis_server.client()
    client.flushdb()
    _add(client, _rec(0, 0, [[1, 2, 3, 4]]))
    _add(client, _rec(0, 1, [[1, 0, 0, 1]]))
    client.xadd(core.physical_key("rd"), {"v": "1", "counts": b"\x00"})       # malformed
    feed = MeasuredFeed(client, "rd", capacity=2)
    feed.poll(world=2)
    view = feed.ring.aligned([0, 1])
    np.testing.assert_array_equal(view.loads_TLG, [[[4, 8]], [[0, 0]]])
    np.testing.assert_array_equal(view.ranks_T, [2, 0])
    assert feed.bad_records == 1 and "physical entry" in feed.last_error and feed.any()
    _add(client, _rec(0, 1, [[1, 0, 0, 1]]))                                   # a repeat
    _add(client, _rec(1, 0, [[1, 1, 1, 1, 1, 1]], gpus=3))                     # another GPU count
    _add(client, _rec(1, 0, [[0, 0, 5, 5]]))
    _add(client, _rec(2, 0, [[7, 0, 0, 0]]))
    feed.poll(world=2)
    assert feed.bad_records == 3 and "on 3 GPUs" in feed.last_error
    view = feed.ring.aligned([0, 1, 2])                                        # capacity 2: step 0 dropped
    np.testing.assert_array_equal(view.ranks_T, [0, 1, 1])
    np.testing.assert_array_equal(view.loads_TLG[1:], [[[0, 10]], [[7, 0]]])
    client.delete(core.physical_key("rd"))                                     # emptied, written again
    # with an id below the last one read: an id from the clock could repeat the last one read within the same
    # millisecond, and then the stream cannot be told from the one read (seen once under a busy make test)
    client.xadd(core.physical_key("rd"), core.encode_physical(_rec(3, 0, [[0, 1, 0, 0]])), id="1-0")
    feed.poll(world=2)
    np.testing.assert_array_equal(feed.ring.aligned([3]).loads_TLG, [[[1, 0]]])
    assert feed.error == ""


def test_an_unreachable_redis_is_an_error_not_a_crash():
    import redis

    feed = MeasuredFeed(redis.Redis(port=1, socket_connect_timeout=0.2), "rd", capacity=4)
    feed.poll()
    assert feed.error and not feed.any()


def test_ring_refusals_change_nothing():
    ring = MeasuredRing(4)
    ring.add(_rec(5, 0, [[1, 1, 1, 1]]))
    for bad in (_rec(5, 0, [[1, 1, 1, 1]]), _rec(6, 0, [[1, 1], [1, 1]], gpus=2)):
        try:
            ring.add(bad)
        except ValueError:
            pass
        else:
            raise AssertionError("refused record taken")
    assert len(ring) == 1 and ring.records == 1
    np.testing.assert_array_equal(ring.aligned([5]).loads_TLG, [[[2, 2]]])
