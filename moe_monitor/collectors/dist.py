"""Rank and world size of this process in an expert-parallel job (torch.distributed when initialised)."""
from __future__ import annotations

import os

import torch


def rank_and_world() -> tuple[int, int]:
    """(rank, world_size): from torch.distributed when it is initialised, else from RANK/WORLD_SIZE set by
    torchrun and most launchers, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1
    return (rank, world) if 0 <= rank < world else (0, 1)
