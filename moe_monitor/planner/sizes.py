"""Sizes of one routed expert that traffic and memory figures need, and the fallback when a run does not
say: DeepSeek-V3's (hidden 7168, expert FFN width 2048, bf16). Whoever falls back says so on the page."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertSizes:
    hidden_size: int            # d: elements per token crossing the all-to-all
    moe_intermediate_size: int  # width of one expert's FFN
    dtype_bytes: int            # bytes per element (bf16: 2)


DEEPSEEK_V3 = ExpertSizes(hidden_size=7168, moe_intermediate_size=2048, dtype_bytes=2)
