"""Which layout the loads are computed under: the run's metadata, a user override, or a layout JSON.

A layout is wire.Layout: gpus, nodes and physical_to_logical_map [L][P] (SGLang's name and shape). The
default, when the run has no metadata, is contiguous: E/G experts per GPU with G = wire.default_gpus().
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import wire


@dataclass(frozen=True)
class ResolvedLayout:
    """The layout in use and where it came from ('run metadata', 'contiguous default', 'override',
    'uploaded JSON'). p2l_LP: int64 [L, P]; slots_per_gpu = P / gpus; gpus_per_node = gpus / nodes."""

    gpus: int
    nodes: int
    p2l_LP: np.ndarray
    origin: str

    @property
    def slots_per_gpu(self) -> int:
        return self.p2l_LP.shape[1] // self.gpus

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node


def resolve_layout(meta: wire.RunMeta | None, num_layers: int, num_experts: int, world_size: int = 1,
                   gpus: int | None = None, gpus_per_node: int | None = None,
                   uploaded: list[list[int]] | None = None) -> ResolvedLayout:
    """The layout to compute GPU loads under.

    Precedence: an uploaded map, else the run's metadata map, else contiguous. `gpus` / `gpus_per_node`
    override the GPU and node counts; a `gpus` that differs from the map's (with nothing uploaded) means a
    contiguous layout over that many GPUs. Raises ValueError with the reason when the pieces do not fit."""
    if uploaded is not None:
        rows, origin = uploaded, "uploaded JSON"
        base_gpus = meta.layout.gpus if meta else wire.default_gpus(num_experts, world_size)
    elif meta is not None:
        rows, origin, base_gpus = meta.layout.physical_to_logical_map, "run metadata", meta.layout.gpus
    else:
        base_gpus = wire.default_gpus(num_experts, world_size)
        rows, origin = wire.contiguous_layout(num_layers, num_experts), "contiguous default"
    use_gpus = base_gpus if gpus is None else int(gpus)
    if gpus is not None and use_gpus != base_gpus and uploaded is None:
        if use_gpus < 1 or num_experts % use_gpus:
            raise ValueError(f"{num_experts} experts do not split evenly over {use_gpus} GPUs")
        rows, origin = wire.contiguous_layout(num_layers, num_experts), f"contiguous over {use_gpus} GPUs (override)"
    if gpus_per_node is None:
        per_node = use_gpus // meta.layout.nodes if meta and use_gpus % meta.layout.nodes == 0 else use_gpus
    else:
        per_node = int(gpus_per_node)
    if per_node < 1 or use_gpus % per_node:
        raise ValueError(f"{use_gpus} GPUs do not split into nodes of {per_node}")
    layout = wire.Layout(gpus=use_gpus, nodes=use_gpus // per_node, physical_to_logical_map=rows)
    layout.validate(num_layers, num_experts)
    return ResolvedLayout(gpus=use_gpus, nodes=layout.nodes, p2l_LP=np.asarray(rows, dtype=np.int64), origin=origin)
