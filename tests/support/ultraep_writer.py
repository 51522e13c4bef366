"""An UltraEP load trace (ultra_ep_trace_v1) made the way UltraEP's load profiler makes it (Dots-Infra/UltraEP
ultra_ep/profiling.py, ExpertLoadProfiler and _write_chunk, with the metadata ultra_ep/manager.py passes it and the
master placement of csrc/kernels/placement.cu; read for these facts, no code taken):

- one writer per EP group (its group rank 0), enabled by ULTRA_EP_LOAD_PROFILING; trace_id is
  f"epg{ep_group_id}_gr{group_rank}_r{global_rank}_{unix ms}";
- the manifest {trace_id}.manifest.json: the Manager's metadata (ep_group_id, ep_rank, ep_size, num_layers,
  max_microbatches, num_local_master_experts, num_local_redundant_experts, num_local_physical_experts,
  num_global_logical_experts, num_global_physical_experts, nvl_domain_size, placement_mode) plus trace_id,
  schema "ultra_ep_trace_v1", created_unix, writer_group_rank, max_pending_records, record_interval,
  flush_interval, then chunks and dropped_records; json.dumps(indent=2, sort_keys=True), written at start
  (chunks 0) and again at close, through a .json.tmp renamed into place;
- a record per (layer, microbatch) whose microbatch % record_interval == 0: pre = the EP group's global logical
  expert loads (int32 [E], E = ep_size x masters per rank), post = tokens per physical slot from the quota
  placement (int32 [P], P = ep_size x (masters + redundant); slot rank*Pl + i < rank*Pl + M holds master
  rank*M + i, the redundant slots change every microbatch and are not recorded);
- every flush_interval records (and at close) a chunk {trace_id}.chunk{id:06d}.npz written with np.savez(handle,
  metadata=np.asarray(json.dumps(meta, separators=(",", ":"))), layers=int32 [R], virtual_layers=int32 [R],
  microbatches=int64 [R], pre_logical_loads=int32 [R, E], post_physical_loads=int32 [R, P]) through .npz.tmp.

Shape legend: R records, E logical experts, P physical slots, M masters per rank, Pl slots per rank.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SCHEMA = "ultra_ep_trace_v1"


class LoadProfileWriter:
    """UltraEP's profiler without CUDA: record(layer, microbatch, pre_E, post_P) as the Manager calls it
    (stage_pre then record_post), close() at the end."""

    def __init__(self, out: Path, ep_size: int, num_layers: int, masters: int, redundant: int,
                 flush_interval: int = 128, record_interval: int = 1, timestamp_ms: int = 1_760_000_000_000,
                 group_id: str = "7f3a2c", global_rank: int = 0):
        self.out = out
        self.trace_id = f"epg{group_id}_gr0_r{global_rank}_{timestamp_ms}"
        self.flush_interval, self.record_interval = flush_interval, record_interval
        self.metadata = {
            "ep_group_id": group_id, "ep_rank": 0, "ep_size": ep_size, "num_layers": num_layers,
            "max_microbatches": 1, "num_local_master_experts": masters, "num_local_redundant_experts": redundant,
            "num_local_physical_experts": masters + redundant, "num_global_logical_experts": masters * ep_size,
            "num_global_physical_experts": (masters + redundant) * ep_size, "nvl_domain_size": ep_size,
            "placement_mode": "quota", "trace_id": self.trace_id, "schema": SCHEMA,
            "created_unix": timestamp_ms / 1000, "writer_group_rank": 0, "max_pending_records": 16,
            "record_interval": record_interval, "flush_interval": flush_interval,
        }
        self.records: list[dict] = []
        self.chunk_id = 0
        self.dropped = 0
        self.microbatch_of: dict[int, int] = {}
        out.mkdir(parents=True, exist_ok=True)
        self.write_manifest()

    def record(self, layer: int, pre_E: np.ndarray, post_P: np.ndarray) -> bool:
        """One forward of `layer` (its microbatch counter advances); True when it was recorded."""
        microbatch = self.microbatch_of.get(layer, 0)
        self.microbatch_of[layer] = microbatch + 1
        if microbatch % self.record_interval:
            return False
        self.records.append({"layer": layer, "virtual_layer": layer, "microbatch": microbatch,
                             "pre": np.asarray(pre_E, dtype=np.int32).copy(),
                             "post": np.asarray(post_P, dtype=np.int32).copy()})
        if len(self.records) >= self.flush_interval:
            self.flush()
        return True

    def flush(self) -> None:
        if not self.records:
            return
        records, self.records = self.records, []
        chunk_meta = {**self.metadata, "chunk_id": self.chunk_id, "records": len(records),
                      "dropped_records": self.dropped}
        path = self.out / f"{self.trace_id}.chunk{self.chunk_id:06d}.npz"
        tmp = path.with_suffix(".npz.tmp")
        with tmp.open("wb") as handle:
            np.savez(handle,
                     metadata=np.asarray(json.dumps(chunk_meta, separators=(",", ":"))),
                     layers=np.asarray([r["layer"] for r in records], dtype=np.int32),
                     virtual_layers=np.asarray([r["virtual_layer"] for r in records], dtype=np.int32),
                     microbatches=np.asarray([r["microbatch"] for r in records], dtype=np.int64),
                     pre_logical_loads=np.stack([r["pre"] for r in records]).astype(np.int32, copy=False),
                     post_physical_loads=np.stack([r["post"] for r in records]).astype(np.int32, copy=False))
        tmp.replace(path)
        self.chunk_id += 1

    def close(self) -> None:
        self.flush()
        self.write_manifest()

    def write_manifest(self) -> None:
        manifest = {**self.metadata, "chunks": self.chunk_id, "dropped_records": self.dropped}
        path = self.out / f"{self.trace_id}.manifest.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        tmp.replace(path)


def quota_post(pre_E: np.ndarray, ep_size: int, masters: int, redundant: int) -> np.ndarray:
    """int32 [P] tokens per physical slot of one (layer, microbatch): each rank's redundant slots replicate the
    hottest experts (hottest first), every expert's load split as evenly as whole tokens allow over its master
    and replicas (what UltraEP's quota placement reaches on easy loads; the split's exact rule is not needed:
    the post loads are read back as written)."""
    per_rank = masters + redundant
    post = np.zeros(ep_size * per_rank, dtype=np.int64)
    hot = np.argsort(-pre_E, kind="stable")[:ep_size * redundant]
    slots_of = {int(e): [(e // masters) * per_rank + e % masters] for e in range(len(pre_E))}
    for j, e in enumerate(hot):
        slots_of[int(e)].append((j % ep_size) * per_rank + masters + j // ep_size)
    for e, slots in slots_of.items():
        share, extra = divmod(int(pre_E[e]), len(slots))
        for i, slot in enumerate(slots):
            post[slot] = share + (1 if i < extra else 0)
    return post.astype(np.int32)


def write_trace(out: Path, rng: np.random.Generator, microbatches: int, layers: list[int], ep_size: int,
                masters: int, redundant: int, **writer_args) -> tuple[LoadProfileWriter, np.ndarray, np.ndarray]:
    """A closed trace of skewed random loads, layers in forward order each microbatch. Returns the writer and
    the recorded truth: pre int32 [T, L, E] and post int32 [T, L, P] of the recorded microbatches, in order."""
    writer = LoadProfileWriter(out, ep_size, max(layers), masters, redundant, **writer_args)
    num_experts = ep_size * masters
    weights = rng.dirichlet(np.full(num_experts, 0.3))
    pre_rows, post_rows = [], []
    for _ in range(microbatches):
        pre_L, post_L = [], []
        for layer in layers:
            pre_E = rng.multinomial(int(rng.integers(64, 512)), weights).astype(np.int32)
            post_P = quota_post(pre_E, ep_size, masters, redundant)
            if writer.record(layer, pre_E, post_P):
                pre_L.append(pre_E)
                post_L.append(post_P)
        if pre_L:
            pre_rows.append(np.stack(pre_L))
            post_rows.append(np.stack(post_L))
    writer.close()
    return writer, np.stack(pre_rows), np.stack(post_rows)
