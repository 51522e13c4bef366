"""The control broadcast of an EP run, every sync_every steps from rank 0: stop now, and/or a new layout
to switch to at this step. Every rank calls sync() at the same steps, so all ranks stop, or switch, at the
same step.

Shape legend (README, Conventions): L MoE layers, P physical slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Decision:
    """stop: every rank ends its loop; layout_LP: int64 [L, P] to switch to now (None: keep the layout)."""

    stop: bool
    layout_LP: np.ndarray | None


def sync(stop: bool, layout_LP: np.ndarray | None, num_layers: int) -> Decision:
    """Rank 0's (stop, layout_LP) on every rank (the other ranks' arguments are ignored)."""
    header = torch.tensor([int(stop), 0 if layout_LP is None else layout_LP.shape[1]], dtype=torch.int64)
    dist.broadcast(header, src=0)
    new = None
    slots = int(header[1])
    if slots:
        layout = torch.from_numpy(np.ascontiguousarray(layout_LP, dtype=np.int64)) if dist.get_rank() == 0 \
            else torch.empty((num_layers, slots), dtype=torch.int64)
        dist.broadcast(layout, src=0)
        new = layout.numpy()
    return Decision(bool(header[0]), new)
