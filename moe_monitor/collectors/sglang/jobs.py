"""One checked SGLang dump turned into what the bridge publishes (a Job): step records and, for per_pass /
per_token dumps, the layout record when the dump's physical_to_logical_map changed and each pass's physical
record (its global_physical_count). Pure: bridge.py publishes and remembers.

Same-batch ranks (`--same-batch-ranks G`, no DP attention): rank 0's pass files are published for all G ranks
(world size 1, scope "dp-group"), the others left unread; stat rows are divided by G, and a row G does not
divide is refused. Why: docs/collectors.md. Shapes: T passes or rows of the dump, L layers, E experts, P slots.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from moe_monitor import core
from moe_monitor.core.sglang_dumps import PassDump, StatDump
from moe_monitor.core.sglang_records import Steps, pass_steps, stat_steps

from . import state as store
from .folder import DumpFile
from .stepids import StepIds


@dataclass
class Job:
    """A dump being published: records not landed yet (steps, physical counts), the layout record (until sent),
    what to save after."""

    file: DumpFile
    records: list[core.StepRecord]
    layout: core.LayoutRecord | None
    ids: StepIds
    layout_sha: str
    seen: store.Seen
    summary: str
    landed_by_rank: dict[int, int] = field(default_factory=dict)
    physical: list[core.PhysicalRecord] = field(default_factory=list)


def layout_sha(layout_LP: np.ndarray) -> str:
    """A digest of a physical_to_logical_map int [L, P]: a changed map is a new layout record."""
    data = np.ascontiguousarray(layout_LP, dtype="<i4")
    return hashlib.sha256(repr(data.shape).encode() + data.tobytes()).hexdigest()


def convert(dump_file: DumpFile, dump: StatDump | PassDump, run: str, meta: core.RunMeta, top_k: int, ids: StepIds,
            current_sha: str, instance: str, sample_tokens: int, every_s: float,
            same_batch_ranks: int = 1) -> Job | str:
    """The Job of one dump of run `run` that fits its metadata `meta` (layers and experts checked by the caller),
    its step ids from `ids` (a copy: the caller keeps it only once the job landed) and `current_sha` the digest of
    the layout in force (empty before the first); same_batch_ranks: G > 1 when G ranks route the same batch (module
    docstring). A str: why the dump holds nothing to publish. ValueError: the dump does not fit this run."""
    num_layers, num_experts = len(meta.layer_names), meta.num_experts
    dump_time_s = dump_file.named.time_s if 0 < dump_file.named.time_s < core.MAX_TIME_S \
        else dump_file.mtime_ns / 1e9
    new_sha = current_sha
    layout = None
    physical: list[core.PhysicalRecord] = []
    scope = "dp-group" if same_batch_ranks > 1 else "rank"
    if isinstance(dump, PassDump):
        if same_batch_ranks > 1 and dump.rank != 0:
            return f"rank {dump.rank} routes the batch rank 0 routes (--same-batch-ranks {same_batch_ranks}): not read"
        world = meta.world_size
        if dump.rank >= world:
            raise ValueError(f"rank {dump.rank} is not below the run's {world} ranks (its metadata): pass "
                             "--gpus with the number of expert-parallel ranks, under a new --run")
        steps = pass_steps(dump, top_k, sample_tokens)
        if not steps.phase_T:
            return "no forward passes recorded"
        step_T = ids.for_passes(dump.rank, dump.pass_id_T)
        time_s_T = ids.times(str(dump.rank), dump_time_s, dump.pass_id_T, every_s)
        digest = layout_sha(dump.layout_LP)
        if digest != current_sha:
            layout = core.LayoutRecord(
                run=run, step=int(step_T[0]), time_s=float(time_s_T[0]),
                layout_LP=dump.layout_LP.astype(np.int32), gpus=meta.layout.gpus,
                nodes=meta.layout.nodes, source="engine" if current_sha else "initial", rank=dump.rank,
                instance=instance).validate(num_experts, num_layers=num_layers)
            new_sha = digest
        mode = f"{dump.mode}, rank {dump.rank}"
        physical = physical_records(run, dump, step_T, time_s_T, meta.layout.gpus, instance)
    else:
        world = 1
        if same_batch_ranks > 1:
            dump = one_batch(dump, same_batch_ranks)
        steps = stat_steps(dump, top_k)
        if not steps.phase_T:
            return "every buffered row is zero"
        step_T = ids.for_rows(len(steps.phase_T))
        time_s_T = ids.times("stat", dump_time_s, np.arange(len(steps.phase_T)), every_s)
        mode = f"stat, {dump.logical_count_TLE.shape[0]} buffered rows"
    records = step_records(run, steps, step_T, time_s_T, world, instance, scope)
    total = sum(rec.tokens for rec in records)
    summary = (f"{dump_file.name} ({mode}): {len(records)} steps {int(step_T[0])}..{int(step_T[-1])}, "
               f"{total} tokens{'; layout change' if layout is not None and layout.source == 'engine' else ''}")
    return Job(dump_file, records, layout, ids, new_sha,
               store.Seen(dump_file.size_bytes, dump_file.mtime_ns, "published", steps=len(records)), summary,
               physical=physical)


def step_records(run: str, steps: Steps, step_T: np.ndarray, time_s_T: np.ndarray, world: int,
                 instance: str, scope: str = "rank") -> list[core.StepRecord]:
    """One StepRecord per pass or row of `steps`, under the step ids step_T [T] and times time_s_T [T]."""
    return [core.StepRecord(
        run=run, rank=steps.rank, world_size=world, step=int(step_T[t]), time_s=float(time_s_T[t]),
        phase=steps.phase_T[t], tokens=int(steps.tokens_T[t]), counts_LE=steps.counts_TLE[t],
        sample_ids_LNK=steps.sample_T[t], instance=instance, scope=scope) for t in range(len(steps.phase_T))]


def one_batch(dump: StatDump, ranks: int) -> StatDump:
    """A stat dump of `ranks` same-batch ranks with each token counted once: logical_count_TLE // ranks.
    ValueError when a count is not a multiple of `ranks` (the ranks did not route one batch)."""
    counts_TLE = dump.logical_count_TLE
    if (counts_TLE % ranks).any():
        raise ValueError(f"its counts are not all multiples of {ranks}: its ranks did not route the same batch "
                         f"(--same-batch-ranks {ranks} is for SGLang without DP attention)")
    return StatDump(counts_TLE // ranks)


def physical_records(run: str, dump: PassDump, step_T: np.ndarray, time_s_T: np.ndarray, gpus: int,
                     instance: str) -> list[core.PhysicalRecord]:
    """One PhysicalRecord per pass: its global_physical_count int32 [L, P] (this rank's tokens per slot)."""
    return [core.PhysicalRecord(
        run=run, step=int(step_T[t]), rank=dump.rank, time_s=float(time_s_T[t]),
        counts_LP=dump.physical_count_TLP[t], gpus=gpus, instance=instance, source="sglang")
        for t in range(len(dump.pass_id_T))]
