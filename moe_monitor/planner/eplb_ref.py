"""EPLB-parity policies, written from the published description of DeepSeek's EPLB (no code copied).

global: replicate every extra slot onto the expert with the largest load per replica, then pack the
P physical replicas onto G GPUs with exactly S = P / G slots each, heaviest replica first onto the
lightest GPU with a free slot. Like EPLB it may put two replicas of one expert on one GPU.
hierarchical: pack Q groups of consecutive experts onto M nodes (Q/M each, balanced packing on group
totals), replicate within each node with its P / M slots, then pack each node's replicas onto its
G / M GPUs. Like EPLB, its node loads are fixed by the group packing ("group floor").

Shapes: weight_LE [L, E] token counts; returns layout_LP [L, P] int64 (slot p on GPU p // S).
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.counts import as_counts

from .loads import check_shape
from .pack import balanced_pack, expand_replicas, layout_from_bins, replicate_greedy


def eplb_global(weight_LE, gpus: int, redundant: int) -> np.ndarray:
    """EPLB's global policy: layout [L, E + redundant]."""
    w = as_counts(weight_LE)
    L, E = w.shape
    check_shape(E, gpus, redundant)
    rep_LE = replicate_greedy(w, E + redundant)
    phys_LP = expand_replicas(rep_LE)
    per_rep_LP = np.take_along_axis(w / rep_LE, phys_LP, axis=1)
    bin_LP = balanced_pack(per_rep_LP, gpus)
    return layout_from_bins(phys_LP, bin_LP, gpus)


def check_hierarchy(num_experts: int, gpus: int, redundant: int, nodes: int, groups: int) -> None:
    """ValueError unless Q groups split E evenly, M nodes split G, K and the R spares evenly."""
    if nodes < 1 or groups < 1:
        raise ValueError(f"--nodes and --groups must be >= 1, got {nodes} and {groups}")
    if num_experts % groups:
        raise ValueError(f"{num_experts} experts do not split into {groups} equal groups")
    if groups % nodes:
        raise ValueError(f"{groups} groups do not split evenly over {nodes} nodes")
    if gpus % nodes:
        raise ValueError(f"{gpus} GPUs do not split evenly over {nodes} nodes")
    if redundant % nodes:
        raise ValueError(f"{redundant} redundant slots do not split evenly over {nodes} nodes")


def group_to_node(weight_LE: np.ndarray, nodes: int, groups: int) -> np.ndarray:
    """Node of every group, [L, K]: balanced packing of group totals, Q/M groups per node."""
    L, E = weight_LE.shape
    group_LQ = weight_LE.reshape(L, groups, E // groups).sum(-1)
    return balanced_pack(group_LQ, nodes)


def eplb_hierarchical(weight_LE, gpus: int, redundant: int, nodes: int, groups: int) -> np.ndarray:
    """EPLB's hierarchical policy: layout [L, E + redundant]; node n owns GPUs n*G/M ... and all replicas
    of the experts in its groups."""
    w = as_counts(weight_LE)
    L, E = w.shape
    check_shape(E, gpus, redundant)
    check_hierarchy(E, gpus, redundant, nodes, groups)
    gsize = E // groups
    node_LQ = group_to_node(w, nodes, groups)
    # experts of each node, node-major, group order kept (like EPLB's log->mlog map)
    node_LE = np.repeat(node_LQ, gsize, axis=1)
    order_LE = np.argsort(node_LE * E + np.arange(E), axis=1, kind="stable")
    per_node = E // nodes
    mlog_LNe = order_LE.reshape(L * nodes, per_node)
    wm = np.take_along_axis(w, order_LE, axis=1).reshape(L * nodes, per_node)
    slots_node = (E + redundant) // nodes
    rep = replicate_greedy(wm, slots_node)
    phys = expand_replicas(rep)
    per_rep = np.take_along_axis(wm / rep, phys, axis=1)
    bins = balanced_pack(per_rep, gpus // nodes)
    local = layout_from_bins(phys, bins, gpus // nodes)
    glob = np.take_along_axis(mlog_LNe, local, axis=1)
    return glob.reshape(L, E + redundant)
