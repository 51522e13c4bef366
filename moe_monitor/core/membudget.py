"""One memory budget per process: the big arrays a reader keeps (step windows, sample and timing rings) reserve
their bytes here before they are allocated and give them back when dropped. Pure bookkeeping, thread-safe.

A window is steps x L x E x 4 bytes whatever its records weigh on the wire, so one budget bounds a process
where a cap per window would not. A holder asking for more than is left gets less (and says so) or is refused
with a message naming the setting that raises it. The budget: the one installed with `using(budget)` for the
current thread or task, else `process_budget()` ($MOE_MONITOR_MEMORY_BUDGET, else DASHBOARD_DEFAULT_BYTES).
Temporaries of one computation are not reserved: readers keep them to a few tens of MB.
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar

ENV_VAR = "MOE_MONITOR_MEMORY_BUDGET"
DASHBOARD_DEFAULT_BYTES = 2 << 30  # a laptop's share for every dashboard session together
EXPORTER_DEFAULT_BYTES = 1 << 30  # every run one exporter watches, together
AGGREGATOR_DEFAULT_BYTES = 1 << 30  # every run one aggregator process sums: steps waiting, held records, rollups
MIN_BUDGET_BYTES = 16 << 20
MAX_BUDGET_BYTES = 1 << 50

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, what: str = "memory budget") -> int:
    """'2GiB', '512 MiB', '1.5G', '800000000' -> bytes (k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB of 1024).
    ValueError naming `what` for anything else, or a size outside MIN_BUDGET_BYTES..MAX_BUDGET_BYTES."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ValueError(f"{what} {text!r}: give a size such as 2GiB, 512MiB or 1500000000 (bytes)")
        value = int(float(match.group(1)) * unit)
    if not MIN_BUDGET_BYTES <= value <= MAX_BUDGET_BYTES:
        raise ValueError(f"{what} {text!r}: must lie between {format_bytes(MIN_BUDGET_BYTES)} and "
                         f"{format_bytes(MAX_BUDGET_BYTES)}")
    return value


def format_bytes(nbytes: int | float) -> str:
    """Bytes as people read them: '2.0 GiB', '37.5 MiB', '512 B'."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # unreachable


class Reservation:
    """Bytes held from one MemoryBudget by one holder. resize_to() grows (when the budget has room) or shrinks
    it; release() gives everything back (idempotent), and so does the reservation's garbage collection: a
    holder keeps its reservation and nothing else, and its bytes go back when it is dropped. A deep copy (a
    holder's copy: a paused page's window) is a new reservation of as many bytes, or ValueError when the budget
    has fewer left."""

    def __init__(self, budget: MemoryBudget, nbytes: int):
        self.budget = budget
        self._held = [int(nbytes)]  # shared with the finalizer, which must not hold the reservation itself
        self._finalizer = weakref.finalize(self, budget._give_back, self._held)

    @property
    def nbytes(self) -> int:
        return self._held[0]

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def resize_to(self, nbytes: int) -> bool:
        """Hold exactly nbytes from now on; False (nothing changed) when growing needs more than is left.
        ValueError once released."""
        if self.released:
            raise ValueError("this reservation was released")
        return self.budget._resize(self._held, int(nbytes))

    def release(self) -> None:
        self._finalizer()

    def __deepcopy__(self, memo) -> Reservation:
        copy = self.budget.try_reserve(0 if self.released else self.nbytes)
        if copy is None:
            raise ValueError(f"a copy needs {format_bytes(self.nbytes)} and {self.budget.describe()} has "
                             f"{format_bytes(self.budget.available_bytes)} left: it is shared by "
                             f"{self.budget.shared_by}")
        return copy


class MemoryBudget:
    """total_bytes shared by every holder of one process (or of one exporter). label names it in messages
    ("the dashboard's memory budget"), shared_by says among whom ("every session"), setting how to raise it."""

    def __init__(self, total_bytes: int, label: str = "the dashboard's memory budget",
                 shared_by: str = "every session", setting: str = f"set {ENV_VAR} / --memory-budget"):
        if int(total_bytes) < 1:
            raise ValueError(f"a memory budget needs at least one byte, got {total_bytes}")
        self.total_bytes = int(total_bytes)
        self.label, self.shared_by, self.setting = label, shared_by, setting
        self._reserved = 0
        self._lock = threading.Lock()
        self._reliefs: list[weakref.WeakMethod] = []  # add_relief()

    @property
    def reserved_bytes(self) -> int:
        with self._lock:
            return self._reserved

    @property
    def available_bytes(self) -> int:
        with self._lock:
            return max(0, self.total_bytes - self._reserved)

    def describe(self) -> str:
        """'the dashboard's memory budget (2.0 GiB, set MOE_MONITOR_MEMORY_BUDGET / --memory-budget to raise it)'."""
        return f"{self.label} ({format_bytes(self.total_bytes)}, {self.setting} to raise it)"

    def try_reserve(self, nbytes: int) -> Reservation | None:
        """A reservation of nbytes, or None when fewer are left (nothing reserved then)."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes} bytes")
        with self._lock:
            if self._reserved + nbytes > self.total_bytes:
                return None
            self._reserved += nbytes
        return Reservation(self, nbytes)

    def add_relief(self, give_back: Callable[[], object]) -> None:
        """Register a bound method (held weakly) that gives back what can go without loss (copies kept for later);
        reserve_rows() calls it when rows do not all fit, before it collects garbage and asks again."""
        with self._lock:
            self._reliefs = [r for r in self._reliefs if r() is not None and r() != give_back]
            self._reliefs.append(weakref.WeakMethod(give_back))

    def _relieve(self) -> None:
        with self._lock:
            reliefs = [r() for r in self._reliefs]
        for give_back in reliefs:
            if give_back is not None:
                give_back()

    def reserve_rows(self, row_bytes: int, rows: int, fixed_bytes: int = 0,
                     collect: bool = True) -> tuple[Reservation, int] | None:
        """(reservation, granted rows) for fixed_bytes plus as many rows of row_bytes as fit, at most `rows`;
        None when not even one row fits. collect: when the rows do not all fit, call the reliefs (add_relief) and
        collect garbage once first (holders of sessions that ended may still wait in a reference cycle) and ask
        again."""
        if row_bytes < 1 or rows < 1 or fixed_bytes < 0:
            raise ValueError(f"rows of {row_bytes} bytes x {rows} (+{fixed_bytes}) is not a request")
        for attempt in range(2 if collect else 1):
            with self._lock:
                left = self.total_bytes - self._reserved - fixed_bytes
                granted = min(int(rows), left // row_bytes) if left > 0 else 0
                if granted == rows or (granted >= 1 and attempt == (1 if collect else 0)):
                    nbytes = fixed_bytes + granted * row_bytes
                    self._reserved += nbytes
                    return Reservation(self, nbytes), granted
            if attempt == 0 and collect:
                self._relieve()
                gc.collect()
        return None

    def _resize(self, held: list[int], nbytes: int) -> bool:
        if nbytes < 0:
            raise ValueError(f"cannot hold {nbytes} bytes")
        with self._lock:
            grow = nbytes - held[0]
            if grow > 0 and self._reserved + grow > self.total_bytes:
                return False
            self._reserved += grow
            held[0] = nbytes
            return True

    def _give_back(self, held: list[int]) -> None:
        with self._lock:
            self._reserved -= held[0]
            held[0] = 0

    def __copy__(self) -> MemoryBudget:
        return self  # one budget: holders and their copies share it

    def __deepcopy__(self, memo) -> MemoryBudget:
        return self


_process_budget: MemoryBudget | None = None
_process_lock = threading.Lock()
_current: ContextVar[MemoryBudget | None] = ContextVar("moe_monitor_memory_budget", default=None)


def process_budget() -> MemoryBudget:
    """The process's budget, made at the first call: $MOE_MONITOR_MEMORY_BUDGET (parse_bytes), else
    DASHBOARD_DEFAULT_BYTES. ValueError when the variable is set to something that is not a size."""
    global _process_budget
    with _process_lock:
        if _process_budget is None:
            text = os.environ.get(ENV_VAR, "").strip()
            total = parse_bytes(text, ENV_VAR) if text else DASHBOARD_DEFAULT_BYTES
            _process_budget = MemoryBudget(total)
        return _process_budget


def current() -> MemoryBudget:
    """The budget holders made now reserve from: the one `using()` installed, else process_budget()."""
    installed = _current.get()
    return installed if installed is not None else process_budget()


@contextlib.contextmanager
def using(budget: MemoryBudget) -> Iterator[MemoryBudget]:
    """Holders made inside the block (in this thread or task) reserve from `budget`."""
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)
