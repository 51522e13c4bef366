"""What a run published into a test's own redis-server: its step records, oldest first."""
from __future__ import annotations

from moe_monitor import core


def published_steps(redis_url: str, run: str) -> list[core.StepRecord]:
    """Every record of moe:{run}:steps, decoded (a fresh connection, closed afterwards)."""
    client = core.connect(redis_url)
    try:
        return [core.decode_step(fields) for _, fields in client.xrange(core.steps_key(run))]
    finally:
        client.close()
