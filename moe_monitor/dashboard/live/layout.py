"""Which layout the loads are computed under: the run's metadata and the layout changes published since
(engine rebalances), a user override, or a layout JSON.

A layout is core.Layout: gpus, nodes and physical_to_logical_map [L][P] (SGLang's name and shape). The
default, when the run has no metadata, is contiguous: E/G experts per GPU with G = core.default_gpus().
A run whose collectors published layout changes (core.LayoutRecord) has a schedule: each step's loads use
the layout in force at that step. An override (uploaded JSON, another GPU count) applies to every step.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core.layouts import check_engine_layout, has_unused
from moe_monitor.dashboard.live.layout_changes import LayoutChange, in_force

_ORIGIN = {"engine": "engine rebalance", "apply": "layout applied", "initial": "initial layout record"}


@dataclass(frozen=True)
class ResolvedLayout:
    """The layout in use and where it came from ('run metadata', 'contiguous default', 'override',
    'uploaded JSON', 'engine rebalance at step k', ...). layout_LP: int64 [L, P], the layout in force at the
    newest step (the What-if's current layout); slots_per_gpu = P / gpus; gpus_per_node = gpus / nodes.
    schedule: the run's layouts by first step, ascending (the first from step 0: the metadata's), each
    step's loads computed under the one in force at that step; () when layout_LP applies to every step (an
    override, or a run without layout changes). since_step: the first step of layout_LP when it came from the
    schedule (else None); source: its core.LAYOUT_SOURCES source, or 'run metadata' ('' when not from the
    schedule); time_s: when it was issued (None for the metadata's); hidden_changes: layout changes of the
    run that an override hides."""

    gpus: int
    nodes: int
    layout_LP: np.ndarray
    origin: str
    schedule: tuple[LayoutChange, ...] = ()
    since_step: int | None = None
    source: str = ""
    time_s: float | None = None
    hidden_changes: int = 0

    @property
    def slots_per_gpu(self) -> int:
        return self.layout_LP.shape[1] // self.gpus

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node


def resolve_layout(meta: core.RunMeta | None, num_layers: int, num_experts: int, world_size: int = 1,
                   gpus: int | None = None, gpus_per_node: int | None = None,
                   uploaded: list[list[int]] | None = None, changes: Sequence[LayoutChange] = (),
                   at_step: int | None = None) -> ResolvedLayout:
    """The layout to compute GPU loads under.

    Precedence: an uploaded map, else the run's metadata map, else contiguous. `gpus` / `gpus_per_node`
    override the GPU and node counts; a `gpus` that differs from the map's (with nothing uploaded) means a
    contiguous layout over that many GPUs. Raises ValueError with the reason when the pieces do not fit.
    changes (ascending by step, already checked against the run: LayoutHistory) are the layouts published
    since the run started; without an override they form the schedule after the base map, and layout_LP is
    the one in force at at_step (default: the latest change). Changes for another GPU count than the base
    layout's are left out (the loads of one window share one GPU axis)."""
    if uploaded is not None:
        rows, origin = uploaded, "uploaded JSON"
        base_gpus = meta.layout.gpus if meta else core.default_gpus(num_experts, world_size)
    elif meta is not None:
        rows, origin, base_gpus = meta.layout.physical_to_logical_map, "run metadata", meta.layout.gpus
    else:
        base_gpus = core.default_gpus(num_experts, world_size)
        rows, origin = core.contiguous_layout(num_layers, num_experts), "contiguous default"
    use_gpus = base_gpus if gpus is None else int(gpus)
    if gpus is not None and use_gpus != base_gpus and uploaded is None:
        if use_gpus < 1 or num_experts % use_gpus:
            raise ValueError(f"{num_experts} experts do not split evenly over {use_gpus} GPUs")
        rows, origin = core.contiguous_layout(num_layers, num_experts), f"contiguous over {use_gpus} GPUs (override)"
    if gpus_per_node is None:
        per_node = use_gpus // meta.layout.nodes if meta and use_gpus % meta.layout.nodes == 0 else use_gpus
    else:
        per_node = int(gpus_per_node)
    if per_node < 1 or use_gpus % per_node:
        raise ValueError(f"{use_gpus} GPUs do not split into nodes of {per_node}")
    layout = core.Layout(gpus=use_gpus, nodes=use_gpus // per_node, physical_to_logical_map=rows)
    if uploaded is not None and has_unused(rows):  # vLLM's -1, an unused slot: it serves nothing
        check_engine_layout(np.asarray(rows), num_experts, use_gpus, num_layers)
    else:
        layout.validate(num_layers, num_experts)
    overridden = uploaded is not None or use_gpus != base_gpus
    usable = [] if overridden else [c for c in changes if c.gpus == use_gpus]
    if not usable:
        return ResolvedLayout(gpus=use_gpus, nodes=layout.nodes, layout_LP=np.asarray(rows, dtype=np.int64),
                              origin=origin, hidden_changes=len(changes) if overridden else 0)
    base = LayoutChange.of(0, rows, use_gpus, layout.nodes, origin)  # "run metadata" (or "contiguous default")
    schedule = (base, *usable)
    now = in_force(schedule, usable[-1].step if at_step is None else at_step) or base
    nodes = now.nodes if gpus_per_node is None else layout.nodes
    if now is not base:
        origin = f"{_ORIGIN.get(now.source, now.source)} at step {now.step}"
    return ResolvedLayout(gpus=use_gpus, nodes=nodes, layout_LP=now.layout_LP, origin=origin, schedule=schedule,
                          since_step=now.step, source=now.source, time_s=now.time_s)


def in_force_note(layout: ResolvedLayout) -> str:
    """One line (markdown) for the Overview: which layout the newest step's loads use, since which step, and
    what the run's layout changes do to the window."""
    shape = f"{layout.gpus} GPUs, {layout.slots_per_gpu} slots/GPU"
    if not layout.schedule:
        hidden = (f"; it hides the run's {layout.hidden_changes} published layout change(s)"
                  if layout.hidden_changes else "")
        return f"**Layout in force:** {layout.origin} ({shape}), for every step in the window{hidden}."
    changes = len(layout.schedule) - 1
    latest = layout.schedule[-1]
    if layout.since_step == 0 and layout.time_s is None:
        what = f"{layout.origin}, since the start"
    else:
        issued = "" if layout.time_s is None else f", issued {_clock(layout.time_s)}"
        what = f"{_ORIGIN.get(layout.source, layout.source)} since step {layout.since_step}{issued}"
    upcoming = (f"; the latest ({_ORIGIN.get(latest.source, latest.source)} from step {latest.step}) "
                "has no step yet" if latest.step > (layout.since_step or 0) else "")
    return (f"**Layout in force:** {what} ({shape}). {changes} layout change(s) published by the run{upcoming}; "
            "each step's GPU loads use the layout in force at that step.")


def _clock(time_s: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time_s))
    except (OverflowError, OSError, ValueError):
        return "at an unknown time"
