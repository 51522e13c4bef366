"""The run's aggregator lease: a string at core.aggregator_key(run) holding the owner's consumer name with an
expiry (SET NX PX). Renewal and release compare the owner first, one small Lua script each (one run's keys).

RENEW's reply: KEPT (1) still ours, expiry pushed out; LOST (0) someone else holds it; RETAKEN (2) lease gone
and the progress hash gone or last written by us (Redis emptied, or our lease merely lapsed): taken again, our
memory still the truth; STALE (3) lease gone, hash last written by another aggregator: not taken, our memory is
stale (back to standby, take over afresh).
"""
from __future__ import annotations

from moe_monitor import core

RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder then
  return 0
end
local last = redis.call('HGET', KEYS[2], 'consumer')
if (not last) or last == '' or last == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 3
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

KEPT, LOST, RETAKEN, STALE = 1, 0, 2, 3


class Lease:
    """The lease of one run for one consumer. Every method sends one command (or script) and lets Redis
    errors through to the caller."""

    def __init__(self, client: core.Client, run: str, consumer: str, lease_s: float, state_key: str):
        self.client, self.consumer = client, consumer
        self.key, self.state_key = core.aggregator_key(run), state_key
        self.lease_ms = max(1, int(round(lease_s * 1000)))
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)

    def acquire(self) -> bool:
        """True when the lease was free and is now ours."""
        return bool(self.client.set(self.key, self.consumer, nx=True, px=self.lease_ms))

    def renew(self) -> int:
        """KEPT, LOST, RETAKEN or STALE (see the module docstring)."""
        return int(self._renew(keys=[self.key, self.state_key], args=[self.consumer, self.lease_ms]))

    def release(self) -> bool:
        """Give the lease up if it is still ours; True when it was."""
        return bool(self._release(keys=[self.key], args=[self.consumer]))

    def holder(self) -> tuple[str, int]:
        """(current holder or '', milliseconds until its lease expires or -2 when there is none)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.key)
        pipe.pttl(self.key)
        name, ttl_ms = pipe.execute()
        return (name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name or "")), int(ttl_ms)
