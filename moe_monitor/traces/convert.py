"""convert(IN, OUT) -> a .parquet or .arrows trace, from: a trace (JSON lines, .arrows, .parquet), an SGLang
expert-distribution dump (.pt: stat, per_pass or per_token; torch imported only for them), an SGLang
logical_count JSON ([L, E] or [T, L, E]), a TensorRT-LLM EXPERT_STATISTIC_PATH folder (traces/trtllm.py), an
UltraEP trace (traces/ultraep.py: physical loads go to the physical sidecar), Megatron-LM's tokens_per_expert
logging (traces/megatron_tokens.py) or vLLM's saved EPLB load window (core/eplb_window.py). Layer timings and
physical records of a trace go along with their steps. describe(IN) says what convert would read and write
(`moe-monitor info`). Every input is refused before it is decoded when what is built from it (its declared shape,
not only its bytes) is over the decoded-bytes budget (core/budget.py). What each input becomes: docs/traces.md.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import numpy as np

from moe_monitor import core
from moe_monitor.core.budget import check_decoded, decoded_budget_bytes
from moe_monitor.core.tracefile import open_trace
from moe_monitor.core.tracefile.side import read_physical, write_physical
from moe_monitor.core.tracefile.writers import open_writer

CHUNK_STEPS = 512
MAX_JSON_BYTES = 1 << 30
# A cell of the [T, L, E] counts an importer builds: int64 sums, the float64 / int32 copies made on the way and
# one chunk of step records (each step's int32 [L, E]); checked from the declared shape before building.
CELL_BYTES = 24


def convert(src: str, dst: str, run: str | None = None, gpus: int | None = None, phase: str = "unknown",
            top_k: int = 8, max_decoded_bytes: int | None = None) -> int:
    """Write src as the trace dst; returns the steps written. ValueError (one line) on bad input, or an input
    that decodes to more than max_decoded_bytes (None: the budget of core/budget.py)."""
    if os.path.abspath(src) == os.path.abspath(dst):
        raise ValueError("IN and OUT are the same file")
    open_writer_check(dst)
    budget = decoded_budget_bytes() if max_decoded_bytes is None else max_decoded_bytes
    found = open_import(src, run, gpus, phase, top_k, budget)
    if found is not None:
        _, meta, steps, physical = found
        return _write(dst, meta, [], ((records, []) for records in steps), [], physical)
    reader = open_trace(src, budget)
    try:
        tl = reader.timeline()
        meta = reader.meta if run is None else _renamed(reader.meta, run)

        def chunks() -> Iterator[tuple[list[core.StepRecord], list[core.TimingRecord]]]:
            low = 0  # timings from here on not handed out yet
            for a in range(0, max(tl.num_steps, 1), CHUNK_STEPS):
                b = min(tl.num_steps, a + CHUNK_STEPS) - 1
                last = int(tl.step_T[b]) if b >= 0 else -1
                records = reader.read_steps(int(tl.step_T[a]), last) if b >= 0 else []
                high = last if b + 1 < tl.num_steps else core.MAX_STEP - 1  # the last chunk takes any later ones
                timings = reader.read_timings(low, high)
                low = high + 1
                if run:
                    records = [_with_run(rec, meta.run) for rec in records]
                    timings = [_timing_run(rec, meta.run) for rec in timings]
                yield records, timings

        layouts = [_layout_run(rec, meta.run) for rec in reader.layouts]
        physical = read_physical(src, meta.run, budget).records  # its sidecar, when the trace has one
        return _write(dst, meta, layouts, chunks(), reader.gpu_samples(), physical)
    finally:
        reader.close()


def open_import(src: str, run: str | None = None, gpus: int | None = None, phase: str = "unknown", top_k: int = 8,
                budget: int | None = None):
    """(kind, meta, step-record chunks, physical records) of an input convert imports (every kind but a trace),
    None for a trace; ValueError for a folder of none of the kinds, or bad input."""
    budget = decoded_budget_bytes() if budget is None else budget
    name = os.path.basename(os.path.normpath(src))
    from .trtllm import is_statistic_folder
    from .ultraep import find_manifest
    manifest = find_manifest(src)
    if manifest is not None:
        return ("UltraEP load trace", *_ultraep_trace(manifest, run, gpus, top_k, budget))
    if is_statistic_folder(src):
        return ("TensorRT-LLM expert statistic", *_trtllm_statistic(src, run, gpus, budget), [])
    from .megatron_tokens import looks_like_megatron_tokens, read_megatron_tokens
    if looks_like_megatron_tokens(src):  # before the JSON-lines traces: both are .jsonl
        return ("Megatron tokens_per_expert", *read_megatron_tokens(src, run, gpus, budget, top_k=top_k), [])
    if os.path.isdir(src):
        raise ValueError(f"{src}: a folder is read as a TensorRT-LLM EXPERT_STATISTIC_PATH (meta_info.json, "
                         f"rank<r>.safetensors), an UltraEP trace (*.manifest.json) or Megatron's tokens_per_expert "
                         f"logging (rank<r>.jsonl); it holds none of them")
    if name.lower().endswith((".pt", ".pth")):
        return ("SGLang expert-distribution dump", *_sglang_dump(src, run, gpus, top_k, budget), [])
    if name.lower().endswith(".safetensors") and os.path.isfile(src):
        return ("vLLM EPLB load window", *_eplb_window(src, run, gpus, top_k, budget), [])
    if name.lower().endswith(".json") and _looks_like_logical_count(src):
        return ("SGLang logical_count JSON", *_logical_count_json(src, run, gpus, phase, top_k, budget), [])
    return None


def describe(src: str, top_k: int = 8, max_decoded_bytes: int | None = None) -> dict | None:
    """What convert would read from src and write (None for a trace: its reader describes it): kind, the run's
    layers, experts, slots, GPUs and ranks, steps and step ids, records, physical records. Reads src within the
    same bounds as convert, keeps no record."""
    found = open_import(src, top_k=top_k, budget=max_decoded_bytes)
    if found is None:
        return None
    kind, meta, chunks, physical = found
    steps: set[int] = set()
    records = 0
    for chunk in chunks:
        records += len(chunk)
        steps.update(rec.step for rec in chunk)
    return {"path": src, "kind": kind, "run": meta.run, "model_name": meta.model_name,
            "layers": len(meta.layer_names), "experts": meta.num_experts,
            "slots": len(meta.layout.physical_to_logical_map[0]), "gpus": meta.layout.gpus,
            "ranks": meta.world_size, "top_k": meta.top_k, "steps": len(steps),
            "first_step": min(steps) if steps else None, "last_step": max(steps) if steps else None,
            "records": records, "physical_records": len(physical),
            "becomes": f"a trace of {len(steps)} steps x {len(meta.layer_names)} layers x {meta.num_experts} experts"
                       + (f" and a physical sidecar of {len(physical)} records" if physical else ""),
            "extra": {k: v for k, v in meta.extra.items() if isinstance(v, (str, int, float))}}


def open_writer_check(dst: str) -> None:
    if not dst.lower().endswith((".parquet", ".arrows")):
        raise ValueError(f"{dst}: OUT must end in .parquet (archive) or .arrows (recording)")


def _write(dst: str, meta: core.RunMeta, layouts, chunks, samples, physical=()) -> int:
    """chunks: (step records, layer timings) pairs in step order; physical: core.PhysicalRecords, written to the
    trace's physical sidecar (core/tracefile/side.py; none: a stale one is removed)."""
    writer = open_writer(dst, meta, layouts)
    steps = 0
    try:
        for records, timings in chunks:
            writer.write(records, (), timings)
            steps += len({rec.step for rec in records})
        writer.write([], samples)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    write_physical(dst, list(physical))
    return steps


def _renamed(meta: core.RunMeta, run: str):
    import dataclasses
    return dataclasses.replace(meta, run=core.check_run_name(run))


def _with_run(rec: core.StepRecord, run: str) -> core.StepRecord:
    import dataclasses
    return dataclasses.replace(rec, run=run)


def _timing_run(rec: core.TimingRecord, run: str) -> core.TimingRecord:
    import dataclasses
    return dataclasses.replace(rec, run=run)


def _layout_run(rec: core.LayoutRecord, run: str) -> core.LayoutRecord:
    import dataclasses
    return dataclasses.replace(rec, run=run)


def _looks_like_logical_count(path: str) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(4096)
    return head.lstrip().startswith(b"{") and b'"logical_count"' in head


def _meta_for(run: str, model: str, num_layers: int, num_experts: int, gpus: int | None, top_k: int,
              layout_rows=None, world: int = 1, extra: dict | None = None,
              layer_names: list[str] | None = None) -> core.RunMeta:
    num_slots = len(layout_rows[0]) if layout_rows is not None else num_experts
    gpus = gpus or next(g for g in (32, 16, 8, 4, 2, 1) if num_slots % g == 0)
    if num_slots % gpus:
        raise ValueError(f"{num_slots} slots do not split over --gpus {gpus}")
    rows = layout_rows if layout_rows is not None else core.contiguous_layout(num_layers, num_experts)
    meta = core.RunMeta(run=core.check_run_name(run), model_name=model,
                        layer_names=layer_names or [f"layer{i}" for i in range(num_layers)], num_experts=num_experts,
                        top_k=top_k,
                        hidden_size=0, moe_intermediate_size=0, dtype_bytes=2, layout=core.Layout(gpus, 1, rows),
                        world_size=world, started_s=time.time(), extra=extra or {})
    core.encode_meta(meta)
    return meta


def _steps_of(run: str, counts_TLE: np.ndarray, phases, tokens_T, rank: int = 0, world: int = 1,
              time0_s: float = 0.0, samples=None, step_T=None) -> Iterator[list[core.StepRecord]]:
    """Step records of counts_TLE [T, L, E], CHUNK_STEPS at a time: step ids step_T [T] (default 0..T-1), one
    second apart from time0_s (the first step's)."""
    step_T = np.arange(counts_TLE.shape[0]) if step_T is None else np.asarray(step_T, dtype=np.int64)
    for a in range(0, counts_TLE.shape[0], CHUNK_STEPS):
        yield [core.StepRecord(run=run, rank=rank, world_size=world, step=int(step_T[t]),
                               time_s=time0_s + int(step_T[t] - step_T[0]), phase=phases[t],
                               tokens=int(tokens_T[t]), counts_LE=counts_TLE[t].astype(np.int32),
                               sample_ids_LNK=None if samples is None else samples[t], instance="converted")
               for t in range(a, min(counts_TLE.shape[0], a + CHUNK_STEPS))]


def _logical_count_json(path: str, run: str | None, gpus: int | None, phase: str, top_k: int, budget: int):
    from moe_monitor.core.counts import as_counts
    from moe_monitor.core.jsonbudget import numbers_array, read_bounded
    size = os.path.getsize(path)
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{path}: larger than {MAX_JSON_BYTES} bytes")
    name = f"{os.path.basename(path)}: logical_count"
    obj = read_bounded(path, "logical_count JSON", budget)  # its worst case counted before json.loads
    found = obj.get("logical_count") if isinstance(obj, dict) else None
    if not isinstance(found, list):
        raise ValueError(f"{name} must be a list [layers][experts] or [steps][layers][experts]")
    counts = as_counts(numbers_array(found, name), name, ndim=(2, 3))
    check_decoded(f"{name} {list(counts.shape)}", counts.size * CELL_BYTES, budget)
    if counts.ndim == 2:
        counts = counts[None]
    if (counts != np.round(counts)).any() or counts.max(initial=0) > np.iinfo(np.int32).max:
        raise ValueError(f"{path}: logical_count must hold whole numbers below 2**31")
    if phase not in core.PHASES:
        raise ValueError(f"--phase must be one of {core.PHASES}")
    stem = os.path.basename(path).rsplit(".", 1)[0]
    meta = _meta_for(run or _run_name(stem), "sglang logical_count", counts.shape[1], counts.shape[2], gpus, top_k,
                     extra={"source": "sglang logical_count JSON", "file": os.path.basename(path)[:200]})
    tokens_T = (counts.sum(axis=2).max(axis=1) + top_k // 2) // max(1, top_k)
    return meta, _steps_of(meta.run, counts.astype(np.int64), [phase] * counts.shape[0], tokens_T,
                           time0_s=float(int(os.path.getmtime(path))))


def _sglang_dump(path: str, run: str | None, gpus: int | None, top_k: int, budget: int):
    from moe_monitor.core.sglang_dumps import PassDump, parse_name, read_dump
    from moe_monitor.core.sglang_records import pass_steps, stat_steps, top_k_of

    dump = read_dump(path, max_bytes=4 << 30, max_decoded_bytes=budget)
    named = parse_name(os.path.basename(path))
    time0_s = named.time_s if named is not None else float(int(os.path.getmtime(path)))
    stem = _run_name(os.path.basename(path).rsplit(".", 1)[0])
    if isinstance(dump, PassDump):
        k = top_k_of(dump) or top_k
        steps = pass_steps(dump, k)
        meta = _meta_for(run or stem, "sglang per-pass dump", dump.num_layers, dump.num_experts, gpus, k,
                         layout_rows=dump.layout_LP.tolist(), world=max(dump.rank + 1, 1),
                         extra={"source": f"sglang {dump.mode} dump", "file": os.path.basename(path)[:200]})
        step_ids = steps.position_T - int(steps.position_T[0]) if steps.position_T.size else steps.position_T
        chunks = ([_step(meta.run, steps, t, int(step_ids[t]), dump.rank, meta.world_size, time0_s)
                   for t in range(a, min(len(step_ids), a + CHUNK_STEPS))]
                  for a in range(0, len(step_ids), CHUNK_STEPS))
        return meta, chunks
    steps = stat_steps(dump, top_k)
    meta = _meta_for(run or stem, "sglang stat dump", dump.num_layers, dump.num_experts, gpus, top_k,
                     extra={"source": "sglang stat dump", "file": os.path.basename(path)[:200]})
    return meta, _steps_of(meta.run, steps.counts_TLE, steps.phase_T, steps.tokens_T, time0_s=time0_s)


def _eplb_window(path: str, run: str | None, gpus: int | None, top_k: int, budget: int):
    """vLLM's saved EPLB load window -> (meta, step chunks): one step per window row ([W, L, E]; vLLM's ring
    buffer order, not time order) or one step ([L, E], the window's sum); phase unknown, contiguous layout."""
    from moe_monitor.core.eplb_window import read_window
    from moe_monitor.core.sglang_records import tokens_from_counts
    window = read_window(path, budget)
    counts = window.counts_XLE if window.counts_XLE.ndim == 3 else window.counts_XLE[None]
    check_decoded(f"{os.path.basename(path)}: {list(counts.shape)} counts", counts.size * CELL_BYTES, budget)
    stem = os.path.basename(path).rsplit(".", 1)[0]
    meta = _meta_for(run or _run_name(stem), "vllm eplb load window", counts.shape[1], counts.shape[2], gpus, top_k,
                     extra={"source": "vllm global_expert_load_window", "file": os.path.basename(path)[:200],
                            "tensor": window.tensor[:200], "other_tensors": [n[:200] for n in window.others[:16]],
                            "rows": "window rows in vLLM's ring-buffer order" if window.counts_XLE.ndim == 3
                            else "the window summed"})
    return meta, _steps_of(meta.run, counts, ["unknown"] * counts.shape[0], tokens_from_counts(counts, top_k),
                           time0_s=float(int(os.path.getmtime(path))))


def _trtllm_statistic(folder: str, run: str | None, gpus: int | None, budget: int):
    """A TensorRT-LLM EXPERT_STATISTIC_PATH folder -> (meta, step chunks): one step per iteration (step id = the
    iteration), the rank files summed (rank 0 of world 1), layers named by the model's indices, the layout
    contiguous over --gpus (default: meta_info's ep_size, else the rank files, when they divide E)."""
    from moe_monitor.core.sglang_records import tokens_from_counts

    from .trtllm import META_NAME, read_statistic
    stat = read_statistic(folder, budget)
    num_slots = stat.num_slots
    for guess in (stat.meta_info.get("ep_size"), len(stat.ranks)):
        if gpus is None and type(guess) is int and 1 <= guess <= num_slots and num_slots % guess == 0:
            gpus = guess
    name = os.path.basename(os.path.normpath(folder))
    meta = _meta_for(run or _run_name(name), "tensorrt-llm expert statistic", len(stat.layer_L), num_slots, gpus,
                     stat.top_k, layer_names=[f"layer{int(i)}" for i in stat.layer_L],
                     extra={"source": "tensorrt-llm EXPERT_STATISTIC_PATH", "folder": name[:200],
                            "rank_files": len(stat.ranks), "iterations": [int(stat.iter_T[0]), int(stat.iter_T[-1])]})
    tokens_T = stat.tokens_T if stat.tokens_T is not None else tokens_from_counts(stat.counts_TLE, stat.top_k)
    time0_s = float(int(os.path.getmtime(os.path.join(folder, META_NAME))))
    return meta, _steps_of(meta.run, stat.counts_TLE, ["unknown"] * len(stat.iter_T), tokens_T, time0_s=time0_s,
                           step_T=stat.iter_T)


def _ultraep_trace(manifest: str, run: str | None, gpus: int | None, top_k: int, budget: int):
    """An UltraEP trace -> (meta, step chunks, physical records): one step per microbatch holding every layer
    (step id = the microbatch), pre_logical_loads as its counts [L, E], post_physical_loads as its
    core.PhysicalRecord [L, P] (source "runtime", gpus = ep_size), rank 0 of world 1 (the EP group's totals).
    The layout is the masters' (contiguous over ep_size GPUs): the replicas move every microbatch, unrecorded."""
    from moe_monitor.core.sglang_records import tokens_from_counts

    from .ultraep import read_trace
    trace = read_trace(manifest, budget)
    man = trace.manifest
    if not len(trace.step_T):
        raise ValueError(f"{os.path.basename(manifest)}: no microbatch holds every layer ({trace.incomplete} "
                         f"incomplete)")
    if gpus is not None and gpus != man.ep_size:
        raise ValueError(f"--gpus {gpus}: an UltraEP trace's GPUs are its ep_size, {man.ep_size}")
    meta = _meta_for(run or _run_name(man.trace_id), "ultraep load trace", len(trace.layer_L), man.num_experts,
                     man.ep_size, top_k, layer_names=[f"layer{int(i)}" for i in trace.layer_L],
                     extra={"source": "ultraep ultra_ep_trace_v1", "trace_id": man.trace_id,
                            "slots_per_gpu": man.slots_per_gpu, "redundant_per_gpu": man.slots_per_gpu - man.masters,
                            "placement_mode": str(man.raw.get("placement_mode", ""))[:40],
                            "record_interval": man.raw.get("record_interval"), "chunks": trace.chunk_files,
                            "dropped_records": man.dropped_records, "incomplete_microbatches": trace.incomplete,
                            "repeated_records": trace.repeated,
                            "layout": "masters only (UltraEP re-places its replicas every microbatch, unrecorded)"})
    created = man.raw.get("created_unix")
    time0_s = float(created) if isinstance(created, (int, float)) and 0 <= created < core.MAX_TIME_S / 2 \
        else float(int(os.path.getmtime(manifest)))
    tokens_T = tokens_from_counts(trace.pre_TLE, top_k)
    steps = _steps_of(meta.run, trace.pre_TLE, ["unknown"] * len(trace.step_T), tokens_T, time0_s=time0_s,
                      step_T=trace.step_T)
    physical = [core.PhysicalRecord(run=meta.run, step=int(step), rank=0,
                                    time_s=time0_s + int(step - trace.step_T[0]), counts_LP=trace.post_TLP[t],
                                    gpus=man.ep_size, instance="converted", source="runtime")
                for t, step in enumerate(trace.step_T)]
    return meta, steps, physical


def _step(run, steps, t: int, step_id: int, rank: int, world: int, time0_s: float) -> core.StepRecord:
    return core.StepRecord(run=run, rank=rank, world_size=world, step=step_id, time_s=time0_s + step_id * 1e-3,
                           phase=steps.phase_T[t], tokens=int(steps.tokens_T[t]), counts_LE=steps.counts_TLE[t],
                           sample_ids_LNK=steps.sample_T[t], instance="converted")


def _run_name(stem: str) -> str:
    import re
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)[:128].strip("-") or "converted"
    return name


def logical_count_of(path: str) -> list:
    """The logical_count list of a JSON file (for tests and tools)."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["logical_count"]
