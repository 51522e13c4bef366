"""The run's metadata (core.RunMeta) from its first dump, and the GPUs of its layout (pure, no I/O).

GPUs of the layout: `gpus` when given, else for per_pass / per_token dumps the number of ranks whose dump
files are in the folder when the first one is read (SGLang writes one file per rank, and its ranks are the
expert-parallel GPUs) when that divides the slots P, else the largest of 32, 16, 8, 4, 2, 1 that divides P;
for stat dumps (no layout in them) a contiguous layout over core.default_gpus(E). per_pass / per_token runs
have one rank per GPU (world size = GPUs); stat rows are summed over ranks (world size 1). With same_batch_ranks
G > 1 (the G ranks route the same batch: SGLang without DP attention) rank 0 publishes for all of them (world size
1) and the layout spans G GPUs unless `gpus` says otherwise.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from moe_monitor import core
from moe_monitor.core.sglang_dumps import PassDump, StatDump


class ConfigError(Exception):
    """The bridge cannot go on with these settings (exit code 2); str() says what to pass."""


@dataclass(frozen=True)
class MetaSettings:
    """What the command line says about the run: gpus (None: chosen as above), nodes, model name, sampled
    rows per pass (per_token), the dump folder (recorded in the metadata's extra)."""

    gpus: int | None = None
    nodes: int = 1
    model_name: str = ""
    sample_tokens: int = 16
    dump_dir: str = ""
    dispatch_algorithm: str | None = None  # SGLang's --ep-dispatch-algorithm (None: not set)
    same_batch_ranks: int = 1


# SGLang's --ep-dispatch-algorithm -> core.dispatch policy (docs/definitions.md, "Dispatch policy"): static sends
# every token of an expert from one source rank to that rank's fixed replica (from counts summed over the ranks:
# a fixed, even split over the replicas, rounded: round_robin); dynamic and fake pick a replica at random per token
# (even in expectation); lp splits by the probabilities its LP solved (lp). Unset: no replica choice to make, or
# static once EPLB or --init-expert-location is on (SGLang's own default then).
SGLANG_DISPATCH = {"static": "round_robin", "dynamic": "even", "fake": "even", "lp": "lp"}


def sglang_dispatch(algorithm: str | None) -> str:
    """The dispatch policy of SGLang's --ep-dispatch-algorithm (None: unset -> round_robin, SGLang's static
    default whenever there are replicas); ConfigError for a value SGLang does not have."""
    if algorithm is None:
        return SGLANG_DISPATCH["static"]
    if algorithm not in SGLANG_DISPATCH:
        raise ConfigError(f"--ep-dispatch-algorithm {algorithm!r} is not one of {', '.join(SGLANG_DISPATCH)}")
    return SGLANG_DISPATCH[algorithm]


def layout_gpus(dump: StatDump | PassDump, gpus: int | None, ranks_seen: int) -> tuple[int, str]:
    """(GPUs of the layout, how they were chosen: for the log)."""
    if isinstance(dump, StatDump):
        chosen = gpus or core.default_gpus(dump.num_experts)
        return chosen, "--gpus" if gpus else "default"
    if gpus:
        return gpus, "--gpus"
    if ranks_seen and dump.num_slots % ranks_seen == 0:
        return ranks_seen, f"{ranks_seen} ranks wrote dumps"
    return next(g for g in (32, 16, 8, 4, 2, 1) if dump.num_slots % g == 0), "default"


def run_meta_for(run: str, dump: StatDump | PassDump, top_k: int, ranks_seen: int, settings: MetaSettings,
                 instance: str) -> tuple[core.RunMeta, str]:
    """(the run's metadata, one line describing it). ConfigError when the GPUs and nodes do not fit."""
    same_batch = settings.same_batch_ranks > 1
    gpus, how = layout_gpus(dump, settings.gpus, settings.same_batch_ranks if same_batch else ranks_seen)
    if isinstance(dump, PassDump):
        rows = dump.layout_LP.tolist()
        world = 1 if same_batch else gpus
        if same_batch and not settings.gpus:
            how = f"--same-batch-ranks {settings.same_batch_ranks}"
        said = f"SGLang's physical_to_logical_map ({dump.num_slots} slots) over {gpus} GPUs ({how})"
    else:
        rows = core.contiguous_layout(dump.num_layers, dump.num_experts)
        world = 1
        said = f"contiguous over {gpus} GPUs ({how}; stat dumps hold no layout)"
    if gpus % settings.nodes or len(rows[0]) % gpus:
        raise ConfigError(f"{len(rows[0])} slots do not split over --gpus {gpus} in --nodes {settings.nodes}")
    sampled = isinstance(dump, PassDump) and dump.topk_ids_T is not None \
        and dump.num_experts <= core.MAX_SAMPLE_EXPERTS
    meta = core.RunMeta(
        run=run, model_name=settings.model_name, layer_names=[f"layer{i}" for i in range(dump.num_layers)],
        num_experts=dump.num_experts, top_k=top_k, hidden_size=0, moe_intermediate_size=0, dtype_bytes=2,
        layout=core.Layout(gpus, settings.nodes, rows), world_size=world, started_s=time.time(),
        host=socket.gethostname()[:core.MAX_NAME_CHARS], sample_tokens_per_layer=settings.sample_tokens if sampled else 0,
        extra={"source": "sglang-bridge", "dump_dir": os.path.abspath(settings.dump_dir)[:1000]}, instance=instance,
        dispatch=sglang_dispatch(settings.dispatch_algorithm))
    try:
        core.encode_meta(meta)
    except ValueError as exc:
        raise ConfigError(f"the run's metadata does not fit: {exc}") from None
    return meta, (f"run {run}: {dump.num_layers} layers x {dump.num_experts} experts, top-{top_k}, "
                  f"layout {said}")
