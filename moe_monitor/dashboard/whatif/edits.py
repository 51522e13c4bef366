"""The What-if page's edit session, pure (no Streamlit): the planned layout, the user's edits on it as a
history (the one undo of the page), and the page's clicks turned into edits.

A click on a GPU bar selects that GPU (clicked_gpu); a click on one of its expert bars selects the expert
(clicked_expert), both read from the Vega-Lite selection event; an Action (add a replica of the expert on a GPU, or move the expert's replica from the
selected GPU to another) applied to the session (apply_action) gives a new session whose current layout is the
edited one; undo gives the session without its newest edit.

Shape legend (README, Conventions): L layers, E logical experts, P slots, G GPUs, S slots per GPU. Layouts
are physical_to_logical_map arrays int64 [L, P] (slot p on GPU p // S, S = P / G); -1 is an unused slot (vLLM's):
an edit fills it first (add: the new replica goes there; move: the replica moves into it, leaving its old slot
unused), and the export keeps it.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.planner.edits import add_replica, move_replica

ACTIONS = ("add", "move")
GPU_PARAM, EXPERT_PARAM = "pick_gpu", "pick_expert"  # the bars' point selections (figures.whatif)


@dataclass(frozen=True)
class Action:
    """One edit of one layer: kind 'add' puts one more replica of `expert` on `gpu`; kind 'move' moves
    `expert`'s replica from `gpu` to `dst_gpu` (swapping with the lightest suitable slot there)."""

    kind: str
    layer: int
    expert: int
    gpu: int
    dst_gpu: int | None = None

    def describe(self) -> str:
        if self.kind == "add":
            return f"layer {self.layer}: + replica of expert {self.expert} on GPU {self.gpu}"
        return f"layer {self.layer}: expert {self.expert} moved GPU {self.gpu} -> GPU {self.dst_gpu}"


@dataclass(frozen=True)
class EditSession:
    """history[0] is the planned layout, history[-1] the current one (each read-only); log[i] describes
    history[i + 1]. `key` names the plan (its inputs) the edits belong to: a new plan starts a new session."""

    key: tuple
    gpus: int
    history: tuple[np.ndarray, ...]
    log: tuple[str, ...] = ()

    @property
    def current(self) -> np.ndarray:
        return self.history[-1]

    @property
    def planned(self) -> np.ndarray:
        return self.history[0]

    @property
    def num_edits(self) -> int:
        return len(self.history) - 1


def _read_only_layout(layout_LP: ArrayLike) -> np.ndarray:
    lay = np.array(layout_LP, dtype=np.int64)
    if lay.ndim != 2:
        raise ValueError(f"layout must be [layers, slots], got shape {lay.shape}")
    lay.setflags(write=False)
    return lay


def new_session(key: tuple, layout_LP: ArrayLike, gpus: int) -> EditSession:
    """A session without edits on a planned layout [L, P]."""
    lay = _read_only_layout(layout_LP)
    if gpus < 1 or lay.shape[1] % gpus:
        raise ValueError(f"{lay.shape[1]} slots do not split over {gpus} GPUs")
    return EditSession(key=key, gpus=gpus, history=(lay,))


def apply_action(session: EditSession, action: Action, counts_LE: ArrayLike) -> EditSession:
    """The session with `action` applied to its current layout; counts_LE [L, E] pick the slot an edit
    replaces (the lightest per-replica load). ValueError (the session unchanged) when the edit is impossible."""
    if action.kind not in ACTIONS:
        raise ValueError(f"unknown edit '{action.kind}' (choose from {', '.join(ACTIONS)})")
    if action.kind == "move" and action.dst_gpu is None:
        raise ValueError("a move needs a destination GPU")
    new = _into_unused_slot(session.current, action, session.gpus)
    if new is None and action.kind == "add":
        new = add_replica(session.current, counts_LE, action.layer, action.expert, action.gpu, session.gpus)
    elif new is None:
        new = move_replica(session.current, counts_LE, action.layer, action.expert, action.gpu,
                           action.dst_gpu, session.gpus)
    return EditSession(key=session.key, gpus=session.gpus, history=session.history + (new,),
                       log=session.log + (action.describe(),))


def _into_unused_slot(layout_LP: np.ndarray, action: Action, gpus: int) -> np.ndarray | None:
    """The edit done into an unused slot (-1) of the GPU that gets the replica, or None when that GPU has none
    (planner.edits then replaces or swaps a slot). ValueError when the edit is impossible."""
    layer, expert = action.layer, action.expert
    if not 0 <= layer < layout_LP.shape[0]:
        raise ValueError(f"layer {layer} out of range 0..{layout_LP.shape[0] - 1}")
    gets = action.gpu if action.kind == "add" else action.dst_gpu
    S = layout_LP.shape[1] // gpus
    if gets is None or not 0 <= gets < gpus or expert < 0:
        return None  # planner.edits names what is wrong
    row = layout_LP[layer]
    free = np.flatnonzero(row[gets * S:(gets + 1) * S] < 0)
    if free.size == 0:
        return None
    if np.any(row[gets * S:(gets + 1) * S] == expert):
        raise ValueError(f"GPU {gets} already holds expert {expert}")
    lay = np.array(layout_LP, dtype=np.int64)
    if action.kind == "move":
        if not 0 <= action.gpu < gpus or action.gpu == gets:
            return None
        held = np.flatnonzero(row[action.gpu * S:(action.gpu + 1) * S] == expert)
        if held.size == 0:
            raise ValueError(f"GPU {action.gpu} holds no replica of expert {expert}")
        lay[layer, action.gpu * S + held[0]] = -1
    lay[layer, gets * S + free[0]] = expert
    lay.setflags(write=False)
    return lay


def undo(session: EditSession) -> EditSession:
    """The session without its newest edit; ValueError when there is none."""
    if session.num_edits == 0:
        raise ValueError("nothing to undo")
    return EditSession(key=session.key, gpus=session.gpus, history=session.history[:-1], log=session.log[:-1])


def _picked(event: Any, param: str, field: str, limit: int) -> int | None:
    """The field's value of the first point a st.vega_lite_chart selection event holds under the point selection
    param ({"selection": {param: [{field: value}, ...]}}, or its "selection" part), as an int in 0..limit-1; None
    for no or an odd selection."""
    if not isinstance(event, Mapping) or not event:
        return None
    selection = event.get("selection", event)
    points = selection.get(param) if isinstance(selection, Mapping) else None
    point = points[0] if isinstance(points, (list, tuple)) and points else None
    value = point.get(field) if isinstance(point, Mapping) else None
    if isinstance(value, (list, tuple)):  # a point selection's store form: {field: [value]}
        value = value[0] if value else None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not number.is_integer() or not 0 <= number < limit:
        return None
    return int(number)


def clicked_gpu(event: Any, gpus: int) -> int | None:
    """GPU of a click on the per-GPU bars (GPU_PARAM's "gpu"), None for no or an odd selection."""
    return _picked(event, GPU_PARAM, "gpu", gpus)


def clicked_expert(event: Any, num_experts: int) -> int | None:
    """Logical expert of a click on a GPU's expert bars (EXPERT_PARAM's "expert"), None for no or
    an odd selection."""
    return _picked(event, EXPERT_PARAM, "expert", num_experts)


def gpu_experts(layout_LP: ArrayLike, counts_LE: ArrayLike, layer: int, gpu: int, gpus: int) -> list[dict]:
    """The slots of one GPU in one layer, heaviest first: [{slot, expert, replicas, tokens, load}] where
    load = tokens / replicas (the even-split share this GPU serves)."""
    lay = np.asarray(layout_LP, dtype=np.int64)
    c = np.asarray(counts_LE, dtype=np.float64)
    if not 0 <= layer < lay.shape[0]:
        raise ValueError(f"layer {layer} out of range 0..{lay.shape[0] - 1}")
    if not 0 <= gpu < gpus:
        raise ValueError(f"GPU {gpu} out of range 0..{gpus - 1}")
    S = lay.shape[1] // gpus
    rep = replica_counts(lay[layer:layer + 1], c.shape[1])[0]
    rows = [{"slot": int(p), "expert": int(lay[layer, p]), "replicas": int(rep[lay[layer, p]]),
             "tokens": float(c[layer, lay[layer, p]]), "load": float(c[layer, lay[layer, p]] / rep[lay[layer, p]])}
            if lay[layer, p] >= 0 else {"slot": int(p), "expert": -1, "replicas": 0, "tokens": 0.0, "load": 0.0}
            for p in range(gpu * S, (gpu + 1) * S)]
    return sorted(rows, key=lambda r: (-r["load"], r["slot"]))


def layout_json(layout_LP: ArrayLike) -> str:
    """SGLang --init-expert-location JSON: {"physical_to_logical_map": [[P ints] x L]} (-1 for an unused slot, as
    vLLM writes it)."""
    lay = np.asarray(layout_LP, dtype=np.int64)
    if lay.ndim != 2:
        raise ValueError(f"layout must be [layers, slots], got shape {lay.shape}")
    return json.dumps({"physical_to_logical_map": lay.tolist()})
