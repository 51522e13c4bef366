"""The progress hash core.aggregator_key(run) + ":state": what the run's aggregator did so far, and the state a
successor needs (the epoch, its collector instances, the retired ones). Pure: fields in, fields out.

Fields (all text): the counters of assembly.Counters and rollup.RollupCounters (cumulative, as of the last commit),
epoch (absent while none is open), last_step (the highest step id written in the
epoch), pending_steps, lag_entries (XINFO GROUPS lag: entries of the steps stream not yet delivered to the group;
-1 when Redis cannot tell), entries_per_s (consumed over the last log interval), consumer (who wrote it), time_s
(unix s of that commit), commit (consumer/sequence of that commit: a retry after a timeout tells whether it
landed), last_problem; and, written when they change (and every STATE_REFRESH_S): instances (JSON {rank: collector
instance}), retired (JSON [...]), held (JSON [rank, ...]: restarted ranks held out, core.restarts).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from redis.typing import EncodableT, FieldT

from moe_monitor import core
from moe_monitor.core.assembly import Counters

from .rollup import RollupCounters

MAX_PROBLEM_CHARS = 300
ROLLUP_FIELDS = {"buckets_1s": "buckets_1s", "buckets_60s": "buckets_60s",
                 "rollup_dropped_steps": "dropped_steps", "rollup_dropped_late_ranks": "dropped_late_ranks"}


def state_key(run: str) -> str:
    """The progress hash of run's aggregator (same hash slot as every other key of the run)."""
    return core.aggregator_state_key(run)


@dataclass
class Progress:
    """A decoded progress hash (defaults where a field is absent or unreadable; `problems` says which)."""

    counters: Counters = field(default_factory=Counters)
    rollups: RollupCounters = field(default_factory=RollupCounters)
    epoch: str | None = None
    last_step: int = -1
    instances: dict[int, str] | None = None  # None: not in the hash
    retired: list[str] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    consumer: str = ""
    commit: str = ""
    problems: list[str] = field(default_factory=list)


def encode_progress(counters: Counters, rollups: RollupCounters, *, epoch: str | None, last_step: int,
                    pending_steps: int, lag_entries: int, entries_per_s: float, consumer: str, time_s: float,
                    commit: str, last_problem: str, instances: Mapping[int, str] | None = None,
                    retired: list[str] | None = None, held: list[int] | None = None) -> dict[FieldT, EncodableT]:
    """The hash fields of one commit (instances, retired and held only when given)."""
    fields: dict[FieldT, EncodableT] = {name: str(value) for name, value in counters.as_dict().items()}
    fields.update({name: str(getattr(rollups, attr)) for name, attr in ROLLUP_FIELDS.items()})
    if epoch is not None:
        fields["epoch"] = epoch
    fields.update({"last_step": str(last_step), "pending_steps": str(pending_steps),
                   "lag_entries": str(lag_entries), "entries_per_s": f"{entries_per_s:.1f}", "consumer": consumer,
                   "time_s": repr(float(time_s)), "commit": commit, "last_problem": last_problem[:MAX_PROBLEM_CHARS]})
    if instances is not None:
        fields["instances"] = json.dumps({str(rank): inst for rank, inst in sorted(instances.items())},
                                         separators=(",", ":"))
    if retired is not None:
        fields["retired"] = json.dumps(list(retired), separators=(",", ":"))
    if held is not None:
        fields["held"] = json.dumps([int(rank) for rank in held], separators=(",", ":"))
    return fields


def decode_progress(raw: Mapping) -> Progress:
    """HGETALL reply (bytes or str keys and values) -> Progress. Never raises: an unreadable field keeps its
    default and is named in Progress.problems."""
    text: dict[str, str] = {}
    for key, value in (raw or {}).items():
        try:
            name = key.decode() if isinstance(key, (bytes, bytearray)) else str(key)
            text[name] = value.decode() if isinstance(value, (bytes, bytearray)) else str(value)
        except UnicodeDecodeError:
            continue
    out = Progress()

    def number(name: str, default: int = 0) -> int:
        if name not in text:
            return default
        try:
            value = int(text[name])
        except ValueError:
            out.problems.append(name)
            return default
        if not 0 <= value < core.MAX_STEP:
            out.problems.append(name)
            return default
        return value

    out.counters = Counters.from_mapping({name: number(name) for name in Counters.__dataclass_fields__})
    out.rollups = RollupCounters(**{attr: number(name) for name, attr in ROLLUP_FIELDS.items()})
    if "epoch" in text:
        if len(text["epoch"]) <= core.MAX_NAME_CHARS:
            out.epoch = text["epoch"]
        else:
            out.problems.append("epoch")
    out.last_step = number("last_step", -1)
    out.consumer, out.commit = text.get("consumer", ""), text.get("commit", "")
    if "instances" in text:
        try:
            pairs = core.parse_json(text["instances"], "instances", 1 << 22)
            out.instances = {int(rank): str(inst) for rank, inst in pairs.items()
                             if 0 <= int(rank) < core.MAX_WORLD and len(str(inst)) <= core.MAX_NAME_CHARS}
        except (ValueError, AttributeError, TypeError):
            out.problems.append("instances")
    if "retired" in text:
        try:
            names = core.parse_json(text["retired"], "retired", 1 << 22)
            out.retired = [str(n) for n in names if len(str(n)) <= core.MAX_NAME_CHARS]
        except (ValueError, TypeError):
            out.problems.append("retired")
    if "held" in text:
        try:
            ranks = core.parse_json(text["held"], "held", 1 << 22)
            out.held = [int(r) for r in ranks if 0 <= int(r) < core.MAX_WORLD]
        except (ValueError, TypeError):
            out.problems.append("held")
    return out
