"""The collectors' health report: what each rank's publisher (or bridge) says of itself, once a second, in the
run's health hash (moe:{R}:health, field = rank, value = JSON). HealthReport is what the writers build; the
decoders are what every reader applies to what it finds there (a hash anyone can write to). No torch, no UI.

Fields: rank; dropped_steps (steps the collector dropped: its queue was full or Redis down), published_steps,
queued (steps waiting), last_error (text, "" when fine), sink_failures and last_failure (writes that failed, the
latest one's message), time_s (unix seconds of the report); a collector adds its own figures in `extra` (ints,
floats, bools, short text: hook_errors, invalid_ids, published_layouts, files_published, collector...).
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field

from . import keys
from .fields import parse_json

MAX_HEALTH_BYTES = 64 << 10  # one rank's health report (JSON)
MAX_HEALTH_ERROR_CHARS = 1000
MAX_HEALTH_KEYS = 64
_RANK_TEXT = re.compile(r"[0-9]{1,5}")


@dataclass
class HealthReport:
    """One rank's health, as its collector writes it (module docstring)."""

    rank: int
    dropped_steps: int = 0
    published_steps: int = 0
    queued: int = 0
    last_error: str = ""
    sink_failures: int = 0
    last_failure: str = ""
    time_s: float = field(default_factory=time.time)
    extra: dict[str, object] = field(default_factory=dict)

    def fields(self) -> dict[str, object]:
        """The flat JSON object the hash holds (extra's keys beside the named ones, never over them)."""
        named = {"rank": self.rank, "dropped_steps": self.dropped_steps, "published_steps": self.published_steps,
                 "queued": self.queued, "last_error": self.last_error, "sink_failures": self.sink_failures,
                 "last_failure": self.last_failure, "time_s": self.time_s}
        return {**{k: v for k, v in self.extra.items() if k not in named}, **named}

    def encode(self) -> str:
        return json.dumps(self.fields())


def decode_health_rank(field) -> int:
    """A field name of moe:<run>:health -> the rank: ASCII digits, below keys.MAX_WORLD; ValueError otherwise."""
    try:
        text = field.decode() if isinstance(field, (bytes, bytearray)) else str(field)
    except UnicodeDecodeError:
        raise ValueError("health field name is not UTF-8") from None
    if not _RANK_TEXT.fullmatch(text) or int(text) >= keys.MAX_WORLD:
        raise ValueError(f"health field {text[:20]!r} is not a rank 0..{keys.MAX_WORLD - 1}")
    return int(text)


def decode_health_report(value) -> dict:
    """A value of moe:<run>:health -> the collector's report, a flat dict of scalars. The fields the pages
    read are checked: dropped_steps, published_steps, queued and rank ints 0..keys.MAX_STEP - 1, time_s a
    finite time, last_error text or null (cut at MAX_HEALTH_ERROR_CHARS); of the other fields (a collector
    may add its own figures) at most MAX_HEALTH_KEYS with short names are kept when they are a bool, null,
    text (cut likewise), an int below 2**63 or a finite float, and dropped otherwise. ValueError (never
    another exception) when it is not a JSON object of at most MAX_HEALTH_BYTES or a checked field is wrong."""
    raw = parse_json(value, "health report", MAX_HEALTH_BYTES)
    if not isinstance(raw, dict):
        raise ValueError("health report is not a JSON object")
    report: dict = {}
    for key in ("rank", "dropped_steps", "published_steps", "queued"):
        if key in raw:
            number = raw[key]
            if not (isinstance(number, int) and not isinstance(number, bool) and 0 <= number < keys.MAX_STEP):
                raise ValueError(f"health report {key!r} is not an integer 0..{keys.MAX_STEP - 1}")
            report[key] = number
    if "time_s" in raw:
        when = raw["time_s"]
        if isinstance(when, bool) or not isinstance(when, (int, float)) or not abs(when) < keys.MAX_TIME_S:
            raise ValueError("health report 'time_s' is not a finite time")  # NaN fails abs(when) < MAX_TIME_S
        report["time_s"] = float(when)
    if "last_error" in raw:
        error = raw["last_error"]
        if error is not None and not isinstance(error, str):
            raise ValueError("health report 'last_error' is not text")
        report["last_error"] = _cut(error)
    for key, item in raw.items():
        if key in report or key in _CHECKED_HEALTH or len(report) >= MAX_HEALTH_KEYS or len(key) > 64:
            continue
        if item is None or isinstance(item, bool) or isinstance(item, int) and abs(item) < 2**63 \
                or isinstance(item, float) and math.isfinite(item):
            report[key] = item
        elif isinstance(item, str):
            report[key] = _cut(item)
    return report


_CHECKED_HEALTH = frozenset({"rank", "dropped_steps", "published_steps", "queued", "time_s", "last_error"})


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= MAX_HEALTH_ERROR_CHARS else text[:MAX_HEALTH_ERROR_CHARS] + "..."
