"""Step ids and step times for bridged dumps, monotonic per run across dumps, bridge restarts and SGLang server
restarts (pure: the bridge persists the state as JSON with the run's keys).

per_pass / per_token: step = offset + forward_pass_id (aligned across ranks); when a rank's pass ids go backwards
(a server restart) a new epoch starts right after the largest step handed out, and the other ranks join it with
their first file of it. stat: a dump's non-zero rows get the next free ids. Times: a dump's steps are spread
evenly over the interval since the same rank's previous dump (the first: `default_span_s`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moe_monitor import core

MAX_SPAN_S = 3600.0  # a gap longer than this since the previous dump (a bridge down for hours) is not spread
STAT_KEY = "stat"


@dataclass
class StepIds:
    """next_step: one more than the largest step id handed out; offset: step = offset + forward_pass_id in
    the current epoch; rank_epoch / rank_last_pass: the epoch each rank is in and its last pass id;
    last_time_s: the latest dump time per rank ("stat" for stat dumps)."""

    next_step: int = 0
    offset: int = 0
    epoch: int = 0
    rank_epoch: dict[int, int] = field(default_factory=dict)
    rank_last_pass: dict[int, int] = field(default_factory=dict)
    last_time_s: dict[str, float] = field(default_factory=dict)

    def for_passes(self, rank: int, pass_id_T: np.ndarray) -> np.ndarray:
        """int64 [T] step ids of a rank's forward passes (pass_id_T ascending, T >= 1)."""
        first, last = int(pass_id_T[0]), int(pass_id_T[-1])
        in_epoch = self.rank_epoch.get(rank) == self.epoch
        restarted = in_epoch and first <= self.rank_last_pass.get(rank, -1)  # the server restarted
        first_of_epoch = not in_epoch and self.epoch not in self.rank_epoch.values()  # nobody in it yet
        if restarted or first_of_epoch:
            self._new_epoch(first)
        self.rank_epoch[rank] = self.epoch
        self.rank_last_pass[rank] = last
        steps_T = self.offset + pass_id_T.astype(np.int64)
        if int(steps_T[-1]) >= core.MAX_STEP:
            raise ValueError(f"step id {int(steps_T[-1])} would pass the wire's bound {core.MAX_STEP}")
        self.next_step = max(self.next_step, int(steps_T[-1]) + 1)
        return steps_T

    def _new_epoch(self, first_pass: int) -> None:
        self.epoch += 1
        self.offset = max(self.offset, self.next_step - first_pass)
        self.rank_epoch = {}

    def for_rows(self, num_rows: int) -> np.ndarray:
        """int64 [num_rows] the next free step ids (stat rows). Per-pass ranks start a new epoch afterwards."""
        steps_T = self.next_step + np.arange(num_rows, dtype=np.int64)
        self.next_step += num_rows
        self.rank_epoch = {}
        return steps_T

    def times(self, key: str, dump_time_s: float, position_T: np.ndarray, default_span_s: float) -> np.ndarray:
        """float64 [T] unix times of a dump's steps. position_T: int [T] ascending position of each step in
        the dump (pass id, or row index); the last position gets dump_time_s, the first the end of the span
        since the previous dump of `key`."""
        previous = self.last_time_s.get(key)
        span_s = dump_time_s - previous if previous is not None else default_span_s
        if not 0.0 < span_s <= MAX_SPAN_S:
            span_s = default_span_s
        self.last_time_s[key] = max(dump_time_s, previous or dump_time_s)
        if position_T.size == 0:
            return np.zeros(0)
        width = int(position_T[-1]) - int(position_T[0]) + 1
        return dump_time_s - (int(position_T[-1]) - position_T.astype(np.float64)) * (span_s / width)

    def to_json(self) -> dict:
        return {"next_step": self.next_step, "offset": self.offset, "epoch": self.epoch,
                "rank_epoch": {str(k): v for k, v in self.rank_epoch.items()},
                "rank_last_pass": {str(k): v for k, v in self.rank_last_pass.items()},
                "last_time_s": dict(self.last_time_s)}

    @classmethod
    def from_json(cls, raw: object) -> StepIds:
        """The state saved by to_json(); ValueError when it is not that."""
        if not isinstance(raw, dict):
            raise ValueError("step-id state is not an object")
        try:
            ids = cls(next_step=_count(raw.get("next_step", 0)), offset=_count(raw.get("offset", 0)),
                      epoch=_count(raw.get("epoch", 0)),
                      rank_epoch={int(k): _count(v) for k, v in dict(raw.get("rank_epoch", {})).items()},
                      rank_last_pass={int(k): int(v) for k, v in dict(raw.get("rank_last_pass", {})).items()},
                      last_time_s={str(k): float(v) for k, v in dict(raw.get("last_time_s", {})).items()})
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"step-id state is malformed ({exc})") from None
        return ids


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < core.MAX_STEP:
        raise ValueError(f"{str(value)[:40]} is not a step count")
    return value
