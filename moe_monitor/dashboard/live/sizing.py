"""How many steps a new window of a run can hold within a memory budget, counting what its first poll decodes.

A Redis source hands the newest window_steps x ranks step records of a run over in its first poll, each decoded
to int32 [L, E], while the window they go into holds window_steps rows of its own: for a moment the process
holds both. `budgeted_steps` sizes the window (and the source's backlog: give both the same steps) so that
both fit what is left of the budget; `first_poll` holds the decoded records' share of the budget while that
poll runs. `entries_per_tick` bounds the records one later poll decodes. Pure bookkeeping, no I/O.

Shape legend: L layers, E logical experts.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from moe_monitor.core import membudget
from moe_monitor.dashboard.live.window import StepWindow

DECODE_BYTES_PER_TICK = 32 << 20  # decoded counts one poll after the first hands over at most (a few records)
MAX_ENTRIES_PER_TICK = 2000  # WatchedRun's own default


def decoded_bytes(num_layers: int, num_experts: int) -> int:
    """Bytes one step record's counts take once decoded (int32 [L, E])."""
    return num_layers * num_experts * 4


def budgeted_steps(asked: int, num_layers: int, num_experts: int, records_per_step: int = 1,
                   budget: membudget.MemoryBudget | None = None) -> tuple[int, str]:
    """(steps, note): at most `asked` steps of a window of [L, E] counts whose first poll decodes
    records_per_step records a step (the run's ranks; 1 for aggregated steps), within what `budget` (default
    core.membudget.current()) has left; note says why fewer than asked ('' when all fit). ValueError when not
    even one step fits."""
    if asked < 1 or records_per_step < 1:
        raise ValueError(f"a window needs at least one step and one record a step, got {asked}, {records_per_step}")
    budget = membudget.current() if budget is None else budget
    per_step = StepWindow.step_bytes(num_layers, num_experts) + records_per_step * decoded_bytes(num_layers,
                                                                                                num_experts)
    left = budget.available_bytes - StepWindow.fixed_bytes(num_layers, num_experts)
    fits = min(int(asked), left // per_step) if left > 0 else 0
    if fits < 1:
        raise ValueError(f"one step of [{num_layers}, {num_experts}] counts from {records_per_step} ranks needs "
                         f"{membudget.format_bytes(per_step)} and {budget.describe()} has "
                         f"{membudget.format_bytes(budget.available_bytes)} left: it is shared by {budget.shared_by}")
    if fits == asked:
        return fits, ""
    return fits, (f"window narrowed to {fits} of {asked} steps: {budget.describe()} is shared by "
                  f"{budget.shared_by}")


@contextlib.contextmanager
def first_poll(steps: int, num_layers: int, num_experts: int, records_per_step: int = 1,
               budget: membudget.MemoryBudget | None = None) -> Iterator[None]:
    """Hold the decoded records of a first poll (steps x records_per_step x L x E x 4 bytes) from `budget` while
    the block runs (as much of it as is left when less is)."""
    budget = membudget.current() if budget is None else budget
    want = steps * records_per_step * decoded_bytes(num_layers, num_experts)
    held = budget.try_reserve(min(want, budget.available_bytes))
    try:
        yield
    finally:
        if held is not None:
            held.release()


def entries_per_tick(num_layers: int, num_experts: int) -> int:
    """Step records one poll may decode so that their counts take at most DECODE_BYTES_PER_TICK (at least 1,
    at most MAX_ENTRIES_PER_TICK)."""
    return max(1, min(MAX_ENTRIES_PER_TICK, DECODE_BYTES_PER_TICK // decoded_bytes(num_layers, num_experts)))
