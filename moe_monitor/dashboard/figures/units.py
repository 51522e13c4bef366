"""Units and number formatting shared by every page and figure: one way to write bytes (binary units) and
one way to write a number that may be unknown (NaN)."""
from __future__ import annotations

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
