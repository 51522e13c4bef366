"""What the bridge has read, kept in Redis under the run's keys so a restarted bridge never publishes a dump twice:

    moe:R:sglang_seen   hash: dump file name -> JSON {"size", "mtime_ns", "status", "steps", "why"}
                        status "published", "empty" or "refused" (why says why; never read again)
    moe:R:sglang_state  string: JSON {"instance", "ids" (stepids.StepIds), "layout_sha256", "gpus", "world",
                        "top_k", "published_by_rank"}

A file is the same file while its name, size and mtime (ns) are. Both are written in one MULTI after the file's
records landed (a bridge killed in between writes the same steps again, which readers skip as repeats); in a
Redis Cluster the run's hash tag puts them in one slot, which the MULTI needs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from moe_monitor import core

MAX_STATE_BYTES = 16 << 20


def seen_key(run: str) -> str:
    return core.run_key(run, "sglang_seen")


def state_key(run: str) -> str:
    return core.run_key(run, "sglang_state")


@dataclass(frozen=True)
class Seen:
    """One dump file the bridge is done with. status: "published", "empty" or "refused"."""

    size: int
    mtime_ns: int
    status: str
    steps: int = 0
    why: str = ""

    def same_file(self, size: int, mtime_ns: int) -> bool:
        return self.size == size and self.mtime_ns == mtime_ns

    def to_json(self) -> str:
        return json.dumps({"size": self.size, "mtime_ns": self.mtime_ns, "status": self.status,
                           "steps": self.steps, "why": self.why[:500]})

    @classmethod
    def from_json(cls, text: bytes | str) -> Seen | None:
        """The entry, or None when it is not one (a hand-edited hash: the file is then read again)."""
        try:
            raw = json.loads(text)
            return cls(size=int(raw["size"]), mtime_ns=int(raw["mtime_ns"]), status=str(raw["status"]),
                       steps=int(raw.get("steps", 0)), why=str(raw.get("why", "")))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def load(client: core.Client, run: str) -> tuple[dict[str, Seen], dict | None, core.RunMeta | None, str]:
    """(seen files, the saved state or None, the run's metadata or None, why the metadata or state could not be
    used ("" when fine)). Raises redis errors (the caller retries)."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(seen_key(run))
    pipe.getrange(state_key(run), 0, MAX_STATE_BYTES)
    pipe.getrange(core.meta_key(run), 0, core.MAX_META_BYTES)
    raw_seen, raw_state, raw_meta = pipe.execute()
    seen: dict[str, Seen] = {}
    for name, value in raw_seen.items():
        entry = Seen.from_json(value)
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        if entry is not None:
            seen[text] = entry
    problems = []
    state = None
    if raw_state:
        try:
            state = json.loads(raw_state)
            if not isinstance(state, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            problems.append(f"{state_key(run)} is unreadable ({exc}): starting a new state")
            state = None
    meta = None
    if raw_meta:
        try:
            meta = core.decode_meta(raw_meta)
        except ValueError as exc:
            problems.append(f"{core.meta_key(run)} is unreadable ({exc}): writing a new one")
    return seen, state, meta, "; ".join(problems)


def commit(client: core.Client, run: str, entries: dict[str, Seen], state: dict | None) -> None:
    """Write seen entries (and the state, when given) in one MULTI. Raises redis errors."""
    pipe = client.pipeline(transaction=True)
    if entries:
        pipe.hset(seen_key(run), mapping={name: entry.to_json() for name, entry in entries.items()})
    if state is not None:
        pipe.set(state_key(run), json.dumps(state, separators=(",", ":")))
    if entries or state is not None:
        pipe.execute()
