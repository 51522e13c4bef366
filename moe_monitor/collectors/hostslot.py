"""The host's side of a step buffer: the slots a step is copied into, what the host knows of a step, and the
order of the step ops across CUDA streams (counter.py's DeviceCounter uses them; shape legend there)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch


@dataclass(eq=False)
class HostSlot:
    """A host copy of one step buffer; `ready` is a CUDA event (None on the CPU); `view`: buf as numpy (the
    same memory); `unfolded`: on the CPU, a step copied here and not yet added into the running total
    (DeviceCounter.fold)."""

    buf: torch.Tensor
    ready: torch.cuda.Event | None

    def __post_init__(self) -> None:
        self.view: np.ndarray = self.buf.numpy()
        self.bytes = byte_view(self.view)  # the same memory, for snapshot()'s copy on the CPU
        self.unfolded = False

    def wait(self) -> np.ndarray:
        """The host copy (a numpy view), once the device has finished writing it."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.view


def byte_view(array: np.ndarray) -> memoryview:
    """A C-contiguous array's memory as bytes: a slice assignment into it is one memcpy."""
    return array.data.cast("B") if array.size else memoryview(bytearray())


class StreamOrder:
    """Orders the counter's per-step ops across CUDA streams: join() makes the stream current now wait for
    the stream the previous join() saw (a device-side wait, no host sync). `current` returns the current
    stream; any object with wait_stream() and == will do (the CPU tests pass stand-ins)."""

    def __init__(self, current: Callable[[], Any]):
        self._current = current
        self.last: Any = None

    def join(self) -> None:
        stream = self._current()
        last = self.last
        if last is not None and last != stream:
            stream.wait_stream(last)
        self.last = stream


class StepFacts(NamedTuple):
    """What the host knows of a step without reading the device: tokens (-1: never begun), whether a padding
    mask applied (then the real token count is on the device), and how many tokens were sampled. A tuple: made
    at every step's end on the model's thread, where a frozen dataclass costs a few microseconds more."""

    tokens: int
    masked: bool
    sample_n: int
