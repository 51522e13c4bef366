"""The one place that reads PyTorch .pt files (SGLang logical_count dumps): weights_only=True, always.

Kept outside dashboard/ so the dashboard package holds no torch code at all; the planner imports this
lazily, only when asked for a .pt file, and a machine without torch gets a clear message instead.
"""
from __future__ import annotations


def load_weights_only(path: str):
    """torch.load(path, weights_only=True) on the CPU. ValueError (never another exception) when torch is
    missing or the file is corrupt, truncated or holds anything but tensors and plain containers."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"{path}: reading a .pt file needs torch installed (or save the counts as JSON)") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt / unsafe files
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"{path}: cannot read as a weights-only torch file ({type(exc).__name__}: {first})") from None
