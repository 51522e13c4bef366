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
        raise ValueError(f"{path}: cannot read as a weights-only torch file ({type(exc).__name__}: "
                         f"{_first_line(exc)})") from None


def tensor_array(tensor, path: str):
    """A loaded tensor as a float64 numpy array. ValueError (never another exception) for tensors that hold no
    plain numbers: sparse, nested, meta (no data), quantized, bool or complex tensors."""
    import torch

    layout = getattr(tensor, "layout", None)
    if getattr(tensor, "is_nested", False) or layout != torch.strided:
        kind = "nested" if getattr(tensor, "is_nested", False) else f"{layout}"
        raise ValueError(f"{path}: logical_count is a {kind} tensor; save a dense one (tensor.to_dense())")
    if getattr(tensor, "is_meta", False):
        raise ValueError(f"{path}: logical_count is a meta tensor (shape only, no data)")
    if getattr(tensor, "is_quantized", False):
        raise ValueError(f"{path}: logical_count is a quantized tensor ({tensor.dtype}); save it dequantized "
                         "(tensor.dequantize())")
    dtype = getattr(tensor, "dtype", None)
    if dtype == torch.bool or getattr(dtype, "is_complex", False):
        raise ValueError(f"{path}: logical_count is a {dtype} tensor; counts are integer or real numbers")
    try:
        return tensor.detach().to("cpu", torch.float64).numpy()
    except Exception as exc:  # any other tensor kind torch cannot hand to numpy
        raise ValueError(f"{path}: logical_count tensor cannot be read as numbers ({type(exc).__name__}: "
                         f"{_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""
