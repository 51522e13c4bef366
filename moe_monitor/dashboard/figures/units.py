"""Units and number formatting shared by every page and figure: one way to write bytes (binary units), a
duration in words, and a number that may be unknown (NaN)."""
from __future__ import annotations

import math

GIB = float(1 << 30)
BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


def byte_unit(largest_bytes: float) -> tuple[float, str]:
    """(scale, unit) to show values up to largest_bytes in: the largest binary unit not above it (B for
    values under 1 KiB, zero and negative)."""
    return next((scale, unit) for scale, unit in BYTE_UNITS if abs(largest_bytes) >= scale or scale == 1)


def format_bytes(n: float, sign: bool = False) -> str:
    """1536 -> '1.50 KiB', 512 -> '512 B' (binary units); sign=True prefixes + for non-negative values."""
    scale, unit = byte_unit(n)
    text = f"{abs(n):.0f} B" if unit == "B" else f"{abs(n) / scale:.2f} {unit}"
    return ("-" if n < 0 else "+" if sign else "") + text


def format_number(value: float, spec: str = ".3f") -> str:
    """value formatted with spec; "n/a" for NaN (a statistic with no data, e.g. eta of idle layers)."""
    return "n/a" if value != value else format(value, spec)


DURATION_UNITS = ((86400.0, "day"), (3600.0, "h"), (60.0, "min"), (1.0, "s"))


def format_duration(seconds: float) -> str:
    """40 -> '40 s', 150 -> '2.5 min', 7200 -> '2 h', 454028 -> '5.3 days'; "unknown" for NaN or negative."""
    if not math.isfinite(seconds) or seconds < 0:
        return "unknown"
    scale, unit = next((s, u) for s, u in DURATION_UNITS if seconds >= s or s == 1.0)
    value = seconds / scale
    text = f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"
    return f"{text} {unit}{'s' if unit == 'day' and text != '1' else ''}"
