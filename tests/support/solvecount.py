"""Counting the steps core.dispatch solves: proof that a reader solves each step once, not every window again."""
from __future__ import annotations

from moe_monitor.core.dispatch import DispatchModel


def count_solved_steps(monkeypatch) -> list[int]:
    """A list that gets the number of steps of every DispatchModel.slot_loads call from now on (the real one
    still answers)."""
    solved: list[int] = []
    real = DispatchModel.slot_loads

    def counting(self, counts_TLE):
        solved.append(len(counts_TLE))
        return real(self, counts_TLE)

    monkeypatch.setattr(DispatchModel, "slot_loads", counting)
    return solved
