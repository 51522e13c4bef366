"""A run's streams that take no more entries, as one writer found them (core.runwrite.exhausted_stream): each is
said once when found and once when it takes entries again, and the health the writer sends says it meanwhile.

A stream that holds the last possible id refuses every XADD until someone deletes it. The writer keeps
retrying (its records wait in the publisher's bounded queue, the model never waits on it), so without this the
refusal would repeat silently every backoff; with it, the log has one line, the health's last_error names the
stream and what to do, and published_steps does not count the steps that cannot land.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from moe_monitor.core.health import HealthReport
from moe_monitor.core.runwrite import exhausted_message, exhausted_stream


class ExhaustedStreams:
    """The exhausted streams one writer knows of (key -> the message said). log: where the line saying one is
    found goes; log_back: the line saying it takes entries again (log when not given)."""

    def __init__(self, log: Callable[[str], None], log_back: Callable[[str], None] | None = None):
        self._log, self._log_back = log, log_back or log
        self.found: dict[str, str] = {}

    @property
    def message(self) -> str:
        """The standing error ("" when every stream takes entries)."""
        return "; ".join(self.found.values())

    def update(self, streams: Sequence[str], replies: Sequence[object]) -> None:
        """Take in the replies of a batch's XADDs (streams[i] is the key of replies[i]): a stream refused for
        its last id is noted and said once; a noted one that took an entry is said to take entries again."""
        landed = {key for key, reply in zip(streams, replies) if not isinstance(reply, BaseException)}
        full = {key for key, reply in zip(streams, replies) if exhausted_stream(reply)}
        for key in sorted(full - self.found.keys()):
            self.found[key] = exhausted_message(key)
            self._log(self.found[key])
        for key in sorted(landed & self.found.keys()):
            del self.found[key]
            self._log_back(f"stream {key} takes entries again")

    def amend(self, health: HealthReport, steps_key: str, steps_sent: int) -> HealthReport:
        """health as it should read while streams are exhausted: their message in last_error, and the steps of
        this batch not counted as published (still queued) when the steps stream is one of them."""
        if not self.found:
            return health
        error = "; ".join(text for text in (health.last_error, self.message) if text)
        if steps_key not in self.found:
            return dataclasses.replace(health, last_error=error)
        return dataclasses.replace(health, last_error=error, queued=health.queued + steps_sent,
                                   published_steps=max(0, health.published_steps - steps_sent))
