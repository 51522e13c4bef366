"""The decoded-bytes budget: how much one trace or dump file may decode to, all of it together (every record
batch, row group, dictionary and sample column of a trace, compressed or not; every tensor element of an
SGLang dump), counted from the file's metadata before anything is decoded. A file over it is refused with one
ValueError that names the bound and how to raise it.

The default, DEFAULT_DECODED_MIB (1 GiB), is the collectors' default trace cap (CollectorOptions.trace_max_bytes):
every recording they write with it fits, whatever its container. MOE_TRACE_MAX_DECODED_MIB (MiB, a positive
number) raises or lowers it for a process; `moe-monitor info` and `moe-monitor convert` take --max-decoded-mib.
"""
from __future__ import annotations

import math
import os

ENV_VAR = "MOE_TRACE_MAX_DECODED_MIB"
DEFAULT_DECODED_MIB = 1024
MIB = 1 << 20


def decoded_budget_bytes(max_decoded_mib: float | None = None) -> int:
    """The budget in bytes: max_decoded_mib when given, else $MOE_TRACE_MAX_DECODED_MIB, else the default.
    ValueError for a value that is not a positive finite number of MiB."""
    if max_decoded_mib is None:
        text = os.environ.get(ENV_VAR, "").strip()
        if not text:
            return DEFAULT_DECODED_MIB * MIB
        try:
            max_decoded_mib = float(text)
        except ValueError:
            raise ValueError(f"{ENV_VAR}={text[:40]!r} is not a number of MiB") from None
    if not math.isfinite(max_decoded_mib) or max_decoded_mib <= 0:
        raise ValueError(f"the decoded-bytes bound must be a positive number of MiB, got {max_decoded_mib}")
    return int(min(max_decoded_mib, 1 << 40) * MIB)


def over_budget(what: str, decoded_bytes: int, budget_bytes: int) -> ValueError:
    """The one error of a file over the budget (what: the parts of the file, plural: "x.pt: its tensors"):
    what they decode to, the bound, and how to raise it."""
    return ValueError(f"{what} decode to {_mib(decoded_bytes)} MiB, more than the {_mib(budget_bytes)} MiB "
                      f"one file may decode to (raise the bound with {ENV_VAR}=<MiB> or --max-decoded-mib)")


def check_decoded(what: str, decoded_bytes: int, budget_bytes: int) -> None:
    """Raise over_budget(...) when decoded_bytes is above budget_bytes."""
    if decoded_bytes > budget_bytes:
        raise over_budget(what, decoded_bytes, budget_bytes)


def _mib(n: int) -> str:
    return f"{n / MIB:,.1f}" if n < 10 * MIB else f"{n / MIB:,.0f}"
