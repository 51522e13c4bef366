"""Small generated inputs that cost far more than their bytes, and files engines write: written by tests and by the
peak-memory measurements in docs/traces.md. Nothing here is a fixture file."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np


def safetensors_bytes(tensors: dict[str, tuple[str, list[int], tuple[int, int]]], data: bytes,
                      header_text: str | None = None) -> bytes:
    """A safetensors file: tensors name -> (dtype, shape, (begin, end)) over `data`, or a raw header_text."""
    header = header_text if header_text is not None else json.dumps(
        {name: {"dtype": dt, "shape": shape, "data_offsets": list(off)} for name, (dt, shape, off) in tensors.items()})
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + data


def eplb_window(path: Path, counts: np.ndarray, name: str = "global_expert_load_window") -> Path:
    """vLLM's saved load window: one int64 tensor (counts [L, E] or [W, L, E])."""
    data = np.ascontiguousarray(counts, dtype="<i8").tobytes()
    path.write_bytes(safetensors_bytes({name: ("I64", list(counts.shape), (0, len(data)))}, data))
    return path


def trtllm_shared_buffer(folder: Path, tensors: int, experts: int) -> Path:
    """A TensorRT-LLM statistic folder whose rank file declares `tensors` [experts] int8 tensors all over one buffer."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta_info.json").write_text(json.dumps({"num_experts": experts, "num_experts_per_token": 1}))
    entries = {f"{i}_0": ("I8", [experts], (0, experts)) for i in range(tensors)}
    (folder / "rank0.safetensors").write_bytes(safetensors_bytes(entries, bytes(experts)))
    return folder


def trtllm_empty_lists_header(folder: Path, header_bytes: int, experts: int = 8) -> Path:
    """A TensorRT-LLM statistic folder whose rank file's header is mostly `[]`s."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta_info.json").write_text(json.dumps({"num_experts": experts, "num_experts_per_token": 1}))
    text = '{"__metadata__": {"a": [' + ",".join(["[]"] * (header_bytes // 3)) + "]}}"
    (folder / "rank0.safetensors").write_bytes(safetensors_bytes({}, b"", header_text=text))
    return folder


def logical_count_of_empty_lists(path: Path, size_bytes: int) -> Path:
    """{"logical_count": [[], [], ...]} of about size_bytes."""
    path.write_text('{"logical_count": [' + ",".join(["[]"] * (size_bytes // 3)) + "]}")
    return path


def ultraep_uint8(folder: Path, records: int, ep: int = 2, masters: int = 4, redundant: int = 0) -> Path:
    """An UltraEP trace of one chunk of `records` records, every array uint8 and deflated (bytes: almost none)."""
    import io
    import zipfile
    folder.mkdir(parents=True, exist_ok=True)
    E, P = ep * masters, ep * (masters + redundant)
    manifest = {"schema": "ultra_ep_trace_v1", "trace_id": "hostile", "ep_size": ep,
                "num_local_master_experts": masters, "num_local_redundant_experts": redundant,
                "num_local_physical_experts": masters + redundant, "num_global_logical_experts": E,
                "num_global_physical_experts": P, "chunks": 1, "dropped_records": 0}
    path = folder / "hostile.manifest.json"
    path.write_text(json.dumps(manifest))
    arrays = {"metadata": np.asarray(json.dumps({"trace_id": "hostile", "chunk_id": 0, "records": records})),
              "layers": np.zeros(records, np.uint8), "virtual_layers": np.zeros(records, np.uint8),
              "microbatches": (np.arange(records) % 251).astype(np.uint8),
              "pre_logical_loads": np.zeros((records, E), np.uint8),
              "post_physical_loads": np.zeros((records, P), np.uint8)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.save(member, value)
            zf.writestr(f"{key}.npy", member.getvalue())
    (folder / "hostile.chunk000000.npz").write_bytes(buffer.getvalue())
    return path


def megatron_wide_then_short(folder: Path, width: int, short: int) -> Path:
    """rank0.jsonl: one line of `width` experts, then `short` lines of new iterations (of 16 layers) with no count."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"iter": 0, "block": "decoder", "layer": 0, "tpe": [[0] * width]})]
    lines += [json.dumps({"iter": i, "block": "decoder", "layer": i % 16, "tpe": []}) for i in range(1, short + 1)]
    (folder / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def megatron_ranks(folder: Path, ranks: list[int], width: int = 4) -> Path:
    """One short rank<r>.jsonl per rank given."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        (folder / f"rank{rank}.jsonl").write_text(
            json.dumps({"iter": 1, "block": "decoder", "layer": 0, "tpe": [[1] * width]}) + "\n")
    return folder
