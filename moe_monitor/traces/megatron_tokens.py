"""Megatron-LM's tokens-per-expert JSON lines (--save-tokens-per-expert-interval) -> per-iteration step records.

Each rank r appends to `{--save}/tokens_per_expert/rank{r}.jsonl` one line per MoE layer and saved iteration,
    {"iter": 100, "block": "decoder", "layer": 3, "tpe": [[128, 64], [96, 80]]}   (tpe: per micro-batch, local experts)
read here as one step per iteration (phase "train", micro-batches summed), rank r's experts at (r % gpus) *
E_local ... (Megatron's contiguous placement); a path is one rank file or the folder (every rank's file). A later
line for the same iteration and layer replaces an earlier one (a resumed run). The files' size is checked against
the decoded-bytes budget (core/budget.py) first; a bad line is one ValueError naming file and line.
Shapes: T iterations, L MoE layers, E experts (E_local per rank). Format and caveats: docs/megatron.md.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np

from moe_monitor import core
from moe_monitor.core.budget import check_decoded

RANK_FILE = re.compile(r"rank(\d{1,6})\.jsonl")
JSON_BYTE_COST = 8  # a byte of JSON decoded: a list slot, then a numpy element
# A cell of what is built from the declared shape: each (iteration, rank) record's [L, E] as int64 then int32 in a
# chunk of step records, and the int32 trace the readers then decode (the output must open within the budget).
CELL_BYTES = 4
CHUNK_CELL_BYTES = 16
_HEAD = re.compile(rb'\s*\{\s*"(iter|block|layer|tpe|mtp_idx)"\s*:')
MAX_LINE_BYTES = 64 << 20
CHUNK_STEPS = 512
_KEYS = ("iter", "block", "layer", "tpe")
LayerKey = tuple[str, int, int]  # (block, mtp_idx (-1 for the decoder), layer)


def looks_like_megatron_tokens(path: str) -> bool:
    """A rank{r}.jsonl (or any .jsonl) that starts as a tokens-per-expert record (an object whose keys are
    Megatron's: iter, block, layer, tpe), or a folder holding such files. Reads the first 4 KiB of one file,
    never a whole line (a line of 65,536 experts is longer than any bound on a first line)."""
    if os.path.isdir(path):
        files = _rank_files(path)
        return bool(files) and looks_like_megatron_tokens(files[0][1])
    if not path.lower().endswith(".jsonl") or not os.path.isfile(path):
        return False
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if _HEAD.match(head) is None:
        return False
    keys = set(re.findall(rb'"([a-z_]{1,8})"\s*:', head.split(b"\n", 1)[0]))
    return {key.encode() for key in _KEYS} <= keys


def read_megatron_tokens(path: str, run: str | None, gpus: int | None, max_decoded_bytes: int, *,
                         top_k: int = 8) -> tuple[core.RunMeta, Iterator[list[core.StepRecord]]]:
    """(the run's metadata, step records in chunks of at most CHUNK_STEPS iterations, every rank's record of an
    iteration in the same chunk) of a tokens_per_expert folder or one rank{r}.jsonl (module docstring). gpus:
    the expert-parallel size; top_k: the model's (for the metadata and the tokens). ValueError on any bad
    input, one line naming the file."""
    files = _rank_files(path) if os.path.isdir(path) else [(_rank_of(path), path)]
    if not files:
        raise ValueError(f"{path}: no rank<r>.jsonl files of Megatron's tokens_per_expert logging in this folder")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a whole number >= 1, got {top_k!r}")
    size = sum(_size(file) for _, file in files)
    check_decoded(f"{path}: its JSON lines", size * JSON_BYTE_COST, max_decoded_bytes)
    for rank, file in files:
        if rank >= core.MAX_WORLD:
            raise ValueError(f"{os.path.basename(file)}: rank {rank} is not below {core.MAX_WORLD} (the readers' "
                             "bound on a world)")
    per_rank = {rank: _read_file(file) for rank, file in files}
    widths = {width for _, width in per_rank.values() if width}
    if len(widths) > 1:
        raise ValueError(f"{path}: the rank files disagree on the number of local experts ({sorted(widths)})")
    local = widths.pop() if widths else 0
    if local == 0:
        raise ValueError(f"{path}: no tokens_per_expert record with any expert")
    world = max(rank for rank, _ in files) + 1 if len(files) > 1 else _rank_of(path) + 1
    ep = gpus if gpus is not None else (len(files) if len(files) > 1 else 1)
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"gpus (the expert-parallel size) must be a whole number >= 1, got {gpus!r}")
    num_experts = local * ep
    keys = sorted({key for records, _ in per_rank.values() for by_layer in records.values() for key in by_layer})
    core.check_sizes(len(keys), num_experts)
    records = sum(len(records) for records, _ in per_rank.values())
    chunk = min(records, CHUNK_STEPS * len(per_rank))
    check_decoded(f"{path}: {records} (iteration, rank) records of {len(keys)} layers x {num_experts} experts",
                  (records * CELL_BYTES + chunk * CHUNK_CELL_BYTES) * len(keys) * num_experts, max_decoded_bytes)
    names = [f"decoder.layers.{layer}" if block == "decoder" else f"mtp.{mtp}.layers.{layer}"
             for block, mtp, layer in keys]
    stem = os.path.basename(os.path.dirname(os.path.abspath(path)) if os.path.isdir(path) else
                            os.path.dirname(os.path.dirname(os.path.abspath(path))) or path)
    meta = core.RunMeta(
        run=core.check_run_name(run or _run_name(f"{stem}-tokens-per-expert")),
        model_name="megatron tokens_per_expert", layer_names=names, num_experts=num_experts, top_k=top_k,
        hidden_size=0, moe_intermediate_size=0, dtype_bytes=2, world_size=world,
        layout=core.Layout(ep, 1, core.contiguous_layout(len(keys), num_experts)),
        started_s=float(int(max(os.path.getmtime(file) for _, file in files))),
        extra={"source": "megatron --save-tokens-per-expert-interval", "file": os.path.basename(path)[:200],
               "expert_parallel": ep})
    core.decode_meta(core.encode_meta(meta))  # the readers' bounds, before anything is written
    return meta, _chunks(meta, per_rank, keys, local, ep, top_k)


def _chunks(meta: core.RunMeta, per_rank: dict[int, tuple[dict[int, dict[LayerKey, np.ndarray]], int]],
            keys: list[LayerKey], local: int, ep: int, top_k: int) -> Iterator[list[core.StepRecord]]:
    row = {key: i for i, key in enumerate(keys)}
    iters = sorted({it for records, _ in per_rank.values() for it in records})
    for a in range(0, len(iters), CHUNK_STEPS):
        chunk = []
        for it in iters[a: a + CHUNK_STEPS]:
            for rank in sorted(per_rank):
                by_layer = per_rank[rank][0].get(it)
                if by_layer is None:
                    continue
                counts_LE = np.zeros((len(keys), meta.num_experts), dtype=np.int64)
                first = (rank % ep) * local
                for key, counts_E in by_layer.items():
                    if counts_E.shape[0]:
                        counts_LE[row[key], first: first + local] = counts_E
                if counts_LE.max(initial=0) > np.iinfo(np.int32).max:
                    raise ValueError(f"iteration {it} of rank {rank}: a count above 2**31")
                tokens = int((counts_LE.sum(axis=1).max() + top_k // 2) // top_k)
                chunk.append(core.StepRecord(run=meta.run, rank=rank, world_size=meta.world_size, step=it,
                                             time_s=meta.started_s + it * 1e-3, phase="train", tokens=tokens,
                                             counts_LE=counts_LE.astype(np.int32), instance="converted"))
        yield chunk


def _read_file(path: str) -> tuple[dict[int, dict[LayerKey, np.ndarray]], int]:
    """{iter: {layer key: int64 [E_local] summed over micro-batches}} of one rank file, and E_local (0: none)."""
    records: dict[int, dict[LayerKey, np.ndarray]] = {}
    width = 0
    name = os.path.basename(path)
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{name} line {number}"
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(f"{where}: longer than {MAX_LINE_BYTES} bytes")
            it, key, counts_ME = _parse_line(core.parse_json(line, where), where)
            if counts_ME.shape[0]:
                if width and counts_ME.shape[1] != width:
                    raise ValueError(f"{where}: {counts_ME.shape[1]} experts, earlier lines had {width}")
                width = counts_ME.shape[1]
            records.setdefault(it, {})[key] = counts_ME.sum(axis=0) if counts_ME.shape[0] else np.zeros(0, np.int64)
    return records, width  # a layer with no micro-batch keeps a [0] array: zeros in its step record


def _parse_line(obj: object, where: str) -> tuple[int, LayerKey, np.ndarray]:
    """(iter, layer key, int64 [micro-batches, E_local]) of one parsed line; ValueError naming `where`."""
    if not isinstance(obj, dict) or any(key not in obj for key in _KEYS):
        raise ValueError(f"{where}: not a tokens_per_expert record (an object with {', '.join(_KEYS)})")
    it, block, layer, tpe = obj["iter"], obj["block"], obj["layer"], obj["tpe"]
    if not _whole(it) or not 0 <= it < core.MAX_STEP:
        raise ValueError(f"{where}: iter must be a whole number 0..{core.MAX_STEP - 1}, got {it!r}"[:300])
    if block not in ("decoder", "mtp"):
        raise ValueError(f"{where}: block must be 'decoder' or 'mtp', got {block!r}"[:300])
    if not _whole(layer) or not 0 <= layer < core.MAX_LAYERS:
        raise ValueError(f"{where}: layer must be a whole number 0..{core.MAX_LAYERS - 1}, got {layer!r}"[:300])
    mtp = obj.get("mtp_idx", 0) if block == "mtp" else -1
    if block == "mtp" and (not _whole(mtp) or not 0 <= mtp < core.MAX_LAYERS):
        raise ValueError(f"{where}: mtp_idx must be a whole number, got {mtp!r}"[:300])
    if not isinstance(tpe, list) or not all(isinstance(row, list) for row in tpe):
        raise ValueError(f"{where}: tpe must be a list (one per micro-batch) of lists of token counts")
    if len({len(row) for row in tpe}) > 1:
        raise ValueError(f"{where}: tpe's micro-batches list different numbers of experts")
    if tpe and not 0 < len(tpe[0]) <= core.MAX_EXPERTS:
        raise ValueError(f"{where}: tpe lists {len(tpe[0])} experts (1..{core.MAX_EXPERTS})")
    if not all(_whole(v) and 0 <= v < 1 << 31 for row in tpe for v in row):
        raise ValueError(f"{where}: tpe's counts must be whole numbers 0..2**31-1")
    counts = np.asarray(tpe, dtype=np.int64).reshape(len(tpe), len(tpe[0]) if tpe else 0)
    return int(it), (str(block), int(mtp), int(layer)), counts


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rank_files(folder: str) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir(folder):
        match = RANK_FILE.fullmatch(name)
        if match and os.path.isfile(os.path.join(folder, name)):
            found.append((int(match.group(1)), os.path.join(folder, name)))
    return sorted(found)


def _rank_of(path: str) -> int:
    match = RANK_FILE.fullmatch(os.path.basename(path))
    return int(match.group(1)) if match else 0


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None


def _run_name(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)[:128].strip("-") or "megatron-tokens"

